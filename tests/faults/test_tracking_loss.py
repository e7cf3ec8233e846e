"""The tracking store fails in the middle of a study: a lost connection that comes back is
retried (nothing missing, exit 0); a store that stays gone costs no finished trial (they are
in the study's storage), the end of the launch says how many trials lack an MLflow run and
the command exits 1; the next launch back-fills them, each exactly once.

The logger runs in a thread here (the launch's fallback when its process cannot start), so
that the fault can be injected into MLflow's store by patching."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import sqlalchemy.exc

from crossflow import cli
from crossflow.search import storage as storage_mod
from crossflow.search.tracking import logger, store
from crossflow.search.tracking.tracker import StudyTracker

pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")
N = 4


def _lost() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError(
        "INSERT INTO runs", None, Exception("server closed the connection unexpectedly"))


@pytest.fixture
def in_thread(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(StudyTracker, "_start_process", lambda self: False)
    return tmp_path


def _launch(tmp_path, capsys) -> tuple[int, str]:
    code = cli.main(["study", "run", "quickstart", "--trials", str(N), "--quiet",
                     "--storage", str(tmp_path / "q.journal")])
    return code, capsys.readouterr().err


def _runs(tmp_path) -> Counter:
    """trial number -> its runs in the study's experiment."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("quickstart")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.trial_number != ''")
    return Counter(int(r.data.tags["trial_number"]) for r in runs)


def _finished(tmp_path) -> list[int]:
    from crossflow.search import load_study, open_study
    from crossflow.search.tracking.records import _finished as finished

    study = open_study(load_study("quickstart"), str(tmp_path / "q.journal"), create=False)
    return [t.number for t in finished(study)]


def test_a_lost_connection_that_comes_back_loses_no_run(in_thread, capsys, monkeypatch):
    real = store.insert_runs
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 2:  # the database restarts: two attempts fail
            raise _lost()
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "insert_runs", flaky)
    retries = storage_mod.RECONNECTS["retries"]
    code, err = _launch(in_thread, capsys)
    assert code == 0, err
    assert storage_mod.RECONNECTS["retries"] >= retries + 2
    assert "no MLflow run" not in err
    assert _runs(in_thread) == Counter(_finished(in_thread))  # each finished trial once


def test_a_store_that_stays_gone_is_counted_then_back_filled(in_thread, capsys, monkeypatch):
    def gone(*args, **kwargs):
        raise _lost()

    monkeypatch.setattr(logger, "RECONNECT_S", 0.5)
    monkeypatch.setattr(store, "insert_runs", gone)
    monkeypatch.setattr(logger._Logger, "_create_run", gone)
    code, err = _launch(in_thread, capsys)
    finished = _finished(in_thread)
    assert len(finished) == N  # nothing finished is lost: the trials are in the storage
    assert code == 1, err
    lines = [line for line in err.splitlines() if "no MLflow run" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    match = re.search(r"(\d+) of (\d+) finished trials have no MLflow run", lines[0])
    assert match and (int(match[1]), int(match[2])) == (N, N), lines[0]
    assert "next launched" in lines[0]
    assert sum(_runs(in_thread).values()) == 0

    monkeypatch.undo()  # the store is back; the next launch back-fills
    monkeypatch.chdir(in_thread)
    monkeypatch.setattr(StudyTracker, "_start_process", lambda self: False)
    code, err = _launch(in_thread, capsys)
    assert code == 0, err
    assert "no MLflow run" not in err
    assert _runs(in_thread) == Counter(finished)


def test_the_logger_gives_up_after_failures_in_a_row():
    """Once the store is gone, each trial run does not wait the bounds out again: after
    GIVE_UP_AFTER failures in a row the rest are not tried (and are counted missing)."""
    log = logger._Logger()
    log.client, log.parent_run_id, log.bulk = object(), "p", False
    tried = []

    def gone(rec):
        tried.append(rec["number"])
        raise _lost()

    log._create_run = gone
    log.reconnect_s = 0.0
    recs = [{"op": "trial", "record": {"number": i, "start_ms": i, "tags": {}}}
            for i in range(10)]
    log._op_trials(recs)
    assert tried == list(range(logger.GIVE_UP_AFTER))
    assert log.given_up == 10 - logger.GIVE_UP_AFTER and log.logged == 0
    assert log.stats()["trials_with_runs"] == []
