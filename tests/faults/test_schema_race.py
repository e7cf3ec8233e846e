"""Issue 21, finding 9: first launches on a fresh database at the same instant.

Optuna's RDB storage creates its schema and stamps its version when the database has none;
two workers that open a fresh database together both do, and the second one's stamp (or, on
PostgreSQL, a type) violates a unique constraint.  Each process must open the storage all
the same (the schema the other one made)."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

WORKERS = 4


def _open(url: str, at: float) -> str:
    from crossflow.search.storage import make_storage

    while time.time() < at:  # every process opens at the same instant
        pass
    try:
        make_storage(url)
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the test reports whatever it is
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def _race(url: str) -> list[str]:
    import optuna  # noqa: F401
    import sqlalchemy  # noqa: F401

    import crossflow.search.storage  # noqa: F401 - imported before the fork, not in the race

    at = time.time() + 0.5
    with mp.get_context("fork").Pool(WORKERS) as pool:
        return pool.starmap(_open, [(url, at)] * WORKERS)


def test_workers_opening_a_fresh_sqlite_database_together_all_open_it(tmp_path):
    # without the retry, 4 of 10 such races failed (UNIQUE constraint failed:
    # alembic_version.version_num): eight all passing by chance is about 2 %
    for k in range(8):
        results = _race(f"sqlite:///{tmp_path}/studies-{k}.db")
        assert results == ["ok"] * WORKERS, (k, results)


def test_only_a_lost_schema_race_is_retried():
    import sqlalchemy.exc as sa

    from crossflow.search.rdb import _first_open

    calls = []

    def lost_once():
        calls.append(1)
        if len(calls) == 1:
            raise sa.IntegrityError("INSERT INTO alembic_version", {},
                                    Exception("UNIQUE constraint failed: alembic_version"))

    _first_open(lost_once)
    assert len(calls) == 2

    def other_violation():
        raise sa.IntegrityError("INSERT INTO studies", {}, Exception("NOT NULL constraint"))

    with pytest.raises(sa.IntegrityError):
        _first_open(other_violation)


def test_workers_opening_a_fresh_postgres_database_together_all_open_it(postgres_url):
    results = _race(postgres_url)
    assert results == ["ok"] * WORKERS, results


# --- the enqueued trials of a fresh study, taken by first launches together -----------------
# Optuna takes a WAITING trial (an enqueued baseline, a dead worker's retry) by reading its
# state, then writing RUNNING, under SELECT ... FOR UPDATE, which SQLite ignores: two workers
# both took one, both ran it, and the second to finish printed "ValueError: Cannot tell a
# COMPLETE trial" and stopped (issue 21, finding 9).


def _take_all(url: str, name: str, at: float) -> list[int]:
    import optuna

    from crossflow.search.storage import make_storage

    study = optuna.load_study(study_name=name, storage=make_storage(url))
    taken = []
    while time.time() < at:
        pass
    while (trial_id := study._pop_waiting_trial_id()) is not None:
        taken.append(trial_id)
    return taken


def test_workers_taking_enqueued_trials_together_take_each_once(tmp_path):
    import optuna

    from crossflow.search.storage import make_storage

    url = f"sqlite:///{tmp_path}/q.db"
    for k in range(3):
        study = optuna.create_study(study_name=f"q{k}", storage=make_storage(url))
        for i in range(100):
            study.enqueue_trial({"x": i})
        at = time.time() + 1.0
        with mp.get_context("fork").Pool(WORKERS) as pool:
            taken = pool.starmap(_take_all, [(url, f"q{k}", at)] * WORKERS)
        ids = sorted(i for got in taken for i in got)
        assert ids == sorted(t._trial_id for t in study.get_trials()), (k, len(ids))


def _launch(url: str, at: float, seed: int) -> str:
    from crossflow.search.study import load_study, run_study

    setup = load_study("quickstart")
    while time.time() < at:
        pass
    try:
        return run_study(setup, n_trials=LAUNCH_TRIALS, storage=url, seed=seed, track=False,
                         progress=False).trials_run
    except Exception as exc:  # noqa: BLE001 - the test reports whatever it is
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


LAUNCH_TRIALS = 12


def _launch_race(url: str) -> None:
    """WORKERS first launches of one study on a fresh storage at the same instant: each
    ends normally, together they finish exactly the budget, each trial run once."""
    import optuna
    from optuna.trial import TrialState

    import crossflow.search.storage  # noqa: F401 - imported before the fork
    from crossflow.search.keys import SURPLUS
    from crossflow.search.study import load_study

    at = time.time() + 1.0
    with mp.get_context("fork").Pool(WORKERS) as pool:
        ran = pool.starmap(_launch, [(url, at, seed) for seed in range(WORKERS)])
    assert all(isinstance(r, int) for r in ran), ran
    trials = optuna.load_study(study_name="quickstart", storage=url).trials
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert sum(ran) == len(complete) == LAUNCH_TRIALS, (ran, len(complete))
    # the baselines enqueued once, by the launch that created the study: each launch that
    # saw no trials used to enqueue them, and a copy made after the budget was taken
    # stayed WAITING
    baselines = [t.params for t in trials if t.user_attrs.get("baseline")]
    assert len(baselines) == len(load_study("quickstart").baseline_trials()), baselines
    stray = [(t.number, t.state.name, t.user_attrs, t.system_attrs) for t in trials
             if not (t.state == TrialState.COMPLETE or t.user_attrs.get(SURPLUS))]
    assert not stray, (ran, stray)  # which state a stray trial was left in, when a race fails


def test_first_launches_on_a_fresh_sqlite_database_run_each_trial_once(tmp_path):
    # before: 1 race in 5 printed "Cannot tell a COMPLETE trial" from a worker
    for k in range(4):
        _launch_race(f"sqlite:///{tmp_path}/studies-{k}.db")


def test_first_launches_on_a_fresh_postgres_database_run_each_trial_once(postgres_url):
    _launch_race(postgres_url)


def test_a_trial_finished_by_another_process_is_skipped_not_told_again(tmp_path):
    """Whatever the way a trial this worker runs gets finished elsewhere (the same trial run
    twice, or failed as stale and retried by another worker), Optuna refuses to tell it
    again ("Cannot tell a COMPLETE trial"): the worker drops its result and goes on."""
    import optuna
    from optuna.trial import TrialState

    from crossflow.search.storage import make_storage
    from crossflow.search.workers import GracefulStop, work

    study = optuna.create_study(storage=make_storage(f"sqlite:///{tmp_path}/q.db"))

    def objective(trial):
        if trial.number == 1:  # another process finishes it meanwhile, with its own value
            study._storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [0.5])
        return float(trial.number)

    with GracefulStop() as stop:
        work(study, objective, 4, callbacks=[], stop=stop, heartbeats=True)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert [t.value for t in trials] == [0.0, 0.5, 2.0, 3.0]


def test_only_the_open_that_creates_a_study_calls_on_create(tmp_path):
    from crossflow.search.study import load_study
    from crossflow.search.study.setup import open_study

    setup, made = load_study("quickstart"), []
    for _ in range(2):
        open_study(setup, str(tmp_path / "q.journal"), on_create=made.append)
    assert len(made) == 1 and made[0].study_name == "quickstart"
