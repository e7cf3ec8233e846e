"""The contract of crossflow.search.tracking.store (the one module on MLflow internals)
against the installed MLflow: runs inserted the way store.py inserts them read back through
the public ``MlflowClient`` exactly like runs logged through the public API, so an MLflow
upgrade that changes the tables, the store's attributes or the validation limits fails here,
not in a user's study."""

from __future__ import annotations

import time

import pytest

from crossflow.search.tracking import store
from crossflow.search.tracking.records import (
    _MAX_KEY,
    _MAX_PARAM,
    _MAX_TAG,
    _PER_BATCH,
    _STATUS,
    trial_run_id,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*")
T0 = 1_767_268_800_000  # 2026-01-01 12:00 UTC, ms


def record(number: int, state: str = "COMPLETE", **extra) -> dict:
    start = T0 + 10_000 * number
    return {"number": number, "state": state, "start_ms": start, "end_ms": start + 2_500,
            "params": {"area_fractions.core": "0.25", "strategy": "RC-4-2",
                       "x": repr(0.1 * number)},
            "metrics": {"iteration_time_s": 1.5 + number, "energy_J": 30.0 * (number + 1)},
            "tags": {"trial_number": str(number), "state": state, "sampler": "tpe",
                     "mlflow.runName": f"trial-{number:05d}", "mlflow.parentRunId": "p" * 32,
                     **extra}}


@pytest.fixture
def client(tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    eid = client.create_experiment("contract",
                                   artifact_location=(tmp_path / "artifacts").as_uri())
    return client, eid


def test_mlflow_limits_are_the_ones_records_truncate_to():
    from mlflow.utils import validation

    assert validation.MAX_PARAM_VAL_LENGTH >= _MAX_PARAM
    assert validation.MAX_TAG_VAL_LENGTH >= _MAX_TAG
    assert validation.MAX_ENTITY_KEY_LENGTH >= _MAX_KEY
    assert validation.MAX_PARAMS_TAGS_PER_BATCH >= _PER_BATCH


def test_the_sql_store_exposes_its_engine_and_a_server_does_not(client):
    from mlflow import MlflowClient

    c, _ = client
    engine = store.sql_engine(c)
    assert engine is not None and engine.dialect.name == "sqlite"
    assert store.sql_engine(MlflowClient("http://127.0.0.1:9")) is None


def test_the_tables_have_the_columns_store_writes():
    from mlflow.store.tracking.dbmodels.models import (
        SqlLatestMetric,
        SqlMetric,
        SqlParam,
        SqlRun,
        SqlTag,
    )

    cols = {m.__tablename__: set(m.__table__.columns.keys())
            for m in (SqlRun, SqlTag, SqlParam, SqlMetric, SqlLatestMetric)}
    assert {"run_uuid", "name", "artifact_uri", "experiment_id", "source_type",
            "source_name", "entry_point_name", "user_id", "status", "start_time",
            "end_time", "deleted_time", "source_version", "lifecycle_stage"} >= {
        c.name for c in SqlRun.__table__.columns if not c.nullable and c.default is None
        and c.server_default is None and not c.primary_key} - {"run_uuid"}
    assert cols["runs"] >= {"run_uuid", "name", "artifact_uri", "experiment_id", "status",
                            "start_time", "end_time", "lifecycle_stage", "deleted_time"}
    assert cols["tags"] >= {"key", "value", "run_uuid"}
    assert cols["params"] >= {"key", "value", "run_uuid"}
    for table in ("metrics", "latest_metrics"):
        assert cols[table] >= {"key", "value", "timestamp", "step", "is_nan", "run_uuid"}


def test_inserted_runs_read_back_through_the_public_client(client):
    c, eid = client
    location = c.get_experiment(eid).artifact_location
    recs = [record(0), record(1, "FAIL"), record(2, "PRUNED")]
    assert store.insert_runs(store.sql_engine(c), eid, location, recs) == 3
    for rec in recs:
        run = c.get_run(trial_run_id(eid, rec["number"], rec["start_ms"]))
        assert run.info.experiment_id == eid
        assert run.info.run_name == rec["tags"]["mlflow.runName"]
        assert run.info.status == _STATUS[rec["state"]]
        assert (run.info.start_time, run.info.end_time) == (rec["start_ms"], rec["end_ms"])
        assert run.info.lifecycle_stage == "active"
        assert run.info.artifact_uri == f"{location}/{run.info.run_id}/artifacts"
        assert run.data.params == rec["params"]
        assert run.data.metrics == rec["metrics"]
        assert run.data.tags == rec["tags"]
        hist = c.get_metric_history(run.info.run_id, "energy_J")
        assert [(m.value, m.step, m.timestamp) for m in hist] == [
            (rec["metrics"]["energy_J"], 0, rec["end_ms"])]
    found = c.search_runs([eid], "metrics.iteration_time_s > 2 and tags.state = 'FAIL'")
    assert [r.data.tags["trial_number"] for r in found] == ["1"]
    found = c.search_runs([eid], "params.strategy = 'RC-4-2'",
                          order_by=["metrics.iteration_time_s DESC"])
    assert [r.data.tags["trial_number"] for r in found] == ["2", "1", "0"]
    assert sorted(store.trial_runs(store.sql_engine(c), eid)) == sorted(
        (str(r["number"]), r["start_ms"], trial_run_id(eid, r["number"], r["start_ms"]))
        for r in recs)


def test_inserted_runs_equal_runs_logged_through_the_public_api(client):
    from mlflow.entities import Metric, Param, RunTag

    c, eid = client
    rec = record(4)
    store.insert_runs(store.sql_engine(c), eid, c.get_experiment(eid).artifact_location,
                      [rec])
    ours = c.get_run(trial_run_id(eid, 4, rec["start_ms"]))
    api = c.create_run(eid, start_time=rec["start_ms"], tags=rec["tags"])
    c.log_batch(api.info.run_id, metrics=[Metric(k, v, rec["end_ms"], 0)
                                          for k, v in rec["metrics"].items()],
                params=[Param(k, v) for k, v in rec["params"].items()],
                tags=[RunTag(k, v) for k, v in rec["tags"].items()])
    c.set_terminated(api.info.run_id, "FINISHED", end_time=rec["end_ms"])
    api = c.get_run(api.info.run_id)
    assert ours.data.params == api.data.params
    assert ours.data.metrics == api.data.metrics
    assert ours.data.tags == api.data.tags
    for field in ("status", "start_time", "end_time", "lifecycle_stage", "run_name",
                  "user_id"):
        assert getattr(ours.info, field) == getattr(api.info, field), field


def test_inserting_again_is_a_no_op_and_a_deleted_run_is_restored(client):
    c, eid = client
    engine, location = store.sql_engine(c), c.get_experiment(eid).artifact_location
    recs = [record(0), record(1)]
    assert store.insert_runs(engine, eid, location, recs) == 2
    assert store.insert_runs(engine, eid, location, recs) == 0  # another launch's retry
    gone = trial_run_id(eid, 1, recs[1]["start_ms"])
    c.delete_run(gone)
    assert len(c.search_runs([eid])) == 1
    assert store.insert_runs(engine, eid, location, recs) == 1
    run = c.get_run(gone)
    assert run.info.lifecycle_stage == "active" and run.data.tags == recs[1]["tags"]
    assert len(c.search_runs([eid])) == 2


def test_a_new_sqlite_store_is_a_copy_of_the_cached_empty_one(tmp_path, monkeypatch):
    """The first new database is made by MLflow and kept; the next is a copy MLflow opens as
    it opens its own (no migration), holds the Default experiment only and takes runs; a
    damaged cached copy is dropped, and an existing database is never touched."""
    import sqlite3

    from mlflow import MlflowClient

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}"
    (tmp_path / "a").mkdir()
    assert store.seed_sqlite(first) == "missing"
    MlflowClient(first).search_experiments()
    store.remember_sqlite(first)
    template = store._template_path()
    assert template is not None and template.is_file()

    second = f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}"
    (tmp_path / "b").mkdir()
    assert store.seed_sqlite(second) == "copied"
    assert store.seed_sqlite(second) == ""  # exists now: left alone
    c = MlflowClient(second)
    assert [e.name for e in c.search_experiments()] == ["Default"]
    eid = c.create_experiment("seeded", artifact_location=(tmp_path / "art").as_uri())
    assert store.insert_runs(store.sql_engine(c), eid, (tmp_path / "art").as_uri(),
                             [record(0), record(1)]) == 2
    assert len(c.search_runs([eid])) == 2
    assert not store._is_empty_store(tmp_path / "b" / "mlflow.db")  # a used store is no seed

    with sqlite3.connect(template) as db:  # damaged: not an empty store any more
        db.execute("DELETE FROM alembic_version")
    db.close()
    third = f"sqlite:///{tmp_path / 'c' / 'mlflow.db'}"
    (tmp_path / "c").mkdir()
    assert store.seed_sqlite(third) == "missing" and not template.exists()
    assert not (tmp_path / "c" / "mlflow.db").exists()
    assert not [p for p in (tmp_path / "c").iterdir()]  # no temporary file left
    # options, a SQLite URI filename, an in-memory database: left to MLflow
    for uri in (f"{third}?timeout=30", "sqlite:///:memory:",
                f"sqlite:///{tmp_path / 'no-such-dir' / 'mlflow.db'}"):
        assert store.seed_sqlite(uri) == ""


