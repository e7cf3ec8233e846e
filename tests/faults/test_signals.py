"""A signal to ``study run --workers 2`` takes its workers with it: SIGTERM (the launcher
stops them and exits) and SIGKILL (no handler runs: the kernel's parent-death signal stops
them).  Within seconds no worker is left, every finished trial is in the journal, and a
re-run resumes the study to its total."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crossflow.search.study import load_study, open_study
from crossflow.search.workers import child_env


def _children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            out.append(int(name))
    return out


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _workers(pid: int) -> list[int]:
    """Children of ``pid`` that have become workers: a child just forked shows its
    parent's command line until it executes its own."""
    return [c for c in _children(pid) if b"worker" in _argv(c)]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] not in ("Z", "X")


def _complete(journal: Path) -> int:
    study = open_study(load_study("quickstart"), str(journal), create=False)
    return sum(t.state.name == "COMPLETE" for t in study.get_trials(deepcopy=False))


def _wait(what, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(step)
    return what()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_signal_to_the_launcher_takes_its_workers(sig, tmp_path):
    journal = tmp_path / "q.journal"
    env = child_env()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "crossflow", "study", "run", "quickstart", "--workers", "2",
         "--trials", "100000", "--storage", str(journal), "--no-tracking", "--quiet"],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        workers = _wait(lambda: (w if len(w := _workers(launcher.pid)) == 2 else []), 90)
        assert len(workers) == 2, (launcher.poll(), [_argv(c) for c in
                                                     _children(launcher.pid)])
        for pid in workers:  # the storage is not on their command line (issue 13, secrets)
            argv = _argv(pid)
            assert b"study" in argv and b"worker" in argv
            assert not any(str(journal).encode() in a for a in argv), argv
        assert _wait(lambda: journal.is_file() and _complete(journal) >= 5, 90)
        launcher.send_signal(sig)
        launcher.wait(timeout=15)
        gone = _wait(lambda: not any(_alive(p) for p in workers), 10)
        assert gone, [p for p in workers if _alive(p)]
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
        out, err = launcher.communicate()
    if sig == signal.SIGTERM:
        assert launcher.returncode == 130, err
        assert b"SIGTERM: stopping the workers" in err and b"Traceback" not in err
    finished = _complete(journal)
    assert finished >= 5
    total = finished + 4
    done = subprocess.run(
        [sys.executable, "-m", "crossflow", "study", "run", "quickstart", "--trials",
         str(total), "--storage", str(journal), "--no-tracking", "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _complete(journal) == total


def test_an_error_in_the_launcher_stops_its_workers(tmp_path):
    """A crash of the supervising loop (here: its progress tick raises) does not leave the
    workers running: they and what they started (their process groups) are stopped."""
    from crossflow.search.workers import WorkerProcess, supervise

    procs = []
    for i in range(2):
        # a worker that starts a process of its own, in its session
        proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; wait"],
                                start_new_session=True)
        procs.append(WorkerProcess(i, proc, tmp_path / f"w{i}.log"))

    def tick():
        raise RuntimeError("the launcher crashed")

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="crashed"):
        supervise(procs, tick=tick, interval_s=0.1)
    assert time.monotonic() - t0 < 10
    for w in procs:
        assert w.proc.poll() is not None
        assert _wait(lambda w=w: not _group_alive(w.proc.pid), 5)


def _group_alive(pgid: int) -> bool:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
    return False
