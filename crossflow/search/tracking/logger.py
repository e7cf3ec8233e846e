"""The logging side of a tracker: :class:`_Logger` executes tracking messages with one
``MlflowClient``; :func:`_worker_main` is the logging process around it (JSON messages on
stdin, JSON events on stdout), started by :class:`.tracker.StudyTracker` through
:func:`crossflow.search.children.spawn_child`, so it goes with the study process: on the
study's exit its stdin closes, and on a crash of the study (even a SIGKILL) Linux sends it
SIGTERM (``PR_SET_PDEATHSIG``).  Either way it logs what it was sent, closes the launch's
parent run as KILLED and exits (within :data:`EXIT_GRACE_S` of a SIGTERM).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crossflow.search.children import take_signal
from crossflow.search.keys import TRIAL_NUMBER_TAG
from crossflow.search.tracking import store
from crossflow.search.tracking.paths import _db_lock
from crossflow.search.tracking.records import (
    _PER_BATCH,
    _STATUS,
    VIEW_TAG,
    _key,
    duplicates,
    is_logged,
)
from crossflow.search.tracking.summary import render_summary

#: After a SIGTERM the logging process finishes what it was sent, at most this long.
EXIT_GRACE_S = 30
#: Bounds of MLflow's HTTP client for CrossFlow's own calls (a user's own values of these
#: variables win): seconds per request, retries, back-off factor.  One request to a server
#: that never answers thus ends within about 10 × 3 + 1 + 2 s.
HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
#: A lost database connection is retried (:func:`crossflow.search.reconnect.retrying`) for up
#: to this many seconds, once per launch; after that the store is taken as gone.
RECONNECT_S = 60.0
#: Most trial runs written in one transaction (one batch); a batch is also written when no
#: further trial arrives within :data:`LINGER_S`, and before any other message (a summary,
#: the end of the launch).
BATCH_RUNS = 500
#: The experiment tag MLflow's UI shows as an experiment's description.
NOTE = "mlflow.note.content"
#: After this many trial runs failed in a row, the rest of the launch's runs are not tried
#: (each would wait out the bounds again); they are counted as missing at the end.
GIVE_UP_AFTER = 3


def bound_http(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's ``os.environ``) with :data:`HTTP_BOUNDS` set where
    the user has not set them."""
    target = os.environ if env is None else env
    for name, value in HTTP_BOUNDS.items():
        target.setdefault(name, value)
    return target


