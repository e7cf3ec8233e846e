"""The one module that touches MLflow internals: batched trial runs on MLflow's SQL stores.

Logging a trial through the public API costs ``create_run`` + ``log_batch`` +
``set_terminated``: three transactions and ~20 ms of Python CPU per run.  On MLflow's SQL
stores (SQLite, PostgreSQL, MySQL) this module writes the same rows for many runs in one
transaction (~1-2 ms a run), and finds the runs already logged with one query.  Everything
else in :mod:`crossflow.search.tracking` uses only MLflow's public API (``MlflowClient``).

MLflow internals used, and why (each pinned against the installed MLflow by
``tests/test_tracking_store.py``, so an upgrade that changes one fails a test, not a user):

* ``MlflowClient._tracking_client.store`` (private attributes) and the SQL store's
  ``engine`` attribute (``mlflow.store.tracking.sqlalchemy_store.SqlAlchemyStore.engine``):
  the SQLAlchemy engine of the tracking database; absent for a tracking server, where
  :func:`sql_engine` returns None and callers use the public API.
* ``mlflow.store.tracking.dbmodels.models`` (``SqlRun``, ``SqlTag``, ``SqlParam``,
  ``SqlMetric``, ``SqlLatestMetric``): the ORM tables behind the store, for their table
  objects and column names; the rows are those ``create_run`` (``runs``, the run-name tag),
  ``log_batch`` (``params``, ``tags``, ``metrics`` and ``latest_metrics``, which
  ``search_runs``/``get_run`` read) and ``set_terminated`` (``status``, ``end_time``) write.
* The table and column names ``runs(run_uuid, experiment_id, start_time,
  lifecycle_stage)`` and ``tags(run_uuid, key, value)`` in a plain SQL query
  (:func:`trial_runs`).
* ``mlflow.utils.uri.append_to_uri_path``: a run's artifact URI
  (``<experiment artifact location>/<run id>/artifacts``), as the store builds it.
* A new SQLite tracking database is a copy of an empty one this MLflow version made
  (:func:`seed_sqlite`): MLflow builds a new database by running its ~60 Alembic
  migrations, ~1.5 s of CPU and ~400 commits (each an fsync) that compete with the study
  for the CPU and with the Optuna journal's own fsyncs for the disk.  It relies on a SQLite
  database being one self-contained file (SQLite's backup API copies it) and on MLflow
  accepting a database whose schema is at its head revision (what it checks on opening one).

Every write is one transaction: on any error it is rolled back and the caller logs the runs
one by one through the public API instead (see :class:`.logger._Logger`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossflow.search.keys import TRIAL_NUMBER_TAG
from crossflow.search.tracking.records import _STATUS, trial_run_id


def sql_engine(client: Any) -> Any:
    """The SQLAlchemy engine of ``client``'s tracking store, or None (a tracking server, a
    file store, or an MLflow whose client no longer exposes it)."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    return getattr(store, "engine", None)


def _template_path() -> Path | None:
    """Where the empty database of the installed MLflow version is kept (a per-user cache,
    ``$XDG_CACHE_HOME/crossflow`` or ``~/.cache/crossflow``); None without a version."""
    from importlib import metadata

    try:
        version = metadata.version("mlflow")
    except metadata.PackageNotFoundError:
        return None
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "crossflow" / f"mlflow-{version}-empty.db"


def _ro(path: Path) -> str:
    return Path(path).resolve().as_uri() + "?mode=ro"


