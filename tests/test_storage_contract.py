"""Optuna's own storage contract (``optuna.testing.pytest_storages.StorageTestCase``) run on
the storages CrossFlow builds (:func:`crossflow.search.storage.make_storage`): the resilient
RDB storage on SQLite (and on PostgreSQL where ``CROSSFLOW_TEST_POSTGRES`` is set, see
tests/conftest.py), and the journal file.  The resilient storage holds a running trial's
parameters and user attributes back, serves the trials this process runs from its own copies
and shares close reads of a study; the contract checks that no caller in the process can
tell."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from optuna.storages import JournalStorage
from optuna.study import StudyDirection
from optuna.testing.pytest_storages import StorageTestCase
from optuna.trial import TrialState

from crossflow.search.rdb import resilient_rdb_storage_class
from crossflow.search.storage import make_storage


@pytest.fixture
def fast_dir(tmp_path):
    """A folder in memory where there is one (/dev/shm): the contract commits thousands of
    small transactions, each an fsync on disk (~90 s on a busy machine, ~20 s in memory)."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="crossflow-contract-") as folder:
        yield Path(folder)


@pytest.fixture(params=["sqlite", "journal", "postgresql"])
def storage(request, fast_dir):
    if request.param == "sqlite":
        url = f"sqlite:///{fast_dir}/contract.db"
    elif request.param == "postgresql":
        url = request.getfixturevalue("postgres_url")  # skips without CROSSFLOW_TEST_POSTGRES
    else:
        url = str(fast_dir / "contract.journal")
    backend = make_storage(url, reconnect_s=2.0)
    yield backend
    if hasattr(backend, "engine"):
        backend.remove_session()
        backend.engine.dispose()


class TestCrossflowStorages(StorageTestCase):
    """Every test of Optuna's contract, on each storage of the ``storage`` fixture."""


def test_the_contract_runs_on_crossflows_classes(tmp_path):
    """The fixture builds CrossFlow's resilient subclass and a journal storage (a change
    to make_storage that returned something else would leave the contract untested)."""
    rdb = make_storage(f"sqlite:///{tmp_path}/c.db")
    assert isinstance(rdb, resilient_rdb_storage_class())
    assert isinstance(make_storage(str(tmp_path / "c.journal")), JournalStorage)


def test_held_back_user_attributes_are_seen_and_written_on_finish(tmp_path):
    """A running trial's user attributes wait in the process (one write at the end), yet
    every reader sees them, and a second storage on the same database sees them once the
    trial has finished."""
    url = f"sqlite:///{tmp_path}/held.db"
    storage = make_storage(url)
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], study_name="held")
    trial_id = storage.create_new_trial(study_id)
    storage.set_trial_user_attr(trial_id, "a", 1)
    assert trial_id in storage._user_attrs  # held back, not written
    assert storage.get_trial(trial_id).user_attrs == {"a": 1}
    assert storage.get_all_trials(study_id)[0].user_attrs == {"a": 1}
    other = make_storage(url)
    assert other.get_trial(trial_id).user_attrs == {}
    storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [1.0])
    assert other.get_trial(trial_id).user_attrs == {"a": 1}
    assert storage._user_attrs == {}


def test_held_back_parameters_are_seen_and_written_with_the_next_write(tmp_path):
    """A running trial's parameters wait in the process (the first of each name is written
    at once: the database checks its distribution) until the trial's next write of another
    kind, which carries them in the same transaction; this process sees them throughout."""
    from optuna.distributions import FloatDistribution, IntDistribution

    url = f"sqlite:///{tmp_path}/params.db"
    storage = make_storage(url)
    other = make_storage(url)
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], study_name="params")
    x = FloatDistribution(0, 1)
    first = storage.create_new_trial(study_id)
    storage._set_trial_param(first, "x", 0.5, x, None)  # a name new to this process
    assert other.get_trial(first).params == {"x": 0.5}
    storage.set_trial_state_values(first, TrialState.COMPLETE, [1.0])
    trial_id = storage.create_new_trial(study_id)
    storage._set_trial_param(trial_id, "x", 0.25, x, x)  # as Optuna's cache calls it
    assert trial_id in storage._params
    assert other.get_trial(trial_id).params == {}
    assert storage.get_trial(trial_id).params == {"x": 0.25}
    assert storage.get_trial_params(trial_id) == {"x": 0.25}
    assert storage.get_trial_param(trial_id, "x") == 0.25
    assert [t.params for t in storage.get_all_trials(study_id)] == [{"x": 0.5}, {"x": 0.25}]
    storage.set_trial_system_attr(trial_id, "constraints", [0.0])
    assert other.get_trial(trial_id).params == {"x": 0.25}
    assert other.get_trial(trial_id).system_attrs == {"constraints": [0.0]}
    assert storage._params == {}
    with pytest.raises(ValueError):  # an incompatible distribution still raises at once
        storage._set_trial_param(trial_id, "y", 1, IntDistribution(0, 2), x)


