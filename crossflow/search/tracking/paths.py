"""Where tracking data lives: the tracking URI and artifact root of a launch, and the lock
that serialises MLflow's first use of a new SQLite database."""

from __future__ import annotations

import contextlib
import os
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



def _lock_path(uri: str) -> str | None:
    """``<database>.lock`` of a SQLite URI (None for any other store, or off POSIX)."""
    try:
        import fcntl  # noqa: F401
    except ImportError:  # not POSIX
        return None
    return uri[len("sqlite:///"):] + ".lock" if uri.startswith("sqlite:///") else None


def _locked(path: str, *, blocking: bool = True):
    """The open lock file ``path``, flocked exclusively; None when not ``blocking`` and
    another process holds it.  The lock is on the file that is at ``path`` once it is
    held: a holder deletes the file before it lets go (:func:`_db_lock`), so a process
    that waited on the deleted file opens the path anew and locks that."""
    import fcntl

    while True:
        fh = open(path, "a")  # noqa: SIM115 - returned open, or closed below
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            fh.close()
            return None
        except BaseException:
            fh.close()
            raise
        try:
            now = os.stat(path)
        except FileNotFoundError:
            now = None
        mine = os.fstat(fh.fileno())
        if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            return fh
        fh.close()  # deleted (or replaced) while this process waited: lock the new one


def _unlock(path: str, fh) -> None:
    """Delete the lock file, still holding it, then let go: nothing is left beside the
    database (issue 20: ``mlruns/mlflow.db.lock`` stayed after every launch and UI)."""
    import fcntl

    try:
        with contextlib.suppress(OSError):
            os.unlink(path)
        fcntl.flock(fh, fcntl.LOCK_UN)
    finally:
        fh.close()


@contextlib.contextmanager
def _db_lock(uri: str):
    """An exclusive lock on ``<database>.lock`` for a SQLite URI (MLflow creates and migrates
    a new database on first use; two processes doing it at once corrupt the migration).
    The file exists while the lock is held and is deleted when it is let go."""
    path = _lock_path(uri)
    if path is None:
        yield
        return
    fh = _locked(path)
    try:
        yield
    finally:
        _unlock(path, fh)


def remove_stale_lock(uri: str) -> bool:
    """Delete ``<database>.lock`` of a SQLite ``uri`` when no process holds it (one left by
    a process killed while it held it, or by an earlier version of CrossFlow, which did not
    delete it); a held one is its holder's to delete.  Whether a file was deleted; never
    raises (a read-only folder keeps its file)."""
    path = _lock_path(uri)
    if path is None or not os.path.exists(path):
        return False
    try:
        fh = _locked(path, blocking=False)
        if fh is None:
            return False
        _unlock(path, fh)
    except OSError:
        return False
    return not os.path.exists(path)