def _copy_db(src: Path, dst: Path) -> None:
    """A consistent copy of the SQLite database ``src`` at ``dst`` (created, or replaced
    atomically: a reader never sees a partial file)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with contextlib.closing(sqlite3.connect(_ro(src), uri=True)) as a, \
                contextlib.closing(sqlite3.connect(tmp)) as b:
            a.backup(b)
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _is_empty_store(path: Path) -> bool:
    """Whether ``path`` is an MLflow database as MLflow leaves a new one: a schema revision,
    the Default experiment alone and no run."""
    try:
        with contextlib.closing(sqlite3.connect(_ro(path), uri=True)) as db:
            revisions = db.execute("SELECT version_num FROM alembic_version").fetchall()
            experiments = db.execute("SELECT experiment_id, name FROM experiments").fetchall()
            runs = db.execute("SELECT count(*) FROM runs").fetchone()[0]
            ok = db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    except sqlite3.Error:
        return False
    return ok and len(revisions) == 1 and experiments == [(0, "Default")] and runs == 0


#: Rows a new MLflow store holds (table -> the key values allowed): anything else is data.
_NEW_STORE_ROWS = {"alembic_version": None, "experiments": {(0, "Default")},
                   "workspaces": {("default",)}}


@dataclass(frozen=True)
class StoreState:
    """What a SQLite tracking database holds, read without MLflow (:func:`store_state`)."""

    path: Path
    revision: str | None       # alembic_version's one row (None: no table, or not one row)
    head: str                  # this MLflow's schema revision
    missing: tuple[str, ...]   # tables this MLflow's schema has and the database lacks
    runs: int                  # rows of ``runs`` (0 when the table is missing)
    holds_data: bool           # rows a new store does not have (runs, experiments, ...)

    @property
    def half_created(self) -> bool:
        """A creation or upgrade of the schema cut short (a full disk, a crash): tables or
        the revision record missing.  MLflow then runs its migrations
        again over what is there, which fails ("table spans already exists")."""
        return self.revision is None or bool(self.missing)

    @property
    def current(self) -> bool:
        return not self.half_created and self.revision == self.head

    def describe(self) -> str:
        """The problem, in a clause: what is missing or different."""
        if self.revision is None:
            return "it has no MLflow schema revision"
        if self.missing:
            some = ", ".join(self.missing[:3]) + (", ..." if len(self.missing) > 3 else "")
            return (f"{len(self.missing)} of this MLflow's tables are missing ({some}; "
                    f"schema revision {self.revision}, this MLflow's is {self.head})")
        return f"its schema revision is {self.revision}, this MLflow's is {self.head}"


def _schema_of(path: Path, *, check: bool = False) -> tuple[list[str], set[str], bool, int,
                                                           bool]:
    """(alembic revisions, tables, SQLite's quick check ok (only if ``check``: it reads the
    whole file), runs, holds data) of a SQLite file, read only.  Raises sqlite3.Error when
    it is no SQLite database."""
    with contextlib.closing(sqlite3.connect(_ro(path), uri=True)) as db:
        tables = {r[0] for r in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
        revisions = [r[0] for r in db.execute("SELECT version_num FROM alembic_version")] \
            if "alembic_version" in tables else []
        ok = not check or db.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        runs = db.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
        data = False
        for table in sorted(tables):
            allowed = _NEW_STORE_ROWS.get(table, set())
            if allowed is None:
                continue
            if table == "experiments":
                rows = set(db.execute("SELECT experiment_id, name FROM experiments"))
            elif table == "workspaces":
                rows = set(db.execute("SELECT name FROM workspaces"))
            else:
                rows = {None} if db.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchone() \
                    else set()
            if rows - allowed:
                data = True
                break
    return revisions, tables, ok, runs, data


def _head_schema() -> tuple[str, frozenset[str]]:
    """(revision, tables) of this MLflow's schema: from the cached empty store when there is
    one (no MLflow import, which takes seconds), else from MLflow's own models."""
    template = _template_path()
    if template is not None and template.is_file():
        with contextlib.suppress(sqlite3.Error):
            revisions, tables, ok, _, data = _schema_of(template, check=True)
            if ok and len(revisions) == 1 and not data:
                return revisions[0], frozenset(tables - {"alembic_version"})
    import mlflow.store.db.utils as db_utils
    from mlflow.store.db.base_sql_model import Base

    return db_utils._get_latest_schema_revision(), frozenset(Base.metadata.tables)


