"""Scale-out and fault tolerance (issue 6): many workers on PostgreSQL, killed workers,
Ctrl-C, a database that goes away for a few seconds, exactly one MLflow run per trial.

The PostgreSQL tests use the ``postgres_url`` fixture (a fresh database on the server that
``.ci/run`` starts; they skip without one, except under ``CI=true``).  The studies run as
real ``crossflow`` processes, as a user would start them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from crossflow.search.workers import SURPLUS

QUICKSTART = "quickstart"


def crossflow(*args: str, cwd: Path, **kw) -> subprocess.Popen:
    """A ``crossflow`` process in its own session (signals reach only what we send)."""
    return subprocess.Popen([sys.executable, "-m", "crossflow", *map(str, args)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kw)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"crossflow did not finish in {timeout} s:\n{out[-3000:]}")
    return out


def load(storage: str, name: str = QUICKSTART):
    import optuna

    from crossflow.search.storage import make_storage

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna.load_study(study_name=name, storage=make_storage(storage))


def states(study) -> Counter:
    return Counter(t.state.name for t in study.get_trials(deepcopy=False))


def child_runs(cwd: Path, tracking_uri: str | None = None, name: str = QUICKSTART):
    """The active child (trial) runs of the study's experiment."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri or f"sqlite:///{cwd / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], max_results=50000)
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def assert_one_run_per_trial(study, runs) -> None:
    """Exactly one run per finished trial (COMPLETE, PRUNED, FAIL), none for surplus ones."""
    numbers = Counter(int(r.data.tags["trial_number"]) for r in runs)
    assert max(numbers.values(), default=1) == 1, \
        f"duplicate runs: {[n for n, k in numbers.items() if k > 1]}"
    expected = {t.number for t in study.get_trials(deepcopy=False)
                if t.state.is_finished() and not t.user_attrs.get(SURPLUS)}
    assert set(numbers) == expected


def assert_nothing_left_running(study) -> None:
    s = states(study)
    assert s.get("RUNNING", 0) == 0 and s.get("WAITING", 0) == 0, s
    for t in study.get_trials(deepcopy=False):
        if t.state.name == "FAIL":  # only a trial that found no slot, or a retried one
            retried = any(u.system_attrs.get("failed_trial") == t.number
                          for u in study.get_trials(deepcopy=False))
            assert t.user_attrs.get(SURPLUS) or retried, (t.number, t.user_attrs)


# --- PostgreSQL -----------------------------------------------------------------------------


def test_four_workers_finish_400_trials_exactly(postgres_url, tmp_path):
    proc = crossflow("study", "run", QUICKSTART, "--trials", 400, "--workers", 4,
                     "--storage", postgres_url, cwd=tmp_path)
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    study = load(postgres_url)
    assert states(study)["COMPLETE"] == 400
    assert_nothing_left_running(study)
    workers = Counter(t.user_attrs.get("worker") for t in study.trials
                      if t.state.name == "COMPLETE")
    assert len(workers) == 4 and min(workers.values()) >= 40, workers  # all four worked
    runs = child_runs(tmp_path)
    assert len(runs) == 400
    assert_one_run_per_trial(study, runs)
    r = runs[0]
    assert "iteration_time_s" in r.data.metrics and "logic_node" in r.data.params


def _worker_pids(coordinator: int) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "crossflow study worker"], capture_output=True,
                         text=True).stdout.split()
    pids = []
    for pid in map(int, out):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == coordinator:  # its parent
                pids.append(pid)
    return pids


def _running(storage: str) -> set[int]:
    return {t.number for t in load(storage).get_trials(deepcopy=False)
            if t.state.name == "RUNNING"}


def test_sigkilled_worker_trial_is_retried(postgres_url, tmp_path):
    total = 120
    proc = crossflow("study", "run", QUICKSTART, "--trials", total, "--workers", 3,
                     "--heartbeat", 1, "--storage", postgres_url, cwd=tmp_path)
    killed = None
    try:
        deadline = time.monotonic() + 120
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1.0)
            pids = _worker_pids(proc.pid)
            if len(pids) < 3 or states(load(postgres_url)).get("COMPLETE", 0) < 15:
                continue
            victim = pids[0]
            os.kill(victim, signal.SIGSTOP)  # freeze it, and see which trial stays RUNNING
            before = _running(postgres_url)
            time.sleep(1.5)
            stuck = before & _running(postgres_url)
            os.kill(victim, signal.SIGKILL)
            if stuck:
                killed = min(stuck)
        assert killed is not None, "no worker was caught in a trial"
        out = finish(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-3000:]
    assert "exited with status -9" in out  # the coordinator says so, and goes on
    study = load(postgres_url)
    trials = {t.number: t for t in study.trials}
    assert trials[killed].state.name == "FAIL"
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed]
    assert len(retries) == 1 and retries[0].state.name == "COMPLETE"
    assert retries[0].params == trials[killed].params  # the same design, evaluated
    assert states(study)["COMPLETE"] == total
    assert_nothing_left_running(study)
    assert_one_run_per_trial(study, child_runs(tmp_path))


