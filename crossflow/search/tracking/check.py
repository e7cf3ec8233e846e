"""Checks of a tracking store made when a launch starts — before the Optuna study is created
and before trial 1 — so that a study never runs for hours while its MLflow runs are lost.

:func:`check_tracking` refuses (:class:`~crossflow.errors.ConfigError`, exit 2, one
paragraph naming ``--tracking-uri``) an unknown URI scheme, a server or database that does
not answer within :data:`CHECK_S`, a SQLite file that is the study's own Optuna storage,
and a local store (SQLite file, file store, artifact directory) that cannot be written,
and an existing SQLite store MLflow could not open (:func:`unusable_store`: half-created
with data in it, or of another MLflow's schema).
Nothing is created: a directory that does not exist yet is checked through the nearest one
that does (only a store that is not current is read under its lock, ``<db>.lock``).  No
``mlflow`` import (it takes a second): sockets and ``urllib``, and for an existing SQLite
store the revision of the cached empty store (MLflow's own schema only when none is
cached).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from crossflow.errors import ConfigError
from crossflow.search.locations import default_tracking_uri, redact

#: Seconds a tracking server or database may take to answer the start-of-launch check.
CHECK_S = 5.0
#: URI schemes MLflow's tracking stores understand (a database scheme may carry a driver:
#: ``postgresql+psycopg2``).
SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "file", "databricks")
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433, "http": 80, "https": 443}
_ALTERNATIVES = "choose another store with --tracking-uri, or run with --no-tracking"


def _error(uri: str, problem: str, allowed: str | None = None) -> ConfigError:
    return ConfigError(problem, file="command line", key="--tracking-uri", value=redact(uri),
                       allowed=allowed)


def scheme_of(uri: str) -> str:
    """The store kind of a tracking URI: its scheme without a driver (``""`` for a path)."""
    if "://" not in uri:
        return "databricks" if uri == "databricks" or uri.startswith("databricks:") else ""
    return uri.split("://", 1)[0].split("+", 1)[0].lower()


def local_path(uri: str) -> Path | None:
    """The file (SQLite) or directory (file store) of a local tracking URI, else None."""
    kind = scheme_of(uri)
    if kind == "sqlite":
        rest = uri.split("://", 1)[1]
        if not rest.startswith("/") or rest in ("/", "/:memory:"):
            return None  # in memory: nothing on disk (checked below)
        return Path(rest[1:]).expanduser()
    if kind == "file":
        return Path(urllib.parse.urlparse(uri).path)
    if kind == "":
        return Path(uri).expanduser()
    return None


def storage_path(storage: str | None) -> Path | None:
    """The file of an Optuna storage: a journal file, or a ``sqlite:///`` database."""
    if not storage:
        return None
    if "://" not in storage:
        return Path(storage).expanduser()
    if storage.lower().startswith("sqlite:///") and storage[len("sqlite:///"):] not in (
            "", ":memory:"):
        return Path(storage[len("sqlite:///"):]).expanduser()
    return None


def _same_database(uri: str, storage: str | None) -> bool:
    """Two database URLs name one database (scheme without driver, host, port, name)."""
    if not storage or "://" not in storage:
        return False

    def key(url: str):
        p = urllib.parse.urlparse(url)
        try:
            port = p.port
        except ValueError:
            port = None
        return (scheme_of(url), (p.hostname or "").lower(),
                port or _DEFAULT_PORTS.get(scheme_of(url)), p.path.rstrip("/"))

    return key(uri) == key(storage)


def _same_file(a: Path, b: Path) -> bool:
    with contextlib.suppress(OSError):
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _writable_dir(uri: str, directory: Path, what: str) -> None:
    """``directory`` (or, if it does not exist yet, its nearest existing ancestor, where it
    will be created) takes new files: tried with a temporary file, removed at once."""
    base = _existing_ancestor(directory)
    if not base.is_dir():
        raise _error(uri, f"{what} {directory} cannot be created: {base} is not a directory",
                     _ALTERNATIVES)
    try:
        fd, probe = tempfile.mkstemp(prefix=".crossflow-probe-", dir=base)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            why = "read-only" if exc.errno == errno.EROFS else "permission denied"
        raise _error(uri, f"{what} {directory} cannot be written ({why} in {base})",
                     _ALTERNATIVES) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _check_local(uri: str, path: Path) -> None:
    kind = scheme_of(uri)
    if kind == "sqlite":
        if path.exists():
            if not path.is_file():
                raise _error(uri, f"the SQLite tracking database {path} is not a regular file",
                             _ALTERNATIVES)
            try:
                with open(path, "r+b") as fh:
                    head = fh.read(16)
            except OSError as exc:
                raise _error(uri, f"the SQLite tracking database {path} cannot be opened for "
                             f"writing ({exc.strerror or exc})", _ALTERNATIVES) from None
            if head and head != b"SQLite format 3\x00":
                raise _error(uri, f"{path} is not an SQLite database", _ALTERNATIVES)
            _check_schema(uri)
        # SQLite writes a journal beside the database; artifacts go beside it too
        _writable_dir(uri, path.parent, "the tracking directory")
    else:  # a file store: a directory
        if path.exists() and not path.is_dir():
            raise _error(uri, f"the file tracking store {path} is not a directory",
                         _ALTERNATIVES)
        _writable_dir(uri, path, "the file tracking store")


