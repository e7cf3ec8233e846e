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
# MLflow's own SQLAlchemy models trigger this when its store is first used
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*:DeprecationWarning")


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


def wait_for_complete(storage: str, n: int, proc: subprocess.Popen,
                      timeout: float = 120) -> int:
    """Wait until the study has ``n`` COMPLETE trials (or ``proc`` ended); returns the count."""
    deadline = time.monotonic() + timeout
    done = 0
    while time.monotonic() < deadline and proc.poll() is None and done < n:
        time.sleep(0.5)
        with contextlib.suppress(Exception):  # (the study may not be created yet)
            done = states(load(storage)).get("COMPLETE", 0)
    return done


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
    # TPE, whose trials include infeasible designs (the driver makes no trial of a split
    # that builds no chip): both kinds must be logged
    proc = crossflow("study", "run", QUICKSTART, "--trials", 400, "--workers", 4,
                     "--storage", postgres_url, "--sampler", "tpe", cwd=tmp_path)
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    study = load(postgres_url)
    assert states(study)["COMPLETE"] == 400
    assert_nothing_left_running(study)
    workers = Counter(t.user_attrs.get("worker") for t in study.trials
                      if t.state.name == "COMPLETE")
    assert len(workers) == 4 and min(workers.values()) >= 10, workers  # all four worked
    runs = child_runs(tmp_path)
    assert len(runs) == 400
    assert_one_run_per_trial(study, runs)
    assert all("logic_node" in r.data.params for r in runs)
    feasible = {r.data.tags["feasible"] == "true" for r in runs}
    assert all(("iteration_time_s" if r.data.tags["feasible"] == "true"
                else "penalty.iteration_time_s") in r.data.metrics for r in runs)
    assert feasible == {True, False}  # both kinds were logged


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


def _caught_in_a_trial(victim: int, storage: str) -> int | None:
    """Freeze ``victim`` (SIGSTOP) and return its running trial (user attribute ``worker``,
    written as the trial starts); None, and the victim resumed, if it is between trials or
    already gone (a worker leaves once the study has its trials: on a loaded machine that
    can come between listing it and stopping it)."""
    try:
        os.kill(victim, signal.SIGSTOP)
    except ProcessLookupError:
        return None
    mine = f"{socket.gethostname()}:{victim}"
    running = [t.number for t in load(storage).get_trials(deepcopy=False)
               if t.state.name == "RUNNING" and t.user_attrs.get("worker") == mine]
    if running:
        return running[0]
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim, signal.SIGCONT)
    return None


def test_sigkilled_worker_trial_is_retried(postgres_url, tmp_path):
    # enough trials that the three workers run together for a while: with ~60 trials/s on
    # PostgreSQL, 120 were over before a worker was caught mid-trial on a loaded machine
    total = 400
    proc = crossflow("study", "run", QUICKSTART, "--trials", total, "--workers", 3,
                     "--heartbeat", 2, "--storage", postgres_url, cwd=tmp_path)
    killed = None
    try:
        deadline = time.monotonic() + 120
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            pids = _worker_pids(proc.pid)
            if len(pids) < 3 or states(load(postgres_url)).get("COMPLETE", 0) < 15:
                continue
            # a quickstart trial takes milliseconds: each worker in turn is a chance to
            # catch one mid-trial before the study has its trials
            for pid in pids:
                killed = _caught_in_a_trial(pid, postgres_url)
                if killed is not None:
                    os.kill(pid, signal.SIGKILL)
                    break
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
    # the same design, evaluated (a trial killed before its first suggestion has none)
    assert trials[killed].params.items() <= retries[0].params.items()
    assert states(study)["COMPLETE"] == total
    assert_nothing_left_running(study)
    assert_one_run_per_trial(study, child_runs(tmp_path))


def _best(storage: str, name: str = QUICKSTART) -> float:
    from crossflow.search.study import is_feasible

    return min(t.value for t in load(storage, name).trials
               if t.state.name == "COMPLETE" and is_feasible(t))


#: quickstart's search by the gd sampler alone: without the baseline trials (the
#: template's design under each logic node) gd's own chains must find the best design.
GD_STUDY = """\
kind: study
name: gd-scaleout
description: quickstart's search space by the gd sampler alone
workload: gemm-8192
hardware: deepflow-case-study
search_space: quickstart
objectives: [iteration_time_s]
sampler: gd-paper
seed: 0
n_trials: 150
baseline: false
"""