def _best(storage: str) -> float:
    from crossflow.search.study import is_feasible

    return min(t.value for t in load(storage).trials
               if t.state.name == "COMPLETE" and is_feasible(t))


def test_gd_on_two_workers_matches_one_worker(postgres_server, tmp_path):
    """The gd sampler's chains, shared by 2 workers, reach the best value 1 worker reaches
    with the same budget, within the spread of that best over seeds."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    budget, seeds = 150, (0, 1, 2)
    best: dict[int, list[float]] = {1: [], 2: []}
    for workers in (1, 2):
        procs = []
        for seed in seeds:
            db = f"gd_{os.getpid()}_{workers}_{seed}"
            with psycopg.connect(postgres_server, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{db}"')
            url = urlunsplit(urlsplit(postgres_server)._replace(path=f"/{db}"))
            cwd = tmp_path / f"w{workers}s{seed}"
            cwd.mkdir()
            procs.append((url, crossflow("study", "run", QUICKSTART, "--sampler", "gd",
                                         "--seed", seed, "--trials", budget, "--workers",
                                         workers, "--no-tracking", "--quiet", "--storage",
                                         url, cwd=cwd)))
        for url, proc in procs:
            out = finish(proc, timeout=600)
            assert proc.returncode == 0, out[-3000:]
            study = load(url)
            assert states(study)["COMPLETE"] == budget
            assert_nothing_left_running(study)
            # no gd role was evaluated twice: (chain, step, role) unique among finished
            roles = Counter((t.system_attrs["gd:chain"], t.system_attrs["gd:step"],
                             t.system_attrs["gd:role"]) for t in study.trials
                            if t.state.name == "COMPLETE" and "gd:chain" in t.system_attrs)
            assert max(roles.values()) == 1, [r for r, k in roles.items() if k > 1]
            best[workers].append(_best(url))
    spread = max(max(b) - min(b) for b in best.values())
    m1, m2 = statistics.median(best[1]), statistics.median(best[2])
    assert abs(m2 - m1) <= spread + 1e-12, (best, spread)


def test_ctrl_c_stops_every_worker_cleanly_and_resumes(postgres_url, tmp_path):
    proc = crossflow("study", "run", QUICKSTART, "--trials", 100000, "--workers", 2,
                     "--storage", postgres_url, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(1.0)
        with contextlib.suppress(Exception):
            if states(load(postgres_url)).get("COMPLETE", 0) >= 20:
                break
    os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends the foreground process
    out = finish(proc, timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert "stopping the workers" in out and "Traceback" not in out
    study = load(postgres_url)
    assert_nothing_left_running(study)
    assert_one_run_per_trial(study, child_runs(tmp_path))
    done = states(study)["COMPLETE"]
    resumed = crossflow("study", "run", QUICKSTART, "--trials", done + 10, "--workers", 2,
                        "--storage", postgres_url, cwd=tmp_path)
    out = finish(resumed)
    assert resumed.returncode == 0, out[-3000:]
    study = load(postgres_url)
    assert states(study)["COMPLETE"] == done + 10
    assert_one_run_per_trial(study, child_runs(tmp_path))


class FlakyProxy:
    """A TCP proxy to the database that can drop every connection and refuse new ones for
    a while (a restarting server or a network blip)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener = self._listen(0)
        self.port = self.listener.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _listen(self, port: int) -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
        return s

    def _accept(self) -> None:
        while not self.stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                time.sleep(0.05)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def outage(self, seconds: float) -> None:
        """Drop every connection and refuse new ones for ``seconds``."""
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.sockets.clear()
        time.sleep(seconds)
        self.listener = self._listen(self.port)

    def close(self) -> None:
        self.stopped = True
        self.listener.close()


def test_database_away_for_seconds_does_not_kill_the_study(postgres_url, tmp_path):
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(postgres_url)
    proxy = FlakyProxy(parts.hostname, parts.port or 5432)
    try:
        url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
        total = 150
        proc = crossflow("study", "run", QUICKSTART, "--trials", total, "--workers", 2,
                         "--storage", url, cwd=tmp_path)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            with contextlib.suppress(Exception):
                if states(load(postgres_url)).get("COMPLETE", 0) >= 30:
                    break
        before = states(load(postgres_url)).get("COMPLETE", 0)
        assert before < total, "the study ended before the outage"
        proxy.outage(4.0)
        out = finish(proc)
    finally:
        proxy.close()
    assert proc.returncode == 0, out[-3000:]
    study = load(postgres_url)
    assert states(study)["COMPLETE"] == total
    assert_nothing_left_running(study)
    assert_one_run_per_trial(study, child_runs(tmp_path))
