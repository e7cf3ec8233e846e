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

Every write is one transaction: on any error it is rolled back and the caller logs the runs
one by one through the public API instead (see :class:`.logger._Logger`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crossflow.search.keys import TRIAL_NUMBER_TAG
from crossflow.search.tracking.records import _STATUS, trial_run_id


def sql_engine(client: Any) -> Any:
    """The SQLAlchemy engine of ``client``'s tracking store, or None (a tracking server, a
    file store, or an MLflow whose client no longer exposes it)."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    return getattr(store, "engine", None)


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