class _Logger:
    """Executes tracking messages with one ``MlflowClient``.  Runs in the worker process
    (default) or in the tracker's thread; holds the trial numbers already logged.

    Trial runs are written in batches: on MLflow's SQL stores (SQLite, PostgreSQL, MySQL)
    every trial waiting in the queue goes into one transaction, through the store's own
    SQLAlchemy tables (:mod:`.store`: ``runs``, ``tags``, ``params``, ``metrics``, ``latest_metrics``,
    filled as ``create_run`` + ``log_batch`` + ``set_terminated`` fill them), ~1 ms a run;
    otherwise (a tracking server, or ``bulk=False``, or any error in a batch, which is rolled
    back) one ``create_run`` + ``log_batch`` + ``set_terminated`` per run, ~20 ms of CPU."""

    def __init__(self) -> None:
        self.client = None
        self.experiment_id: str | None = None
        self.artifact_location: str | None = None
        self.parent_run_id: str | None = None
        self.known: dict[int, list[int]] = {}  # trial number -> start times (ms) of its runs
        self.bulk = False
        self.batch = BATCH_RUNS
        self.batches = 0
        self.largest_batch = 0
        self.logged = 0
        self.logged_bulk = 0
        self.skipped = 0
        self.duplicates_removed = 0
        self.errors: list[str] = []
        self.notes: list[str] = []
        self.busy_s = 0.0
        self.op_s: dict[str, float] = {}  # seconds spent per operation (init, trials, ...)
        #: whether the summary's imports were done before it (the logging process warms
        #: up once the parent run exists: :func:`_worker_main`)
        self.summary_warm: bool | None = None
        self.setup_s = 0.0
        self.reconnect_s = RECONNECT_S
        self.failed_in_row = 0
        self.given_up = 0  # trial runs not tried: the store had failed GIVE_UP_AFTER times
        #: draw the summary's figures in forked children (the logging process only: see
        #: render_summary)
        self.fork_figures = False

    # -- dispatch
    def handle_many(self, msgs: list[dict[str, Any]]) -> None:
        """Handle messages in order, each run of consecutive trial messages as one batch (or
        several, of at most :attr:`batch` trials)."""
        batch: list[dict[str, Any]] = []
        for msg in msgs:
            if msg["op"] == "trial":
                batch.append(msg)
                if len(batch) >= self.batch:
                    self._run("trials", self._op_trials, batch)
                    batch = []
                continue
            if batch:
                self._run("trials", self._op_trials, batch)
                batch = []
            self._run(msg["op"], getattr(self, "_op_" + msg["op"]), msg)
        if batch:
            self._run("trials", self._op_trials, batch)

    def _run(self, op: str, fn, arg) -> None:
        t0 = time.perf_counter()
        try:
            if op == "init" or self.client is not None:  # else init failed (recorded)
                fn(arg)
        except Exception as exc:  # logging must never stop a study
            if len(self.errors) < 20:
                self.errors.append(f"{op}: {type(exc).__name__}: {exc}"[:500])
        finally:
            dt = time.perf_counter() - t0
            self.busy_s += dt
            self.op_s[op] = self.op_s.get(op, 0.0) + dt
            if op == "init":
                self.setup_s = dt

    def stats(self) -> dict[str, Any]:
        return {"runs_logged": self.logged, "runs_logged_in_batches": self.logged_bulk,
                "skipped_existing": self.skipped, "duplicates_removed": self.duplicates_removed,
                "batches": self.batches, "largest_batch": self.largest_batch,
                "busy_s": self.busy_s, "setup_s": self.setup_s, "op_s": self.op_s,
                "summary_warm": self.summary_warm,
                "errors": self.errors,
                "notes": self.notes, "batched": self.bulk,
                "trials_with_runs": sorted(self.known), "given_up": self.given_up,
                "experiment_id": self.experiment_id, "parent_run_id": self.parent_run_id}

    # -- helpers
    def _log(self, run_id: str, params: Mapping[str, str] | None = None,
             metrics: Mapping[str, float] | None = None, tags: Mapping[str, str] | None = None,
             ts: int | None = None) -> None:
        """``log_batch`` once (more only past MLflow's 100 params/tags per request)."""
        from mlflow.entities import Metric, Param, RunTag

        ts = ts or int(time.time() * 1000)
        p = [Param(k, v) for k, v in (params or {}).items()]
        t = [RunTag(k, v) for k, v in (tags or {}).items()]
        m = [Metric(k, v, ts, 0) for k, v in (metrics or {}).items()]
        first = True
        while first or p or t:
            n_p = min(len(p), _PER_BATCH)
            n_t = min(len(t), _PER_BATCH - n_p)
            self.client.log_batch(run_id, metrics=m if first else [], params=p[:n_p],
                                  tags=t[:n_t], synchronous=True)
            p, t, first = p[n_p:], t[n_t:], False

    def _retrying(self, fn):
        """``fn()``, retried while the database connection is lost, for up to
        :attr:`reconnect_s` (:data:`RECONNECT_S`; 0 once a retry has run out: the store is
        gone, and each later call fails at once rather than waiting again)."""
        from crossflow.search.reconnect import retrying

        t0 = time.monotonic()
        try:
            return retrying(fn, self.reconnect_s)
        except Exception:
            if self.reconnect_s and time.monotonic() - t0 >= self.reconnect_s:
                self.reconnect_s = 0.0
            raise

    def _engine(self):
        return store.sql_engine(self.client)

    def _trial_runs(self) -> dict[int, list[tuple[int, str]]]:
        """trial number -> [(start time ms, run id)] of the active child runs in the
        experiment.  One SQL query on MLflow's SQL stores (:func:`.store.trial_runs`), else
        paginated ``search_runs``."""
        out: dict[int, list[tuple[int, str]]] = {}
        engine = self._engine()
        rows = None
        if engine is not None:
            try:
                rows = store.trial_runs(engine, self.experiment_id)
            except Exception:
                rows = None
        if rows is None:
            rows, token = [], None
            while True:
                page = self.client.search_runs(
                    [self.experiment_id], filter_string=f"tags.{TRIAL_NUMBER_TAG} != ''",
                    max_results=10000, page_token=token)
                rows += [(r.data.tags.get(TRIAL_NUMBER_TAG), r.info.start_time,
                          r.info.run_id) for r in page]
                token = page.token
                if not token:
                    break
        for number, start, run_id in rows:
            with contextlib.suppress(TypeError, ValueError):
                out.setdefault(int(number), []).append((int(start or 0), run_id))
        return out

    # -- operations
    def _op_init(self, msg: dict[str, Any]) -> None:
        import logging

        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        bound_http()
        self.batch = max(1, int(msg.get("batch") or BATCH_RUNS))
        name = msg["study_name"]
        # launches creating one new SQLite database race in its migrations: tried again;
        # elsewhere only a lost connection is (bounded), each HTTP request being bounded too
        attempts = 6 if msg["tracking_uri"].startswith("sqlite:") else 1
        for attempt in range(attempts):
            try:
                with _db_lock(msg["tracking_uri"]):
                    seeded = store.seed_sqlite(msg["tracking_uri"])
                    client = MlflowClient(tracking_uri=msg["tracking_uri"])
                    exp = self._retrying(lambda c=client: c.get_experiment_by_name(name))
                    if seeded == "missing":
                        store.remember_sqlite(msg["tracking_uri"])
                break
            except Exception:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.25 * 2 ** attempt)
        if exp is None:
            location = msg["artifact_root"]
            if location:
                location = f"{location}/{_key(name).replace('/', '_').replace(' ', '_')}"
            # MLflow shows the note tag as the experiment's description
            note = {NOTE: msg["description"]} if msg.get("description") else {}
            try:
                eid = client.create_experiment(name, artifact_location=location,
                                               tags={"crossflow.study": name, **note})
            except MlflowException:  # another launch created it meanwhile
                exp = client.get_experiment_by_name(name)
                if exp is None:
                    raise
                eid = exp.experiment_id
        else:
            eid = exp.experiment_id
            if exp.lifecycle_stage == "deleted":
                client.restore_experiment(eid)
            if msg.get("description") and not exp.tags.get(NOTE):  # a store of an older run
                client.set_experiment_tag(eid, NOTE, msg["description"])
        view = msg.get("view")
        if view and (exp is None or exp.tags.get(VIEW_TAG) != view):
            client.set_experiment_tag(eid, VIEW_TAG, view)
        self.client, self.experiment_id = client, eid
        self.artifact_location = client.get_experiment(eid).artifact_location
        self.bulk = bool(msg.get("bulk", True)) and self._engine() is not None
        self.known = {n: [s for s, _ in runs] for n, runs in self._trial_runs().items()}
        parent = client.create_run(eid, start_time=msg["start_ms"], tags=msg["tags"],
                                   run_name=msg["run_name"])
        self.parent_run_id = parent.info.run_id
        self._log(self.parent_run_id, params=msg["params"])

    def _op_trials(self, msgs: list[dict[str, Any]]) -> None:
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(msgs))
        new = []
        for msg in msgs:
            rec = msg["record"]
            if is_logged(self.known, rec["number"], rec["start_ms"]):
                self.skipped += 1
                continue
            tags = {**rec["tags"], "mlflow.parentRunId": self.parent_run_id}
            if msg.get("backfill"):
                tags["backfilled"] = "true"
            new.append({**rec, "tags": tags})
        if not new:
            return
        done: list[dict[str, Any]] = []  # runs that exist now
        if self.bulk:
            try:
                inserted = self._retrying(lambda: store.insert_runs(
                    self._engine(), self.experiment_id, self.artifact_location, new))
                self.logged += inserted
                self.logged_bulk += inserted
                self.skipped += len(new) - inserted  # logged by another process
                done, new = new, []
            except Exception as exc:  # rolled back: log them one by one instead
                self.bulk = False
                self.notes.append(f"batch insert disabled: {type(exc).__name__}: {exc}"[:500])
        for rec in new:
            if self.failed_in_row >= GIVE_UP_AFTER:
                self.given_up += 1
                continue
            try:
                self._retrying(lambda rec=rec: self._create_run(rec))
                done.append(rec)
                self.logged += 1
                self.failed_in_row = 0
            except Exception as exc:
                self.failed_in_row += 1
                if len(self.errors) < 20:
                    self.errors.append(f"trial {rec['number']}: {type(exc).__name__}: {exc}"[:500])
                if self.failed_in_row == GIVE_UP_AFTER:
                    self.notes.append(f"{GIVE_UP_AFTER} trial runs failed in a row: the "
                                      "launch's remaining trials are not logged")
        for rec in done:
            self.known.setdefault(rec["number"], []).append(rec["start_ms"])

    def _create_run(self, rec: dict[str, Any]) -> None:
        """One trial run through the public API: create_run + log_batch + set_terminated."""
        run = self.client.create_run(self.experiment_id, start_time=rec["start_ms"],
                                     tags=rec["tags"])
        run_id = run.info.run_id
        self._log(run_id, params=rec["params"], metrics=rec["metrics"], ts=rec["end_ms"])
        self.client.set_terminated(run_id, _STATUS.get(rec["state"], "FINISHED"),
                                   end_time=rec["end_ms"])

    def _op_artifacts(self, msg: dict[str, Any]) -> None:
        if msg.get("dir"):
            self.client.log_artifacts(self.parent_run_id, msg["dir"], msg.get("path"))
        if msg.get("metrics") or msg.get("tags"):
            self._log(self.parent_run_id, metrics=msg.get("metrics"), tags=msg.get("tags"))

    def _op_summary(self, msg: dict[str, Any]) -> None:
        self.summary_warm = "warm_up" in self.op_s
        out = Path(tempfile.mkdtemp(prefix="crossflow-summary-"))
        try:
            metrics, tags = render_summary(out, msg, fork=self.fork_figures)
            self.client.log_artifacts(self.parent_run_id, str(out))
            self._log(self.parent_run_id, metrics=metrics, tags=tags)
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def _op_close(self, msg: dict[str, Any]) -> None:
        try:
            runs_now = self._trial_runs()
            # what the store holds now: the launch's final account of trials with a run
            self.known = {n: [s for s, _ in runs] for n, runs in runs_now.items()}
            for runs in runs_now.values():
                for run_id in duplicates(runs):
                    self.client.delete_run(run_id)
                    self.duplicates_removed += 1
        finally:
            self._log(self.parent_run_id, metrics={"n_trial_runs_logged": self.logged})
            self.client.set_terminated(self.parent_run_id, msg.get("status", "FINISHED"))