def test_gd_on_two_workers_matches_one_worker(postgres_server, tmp_path):
    """The gd sampler's chains, shared by 2 workers, reach the best value 1 worker reaches
    with the same budget, within the spread of that best over seeds."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    study_file = tmp_path / "gd-scaleout.yaml"
    study_file.write_text(GD_STUDY)
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
            procs.append((url, crossflow("study", "run", study_file, "--seed", seed,
                                         "--trials", budget, "--workers", workers,
                                         "--no-tracking", "--quiet", "--storage", url,
                                         cwd=cwd)))
        for url, proc in procs:
            out = finish(proc, timeout=600)
            assert proc.returncode == 0, out[-3000:]
            study = load(url, "gd-scaleout")
            assert states(study)["COMPLETE"] == budget
            assert_nothing_left_running(study)
            # no gd role was evaluated twice: (chain, step, role) unique among finished
            roles = Counter((t.system_attrs["gd:chain"], t.system_attrs["gd:step"],
                             t.system_attrs["gd:role"]) for t in study.trials
                            if t.state.name == "COMPLETE" and "gd:chain" in t.system_attrs)
            assert roles and max(roles.values()) == 1, \
                [r for r, k in roles.items() if k > 1]
            best[workers].append(_best(url, "gd-scaleout"))
    print(f"gd best over seeds {seeds}: 1 worker {best[1]}, 2 workers {best[2]}")
    assert len(set(best[1])) > 1, "the seeds should lead gd to different designs"
    spread = max(max(b) - min(b) for b in best.values())
    m1, m2 = statistics.median(best[1]), statistics.median(best[2])
    assert abs(m2 - m1) <= spread, (best, spread)


def test_ctrl_c_stops_every_worker_cleanly_and_resumes(postgres_url, tmp_path):
    proc = crossflow("study", "run", QUICKSTART, "--trials", 100000, "--workers", 2,
                     "--storage", postgres_url, cwd=tmp_path)
    assert wait_for_complete(postgres_url, 20, proc) >= 20
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
        assert wait_for_complete(postgres_url, 30, proc) < total, \
            "the study ended before the outage"
        proxy.outage(4.0)
        out = finish(proc)
    finally:
        proxy.close()
    assert proc.returncode == 0, out[-3000:]
    study = load(postgres_url)
    assert states(study)["COMPLETE"] == total
    assert_nothing_left_running(study)
    assert_one_run_per_trial(study, child_runs(tmp_path))


# --- without PostgreSQL: journal files, the pieces -------------------------------------------


def test_two_workers_on_the_journal_file_finish_exactly(tmp_path):
    proc = crossflow("study", "run", QUICKSTART, "--trials", 60, "--workers", 2, cwd=tmp_path)
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "(2 workers)" in out
    storage = str(tmp_path / "mlruns" / "optuna" / f"{QUICKSTART}.journal")
    study = load(storage)
    assert states(study)["COMPLETE"] == 60
    assert_nothing_left_running(study)
    assert len({t.user_attrs["worker"] for t in study.trials}) == 2
    assert_one_run_per_trial(study, child_runs(tmp_path))


def test_a_dead_local_workers_trial_on_a_journal_is_failed_and_retried(tmp_path):
    import optuna

    from crossflow.search.storage import make_storage
    from crossflow.search.workers import WORKER, census, fail_orphans

    study = optuna.create_study(study_name="s", storage=make_storage(str(tmp_path / "s.log")))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr(WORKER, f"{socket.gethostname()}:{dead.pid}")
    alive = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    alive.set_user_attr(WORKER, f"{socket.gethostname()}:{os.getpid()}")
    assert census(study, 5, heartbeats=False).free == 3
    assert fail_orphans(study) == [trial.number]
    assert fail_orphans(study) == []  # once
    by_number = {t.number: t for t in study.trials}
    assert by_number[trial.number].state.name == "FAIL"
    assert by_number[alive.number].state.name == "RUNNING"
    retry = [t for t in study.trials if t.system_attrs.get("failed_trial") == trial.number]
    assert len(retry) == 1 and retry[0].state.name == "WAITING"
    assert retry[0].params == by_number[trial.number].params
    c = census(study, 2, heartbeats=False)
    assert c.free == 1 and c.waiting_in_budget == 1  # the retry holds a slot


def test_a_trial_no_worker_claimed_is_failed_after_a_while(tmp_path, monkeypatch):
    """A worker killed between Optuna creating its trial and the objective recording the
    worker leaves a RUNNING trial nobody owns: it is failed and retried once it is older
    than UNCLAIMED_RUNNING (else a resume would wait for it for STALE_RUNNING)."""
    from datetime import timedelta

    import optuna

    from crossflow.search import workers
    from crossflow.search.storage import make_storage

    study = optuna.create_study(study_name="s", storage=make_storage(str(tmp_path / "s.log")))
    orphan = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    assert workers.fail_orphans(study) == []  # just created: its worker may be proposing
    monkeypatch.setattr(workers, "UNCLAIMED_RUNNING", timedelta(0))
    assert workers.fail_orphans(study) == [orphan.number]
    retry = [t for t in study.trials if t.system_attrs.get("failed_trial") == orphan.number]
    assert len(retry) == 1 and retry[0].state.name == "WAITING"


def test_budget_slots_and_surplus(tmp_path):
    """Trial numbers settle a race for the last slots: a trial beyond them is surplus."""
    import optuna

    from crossflow.search.workers import SURPLUS, Budgeted, Surplus

    study = optuna.create_study()
    for _ in range(3):
        study.ask()  # three trials running elsewhere
    budgeted = Budgeted(lambda trial: 1.0, total=3, heartbeats=True)
    trial = study.ask()
    with pytest.raises(Surplus):
        budgeted(trial)
    assert study.trials[-1].user_attrs[SURPLUS] is True
    budgeted = Budgeted(lambda trial: 1.0, total=5, heartbeats=True)
    assert budgeted(study.ask()) == 1.0  # trials 0-2 and 4 are live: trial 4 holds a slot


@pytest.mark.parametrize("args, key", [
    (("study", "run", QUICKSTART, "--workers", 0), "--workers"),
    (("study", "run", QUICKSTART, "--heartbeat", 0), "--heartbeat"),
    (("study", "worker", QUICKSTART, "--storage", "nowhere/x.journal"), "storage"),
])
def test_bad_worker_arguments_are_errors(cli, tmp_path, monkeypatch, args, key):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(*args)
    assert code == 2 and key in err and "Traceback" not in err


def test_joining_an_unknown_launch_is_an_error(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli("study", "run", QUICKSTART, "--trials", 3, "--no-tracking", "--quiet")[0] == 0
    storage = str(tmp_path / "mlruns" / "optuna" / f"{QUICKSTART}.journal")
    code, _, err = cli("study", "worker", QUICKSTART, "--storage", storage,
                       "--launch", "launch.9999.nothere", "--no-tracking")
    assert code == 2 and "--launch" in err and "launch.0000." in err
    # joining the latest launch when the budget is done: nothing to run
    code, out, _ = cli("study", "worker", QUICKSTART, "--storage", storage, "--no-tracking",
                       "--quiet")
    assert code == 0 and "ran 0 trials" in out


def test_worker_seeds():
    from crossflow.search.study import worker_seed

    assert worker_seed("tpe", 5, 0) == 5
    assert len({worker_seed("tpe", 5, i) for i in range(8)}) == 8
    assert {worker_seed("gd", 5, i) for i in range(8)} == {5}  # gd: the chains' streams
    assert worker_seed("random", None, 3) is None
    assert 0 <= worker_seed("tpe", 2**32 - 1, 99_991) < 2**32  # numpy's seed range


def test_passwords_are_redacted():
    from crossflow.search.locations import redact

    assert redact("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact("mlruns/optuna/x.journal") == "mlruns/optuna/x.journal"


def failing_twice(exc: Exception):
    """A function that raises ``exc`` on its first two calls, then returns "ok"; and the
    list of its calls."""
    calls: list[int] = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise exc
        return "ok"

    return flaky, calls


def test_lost_connections_are_retried_and_other_errors_are_not():
    import sqlalchemy.exc as sa
    from optuna.exceptions import StorageInternalError

    from crossflow.search import storage

    lost = sa.OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    wrapped = StorageInternalError("commit failed")
    wrapped.__cause__ = lost
    assert storage._connection_lost(lost) and storage._connection_lost(wrapped)
    assert not storage._connection_lost(sa.IntegrityError("INSERT", {}, Exception("dup")))
    assert not storage._connection_lost(ValueError("bad value"))

    flaky, calls = failing_twice(wrapped)
    before = storage.RECONNECTS["retries"]
    assert storage.retrying(flaky, reconnect_s=10) == "ok" and len(calls) == 3
    assert storage.RECONNECTS["retries"] - before == 2
    with pytest.raises(StorageInternalError):
        storage.retrying(lambda: (_ for _ in ()).throw(wrapped), reconnect_s=0.0)
    with pytest.raises(ValueError):
        storage.retrying(lambda: int("x"), reconnect_s=10)


def test_user_attributes_are_written_when_the_trial_finishes(tmp_path):
    import optuna

    from crossflow.search.storage import make_storage

    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="s", storage=make_storage(url))
    trial = study.ask()
    trial.set_user_attr("a", 1)
    trial.set_user_attr("b", {"c": [1, 2]})
    assert trial.user_attrs == {"a": 1, "b": {"c": [1, 2]}}  # this process sees them
    other = optuna.load_study(study_name="s", storage=url)
    assert other.trials[0].user_attrs == {}  # not written yet
    study.tell(trial, 0.5)
    other = optuna.load_study(study_name="s", storage=url)
    assert other.trials[0].user_attrs == {"a": 1, "b": {"c": [1, 2]}}


def test_two_trackers_back_filling_at_once_insert_each_run_once(tmp_path):
    import optuna

    from crossflow.search.tracking import StudyTracker

    study = optuna.create_study(study_name="race")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=30)
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    trackers = [StudyTracker("race", uri, {"sampler": "random"}, {}, study=study,
                             mode="thread") for _ in range(2)]
    with trackers[0], trackers[1]:
        pass
    runs = child_runs(tmp_path, uri, "race")
    assert sorted(int(r.data.tags["trial_number"]) for r in runs) == list(range(30))
    logged = [t.stats["worker"]["runs_logged"] for t in trackers]
    assert sum(logged) == 30, logged  # inserted once, not inserted twice and deleted
    assert all(t.stats["worker"].get("duplicates_removed", 0) == 0 for t in trackers)


def test_a_worker_joining_from_elsewhere_logs_each_trial_once(postgres_url, tmp_path):
    """``study worker`` (its own tracker) beside ``study run --workers 2`` (which logs every
    worker's trials from the storage), both into one MLflow store: runs are inserted once."""
    total = 300
    coordinator = crossflow("study", "run", QUICKSTART, "--trials", total, "--workers", 2,
                            "--storage", postgres_url, cwd=tmp_path)
    wait_for_complete(postgres_url, 10, coordinator)
    joined = crossflow("study", "worker", QUICKSTART, "--storage", postgres_url, "--quiet",
                       cwd=tmp_path)
    out = finish(coordinator) + finish(joined)
    assert coordinator.returncode == 0 and joined.returncode == 0, out[-3000:]
    study = load(postgres_url)
    assert states(study)["COMPLETE"] == total
    assert_nothing_left_running(study)
    assert len({t.user_attrs["worker"] for t in study.trials}) == 3
    assert_one_run_per_trial(study, child_runs(tmp_path))


def test_nested_storage_calls_retry_only_at_the_outside():
    """Storage methods call one another (both retried): only the outer call retries, so
    the time limit and the retry count are those of one call."""
    import sqlalchemy.exc as sa

    from crossflow.search import storage

    lost = sa.OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    flaky, calls = failing_twice(lost)
    before = storage.RECONNECTS["retries"]
    assert storage.retrying(lambda: storage.retrying(flaky, 10), 10) == "ok"
    assert len(calls) == 3 and storage.RECONNECTS["retries"] - before == 2
    calls.clear()
    with pytest.raises(sa.OperationalError):  # the outer limit holds for the inner call
        storage.retrying(lambda: storage.retrying(flaky, 10), 0.0)
    assert len(calls) == 1