def test_close_reads_share_one_query_until_this_process_writes(tmp_path, monkeypatch):
    """Reads of a study within SHARED_READ_S of one another share a query; a write of this
    process to another trial, a trial it starts or ends, and the budget's census
    (``fresh_reads``) make the next read ask the database."""
    import optuna

    from crossflow.search import rdb
    from crossflow.search.workers import census

    monkeypatch.setattr(rdb, "SHARED_READ_S", 3600.0)
    url = f"sqlite:///{tmp_path}/reads.db"
    storage = make_storage(url)
    other = make_storage(url)
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], study_name="reads")
    assert storage.get_all_trials(study_id) == []
    elsewhere = other.create_new_trial(study_id)
    assert storage.get_all_trials(study_id) == []  # the shared read
    mine = storage.create_new_trial(study_id)  # a trial this process starts
    assert [t._trial_id for t in storage.get_all_trials(study_id)] == [elsewhere, mine]
    other.set_trial_state_values(elsewhere, TrialState.COMPLETE, [1.0])
    assert storage.get_trial(elsewhere).state == TrialState.COMPLETE  # get_trial: no sharing
    assert storage.get_all_trials(study_id)[0].state == TrialState.RUNNING
    third = other.create_new_trial(study_id)
    storage.set_trial_user_attr(third, "seen", True)  # a write to another trial
    assert storage.get_all_trials(study_id)[0].state == TrialState.COMPLETE
    fourth = other.create_new_trial(study_id)
    study = optuna.load_study(study_name="reads", storage=storage)
    assert len(census(study, 10, heartbeats=True).live) == 4
    assert fourth in [t._trial_id for t in storage.get_all_trials(study_id)]


def test_a_reader_thread_and_the_trials_thread_do_not_collide(tmp_path):
    """The MLflow logger's thread reads the study while the trial's thread records into the
    process's copies of its running trials: neither sees a copy half-changed."""
    import threading

    from optuna.distributions import FloatDistribution

    storage = make_storage(f"sqlite:///{tmp_path}/threads.db")
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], study_name="threads")
    x = FloatDistribution(0, 1)
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                for trial in storage.get_all_trials(study_id):
                    storage.get_trial(trial._trial_id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(30):
            trial_id = storage.create_new_trial(study_id)
            for k in range(20):
                storage._set_trial_param(trial_id, f"p{k}", 0.5, x, x if n else None)
                storage.set_trial_user_attr(trial_id, f"u{k}", k)
            storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [float(n)])
    finally:
        done.set()
        reader.join()
    assert not errors, errors
    assert len(storage.get_all_trials(study_id)) == 30
    assert all(len(t.params) == 20 for t in storage.get_all_trials(study_id))