#: The logging process's program (``python -c``).  It needs this package, not the model:
#: ``crossflow`` is entered without running its ``__init__``, which imports the prediction
#: stack (networkx, the workload and parallelism modules: ~0.4 s of CPU that, on a 2-core
#: machine, is taken from the study).
WORKER_BOOT = (
    "import importlib.util, sys, types\n"
    "spec = importlib.util.find_spec('crossflow')\n"
    "pkg = types.ModuleType('crossflow')\n"
    "pkg.__path__ = list(spec.submodule_search_locations)\n"
    "pkg.__spec__, pkg.__file__ = spec, spec.origin\n"
    "sys.modules['crossflow'] = pkg\n"
    "from crossflow.search.tracking.logger import _worker_main\n"
    "_worker_main()\n")

_BATCH = 500  # most messages handled at once
#: Trials wait up to this long for more trials to share their transaction: one SQLite
#: commit (fsync) per trial would compete with the Optuna storage's own fsyncs on the disk.
LINGER_S = 0.5


def _gather(inbox: queue.SimpleQueue, lingers) -> list[Any]:
    """The next message and whatever follows it within :data:`LINGER_S`, as long as every
    message so far ``lingers`` (trial messages; any other message is handled at once)."""
    items = [inbox.get()]
    deadline = time.monotonic() + LINGER_S
    while len(items) < _BATCH:
        wait = deadline - time.monotonic() if lingers(items[-1]) else 0.0
        try:
            items.append(inbox.get(timeout=wait) if wait > 0 else inbox.get_nowait())
        except queue.Empty:
            break
    return items