def unusable_store(uri: str) -> str | None:
    """Why MLflow could not use the existing SQLite tracking database of ``uri`` (a clause
    naming the file and what to do), or None.  A half-created one (a creation cut short by
    a full disk, say) that holds nothing a new store does not is no problem: the launch
    makes it anew (:func:`~.store.rebuild_half_created`).  Read under the store's lock, so
    a store another launch is creating is seen when made."""
    from crossflow.search.tracking import store
    from crossflow.search.tracking.paths import _db_lock

    state = store.store_state(uri)
    if state is None or state.current:
        return None
    with contextlib.suppress(OSError), _db_lock(uri):  # (a read-only folder: no lock)
        state = store.store_state(uri)
    if state is None or state.current or (state.half_created and not state.holds_data):
        return None
    return store_advice(state)


def store_advice(state) -> str:
    """What is wrong with a tracking database MLflow cannot open, and what to do."""
    url = f"sqlite:///{state.path}"
    if state.half_created:
        runs = f"{state.runs} run{'' if state.runs == 1 else 's'}"
        return (f"the MLflow tracking database {state.path} is half-created: "
                f"{state.describe()}, as a creation or upgrade cut short (a full disk, a "
                f"crash) leaves it; it holds data ({runs}), so it is not made anew: back it "
                f"up, then run 'mlflow db upgrade {url}', or move it away and a new store "
                "is made")
    return (f"the MLflow tracking database {state.path} has another MLflow version's schema "
            f"({state.describe()}): if an older MLflow made it, back it up, then run "
            f"'mlflow db upgrade {url}'; if a newer one did, use that MLflow")


def _check_schema(uri: str) -> None:
    problem = unusable_store(uri)
    if problem:
        raise _error(uri, problem, _ALTERNATIVES)


def _answers(uri: str, timeout: float) -> None:
    """A tracking server answers an HTTP request within ``timeout`` (any HTTP status will
    do: a server that wants a login still answers)."""
    url = uri.rstrip("/") + "/health"
    try:
        urllib.request.urlopen(url, timeout=timeout).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, socket.timeout | TimeoutError):
            reason = f"no answer within {timeout:g} s"
        raise _error(uri, f"the MLflow tracking server does not answer ({reason})",
                     "a running server (start one with 'mlflow server'), another "
                     "--tracking-uri, or --no-tracking") from None


def _reachable(uri: str, timeout: float) -> None:
    """A database server accepts a TCP connection within ``timeout``."""
    parsed = urllib.parse.urlparse(uri)
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:
        raise _error(uri, "the port in the URI is not a number", _ALTERNATIVES) from None
    if not host:
        return  # a local socket or a driver's own default: the logger's bounds apply
    port = port or _DEFAULT_PORTS.get(scheme_of(uri))
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        reason = f"no answer within {timeout:g} s" if isinstance(
            exc, socket.timeout | TimeoutError) else (exc.strerror or str(exc))
        raise _error(uri, f"the tracking database at {host}:{port} cannot be reached "
                     f"({reason})", _ALTERNATIVES) from None


def check_tracking(tracking_uri: str | None, storage: str | None = None, *,
                   timeout: float = CHECK_S, key: str = "--tracking-uri") -> str:
    """Check the tracking store of a launch before anything is created (see the module
    docstring); returns the URI (the default one when ``tracking_uri`` is None).

    Raises:
        ConfigError: naming ``key`` (``--tracking-uri``; ``tracking_uri`` when the URI
            comes from the study file); at most ``timeout`` seconds of waiting for a server
            or database (each of connect and answer)."""
    uri = tracking_uri or default_tracking_uri()
    try:
        _check(uri, storage, timeout)
    except ConfigError as exc:
        if key == exc.key:
            raise
        raise ConfigError(exc.problem, file=None, key=key, value=exc.value,
                          allowed=exc.allowed) from None
    return uri


def _check(uri: str, storage: str | None, timeout: float) -> None:
    if not uri.strip():
        raise _error(uri, "empty tracking URI", "a sqlite:///FILE.db, http(s)://HOST:PORT "
                     "or database URI")
    kind = scheme_of(uri)
    if kind not in SCHEMES and kind != "":
        raise _error(uri, f"unknown tracking URI scheme {kind + '://'!r}",
                     "sqlite:///FILE.db, postgresql://, mysql://, mssql://, http(s)://, "
                     "file://, databricks")
    if kind == "sqlite" and local_path(uri) is None:
        raise _error(uri, "an in-memory SQLite tracking store loses every run when the "
                     "launch ends", "sqlite:///FILE.db (three slashes, then the path)")
    path = local_path(uri)
    if path is not None:
        own = storage_path(storage)
        if own is not None and _same_file(path, own):
            raise _error(uri, f"the tracking store {path} is the study's own Optuna storage "
                         "(--storage); MLflow and Optuna cannot share one file",
                         "another file, e.g. the default mlruns/mlflow.db")
        _check_local(uri, path)
    elif kind in ("postgresql", "mysql", "mssql") and _same_database(uri, storage):
        raise _error(uri, "the tracking store is the study's own Optuna database (--storage); "
                     "both keep an 'alembic_version' table, so one would break the other",
                     "another database")
    if kind in ("http", "https"):
        _answers(uri, timeout)
    elif kind in ("postgresql", "mysql", "mssql"):
        _reachable(uri, timeout)