def _fill(storage, study_id: int) -> list[int]:
    """Trials of every kind of record, and values Optuna stores specially (±inf, NaN)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    ids = []
    for n, (state, values) in enumerate([(TrialState.COMPLETE, [0.5, float("inf")]),
                                         (TrialState.FAIL, None),
                                         (TrialState.COMPLETE, [float("-inf"), 2.0])]):
        trial_id = storage.create_new_trial(study_id)
        storage.set_trial_param(trial_id, "x", n / 4, FloatDistribution(0, 1))
        storage.set_trial_param(trial_id, "kind", n % 2, CategoricalDistribution(["a", "b"]))
        storage.set_trial_user_attr(trial_id, "worker", f"w{n}")
        storage.set_trial_user_attr(trial_id, "design", {"n": n, "units": [1, 2]})
        storage.set_trial_system_attr(trial_id, "constraints", [float(n) - 1])
        storage.set_trial_intermediate_value(trial_id, 0, float("nan"))
        storage.set_trial_intermediate_value(trial_id, 1, float(n))
        storage.set_trial_state_values(trial_id, state, values)
        ids.append(trial_id)
    ids.append(storage.create_new_trial(study_id))  # one still running
    return ids


def _same(a, b) -> bool:
    """Two FrozenTrials equal field by field (NaN equal to NaN)."""
    import math

    def norm(trial):
        return {k: v for k, v in vars(trial).items() if k != "intermediate_values"} | {
            "steps": {k: "nan" if math.isnan(v) else v
                      for k, v in trial.intermediate_values.items()}}

    return norm(a) == norm(b)


def test_what_this_process_reads_and_keeps_is_what_optuna_reads(fast_dir, request):
    """The resilient storage reads trials with its own SQL (and keeps a copy of each trial it
    finishes for Optuna's read right after): every field of every trial is what Optuna's own
    RDBStorage reads from the same database, on SQLite and PostgreSQL, local time included."""
    from optuna.storages import RDBStorage

    urls = [f"sqlite:///{fast_dir}/same.db"]
    if os.environ.get("CROSSFLOW_TEST_POSTGRES"):
        urls.append(request.getfixturevalue("postgres_url"))
    for url in urls:
        storage = make_storage(url)
        study_id = storage.create_new_study([StudyDirection.MINIMIZE] * 2, study_name="same")
        ids = _fill(storage, study_id)
        kept = [storage.get_trial(i) for i in ids]  # this process's copies of the last ones
        optuna_s = RDBStorage(url)
        theirs = optuna_s.get_all_trials(study_id)
        assert len(theirs) == 4
        assert all(_same(a, b) for a, b in zip(kept, theirs, strict=True))
        fresh = make_storage(url)  # a storage that did not write them: reads it all
        assert all(_same(a, b) for a, b in
                   zip(fresh.get_all_trials(study_id), theirs, strict=True))
        assert theirs[0].values == [0.5, float("inf")] and theirs[1].values is None
        storage.delete_study(study_id)
        optuna_s.engine.dispose()


def test_a_taken_trial_starts_at_the_local_time(tmp_path, monkeypatch):
    """An enqueued trial a worker takes up records its start as Optuna does (naive UTC in
    the database, local time when read), also where local time is not UTC."""
    import time
    from datetime import datetime

    from optuna.storages import RDBStorage

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        url = f"sqlite:///{tmp_path}/tz.db"
        storage = make_storage(url)
        study_id = storage.create_new_study([StudyDirection.MINIMIZE], study_name="tz")
        from optuna.trial import create_trial

        trial_id = storage.create_new_trial(study_id, create_trial(state=TrialState.WAITING))
        assert storage.set_trial_state_values(trial_id, TrialState.RUNNING)
        start = RDBStorage(url).get_trial(trial_id).datetime_start
        assert abs((datetime.now() - start).total_seconds()) < 60
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_heartbeats_are_one_row_per_trial(tmp_path):
    """A heartbeat is one statement that inserts the trial's row or moves its time on."""
    import sqlalchemy
    from optuna.storages._rdb import models

    storage = make_storage(f"sqlite:///{tmp_path}/beat.db", heartbeat_s=1)
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], study_name="beat")
    trial_id = storage.create_new_trial(study_id)
    beats = models.TrialHeartbeatModel.__table__
    for _ in range(3):
        storage.record_heartbeat(trial_id)
    with storage.engine.connect() as conn:
        rows = conn.execute(sqlalchemy.select(beats.c.trial_id, beats.c.heartbeat)).all()
    assert [r[0] for r in rows] == [trial_id] and rows[0][1] is not None
