"""The front end of MLflow tracking: :class:`StudyTracker`, the Optuna callback a study
launch uses (see the package docstring for what it logs and its guarantees)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from crossflow.search.keys import SURPLUS  # a trial never evaluated: it gets no run
from crossflow.search.locations import default_tracking_uri, git_revision, redact
from crossflow.search.tracking.logger import (
    BATCH_RUNS,
    WORKER_BOOT,
    _gather,
    _Logger,
    bound_http,
)
from crossflow.search.tracking.paths import resolve_locations
from crossflow.search.tracking.records import (
    _finished,
    _ms,
    _plain,
    _serialize,
    flatten,
    is_logged,
    runs_view,
    trial_record,
)

#: At the end of a launch, the logger has this long to log what it was sent (a bound: a
#: tracking store that stops answering must not hold the launch; each of its requests is
#: bounded too, see :data:`.logger.HTTP_BOUNDS`).
DRAIN_S = 300.0


def unlogged_trials(study: Any, study_name: str, tracking_uri: str | None) -> list[int]:
    """Numbers of ``study``'s finished trials without a run in the study's experiment at
    ``tracking_uri`` (None: the default store), read without writing: a store or experiment
    that does not exist has none of them.  Raises whatever MLflow raises for a store that
    cannot be read."""
    import logging

    from crossflow.search.tracking.check import local_path

    finished = _finished(study)
    if not finished:
        return []
    uri = tracking_uri or default_tracking_uri()
    path = local_path(uri)
    if path is not None and not path.exists():  # no store yet: MLflow would create one
        return [t.number for t in finished]
    from mlflow import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(study_name)
    if exp is None or exp.lifecycle_stage == "deleted":
        return [t.number for t in finished]
    reader = _Logger()
    reader.client, reader.experiment_id = client, exp.experiment_id
    known = {n: [s for s, _ in runs] for n, runs in reader._trial_runs().items()}
    return [t.number for t in finished if not is_logged(known, t.number, _ms(t.datetime_start))]


class StudyTracker:
    """Optuna callback that logs a study to MLflow; use as a context manager (see module
    docstring).

    Args:
        study_name: the Optuna study name, also the MLflow experiment name.
        tracking_uri: MLflow tracking URI; None: ``sqlite:///<cwd>/mlruns/mlflow.db``.
        launch_params: this launch's settings (sampler, seed, n_trials, storage, …): params
            and tags of the parent run.
        search_space: the study's search space (plain data or Optuna distributions).
        artifact_root: where new experiments keep artifacts; None: see
            :func:`resolve_locations`.
        study: optional; the study, so finished trials without runs are back-filled as soon
            as the tracker starts (otherwise at the first callback, ``finish`` or exit).
        mode: ``"process"`` (default) or ``"thread"``: where the MLflow calls run.
        bulk: write trial runs in batches, one transaction each, on MLflow's SQL stores
            (default); False: one ``create_run`` + ``log_batch`` + ``set_terminated`` each.
        batch_size: most trial runs in one batch (:data:`.logger.BATCH_RUNS`).
        description: the study's description, shown as its MLflow experiment's.
    """

    def __init__(self, study_name: str, tracking_uri: str | None,
                 launch_params: dict[str, Any], search_space: dict,
                 artifact_root: str | None = None, *, study: Any = None,
                 mode: str = "process", bulk: bool = True,
                 batch_size: int = BATCH_RUNS, description: str | None = None) -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', not {mode!r}")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size!r}")
        self.batch_size = int(batch_size)
        self.study_name = study_name
        self.description = description
        self.tracking_uri, self.artifact_root = resolve_locations(tracking_uri, artifact_root)
        self.launch_params = dict(launch_params or {})
        self.search_space = search_space or {}
        self.mode = mode
        self.bulk = bulk
        self.sampler_name = str(self.launch_params.get("sampler", "")) or None
        self._study = study
        self._metric_names: list[str] | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._sent: set[int] = set()
        self._known: dict[int, list[int]] | None = None
        self._ready = threading.Event()
        #: the study's storage failed a read (a database away past its reconnect window, a
        #: journal deleted): later reads are skipped rather than each waiting that window
        self._storage_gone = False
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._stderr_path: str | None = None
        self._logger: _Logger | None = None
        self._tmp: Path | None = None
        self._events: list[dict[str, Any]] = []
        self._active = False
        self._finished = False
        self.parent_run_id: str | None = None
        #: after the with block: numbers of the study's finished trials without an MLflow
        #: run (reported on stderr; ``crossflow study run`` then exits 1), of how many
        self.missing_runs: list[int] = []
        self.finished_trials = 0
        self.experiment_id: str | None = None
        #: timings (s) and counts, filled as the tracker runs (``benchmarks/bench_study.py``)
        self.stats: dict[str, Any] = {"mode": mode, "callback_s": 0.0, "callbacks": 0,
                                      "enter_s": 0.0, "finish_s": 0.0, "drain_s": 0.0,
                                      "front_thread_cpu_s": 0.0, "records_sent": 0}

    # -- context manager
    def __enter__(self) -> StudyTracker:
        t0 = time.perf_counter()
        import crossflow

        rev, dirty = git_revision()
        lp = self.launch_params
        tags = {"crossflow.kind": "launch", "crossflow_version": crossflow.__version__,
                "git_revision": rev, "mlflow.source.git.commit": rev,
                "optuna.study_name": self.study_name,
                "sampler": str(lp.get("sampler", "")), "seed": str(lp.get("seed", ""))}
        if dirty is not None:
            tags["git_dirty"] = str(dirty).lower()
        params = flatten(_plain(lp))
        params.update(flatten(_plain(self.search_space), "space."))
        params.setdefault("crossflow_version", crossflow.__version__)
        params.setdefault("git_revision", rev)
        now = datetime.now()
        self._enter_ms = _ms(now)
        init = {"op": "init", "tracking_uri": self.tracking_uri,
                "artifact_root": self.artifact_root, "study_name": self.study_name,
                "run_name": f"launch-{now:%Y%m%d-%H%M%S}", "start_ms": _ms(now),
                "tags": tags, "params": params, "bulk": self.bulk,
                "batch": self.batch_size, "description": self.description,
                "view": json.dumps(runs_view(self._objectives(), self._space()),
                                   separators=(",", ":"))}
        self._tmp = Path(tempfile.mkdtemp(prefix="crossflow-tracking-"))
        launch_dir = self._tmp / "launch"
        launch_dir.mkdir()
        with (launch_dir / "search_space.yaml").open("w") as fh:
            yaml.safe_dump(_plain(self.search_space), fh, sort_keys=False)
        with (launch_dir / "launch_params.yaml").open("w") as fh:
            yaml.safe_dump(_plain({**lp, "crossflow_version": crossflow.__version__,
                                   "git_revision": rev}), fh, sort_keys=False)
        if self.mode == "process" and not self._start_process():
            self.mode = self.stats["mode"] = "thread"
        if self.mode == "thread":
            self._logger = _Logger()
        self._queue.put(("msg", init))
        self._queue.put(("msg", {"op": "artifacts", "dir": str(launch_dir), "path": "launch"}))
        if self._study is not None:
            self._queue.put(("sweep", self._study))
        self._thread = threading.Thread(target=self._front, name="crossflow-mlflow",
                                        daemon=True)
        self._thread.start()
        self._active = True
        self.stats["enter_s"] = time.perf_counter() - t0
        return self

    def __call__(self, study: Any, trial: Any) -> None:
        """Optuna callback: queue ``trial`` for logging (microseconds)."""
        t0 = time.perf_counter()
        if not self._active:
            raise RuntimeError("StudyTracker must be used as a context manager "
                               "(with StudyTracker(...) as tracker: ...)")
        if self._study is not study:
            self._study = study
            self._queue.put(("sweep", study))  # resumed study: back-fill
        self._queue.put(("trial", study, trial))
        self.stats["callbacks"] += 1
        self.stats["callback_s"] += time.perf_counter() - t0

    def sweep(self, study: Any) -> None:
        """Queue every finished trial of ``study`` that has no run yet (trials that other
        processes ran: ``study run --workers K`` sweeps the storage each second)."""
        if not self._active:
            raise RuntimeError("StudyTracker.sweep must be called inside the with block")
        self._study = study
        self._queue.put(("sweep", study))

    def finish(self, study: Any, best_design: dict | None) -> None:
        """Queue the parent run's summary: artifacts ``best_design.yaml`` (``best_design``,
        or the best trial's decoded parameters when None), ``trials.csv``,
        ``optimization_history.png``, ``param_importances.png``; metrics
        ``best_<objective>`` (single objective) or ``n_pareto_trials``, ``n_trials`` and
        ``n_trials_<state>``.  They are drawn by the logger (in the worker process, which has
        matplotlib and Optuna's importance module imported while the study ran) from a
        snapshot of the study's trials."""
        t0 = time.perf_counter()
        if not self._active:
            raise RuntimeError("StudyTracker.finish must be called inside the with block")
        self._study = study
        self._queue.put(("sweep", study))
        self._queue.put(("summary", study, _plain(best_design) if best_design is not None
                         else None))
        self.stats["finish_s"] = time.perf_counter() - t0

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Send every finished trial, then wait until all are logged (also on Ctrl-C)."""
        t0 = time.perf_counter()
        self._active = False
        status = ("FINISHED" if exc_type is None else
                  "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")
        if self._study is not None:
            self._queue.put(("sweep", self._study))
        self._queue.put(("msg", {"op": "close", "status": status}))
        self._queue.put(("stop",))
        try:
            self._drain(time.monotonic() + DRAIN_S)
        except KeyboardInterrupt:  # a second Ctrl-C while waiting
            if self._proc is not None and not self._thread.is_alive():
                print(f"crossflow: MLflow logging goes on in the background (process "
                      f"{self._proc.pid}) until every finished trial is logged",
                      file=sys.stderr)
            else:
                print("crossflow: MLflow logging interrupted; trials without a run are "
                      "logged when this study is next launched", file=sys.stderr)
            raise
        self.stats["drain_s"] = time.perf_counter() - t0
        self._collect()
        shutil.rmtree(self._tmp, ignore_errors=True)
        return False

    # -- internals
    def _drain(self, deadline: float) -> None:
        """Wait for the logger to log what it was sent, until ``deadline`` (monotonic); past
        it, say so and stop the logging process (its group), so nothing outlives the
        launch.  Runs it had not logged are counted missing by :meth:`_collect`."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._proc is not None:
            if self._reader is not None:  # its output ends as it exits: no polling wait
                self._reader.join(max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(max(0.0, deadline - time.monotonic()))
        if self._proc is not None and self._proc.poll() is None:
            from crossflow.search.children import kill_group

            self.stats["drain_timeout"] = True
            print(f"crossflow: error: MLflow logging did not finish within {DRAIN_S:g} s "
                  f"(tracking store {redact(self.tracking_uri)}); stopped it", file=sys.stderr)
            kill_group(self._proc, grace=5.0)
        elif self._thread.is_alive():  # thread mode: the daemon thread is left to the exit
            self.stats["drain_timeout"] = True
            print(f"crossflow: error: MLflow logging did not finish within {DRAIN_S:g} s "
                  f"(tracking store {redact(self.tracking_uri)})", file=sys.stderr)
        if self._reader is not None:
            self._reader.join(5.0)

    def _objectives(self) -> list[str]:
        """The objectives' names the launch parameters give (a study's), else none."""
        lp = self.launch_params
        cand = lp.get("metric_names", lp.get("objectives", lp.get("objective")))
        cand = [cand] if isinstance(cand, str) else cand
        return [str(c) for c in cand] if isinstance(cand, list | tuple) else []

    def _space(self) -> dict[str, Any] | None:
        """The search space part of the study's description (simplexes, dimensions)."""
        space = self.search_space
        inner = space.get("search_space", space) if isinstance(space, dict) else None
        return inner if isinstance(inner, dict) and ("simplexes" in inner
                                                     or "dimensions" in inner) else None

    def _names(self, study: Any) -> list[str]:
        if self._metric_names is None:
            n = len(study.directions)
            names = study.metric_names
            if not names:
                lp = self.launch_params
                cand = lp.get("metric_names", lp.get("objectives", lp.get("objective")))
                cand = [cand] if isinstance(cand, str) else cand
                names = ([str(c) for c in cand] if isinstance(cand, list | tuple)
                         and len(cand) == n else None)
            self._metric_names = list(names) if names else (
                ["value"] if n == 1 else [f"value_{i}" for i in range(n)])
        return self._metric_names

    def _sampler(self, study: Any) -> str:
        if self.sampler_name is None:
            self.sampler_name = type(study.sampler).__name__
        return self.sampler_name

    def _start_process(self) -> bool:
        from crossflow.search.children import spawn_child
        from crossflow.search.workers import child_env

        with tempfile.NamedTemporaryFile(prefix="crossflow-mlflow-", suffix=".log",
                                         delete=False) as err:
            self._stderr_path = err.name
            try:  # its own session (a second Ctrl-C does not stop it); dies with this one
                self._proc = spawn_child(
                    [sys.executable, "-c", WORKER_BOOT],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                    env=bound_http(child_env()), text=True)
            except OSError as exc:
                warnings.warn(f"MLflow worker process did not start ({exc}); logging in a "
                              "thread", RuntimeWarning, stacklevel=3)
                return False
        self._reader = threading.Thread(target=self._read_events, daemon=True,
                                        name="crossflow-mlflow-events")
        self._reader.start()
        return True

    def _read_events(self) -> None:
        for line in self._proc.stdout:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                self._events.append(event)
                if event.get("event") == "ready":
                    self._known = {int(n): s for n, s in event.get("known", {}).items()}
                    self._ready.set()
        self._ready.set()

    def _dispatch(self, msgs: list[dict[str, Any]]) -> None:
        """To the logger (thread mode) or down the worker's stdin (process mode)."""
        if not msgs:
            return
        if self._logger is not None:
            self._logger.handle_many(msgs)
            if any(m["op"] == "init" for m in msgs):
                self._known = {n: list(s) for n, s in self._logger.known.items()}
                self._ready.set()
            return
        try:
            self._proc.stdin.write("".join(json.dumps(m, separators=(",", ":")) + "\n"
                                           for m in msgs))
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.stats["send_errors"] = self.stats.get("send_errors", 0) + 1

    def _trial_msg(self, study: Any, trial: Any) -> dict[str, Any] | None:
        if trial.number in self._sent or trial.user_attrs.get(SURPLUS):
            return None
        self._sent.add(trial.number)
        record = trial_record(trial, self._sampler(study), self._names(study))
        # a trial that started before this launch: back-filled from an earlier launch
        backfill = record["start_ms"] is not None and record["start_ms"] < self._enter_ms
        self.stats["records_sent"] += 1
        return {"op": "trial", "record": record, "backfill": backfill}

    def _summary_msg(self, study: Any, best_design: Any) -> dict[str, Any]:
        return {"op": "summary", "study_name": self.study_name,
                "directions": [d.name.lower() for d in study.directions],
                "metric_names": self._names(study), "sampler": self._sampler(study),
                "best_design": best_design, "space": _plain(self.search_space),
                "trials": [_serialize(t) for t in study.get_trials(deepcopy=False)]}

    def _read_study(self, read, *args: Any) -> Any:
        """``read(*args)``, which reads the study's storage; None when the storage fails
        (a journal deleted, a database gone): the launch's own thread meets the same error
        and reports it, so this thread logs what it can instead of dying with a
        traceback.  After one failure it reads no more (each read of a database that is
        gone waits out the reconnect window: queued sweeps would hold the launch's end for
        minutes)."""
        if self._storage_gone:
            return None
        try:
            return read(*args)
        except Exception as exc:  # noqa: BLE001 - see above
            self._storage_gone = True
            self.stats.setdefault("storage_errors", []).append(f"{type(exc).__name__}: {exc}")
            return None

    def _front(self) -> None:
        """Queue -> messages, in batches of whatever is waiting -> :meth:`_dispatch`."""
        cpu0 = time.thread_time()
        try:
            stop = False
            thread = self._logger is not None
            while not stop:
                items = _gather(self._queue, lambda i: thread and i[0] == "trial")
                msgs: list[dict[str, Any]] = []
                for item in items:
                    kind = item[0]
                    if kind == "stop":
                        stop = True
                        break
                    if kind == "msg":
                        msgs.append(item[1])
                    elif kind == "trial":
                        msgs.append(self._read_study(self._trial_msg, item[1], item[2]))
                    elif kind == "summary":
                        msgs.append(self._read_study(self._summary_msg, item[1], item[2]))
                    elif kind == "sweep":  # every finished trial without a run
                        self._dispatch([m for m in msgs if m])
                        msgs = []
                        self._ready.wait(timeout=120)
                        known = self._known or {}
                        msgs += self._read_study(lambda study, known=known: [
                            self._trial_msg(study, t) for t in _finished(study)
                            if not is_logged(known, t.number, _ms(t.datetime_start))],
                            item[1]) or []
                self._dispatch([m for m in msgs if m])
        finally:
            if self._proc is not None:
                with contextlib.suppress(BrokenPipeError, OSError, ValueError):
                    self._proc.stdin.close()
            self.stats["front_thread_cpu_s"] = time.thread_time() - cpu0

    def _missing(self, worker: dict[str, Any]) -> list[int]:
        """Numbers of the study's finished trials that have no MLflow run after this launch
        (by the logger's final account of the store; every finished trial when the logger
        gave none)."""
        if self._study is None or self._storage_gone:
            return []
        try:
            numbers = [t.number for t in _finished(self._study)]
        except Exception:  # the storage is gone too: nothing to compare with
            return []
        self.finished_trials = len(numbers)
        logged = set(worker.get("trials_with_runs") or [])
        return [n for n in numbers if n not in logged]

    def _collect(self) -> None:
        if self._logger is not None:
            worker = {**self._logger.stats(), "cpu_s": self.stats["front_thread_cpu_s"]}
        else:
            worker = next((e for e in reversed(self._events) if e.get("event") == "stats"), None)
            if worker is None:
                worker = {"errors": [f"MLflow worker exited with code {self._proc.returncode} "
                                     f"without reporting; see {self._stderr_path}"]}
        self.stats["worker"] = worker
        self.parent_run_id = worker.get("parent_run_id")
        self.experiment_id = worker.get("experiment_id")
        tail = ""
        if self._stderr_path and os.path.exists(self._stderr_path):
            tail = Path(self._stderr_path).read_text(errors="replace")[-2000:].strip()
        self.missing_runs = self._missing(worker)
        if self.missing_runs:
            first = " ".join((worker.get("errors") or ["no error was reported"])[0].split())
            first = first if len(first) <= 240 else first[:239] + "…"  # one paragraph
            # no account from the logger (stopped, crashed): runs it made are not known
            lack = ("have no MLflow run" if "trials_with_runs" in worker
                    else "have no MLflow run known to have been logged")
            print(f"crossflow: error: {len(self.missing_runs)} of {self.finished_trials} "
                  f"finished trials {lack} in {redact(self.tracking_uri)} (first "
                  f"trial without one: {self.missing_runs[0]}; {first}); the trials are safe "
                  "in the study's storage and are logged when the study is next launched "
                  "with the tracking store reachable"
                  + (f" (logging process's log: {self._stderr_path})" if tail else ""),
                  file=sys.stderr)
        elif worker.get("errors"):
            warnings.warn(f"MLflow logging had errors (every trial has its run): "
                          f"{worker['errors']}"
                          + (f"\nworker log {self._stderr_path}:\n{tail}" if tail else ""),
                          RuntimeWarning, stacklevel=3)
        if self._stderr_path and not ((worker.get("errors") or self.missing_runs) and tail):
            with contextlib.suppress(OSError):
                os.unlink(self._stderr_path)