def store_state(uri: str) -> StoreState | None:
    """What the existing SQLite tracking database of ``uri`` holds; None when there is no
    such file (or it is no SQLite database: MLflow says so when it opens it)."""
    if not uri.startswith("sqlite:///") or any(c in uri for c in "?#"):
        return None
    path = Path(uri[len("sqlite:///"):])
    if path.name in ("", ":memory:") or not path.is_file():
        return None
    try:
        revisions, tables, _, runs, data = _schema_of(path)
    except sqlite3.Error:
        return None
    head, expected = _head_schema()
    return StoreState(path=path, revision=revisions[0] if len(revisions) == 1 else None,
                      head=head, missing=tuple(sorted(expected - tables)), runs=runs,
                      holds_data=data)


def rebuild_half_created(uri: str) -> bool:
    """The caller holds :func:`~.paths._db_lock`: a half-created SQLite tracking database
    (:attr:`StoreState.half_created`) that holds nothing a new store does not is removed,
    with SQLite's journal beside it, so that it is made again (:func:`seed_sqlite`).
    Returns whether it was; a store holding data is never touched."""
    state = store_state(uri)
    if state is None or not state.half_created or state.holds_data:
        return False
    # MLflow keeps one engine per URI for the process: its pooled connections would go on
    # writing to the removed file (a retried start of the logging process)
    sql_store = sys.modules.get("mlflow.store.tracking.sqlalchemy_store")
    engine_map = getattr(getattr(sql_store, "SqlAlchemyStore", None), "_engine_map", None)
    engine = engine_map.pop(uri, None) if isinstance(engine_map, dict) else None
    if engine is not None:
        engine.dispose()
    for suffix in ("-journal", "-wal", "-shm", ""):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{state.path}{suffix}")
    return True


def seed_sqlite(uri: str) -> str:
    """Before MLflow first opens the SQLite database of ``uri`` (the caller holds
    :func:`~.paths._db_lock`): a missing database, or a half-created one that holds nothing
    (:func:`rebuild_half_created`), becomes a copy of the cached empty one of this MLflow
    version, so MLflow finds its schema current and runs no migration.
    Returns "copied"; "missing" when the database is missing and no valid copy is cached
    (MLflow creates it; then :func:`remember_sqlite` keeps a copy); "" otherwise (not
    SQLite, the database exists)."""
    if not uri.startswith("sqlite:///") or any(c in uri for c in "?#"):
        return ""  # SQLAlchemy options or a SQLite URI filename: MLflow decides
    path = Path(uri[len("sqlite:///"):])
    if path.name in ("", ":memory:") or not path.parent.is_dir():
        return ""
    if path.exists():
        try:
            if not rebuild_half_created(uri):
                return ""
        except (OSError, sqlite3.Error):  # unreadable, or not removable: MLflow decides
            return ""
    template = _template_path()
    if template is None or not template.is_file():
        return "missing"
    tmp = path.parent / f".{path.name}.{os.getpid()}.seed"
    try:
        try:
            _copy_db(template, tmp)
            if not _is_empty_store(tmp):
                with contextlib.suppress(OSError):
                    template.unlink()
                return "missing"
            os.link(tmp, path)  # never over a database that appeared meanwhile
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except (OSError, sqlite3.Error):  # a read-only cache or directory: MLflow decides
        return "" if path.exists() else "missing"
    return "copied"


def remember_sqlite(uri: str) -> None:
    """After MLflow made the new SQLite database of ``uri`` (still empty): keep a copy as the
    cached empty database of this MLflow version, for :func:`seed_sqlite`.  Best effort."""
    path = Path(uri[len("sqlite:///"):])
    template = _template_path()
    if template is None or template.exists():
        return
    with contextlib.suppress(OSError, sqlite3.Error):
        if _is_empty_store(path):
            _copy_db(path, template)


def trial_runs(engine: Any, experiment_id: str) -> list[tuple[str, int, str]]:
    """(trial number tag, start time ms, run id) of the active runs of the experiment that
    have a :data:`~crossflow.search.keys.TRIAL_NUMBER_TAG` tag, in one query."""
    import sqlalchemy

    q = sqlalchemy.text(
        "SELECT t.value, r.start_time, r.run_uuid FROM tags t JOIN runs r "
        "ON r.run_uuid = t.run_uuid WHERE r.experiment_id = :eid "
        "AND r.lifecycle_stage = 'active' AND t.key = :key")
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(
            q, {"eid": int(experiment_id), "key": TRIAL_NUMBER_TAG}).all()]


