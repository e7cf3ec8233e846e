"""A tracking server that refuses connections or accepts them and never answers: nothing
hangs and nothing is left behind.  A launch refuses it at start within the check's bound
(exit 2); a tracker used through the API (no start check) ends within the bounds of the HTTP
client and of the end-of-launch drain, says how many trials lack a run, and its logging
process is gone."""

from __future__ import annotations

import socket
import time

import optuna
import pytest

from crossflow.search.children import group_members
from crossflow.search.tracking import check
from crossflow.search.tracking import tracker as tracker_mod
from crossflow.search.tracking.tracker import StudyTracker

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def silent_port():
    """Accepts connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_a_launch_on_an_unusable_server_ends_at_once_with_nothing_left(kind, tmp_path,
                                                                       silent_port,
                                                                       cli_process):
    port = _closed_port() if kind == "refused" else silent_port
    t0 = time.monotonic()
    code, out, err, pid = cli_process("study", "run", "quickstart", "--trials", "3",
                                      "--quiet", "--tracking-uri", f"http://127.0.0.1:{port}",
                                      cwd=tmp_path)
    took = time.monotonic() - t0
    assert code == 2, (out, err)
    assert err.startswith("crossflow: error: ") and "Traceback" not in err, err
    assert err.strip().count("\n") == 0 and "--tracking-uri" in err, err
    assert took < check.CHECK_S + 60, took  # the check's bound, plus Python's start-up
    assert group_members(pid) == []  # no logger, no worker left
    assert not (tmp_path / "mlruns").exists()  # nothing created


def _toy(trial: optuna.Trial) -> float:
    return trial.suggest_float("x", 0.0, 1.0) ** 2


def _track(uri: str, n: int = 3) -> tuple[StudyTracker, float]:
    study = optuna.create_study(study_name="toy", sampler=optuna.samplers.RandomSampler(0))
    t0 = time.monotonic()
    with StudyTracker("toy", uri, {"sampler": "random"}, {}) as tracker:
        study.optimize(_toy, n_trials=n, callbacks=[tracker])
    return tracker, time.monotonic() - t0


def _gone(tracker: StudyTracker) -> None:
    assert tracker._proc is not None and tracker._proc.poll() is not None
    deadline = time.monotonic() + 10
    while group_members(tracker._proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(tracker._proc.pid) == []


def test_the_http_bounds_end_the_logging_of_a_silent_server(silent_port, monkeypatch,
                                                            capsys):
    """Each request is bounded (here 1 s, no retry): the tracker ends long before its drain
    bound, counts every trial as missing and leaves no process."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    tracker, took = _track(f"http://127.0.0.1:{silent_port}")
    err = capsys.readouterr().err
    assert took < 60, took
    assert tracker.missing_runs == [0, 1, 2], tracker.stats
    assert "3 of 3 finished trials have no MLflow run" in err and "Traceback" not in err
    assert not tracker.stats.get("drain_timeout")
    _gone(tracker)


def test_the_drain_bound_stops_a_logger_that_waits_on_a_server(silent_port, monkeypatch,
                                                               capsys):
    """A logger stuck on a server past :data:`DRAIN_S`: stopped (its whole group), a clear
    error, every trial counted missing — within DRAIN_S plus the stop's grace."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
    monkeypatch.setattr(tracker_mod, "DRAIN_S", 3.0)
    tracker, took = _track(f"http://127.0.0.1:{silent_port}")
    err = capsys.readouterr().err
    assert took < 3.0 + 5.0 + 15, took
    assert tracker.stats.get("drain_timeout") is True
    assert "MLflow logging did not finish within 3 s" in err, err
    assert tracker.missing_runs == [0, 1, 2]
    assert "3 of 3 finished trials have no MLflow run known to have been logged" in err, err
    _gone(tracker)
