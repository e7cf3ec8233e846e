"""Where tracking data lives: the tracking URI and artifact root of a launch, and the lock
that serialises MLflow's first use of a new SQLite database."""

from __future__ import annotations

import contextlib
from pathlib import Path

from crossflow.search.locations import default_tracking_uri


def resolve_locations(tracking_uri: str | None, artifact_root: str | None = None, *,
                      create: bool = True) -> tuple[str, str | None]:
    """(tracking URI, artifact root URI or None).

    No URI: the SQLite store ``<cwd>/mlruns/mlflow.db`` with artifacts in
    ``<cwd>/mlruns/artifacts``.  A ``sqlite:///path/x.db`` URI: artifacts beside the
    database (``path/artifacts``).  A server (``http(s)://``, ``databricks``): the server's
    own artifact store unless ``artifact_root`` is given.  Any other database URI:
    ``<cwd>/mlruns/artifacts``.  Local artifact directories are created unless not
    ``create`` (a reader such as ``crossflow ui`` on a read-only store)."""
    uri = tracking_uri or default_tracking_uri()
    if artifact_root is None:
        if uri.startswith(("http://", "https://", "databricks")):
            return uri, None
        if uri.startswith("sqlite:///"):
            db = Path(uri[len("sqlite:///"):])
            if create:
                db.parent.mkdir(parents=True, exist_ok=True)
            artifact_root = str(db.parent.resolve() / "artifacts")
        else:
            artifact_root = str(Path.cwd().resolve() / "mlruns" / "artifacts")
    if "://" not in artifact_root:
        path = Path(artifact_root).resolve()
        if create:
            path.mkdir(parents=True, exist_ok=True)
        artifact_root = path.as_uri()
    return uri, artifact_root.rstrip("/")



@contextlib.contextmanager
def _db_lock(uri: str):
    """An exclusive lock on ``<database>.lock`` for a SQLite URI (MLflow creates and migrates
    a new database on first use; two processes doing it at once corrupt the migration)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None
    if fcntl is None or not uri.startswith("sqlite:///"):
        yield
        return

    with open(uri[len("sqlite:///"):] + ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)