def insert_runs(engine: Any, experiment_id: str, artifact_location: str,
                recs: list[dict[str, Any]]) -> int:
    """Trial runs (records of :func:`~.records.trial_record`, tags complete: the run name,
    the parent run id) in one transaction, under ids of :func:`~.records.trial_run_id`;
    runs another process inserted already are left alone.  Returns how many were inserted
    (or restored)."""
    import sqlalchemy

    by_id = {trial_run_id(experiment_id, r["number"], r["start_ms"]): r for r in recs}
    for _ in range(2):
        try:
            return _write_runs(engine, experiment_id, artifact_location, by_id)
        except sqlalchemy.exc.IntegrityError:  # inserted meanwhile by another process
            pass
    return _write_runs(engine, experiment_id, artifact_location, by_id)


def _write_runs(engine: Any, experiment_id: str, artifact_location: str,
                by_id: Mapping[str, dict[str, Any]]) -> int:
    """The rows ``create_run``, ``log_batch`` and ``set_terminated`` would write (finished
    status, run-name tag, metrics with their latest values) for the runs of ``by_id`` (run
    id -> record) not in the store yet, in one transaction.  A trial's run deleted since (by
    hand) is restored, with fresh tags."""
    import sqlalchemy
    from mlflow.store.tracking.dbmodels.models import (
        SqlLatestMetric,
        SqlMetric,
        SqlParam,
        SqlRun,
        SqlTag,
    )
    from mlflow.utils.uri import append_to_uri_path

    with engine.begin() as conn:
        there = dict(conn.execute(sqlalchemy.select(
            SqlRun.run_uuid, SqlRun.lifecycle_stage).where(
            SqlRun.run_uuid.in_(list(by_id)))).all())
        restore = [r for r, stage in there.items() if stage != "active"]
        if restore:
            conn.execute(sqlalchemy.update(SqlRun).where(
                SqlRun.run_uuid.in_(restore)).values(
                lifecycle_stage="active", deleted_time=None))
            conn.execute(sqlalchemy.delete(SqlTag).where(SqlTag.run_uuid.in_(restore)))
            conn.execute(SqlTag.__table__.insert(), [
                {"key": k, "value": v, "run_uuid": r}
                for r in restore for k, v in by_id[r]["tags"].items()])
        runs, tags, params, metrics = [], [], [], []
        for run_id, rec in by_id.items():
            if run_id in there:
                continue
            runs.append({
                "run_uuid": run_id, "name": rec["tags"]["mlflow.runName"],
                "artifact_uri": append_to_uri_path(artifact_location, run_id, "artifacts"),
                "experiment_id": int(experiment_id), "source_type": "UNKNOWN",
                "source_name": "", "entry_point_name": "",
                "user_id": rec["tags"].get("mlflow.user", "unknown"),
                "status": _STATUS.get(rec["state"], "FINISHED"),
                "start_time": rec["start_ms"], "end_time": rec["end_ms"],
                "deleted_time": None, "source_version": "", "lifecycle_stage": "active"})
            tags += [{"key": k, "value": v, "run_uuid": run_id}
                     for k, v in rec["tags"].items()]
            params += [{"key": k, "value": v, "run_uuid": run_id}
                       for k, v in rec["params"].items()]
            metrics += [{"key": k, "value": v, "timestamp": rec["end_ms"], "step": 0,
                         "is_nan": False, "run_uuid": run_id}
                        for k, v in rec["metrics"].items()]
        if runs:
            conn.execute(SqlRun.__table__.insert(), runs)
            conn.execute(SqlTag.__table__.insert(), tags)
        if params:
            conn.execute(SqlParam.__table__.insert(), params)
        if metrics:
            conn.execute(SqlMetric.__table__.insert(), metrics)
            conn.execute(SqlLatestMetric.__table__.insert(), metrics)
    return len(runs) + len(restore)
