"""Workers: any number of processes, on any number of machines, finishing one study's budget.

Every process that runs trials of a study — the one ``crossflow study run`` starts, the K
that ``study run --workers K`` starts, one ``crossflow study worker`` on another machine —
runs :func:`work`.  The study's storage is the only thing they share, and it is enough:

* **Exactly ``n_trials`` finished trials.**  The *live* trials (finished COMPLETE or
  PRUNED, running, or waiting to run) in trial-number order hold the budget's slots; a
  trial runs only if it holds one of the first ``n_trials``.  A worker asks for a trial
  only while a slot is free, so a race is rare (two workers asking for the last slot at
  once), and it is settled by the trial numbers the storage hands out: the one left
  without a slot is not evaluated but recorded FAIL with the user attribute ``surplus``
  (no MLflow run, no ``gd`` attempt).  A worker whose every slot is taken by trials
  running elsewhere waits for them: they finish, or their worker died and the trial is
  retried (then it runs the retry).
* **Dead workers.**  On RDB storages a trial without a heartbeat is failed and retried (see
  :mod:`crossflow.search.storage`).  Journal files have no heartbeats: a running trial
  whose worker (user attribute ``worker``: host:pid) is a process of this machine that no
  longer exists is failed and retried the same way (:func:`fail_orphans`); one from
  another machine or an older CrossFlow counts as dead after :data:`STALE_RUNNING`.
* **Ctrl-C** (:class:`GracefulStop`) ends the trial in progress first.

:func:`run_workers` is ``study run --workers K``: it starts K ``crossflow study worker``
processes on one launch, logs their trials to MLflow from the storage (one tracker), shows
one progress line, and forwards Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from crossflow.errors import CrossflowError
from crossflow.search.children import (
    group_members,
    kill_group,
    restore_signals,
    spawn_child,
    take_signal,
)
from crossflow.search.keys import SURPLUS, WORKER

#: A RUNNING trial older than this, of no live worker of this machine, is taken as left
#: behind by a dead worker (journal files have no heartbeat) and no longer holds a slot.
STALE_RUNNING = timedelta(minutes=10)
#: A RUNNING trial whose worker never recorded itself (killed between Optuna creating the
#: trial and the objective starting, when it writes :data:`WORKER`) is taken as dead after
#: this long: a live worker records itself as soon as the sampler has proposed the point.
UNCLAIMED_RUNNING = timedelta(minutes=2)
#: Seconds between two looks at the storage while waiting for trials running elsewhere.
POLL_S = 0.5
#: Optuna's refusal to tell the end of a trial that is no longer RUNNING (``optuna.study._tell``).
_FINISHED_ELSEWHERE = re.compile(r"Cannot tell a (COMPLETE|PRUNED|FAIL) trial\.")


#: The environment variable that gives ``crossflow study worker`` its storage when
#: ``--storage`` is not on its command line: the launcher passes the URL (a database
#: password in it) this way, where ``ps`` does not show it.
STORAGE_ENV = "CROSSFLOW_STORAGE"


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def child_env() -> dict[str, str]:
    """The environment of a CrossFlow child process (workers, the MLflow logger): this one,
    with this CrossFlow's source tree first on ``PYTHONPATH``."""
    import crossflow

    root = str(Path(crossflow.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class Surplus(Exception):
    """A trial that found every slot of the budget taken (raised before evaluating it)."""


#: Signals that stop a launch as Ctrl-C does: a terminal's Ctrl-C, a service manager's or
#: ``kill``'s SIGTERM, a closed terminal's or SSH session's SIGHUP.
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _as_ctrl_c(signum, frame) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_as_ctrl_c() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise KeyboardInterrupt as Ctrl-C does, so one path
    serves all three: Optuna records the trial in progress, the storage's locks are released
    by their ``finally``, the command says it was interrupted and exits 130 (the default
    action of SIGTERM would leave a RUNNING trial and a stale journal lock).  Main thread
    only."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in INTERRUPTS[1:]:
            previous[sig] = take_signal(sig, _as_ctrl_c)
    try:
        yield
    finally:
        restore_signals(previous)


class GracefulStop:
    """Ctrl-C (SIGINT), SIGTERM or SIGHUP stops the work after the trial in progress, so no
    trial is left half-written; a second signal interrupts at once (Optuna records that
    trial FAIL).  Only in the main thread.  Also an Optuna callback (stops the study when
    requested)."""

    def __init__(self, message: str = "stopping after the trial in progress") -> None:
        self.requested = False
        self.message = message
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in INTERRUPTS:
                self._previous[sig] = take_signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            self._restore()
            raise KeyboardInterrupt
        self.requested = True
        again = "Ctrl-C again" if signum == signal.SIGINT else "a second signal"
        name = "" if signum == signal.SIGINT else f"{signal.Signals(signum).name}: "
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            print(f"\ncrossflow: {name}{self.message} ({again} to abort)", file=sys.stderr,
                  flush=True)

    def __call__(self, study, trial) -> None:
        if self.requested:
            study.stop()

    def _restore(self) -> None:
        restore_signals(self._previous)
        self._previous = {}

    def __exit__(self, *exc) -> None:
        self._restore()


# --- the budget -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Census:
    """Where a study stands against its budget of ``total`` finished trials."""

    total: int
    done: int            # COMPLETE + PRUNED
    live: list[Any]      # done, running (not stale) and waiting trials, by number
    waiting_in_budget: int

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    @property
    def free(self) -> int:
        """Trials a worker may ask for now (new slots, and waiting trials holding one)."""
        return max(0, self.total - len(self.live)) + self.waiting_in_budget


def census(study, total: int, *, heartbeats: bool) -> Census:
    """The study's live trials against ``total`` (``heartbeats``: the storage fails dead
    trials itself, so every RUNNING trial is live; else stale ones are not)."""
    from optuna.trial import TrialState

    from crossflow.search.storage import fresh_reads

    fresh_reads(study)
    now = datetime.now()
    live, done = [], 0
    for t in study.get_trials(deepcopy=False, states=(
            TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)):
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            done += 1
        elif (t.state == TrialState.RUNNING and not heartbeats
              and t.datetime_start is not None and now - t.datetime_start > STALE_RUNNING
              and not _local_alive(t.user_attrs.get(WORKER))):
            continue
        live.append(t)
    live.sort(key=lambda t: t.number)
    waiting = sum(1 for t in live[:total] if t.state == TrialState.WAITING)
    return Census(total, done, live, waiting)


def _local_pid(worker: Any) -> int | None:
    """The process id of ``worker`` (host:pid) if it is a process of this machine."""
    if not isinstance(worker, str):
        return None
    host, _, pid = worker.rpartition(":")
    return int(pid) if host == socket.gethostname() and pid.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _local_alive(worker: Any) -> bool:
    """Whether ``worker`` (host:pid) is a live process of this machine."""
    pid = _local_pid(worker)
    return pid is not None and _alive(pid)


def fail_orphans(study) -> list[int]:
    """Fail the RUNNING trials whose worker was a process of this machine that is gone (a
    journal file has no heartbeat), or that no worker claimed for
    :data:`UNCLAIMED_RUNNING`, and enqueue a copy of each (Optuna's retry callback:
    same parameters, the ``gd`` role kept).  Returns the numbers failed by this call."""
    from optuna.trial import TrialState

    from crossflow.search.storage import fail_trial, retry_trial

    failed = []
    now = datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if WORKER not in t.user_attrs:
            if t.datetime_start is None or now - t.datetime_start <= UNCLAIMED_RUNNING:
                continue  # its worker is still proposing the point, or died just now
        else:
            pid = _local_pid(t.user_attrs.get(WORKER))
            if pid is None or _alive(pid):
                continue
        if not fail_trial(study, t):
            continue
        failed.append(t.number)
        with _quiet():
            retry_trial(study, t)
    return failed


class Budgeted:
    """The objective, run only by a trial that holds one of the budget's slots (else
    :class:`Surplus`); records which worker ran each trial."""

    def __init__(self, objective, total: int, *, heartbeats: bool) -> None:
        self.objective, self.total, self.heartbeats = objective, total, heartbeats
        self.worker = worker_id()

    def __call__(self, trial):
        if trial.user_attrs.get(WORKER) != self.worker:  # (claimed at creation on a journal)
            trial.set_user_attr(WORKER, self.worker)
        # a trial's rank among the live trials is at most its number: below the budget,
        # it holds a slot without looking
        if trial.number >= self.total and not self.holds_slot(trial):
            trial.set_user_attr(SURPLUS, True)  # (the callback of work() then stops)
            raise Surplus(f"trial {trial.number}: the budget of {self.total} trials is "
                          "taken by other workers")
        return self.objective(trial)

    def holds_slot(self, trial) -> bool:
        c = census(trial.study, self.total, heartbeats=self.heartbeats)
        return any(t.number == trial.number for t in c.live[:self.total])


def work(study, objective, total: int, *, callbacks: list[Any], stop: GracefulStop,
         heartbeats: bool) -> None:
    """Run trials of ``study`` until it has ``total`` finished ones (other workers may run
    some), or ``stop`` is requested."""
    import optuna

    from crossflow.search.storage import claim_trials, live_below

    budgeted = Budgeted(objective, total, heartbeats=heartbeats)
    if not heartbeats:
        # a journal has no heartbeat: a trial records its worker the moment Optuna creates
        # it, before the sampler proposes its point, so a worker killed while sampling
        # leaves a trial fail_orphans recognises at once (not after UNCLAIMED_RUNNING)
        claim_trials(study, WORKER, budgeted.worker)

    def full(study, trial) -> None:  # no slot left: let the outer loop wait or end
        if not live_below(study, total) and \
                census(study, total, heartbeats=heartbeats).free <= 0:
            study.stop()

    def each_trial(study, trial) -> None:
        # one callback for Optuna, which deep-copies the finished trial for every callback
        # it is given (~1 ms a copy of a quickstart trial); they only read it
        for callback in (*callbacks, full, stop):
            callback(study, trial)

    while not stop.requested:
        if heartbeats:
            with _quiet():
                optuna.storages.fail_stale_trials(study)
        else:
            fail_orphans(study)
        c = census(study, total, heartbeats=heartbeats)
        if c.finished:
            return
        if c.free <= 0:  # every slot is taken by trials running elsewhere
            time.sleep(POLL_S)
            continue
        try:
            study.optimize(budgeted, n_trials=c.free, callbacks=[each_trial],
                           catch=(Surplus,), gc_after_trial=False)
        except ValueError as exc:
            # Optuna tells a trial's end only if it is still RUNNING: one another process
            # finished meanwhile (it ran the same trial, or failed it as stale and enqueued
            # a copy) is that process's; this one's result is dropped, the loop goes on
            if not _FINISHED_ELSEWHERE.fullmatch(str(exc)):
                raise
        except (AssertionError, UnboundLocalError) as exc:
            # Optuna's trial runner asserts, or meets an unset local in its `finally`, when
            # recording a trial's end fails; the storage's own error (a full disk, a journal
            # deleted under the launch) is what the user must read
            raise _storage_error(exc) or exc from None


def _storage_error(exc: BaseException) -> BaseException | None:
    """The CrossFlow error (a storage that could not write) that ``exc`` hides, if any."""
    from crossflow.errors import CrossflowError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, CrossflowError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def _quiet():
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


# --- K local worker processes ---------------------------------------------------------------


@dataclass
class WorkerProcess:
    index: int
    proc: subprocess.Popen
    log: Path

    def tail(self, n: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-n:].strip()
        return ""


def worker_command(study_ref: str, launch_key: str, index: int, *,
                   heartbeat_s: float | None = None) -> list[str]:
    """The command line of local worker ``index`` (its storage comes from the
    environment, :data:`STORAGE_ENV`)."""
    cmd = [sys.executable, "-m", "crossflow", "study", "worker", study_ref,
           "--launch", launch_key, "--worker-index", str(index), "--no-tracking", "--quiet"]
    if heartbeat_s is not None:
        cmd += ["--heartbeat", str(heartbeat_s)]
    return cmd


def start_workers(study_ref: str, storage: str, launch_key: str, k: int, *,
                  heartbeat_s: float | None) -> list[WorkerProcess]:
    """K ``crossflow study worker`` processes on one launch, each in its own session (so a
    terminal's Ctrl-C reaches only the coordinator, which forwards it once) and stopped by
    the kernel when the coordinator dies (:func:`crossflow.search.children.spawn_child`,
    ``PR_SET_PDEATHSIG``: a SIGKILL of the coordinator, or its crash).  The storage
    URL goes through the environment (:data:`STORAGE_ENV`), never the command line, where
    any user's ``ps`` would show its password."""
    env = child_env()
    env[STORAGE_ENV] = storage
    out = []
    for i in range(k):
        cmd = worker_command(study_ref, launch_key, i, heartbeat_s=heartbeat_s)
        log = Path(tempfile.mkstemp(prefix=f"crossflow-worker{i}-", suffix=".log")[1])
        with log.open("w") as fh:
            # its own session, and the kernel's SIGTERM when this process dies, however it
            # dies (SIGKILL included: no handler here would run)
            proc = spawn_child(cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, env=env)
        out.append(WorkerProcess(i, proc, log))
    return out


#: Signals that end a launch: the launcher stops its workers, then exits (SIGINT is
#: Ctrl-C: the workers finish their trial in progress first).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: Seconds workers get to exit after a stop signal before they are killed.
STOP_GRACE_S = 5.0


def supervise(workers: list[WorkerProcess], *, tick, interval_s: float = 1.0) -> bool:
    """Wait for the workers, calling ``tick()`` every ``interval_s``; Ctrl-C is forwarded to
    each of them (once per Ctrl-C: the first lets them finish their trial, a second aborts
    it); SIGTERM or SIGHUP stops them at once.  Whatever ends the wait — the workers done,
    a signal, an error here — no worker outlives it: those still running are stopped
    (:func:`stop_workers`).  Returns whether the user interrupted."""
    interrupted = 0
    stopped: list[int] = []

    def forward(signum, frame) -> None:
        nonlocal interrupted
        interrupted += 1
        print("\ncrossflow: stopping the workers after their trials in progress"
              if interrupted == 1 else "\ncrossflow: aborting the workers' trials",
              file=sys.stderr, flush=True)
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGINT)

    def stop(signum, frame) -> None:
        stopped.append(signum)
        print(f"\ncrossflow: {signal.Signals(signum).name}: stopping the workers",
              file=sys.stderr, flush=True)
        for w in workers:
            _signal_worker(w, signal.SIGTERM)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous[signal.SIGINT] = take_signal(signal.SIGINT, forward)
        for sig in STOP_SIGNALS:
            previous[sig] = take_signal(sig, stop)
    try:
        while any(w.proc.poll() is None for w in workers):
            deadline = time.monotonic() + interval_s
            while time.monotonic() < deadline and any(w.proc.poll() is None for w in workers):
                time.sleep(0.05)
            if stopped:
                break
            tick()
    finally:
        try:
            stop_workers(workers)
        finally:
            restore_signals(previous)
    return interrupted > 0 or bool(stopped)


def _signal_worker(w: WorkerProcess, sig: int) -> None:
    """``sig`` to worker ``w`` and whatever it started (its process group: it leads a
    session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(w.proc.pid, sig)


def stop_workers(workers: list[WorkerProcess], grace_s: float = STOP_GRACE_S) -> None:
    """Stop the workers still running and whatever they started (their process groups):
    SIGTERM to all at once, up to ``grace_s`` seconds, then SIGKILL
    (:func:`crossflow.search.children.kill_group`)."""
    alive = [w for w in workers if w.proc.poll() is None or group_members(w.proc.pid)]
    for w in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(w.proc.pid, signal.SIGTERM)
    for w in alive:
        kill_group(w.proc, signal.SIGTERM, grace=grace_s)


def check_workers(workers: list[WorkerProcess], *, interrupted: bool,
                  finished: bool, study=None) -> list[str]:
    """The workers that exited for a reason other than Ctrl-C, as lines to warn about (each
    says what became of the trial it left, read from ``study``'s storage when given);
    raises CrossflowError when they left the study unfinished (with a log's tail)."""
    ok = (0, 130, -signal.SIGINT, -signal.SIGTERM, 143) if interrupted else (0,)
    bad = [w for w in workers if w.proc.returncode not in ok]
    for w in workers:
        if w not in bad:
            with contextlib.suppress(OSError):
                w.log.unlink()
    if bad and not finished and not interrupted:
        w = bad[0]
        raise CrossflowError(f"{len(bad)} of {len(workers)} worker processes failed and the "
                             f"study is not finished; worker {w.index} exited with status "
                             f"{w.proc.returncode}; its log ({w.log}) ends:\n{w.tail()}")
    return [f"worker {w.index} (pid {w.proc.pid}) exited with status {w.proc.returncode}"
            f"{_left_behind(study, w.proc.pid)} (log: {w.log})" for w in bad]


def _left_behind(study, pid: int) -> str:
    """What worker process ``pid`` of this machine left unfinished, and whether each such
    trial was run again (a clause of :func:`check_workers`' line; empty without a study)."""
    if study is None:
        return ""
    from optuna.trial import TrialState

    name = f"{socket.gethostname()}:{pid}"
    trials = study.get_trials(deepcopy=False)
    left = [t.number for t in trials if t.user_attrs.get(WORKER) == name
            and t.state == TrialState.FAIL and not t.user_attrs.get(SURPLUS)]
    if not left:
        return " with no trial in progress"
    again = {t.system_attrs.get("failed_trial") for t in trials}
    done = [f"#{n}" for n in left if n in again]
    lost = [f"#{n}" for n in left if n not in again]
    out = []
    if done:
        out.append(f"its trial{'s' if len(done) > 1 else ''} in progress ({', '.join(done)}) "
                   f"failed and {'were' if len(done) > 1 else 'was'} run again by the others")
    if lost:
        out.append(f"trial{'s' if len(lost) > 1 else ''} {', '.join(lost)} failed and "
                   f"{'were' if len(lost) > 1 else 'was'} not run again")
    return "; " + "; ".join(out)
