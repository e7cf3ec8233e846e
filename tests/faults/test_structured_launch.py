"""The ``structured`` driver under faults, as a user runs it (issue 18, item 4): one worker
of ``study run --sampler structured --workers 2`` killed with SIGKILL does not freeze the
other (the launch finishes its total within a bounded time, the dead worker's trial is
failed and run again, and what the launcher says about it is true); Ctrl-C stops a
single-process launch within seconds with exit status 130 (README, Fault tolerance), and
the same command again resumes it to its total."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from test_signals import _alive, _children, _wait  # tests/faults/test_signals.py

from crossflow.search.samplers.structured._sampler import POINT, SLOT
from crossflow.search.study import load_study, open_study
from crossflow.search.workers import SURPLUS, WORKER, child_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _command(journal, total: int, *more: str) -> list[str]:
    return [sys.executable, "-m", "crossflow", "study", "run", "quickstart", "--sampler",
            "structured", "--trials", str(total), "--storage", str(journal), "--no-tracking",
            "--quiet", *more]


def _start(cmd, cwd) -> subprocess.Popen:
    # its own session, as a terminal's foreground job: a signal to its group reaches it
    # (and not pytest); ``study run --workers`` starts its workers in sessions of their own
    return subprocess.Popen(cmd, cwd=cwd, env=child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _trials(journal):
    study = open_study(load_study("quickstart"), str(journal), create=False)
    return study.get_trials(deepcopy=False)


def _count(journal, state: str = "COMPLETE") -> int:
    if not journal.is_file():
        return 0
    return sum(t.state.name == state for t in _trials(journal))


def _running_on(journal, worker: str) -> list[int]:
    return [t.number for t in _trials(journal)
            if t.state.name == "RUNNING" and t.user_attrs.get(WORKER) == worker]


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"still running after {timeout} s; stderr ends:\n{err[-2000:]}")


def test_a_killed_worker_does_not_freeze_a_structured_launch(tmp_path):
    total = 300
    journal = tmp_path / "q.journal"
    launcher = _start(_command(journal, total, "--workers", "2"), tmp_path)
    workers: list[int] = []
    try:
        workers = _wait(lambda: (w if len(w := _children(launcher.pid)) == 2 else []), 90)
        assert len(workers) == 2, launcher.poll()
        assert _wait(lambda: _count(journal) >= 20, 90), "no trials within 90 s"
        victim = workers[0]
        name = f"{socket.gethostname()}:{victim}"
        _wait(lambda: _running_on(journal, name), 10, step=0.01)  # in a trial, mostly
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        out, err = _finish(launcher, 240)
        after_kill = time.monotonic() - killed
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    # bounded: the survivor ran the rest at once, with no wait for the dead one (the freeze
    # this guards against waited 600 s).  The rest takes ~10 s on an idle 2-core VM and was
    # seen at 95 s on one loaded by two other jobs, so the bound leaves room for load.
    assert after_kill < 180, after_kill
    trials = _trials(journal)
    states = [t.state.name for t in trials]
    assert states.count("COMPLETE") == total
    assert "RUNNING" not in states and "WAITING" not in states
    # what the dead worker left: failed by the survivor and run again, the point kept
    left = [t for t in trials if t.user_attrs.get(WORKER) == name
            and t.state.name == "FAIL" and not t.user_attrs.get(SURPLUS)]
    assert len(left) <= 1
    again = {t.system_attrs.get("failed_trial"): t for t in trials
             if t.system_attrs.get("failed_trial") is not None}
    for t in left:
        retry = again[t.number]
        assert retry.state.name == "COMPLETE"
        # killed after the driver wrote its point and then its slot: the retry keeps both
        # (killed between the two writes, the retry is planned afresh: test_structured.py)
        if SLOT in t.system_attrs:
            assert retry.system_attrs.get(SLOT) == t.system_attrs[SLOT]
            assert retry.params == t.system_attrs[POINT]
    # the launcher's warning names the worker and says what happened to its trial
    lines = [line for line in err.splitlines() if f"(pid {victim})" in line]
    assert len(lines) == 1, err[-3000:]
    line = lines[0]
    assert "exited with status -9" in line
    if left:
        assert f"#{left[0].number}" in line and "run again" in line, line
    else:
        assert "no trial in progress" in line and "run again" not in line, line
    log = re.search(r"\(log: ([^)]+)\)", line)
    if log and os.path.isfile(log.group(1)):
        os.unlink(log.group(1))                   # (kept for the user: a worker failed)


def test_ctrl_c_stops_a_structured_launch_within_seconds_and_it_resumes(tmp_path):
    total = 200
    journal = tmp_path / "q.journal"
    cmd = _command(journal, total)
    proc = _start(cmd, tmp_path)
    try:
        assert _wait(lambda: _count(journal) >= 10, 90), "no trials within 90 s"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the job's group
        t0 = time.monotonic()
        out, err = _finish(proc, 15)
        stopped_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert stopped_in < 5, stopped_in
    assert "Traceback" not in err
    # the command to resume is the one that ran (the file's sampler is tpe, and its
    # storage another file)
    assert (f"run 'crossflow study run quickstart --sampler structured --trials {total} "
            f"--storage {journal}' again to resume") in err
    stopped = _count(journal)
    assert 10 <= stopped < total
    assert _count(journal, "RUNNING") == 0         # the trial in progress was finished
    again = subprocess.run(cmd, cwd=tmp_path, env=child_env(), capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{total - stopped} trials run" in again.stdout, again.stdout
    states = [t.state.name for t in _trials(journal)]
    assert states.count("COMPLETE") == total and set(states) == {"COMPLETE"}