def _warm_up() -> None:
    """What the summary needs, done while the study runs rather than after it: the imports
    (matplotlib, Optuna's importance module) and a first figure drawn (fonts and text
    layout are set up on first use, ~0.25 s)."""
    import io

    import matplotlib.backends.backend_agg  # noqa: F401
    import optuna.importance  # noqa: F401

    from crossflow.search import _plots

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    fig = _plots._figure(2.0, 1.5)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([0, 1], [0, 1])
    ax.set_xlabel("warm-up")
    fig.tight_layout()
    fig.savefig(io.BytesIO(), format="png")


def _worker_main() -> None:
    """The logging process: JSON messages on stdin, JSON events on (a private copy of)
    stdout; ``mlflow``'s own output goes to stderr.  Whatever is waiting is handled at once,
    so trials that arrive while a batch is written go into the next batch."""
    # Optuna's importance package imports scikit-learn (~2 s of CPU) for its fANOVA
    # evaluator, which this process never uses (the summary's importances are PED-ANOVA's,
    # crossflow.search._plots.IMPORTANCE_METHOD); on a 2-core machine the study pays for
    # every CPU second spent here.  Optuna imports it through ``try_import``, which takes
    # the refusal as "not installed".
    sys.modules["sklearn"] = None  # type: ignore[assignment]
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    cpu0 = time.process_time()
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        for line in sys.stdin:
            inbox.put(json.loads(line))
        inbox.put(None)

    threading.Thread(target=read, daemon=True).start()

    def on_term(signum, frame) -> None:  # the study process is gone (or asks us to stop)
        inbox.put(None)  # SimpleQueue.put is reentrant: safe in a signal handler
        signal.alarm(EXIT_GRACE_S)  # SIGALRM's default action ends the process

    # under nohup the study goes on after its terminal closes, and so does its logger
    for sig in (signal.SIGTERM, signal.SIGHUP):
        take_signal(sig, on_term)
    log = _Logger()
    log.fork_figures = True
    closed = eof = warm = False
    while not (closed or eof):
        msgs = _gather(inbox, lambda m: m is not None and m["op"] == "trial")
        if None in msgs:
            eof = True
            msgs = msgs[:msgs.index(None)]
        if any(m["op"] == "close" for m in msgs):
            closed = True
            msgs = msgs[:next(i for i, m in enumerate(msgs) if m["op"] == "close") + 1]
        for i, m in enumerate(msgs):
            if m["op"] == "init":  # answer "ready" (the known trials) as soon as possible
                log.handle_many(msgs[:i + 1])
                proto.write(json.dumps({"event": "ready", "known": log.known,
                                        **log.stats()}) + "\n")
                msgs = msgs[i + 1:]
                break
        log.handle_many(msgs)
        if not warm and log.client is not None and not (closed or eof):
            # once the parent run exists, import what the summary needs, off the critical
            # path: the trials that arrive meanwhile wait in the inbox and go in the next
            # batch.  Waiting for an idle moment instead left it to the summary (on the
            # study's critical path, ~0.3-0.5 s) whenever trials came faster than a batch
            # is written, as in any quick study.
            warm = True
            t0 = time.perf_counter()
            with contextlib.suppress(Exception):
                _warm_up()
            log.op_s["warm_up"] = time.perf_counter() - t0
    if not closed and log.client is not None:  # stdin closed: the study process is gone
        log.handle_many([{"op": "close", "status": "KILLED"}])
    proto.write(json.dumps({"event": "stats", "cpu_s": time.process_time() - cpu0,
                            **log.stats()}) + "\n")
    proto.close()
    sys.stderr.flush()
    os._exit(0)  # all committed; skip the ~1 s interpreter teardown (MLflow's exit hooks)

