"""Children go with their parent (crossflow.search.children): ``crossflow ui`` and the MLflow
logging process stop, with everything they started, when the CrossFlow process that
started them is stopped by SIGTERM or killed by SIGKILL (issue 10)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from crossflow.search.children import GRACE_S, group_members
from crossflow.search.workers import child_env

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.filterwarnings("ignore:.*noload.*"), pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="PR_SET_PDEATHSIG and /proc are Linux's")]
#: How long the MLflow server may take to answer (it migrates a new database first, and
#: this machine is shared).
START_S = 240


def _env() -> dict[str, str]:
    return child_env()


def _stats() -> dict[int, tuple[str, int, int]]:
    """pid -> (state, ppid, pgid) of every process."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{name}/stat").read_text()
                f = text[text.rindex(")") + 2:].split()
                out[int(name)] = (f[0], int(f[1]), int(f[2]))
    return out


def descendants(pid: int) -> set[int]:
    stats = _stats()
    out, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        kids = {p for p, (_, ppid, _) in stats.items() if ppid == parent}
        todo += list(kids - out)
        out |= kids
    return out


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (zombies do not: nothing of them is left)."""
    stats = _stats()
    return {p for p in pids if p in stats and stats[p][0] not in ("Z", "X")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True


@contextlib.contextmanager
def ui_process(tmp_path):
    """``python -m crossflow ui --port P`` in ``tmp_path``, once the server answers HTTP:
    (the crossflow process, the port, every process under it)."""
    port = free_port()
    log = (tmp_path / "ui.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "crossflow", "ui", "--port", str(port)],
                            cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    under: set[int] = set()
    try:
        deadline = time.monotonic() + START_S
        while not answers(port):
            assert proc.poll() is None, (tmp_path / "ui.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the MLflow UI did not answer"
            time.sleep(0.5)
        under = descendants(proc.pid)
        yield proc, port, under
    finally:
        for pid in alive(under | {proc.pid}):  # whatever a failed test left
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        log.close()


def wait_gone(port: int, pids: set[int], pgids: set[int], within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = alive(pids) | {p for g in pgids for p in group_members(g)}
        if not left and not answers(port):
            return
        time.sleep(0.2)
    left = alive(pids) | {p for g in pgids for p in group_members(g)}
    raise AssertionError(f"still there after {within} s: port answers={answers(port)}, "
                         f"processes {sorted(left)}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_ui_server_goes_with_the_crossflow_process(tmp_path, sig):
    with ui_process(tmp_path) as (proc, port, under):
        stats = _stats()
        pgids = {stats[p][2] for p in under if p in stats}
        assert pgids and proc.pid not in pgids  # the server runs in a group of its own
        assert len(under) >= 3  # supervisor, mlflow CLI, uvicorn (and MLflow's job runners)
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        assert code == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL)
        wait_gone(port, under, pgids, within=GRACE_S + 5)


def test_ctrl_c_stops_the_ui_quietly(tmp_path):
    """Ctrl-C (SIGINT to the crossflow process, the terminal's foreground group): exit 0,
    the server and all it started gone, and no traceback in what the user saw (MLflow's
    job-runner processes printed a KeyboardInterrupt traceback each)."""
    with ui_process(tmp_path) as (proc, port, under):
        stats = _stats()
        pgids = {stats[p][2] for p in under if p in stats}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        wait_gone(port, under, pgids, within=GRACE_S + 5)
    shown = (tmp_path / "ui.log").read_text(errors="replace")
    assert "Traceback" not in shown and "KeyboardInterrupt" not in shown, shown[-3000:]
    assert "DeprecationWarning" not in shown, shown[-3000:]


def test_stopping_the_ui_leaves_no_lock_file_beside_the_store(tmp_path):
    """Issue 20: ``mlruns/mlflow.db.lock`` stayed after ``crossflow ui`` stopped.  The file
    is CrossFlow's (crossflow.search.tracking.paths._db_lock, the lock a launch takes to
    create the store; MLflow's server makes none): whoever holds it deletes it, and one
    left by a killed launch (no one holds it) goes when the UI stops."""
    (tmp_path / "mlruns").mkdir()
    lock = tmp_path / "mlruns" / "mlflow.db.lock"
    lock.touch()
    with ui_process(tmp_path) as (proc, _, _):
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()
    assert sorted(p.name for p in (tmp_path / "mlruns").iterdir()
                  if p.name.endswith(".lock")) == []


def test_spawn_child_gets_sigterm_when_its_parent_is_killed(tmp_path):
    """``PR_SET_PDEATHSIG``: a SIGKILL of the parent (no handler runs) still ends the
    child, which runs in its own session."""
    code = textwrap.dedent("""
        import sys, time
        from crossflow.search.children import spawn_child
        child = spawn_child(["sleep", "300"])
        print(child.pid, flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], env=_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert alive({child}) and os.getsid(child) == child != os.getsid(parent.pid)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while alive({child}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive({child})
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()


STUDY = """
import sys, time, optuna
sys.path.insert(0, {tests!r})
from test_tracking import objective
from crossflow.search.tracking import StudyTracker
optuna.logging.set_verbosity(optuna.logging.WARNING)

def slow(trial):
    time.sleep(0.1)
    return objective(trial)

study = optuna.create_study(study_name="killed", sampler=optuna.samplers.RandomSampler(0))
with StudyTracker("killed", {uri!r}, {{"sampler": "random"}}, {{}}) as tr:
    print(tr._proc.pid, flush=True)
    study.optimize(slow, n_trials=10000, callbacks=[tr], catch=(ValueError,))
"""


@pytest.mark.parametrize("how", ["kill-study", "terminate-logger"])
def test_the_logging_process_goes_with_a_killed_study_and_closes_its_run(tmp_path, how):
    """SIGKILL of the study process (its stdin closes; the death signal follows), or a
    SIGTERM of the logging process itself: it logs what it has, closes the launch's run
    as KILLED and exits."""
    from mlflow import MlflowClient

    from crossflow.search.tracking import EXIT_GRACE_S, _db_lock

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-c", STUDY.format(tests=str(REPO / "tests"), uri=uri)],
        env=_env(), stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        logger = int(proc.stdout.readline())
        with _db_lock(uri):  # the logger may be creating the database: no racing migration
            client = MlflowClient(uri)
            client.search_experiments()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until some trials are logged
            exp = client.get_experiment_by_name("killed")
            if exp and len(client.search_runs([exp.experiment_id],
                                              "tags.trial_number != ''")) >= 3:
                break
            time.sleep(0.5)
        if how == "kill-study":
            proc.kill()
            proc.wait()
        else:
            os.kill(logger, signal.SIGTERM)
        deadline = time.monotonic() + EXIT_GRACE_S + 10
        while alive({logger}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive({logger})
        every = client.search_runs([exp.experiment_id])
        parent, = [r for r in every if "trial_number" not in r.data.tags]
        assert parent.info.status == "KILLED" and parent.info.end_time
        assert len(every) - 1 >= 3
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_forwarding_leaves_a_signal_the_process_ignores_ignored():
    """``nohup crossflow ui``: SIGHUP is ignored, so closing the terminal must neither stop
    the command nor be forwarded to its server; the signals it does take are forwarded and
    their handlers put back afterwards."""
    from crossflow.search.children import forward_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM)}
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with forward_signals(child) as received:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.2)
            assert received == [] and child.poll() is None
            os.kill(os.getpid(), signal.SIGTERM)
            child.wait(timeout=10)
            assert received == [signal.SIGTERM] and child.returncode == -signal.SIGTERM
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    finally:
        child.kill()
        child.wait()
        for s, h in before.items():
            signal.signal(s, h)


def test_the_logging_process_of_a_nohup_study_outlives_a_sighup(tmp_path):
    """A study started under ``nohup`` goes on when its terminal closes, and so must its
    logging process (it inherits the ignored SIGHUP and keeps it), or the rest of the
    study's trials would reach MLflow only at the next launch."""
    from mlflow import MlflowClient

    from crossflow.search.tracking import _db_lock

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-c", STUDY.format(tests=str(REPO / "tests"), uri=uri)],
        env=_env(), stdout=subprocess.PIPE, text=True, cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        logger = int(proc.stdout.readline())
        with _db_lock(uri):
            client = MlflowClient(uri)
            client.search_experiments()

        def logged() -> int:
            exp = client.get_experiment_by_name("killed")
            return len(client.search_runs([exp.experiment_id], "tags.trial_number != ''")
                       ) if exp else 0

        deadline = time.monotonic() + 120
        while logged() < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        os.kill(logger, signal.SIGHUP)
        os.kill(proc.pid, signal.SIGHUP)
        after = logged()
        deadline = time.monotonic() + 60
        while logged() <= after + 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alive({logger}) and proc.poll() is None
        assert logged() > after + 3
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