# --- the store's lock file, <database>.lock (issue 20: it stayed beside mlflow.db) --------------


def test_the_store_lock_leaves_no_file_once_let_go(tmp_path):
    from crossflow.search.tracking.paths import _db_lock

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lock = tmp_path / "mlflow.db.lock"
    with _db_lock(uri):
        assert lock.is_file()
    assert not lock.exists()
    with pytest.raises(KeyError), _db_lock(uri):  # an error inside: let go all the same
        raise KeyError("x")
    assert not lock.exists()
    with _db_lock("postgresql://u@h/db"):  # no file for a server database
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_process_that_waited_on_a_deleted_lock_file_locks_the_new_one(tmp_path):
    """The holder deletes the file before it lets go: a waiter, woken on the deleted file,
    opens the path again, so two holders never hold two different files at once."""
    import threading

    from crossflow.search.tracking.paths import _db_lock, _locked, remove_stale_lock

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    lock = tmp_path / "mlflow.db.lock"
    first_in, second_in, release, done = (threading.Event() for _ in range(4))
    inside: list[str] = []

    def second():
        first_in.wait()
        with _db_lock(uri):
            inside.append("second")
            second_in.set()
            release.wait(10)
        done.set()

    worker = threading.Thread(target=second)
    worker.start()
    with _db_lock(uri):
        first_in.set()
        time.sleep(0.3)  # the second waits on this file
        assert inside == [] and not remove_stale_lock(uri)  # held: not deleted
    assert second_in.wait(10) and inside == ["second"]
    assert lock.is_file()  # the second's own file, held: nobody else gets it
    assert _locked(str(lock), blocking=False) is None
    assert not remove_stale_lock(uri) and lock.is_file()
    release.set()
    assert done.wait(10)
    worker.join()
    assert not lock.exists()


def test_a_stale_lock_file_is_removed_and_a_missing_one_is_no_error(tmp_path):
    from crossflow.search.tracking.paths import remove_stale_lock

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert not remove_stale_lock(uri)
    (tmp_path / "mlflow.db.lock").touch()  # left by a killed launch or an older CrossFlow
    assert remove_stale_lock(uri) and not (tmp_path / "mlflow.db.lock").exists()
    assert not remove_stale_lock("postgresql://u@h/db")
