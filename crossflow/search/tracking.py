"""MLflow tracking of Optuna studies (docs/architecture.md, "Data flow of one study trial";
issue #4 item 6).

::

    with StudyTracker(study_name, tracking_uri, launch_params, search_space) as tracker:
        study.optimize(objective, n_trials=n, callbacks=[tracker])
        tracker.finish(study, best_design)

* One MLflow experiment per study (named after it); one **parent run per launch** (params:
  the launch parameters and the search space; tags: sampler, seed, CrossFlow version, git
  revision; artifact ``launch/search_space.yaml``); one **child run per finished trial**
  (tag ``mlflow.parentRunId``), with the decoded parameters as params, the values and the
  unit-suffixed user attributes (``iteration_time_s``, ``energy_J``, ``*_bytes``, …) as
  metrics, and tags ``state``, ``infeasible_reason``, ``sampler``, ``chain``,
  ``trial_number``.  :meth:`StudyTracker.finish` adds the best design (YAML), every trial
  (CSV), the optimisation-history and parameter-importance plots (PNG) and summary metrics
  to the parent run.
* **Off the critical path.**  ``tracker(study, trial)`` only puts the trial on a queue
  (microseconds).  By default a worker *process* (one ``MlflowClient``) does the MLflow
  work, on the other core: the trials waiting (up to :data:`LINGER_S`) go into one
  transaction of MLflow's SQL store (~2 ms a run, see :class:`_Logger`); a tracking server
  gets ``create_run`` + one ``log_batch`` + ``set_terminated`` per run (~20 ms of Python CPU
  each, which in a thread would hold the GIL the sampler and CrossFlow need).  The worker
  also draws the summary plots, having imported matplotlib and Optuna's importance module
  while the study ran.  ``mode="thread"`` keeps all this in a thread of this process (also
  the fallback when the process cannot start).
* **Complete.**  ``__exit__`` (also on Ctrl-C or an exception) sends every finished trial not
  yet sent — including one that Ctrl-C interrupted (Optuna records it FAIL without calling
  the callbacks) — and waits until the worker has logged them.  The worker runs in its own
  session, so a second Ctrl-C does not stop it: it finishes what it was sent and exits.
* **Exactly once.**  Runs are keyed by the tag ``trial_number``.  On start the worker reads
  the trial numbers already logged in the experiment; the tracker back-fills every finished
  trial of the study that has no run (a resumed study, or trials a crashed launch never
  logged) and skips the rest; at close it deletes any duplicate that concurrent launches on
  one study raced to create (keeping the smallest run id, so all launches agree).

``mlflow`` (and optuna, matplotlib) are imported inside functions, never when this module is
imported.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from crossflow.search.keys import CHAIN, FEASIBLE, REASON, TRIAL_NUMBER_TAG
from crossflow.search.locations import default_tracking_uri, git_revision, redact_text
from crossflow.search.workers import SURPLUS  # a trial never evaluated: it gets no run

#: User attributes with these name endings are metrics (their unit is in the name).
METRIC_SUFFIXES = ("_s", "_J", "_W", "_bytes", "_flops_per_s")
#: User attributes that become tags, not parameters.
INFEASIBLE_REASON = REASON
CHAIN_ATTR = CHAIN
#: A run is the run of a trial when it has the trial's number and a start time within this
#: many milliseconds of the trial's (storages round datetimes; a study deleted and created
#: again under the same name starts its trial 0 much later, so its trials are logged anew).
SAME_TRIAL_MS = 1000

#: Namespace of trial run ids: uuid5(namespace, "<experiment id>/<trial number>/<start ms>").
_RUN_NAMESPACE = uuid.UUID("5f0c3b7e-6c1a-4d51-9a43-0c2f1e8d7a10")

_MAX_PARAM = 6000   # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
_MAX_TAG = 8000     # MAX_TAG_VAL_LENGTH
_MAX_KEY = 250      # MAX_ENTITY_KEY_LENGTH
_PER_BATCH = 100    # MAX_PARAMS_TAGS_PER_BATCH
_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}


# --------------------------------------------------------------------------- locations

def resolve_locations(tracking_uri: str | None,
                      artifact_root: str | None = None) -> tuple[str, str | None]:
    """(tracking URI, artifact root URI or None).

    No URI: the SQLite store ``<cwd>/mlruns/mlflow.db`` with artifacts in
    ``<cwd>/mlruns/artifacts``.  A ``sqlite:///path/x.db`` URI: artifacts beside the
    database (``path/artifacts``).  A server (``http(s)://``, ``databricks``): the server's
    own artifact store unless ``artifact_root`` is given.  Any other database URI:
    ``<cwd>/mlruns/artifacts``.  Local artifact directories are created."""
    uri = tracking_uri or default_tracking_uri()
    if artifact_root is None:
        if uri.startswith(("http://", "https://", "databricks")):
            return uri, None
        if uri.startswith("sqlite:///"):
            db = Path(uri[len("sqlite:///"):])
            db.parent.mkdir(parents=True, exist_ok=True)
            artifact_root = str(db.parent.resolve() / "artifacts")
        else:
            artifact_root = str(Path.cwd().resolve() / "mlruns" / "artifacts")
    if "://" not in artifact_root:
        path = Path(artifact_root).resolve()
        path.mkdir(parents=True, exist_ok=True)
        artifact_root = path.as_uri()
    return uri, artifact_root.rstrip("/")


# --------------------------------------------------------------------------- records

def _key(name: str) -> str:
    """A valid MLflow param / metric / tag name."""
    out = "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in str(name))
    out = out.replace("//", "/").strip("/") or "_"
    if out.startswith("..") or out == ".":
        out = "_" + out
    return out[:_MAX_KEY]


def _plain(value: Any) -> Any:
    """YAML/JSON-safe plain data (Optuna distributions become their JSON form)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        with contextlib.suppress(Exception):
            return _plain(value.item())
    if type(value).__module__.startswith("optuna.distributions"):
        from optuna.distributions import distribution_to_json

        return json.loads(distribution_to_json(value))
    return str(value)


def _text(value: Any, limit: int) -> str:
    if isinstance(value, str):  # never log a password in a storage / tracking URL
        return redact_text(value)[:limit]
    if isinstance(value, float | int | bool) or value is None:
        return str(value)[:limit]
    return json.dumps(_plain(value), separators=(",", ":"), sort_keys=True)[:limit]


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> {"a.b.c": text}; lists and scalars are leaves."""
    out: dict[str, str] = {}
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, name + "."))
        else:
            out[_key(name)] = _text(v, _MAX_PARAM)
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _ms(dt: datetime | None) -> int | None:
    return int(dt.timestamp() * 1000) if dt is not None else None


def trial_record(trial: Any, sampler: str, metric_names: list[str]) -> dict[str, Any]:
    """Everything the child run of ``trial`` (an Optuna ``FrozenTrial``) holds, as plain
    data: ``params`` (text), ``metrics`` (float), ``tags`` (text), times (ms).

    Params are ``trial.params`` overlaid with the user attributes that hold decoded values
    (scalars: fractions such as ``area.core``, ``strategy``, ``mapping_order``; dicts are
    flattened to ``name.key``); a raw parameter a decoded attribute replaces (the encoded
    simplex coordinate ``area.core``) is kept as ``encoded.<name>``.  Metrics are the trial's
    values (named by ``metric_names``) and the numeric user attributes whose names end in a
    unit (:data:`METRIC_SUFFIXES`); non-finite values are left out.  An infeasible trial's
    values (the study's graded penalty) are ``penalty.<name>``."""
    params: dict[str, Any] = dict(trial.params)
    metrics: dict[str, float] = {}
    user = trial.user_attrs
    decoded: dict[str, Any] = {}
    for k, v in user.items():
        if k in (INFEASIBLE_REASON, CHAIN_ATTR):
            continue
        if k.endswith(METRIC_SUFFIXES) and _is_number(v):
            if math.isfinite(v):
                metrics[_key(k)] = float(v)
        elif isinstance(v, Mapping):
            decoded.update({f"{k}.{sk}": sv for sk, sv in v.items()})
        else:
            decoded[k] = v
    for k, v in decoded.items():
        if k in params and params[k] != v:
            params[f"encoded.{k}"] = params[k]
        params[k] = v
    values = trial.values or []
    constraints = getattr(trial, "constraints", None) or {}
    infeasible = user.get(FEASIBLE) is False or any(c > 0 for c in constraints.values())
    for name, v in zip(metric_names, values, strict=False):
        if v is not None and math.isfinite(v):
            # an infeasible design's value is the study's penalty, not a time or an energy:
            # kept apart, so a metric column and its sorting show real values only
            metrics.setdefault(_key(f"penalty.{name}" if infeasible else name), float(v))
    state = trial.state.name
    tags = {TRIAL_NUMBER_TAG: str(trial.number), "state": state, "sampler": sampler,
            "mlflow.runName": f"trial-{trial.number:05d}"}
    reason = user.get(INFEASIBLE_REASON)
    if constraints:
        violated = {k: c for k, c in constraints.items() if c > 0}
        tags[FEASIBLE] = "false" if violated or reason else "true"
        if violated and reason is None:
            reason = "; ".join(f"constraint {k} = {c:g} > 0" for k, c in violated.items())
    elif reason is not None:
        tags[FEASIBLE] = "false"
    if reason is not None:
        tags[INFEASIBLE_REASON] = _text(reason, _MAX_TAG)
    chain = user.get(CHAIN_ATTR, trial.system_attrs.get(CHAIN_ATTR))
    if chain is not None:
        tags["chain"] = _text(chain, _MAX_TAG)
    start = _ms(trial.datetime_start)
    end = _ms(trial.datetime_complete)
    return {"number": trial.number, "state": state,
            "params": {_key(k): _text(v, _MAX_PARAM) for k, v in params.items()},
            "metrics": metrics, "tags": tags, "start_ms": start or end, "end_ms": end or start}


def _finished(study: Any) -> list[Any]:
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False, states=(
        TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
        if not t.user_attrs.get(SURPLUS)]


def trial_run_id(experiment_id: str | int, number: int, start_ms: int | None) -> str:
    """The MLflow run id of a trial's run on SQL stores: the same in every process that logs
    it (an experiment is one study), so a trial logged twice — by a retried or restarted
    worker, or by two launches back-filling at once — is inserted once."""
    return uuid.uuid5(_RUN_NAMESPACE, f"{experiment_id}/{number}/{start_ms}").hex


def is_logged(known: Mapping[int, list[int]], number: int, start_ms: int | None) -> bool:
    """Whether ``known`` (trial number -> start times of its runs) has this trial's run."""
    return any(start_ms is None or abs(s - start_ms) <= SAME_TRIAL_MS
               for s in known.get(number, ()))


def duplicates(runs: list[tuple[int, str]]) -> list[str]:
    """Run ids to delete among one trial number's runs [(start ms, run id)]: runs whose
    start times agree (within :data:`SAME_TRIAL_MS`) are one trial's; of those the smallest
    run id stays, so concurrent launches deduplicating at once delete the same runs."""
    out: list[str] = []
    group: list[tuple[int, str]] = []
    for start, run_id in sorted(runs) + [(None, "")]:
        if group and (start is None or start - group[0][0] > SAME_TRIAL_MS):
            out += sorted(r for _, r in group)[1:]
            group = []
        if start is not None:
            group.append((start, run_id))
    return out


def _serialize(trial: Any) -> dict[str, Any]:
    """A FrozenTrial as JSON-able data (what the summary needs)."""
    from optuna.distributions import distribution_to_json

    return {"number": trial.number, "state": trial.state.name, "values": trial.values,
            "params": _plain(trial.params),
            "distributions": {k: distribution_to_json(d) for k, d in trial.distributions.items()},
            "user_attrs": _plain(trial.user_attrs),
            "system_attrs": {k: _plain(v) for k, v in trial.system_attrs.items()
                             if k == CHAIN_ATTR or k.startswith("constraints:")},
            "start": trial.datetime_start.isoformat() if trial.datetime_start else None,
            "complete": (trial.datetime_complete.isoformat() if trial.datetime_complete
                         else None)}


def _deserialize(data: Mapping[str, Any], **system_attrs: Any) -> Any:
    from optuna.distributions import json_to_distribution
    from optuna.trial import FrozenTrial, TrialState

    return FrozenTrial(
        number=data["number"], state=TrialState[data["state"]], value=None,
        values=data["values"],
        datetime_start=datetime.fromisoformat(data["start"]) if data["start"] else None,
        datetime_complete=datetime.fromisoformat(data["complete"]) if data["complete"] else None,
        params=data["params"],
        distributions={k: json_to_distribution(v) for k, v in data["distributions"].items()},
        user_attrs=data["user_attrs"], system_attrs={**data["system_attrs"], **system_attrs},
        intermediate_values={}, trial_id=data["number"])


def render_summary(out: Path, msg: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """Write the summary artifacts of a study (``msg``: see ``StudyTracker.finish``) into
    ``out``; return the parent run's (metrics, tags)."""
    import optuna

    from crossflow.search import _plots

    names, directions, title = msg["metric_names"], msg["directions"], msg["study_name"]
    trials = [_deserialize(d) for d in msg["trials"]]
    finished = [t for t in trials if t.state.is_finished()]
    _plots.write_csv(out / "trials.csv", [trial_record(t, msg["sampler"], names)
                                          for t in finished])
    metrics: dict[str, float] = {"n_trials": float(len(trials))}
    for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING"):
        metrics[f"n_trials_{state.lower()}"] = float(sum(t.state.name == state for t in trials))
    # an in-memory copy of the study (numbers kept in a system attribute: add_trials renumbers)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line
    try:
        study = optuna.create_study(directions=directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    study.add_trials([_deserialize(d, **{"crossflow:number": d["number"]})
                      for d in msg["trials"] if d["state"] in ("COMPLETE", "PRUNED", "FAIL")])
    by_number = {t.number: t for t in trials}
    tags: dict[str, str] = {}
    best = None
    try:
        if len(directions) == 1:
            best = by_number[study.best_trial.system_attrs["crossflow:number"]]
            metrics[f"best_{_key(names[0])}"] = float(best.values[0])
            tags["best_trial_number"] = str(best.number)
        else:
            front = sorted(t.system_attrs["crossflow:number"] for t in study.best_trials)
            metrics["n_pareto_trials"] = float(len(front))
            tags["pareto_trial_numbers"] = _text(front, _MAX_TAG)
    except (ValueError, RuntimeError):  # no complete trial
        pass
    design = msg["best_design"]
    if design is None and best is not None:
        rec = trial_record(best, msg["sampler"], names)
        design = {"trial_number": best.number, "values": best.values,
                  "params": {k: _yaml_scalar(v) for k, v in rec["params"].items()}}
    with (out / "best_design.yaml").open("w") as fh:
        yaml.safe_dump(design if design is not None else
                       {"best_design": None, "note": "no complete trial"}, fh, sort_keys=False)
    _plots.history_png(out / "optimization_history.png", trials, directions, names, title)
    tags["importance_method"] = _plots.importance_png(out / "param_importances.png", study,
                                                      names, title)
    return metrics, tags


# --------------------------------------------------------------------------- MLflow side

class _Logger:
    """Executes tracking messages with one ``MlflowClient``.  Runs in the worker process
    (default) or in the tracker's thread; holds the trial numbers already logged.

    Trial runs are written in batches: on MLflow's SQL stores (SQLite, PostgreSQL, MySQL)
    every trial waiting in the queue goes into one transaction, through the store's own
    SQLAlchemy tables (``runs``, ``tags``, ``params``, ``metrics``, ``latest_metrics``,
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
        self.logged = 0
        self.logged_bulk = 0
        self.skipped = 0
        self.duplicates_removed = 0
        self.errors: list[str] = []
        self.notes: list[str] = []
        self.busy_s = 0.0
        self.setup_s = 0.0

    # -- dispatch
    def handle_many(self, msgs: list[dict[str, Any]]) -> None:
        """Handle messages in order, each run of consecutive trial messages as one batch."""
        batch: list[dict[str, Any]] = []
        for msg in msgs:
            if msg["op"] == "trial":
                batch.append(msg)
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
            if op == "init":
                self.setup_s = dt

    def stats(self) -> dict[str, Any]:
        return {"runs_logged": self.logged, "runs_logged_in_batches": self.logged_bulk,
                "skipped_existing": self.skipped, "duplicates_removed": self.duplicates_removed,
                "busy_s": self.busy_s, "setup_s": self.setup_s, "errors": self.errors,
                "notes": self.notes, "batched": self.bulk,
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

    def _engine(self):
        store = getattr(getattr(self.client, "_tracking_client", None), "store", None)
        return getattr(store, "engine", None)

    def _trial_runs(self) -> dict[int, list[tuple[int, str]]]:
        """trial number -> [(start time ms, run id)] of the active child runs in the
        experiment.  One SQL query on MLflow's SQL stores (its ``runs`` and ``tags`` tables),
        else paginated ``search_runs``."""
        out: dict[int, list[tuple[int, str]]] = {}
        engine = self._engine()
        rows = None
        if engine is not None:
            try:
                import sqlalchemy

                q = sqlalchemy.text(
                    "SELECT t.value, r.start_time, r.run_uuid FROM tags t JOIN runs r "
                    "ON r.run_uuid = t.run_uuid WHERE r.experiment_id = :eid "
                    "AND r.lifecycle_stage = 'active' AND t.key = :key")
                with engine.connect() as conn:
                    rows = conn.execute(q, {"eid": int(self.experiment_id),
                                            "key": TRIAL_NUMBER_TAG}).all()
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
        name = msg["study_name"]
        for attempt in range(6):  # launches creating one new database race in its migrations
            try:
                with _db_lock(msg["tracking_uri"]):
                    client = MlflowClient(tracking_uri=msg["tracking_uri"])
                    exp = client.get_experiment_by_name(name)
                break
            except Exception:
                if attempt == 5:
                    raise
                time.sleep(0.25 * 2 ** attempt)
        if exp is None:
            location = msg["artifact_root"]
            if location:
                location = f"{location}/{_key(name).replace('/', '_').replace(' ', '_')}"
            try:
                eid = client.create_experiment(name, artifact_location=location,
                                               tags={"crossflow.study": name})
            except MlflowException:  # another launch created it meanwhile
                exp = client.get_experiment_by_name(name)
                if exp is None:
                    raise
                eid = exp.experiment_id
        else:
            eid = exp.experiment_id
            if exp.lifecycle_stage == "deleted":
                client.restore_experiment(eid)
        self.client, self.experiment_id = client, eid
        self.artifact_location = client.get_experiment(eid).artifact_location
        self.bulk = bool(msg.get("bulk", True)) and self._engine() is not None
        self.known = {n: [s for s, _ in runs] for n, runs in self._trial_runs().items()}
        parent = client.create_run(eid, start_time=msg["start_ms"], tags=msg["tags"],
                                   run_name=msg["run_name"])
        self.parent_run_id = parent.info.run_id
        self._log(self.parent_run_id, params=msg["params"])

    def _op_trials(self, msgs: list[dict[str, Any]]) -> None:
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
            from crossflow.search.storage import retrying

            try:
                inserted = retrying(lambda: self._insert_runs(new))
                self.logged += inserted
                self.logged_bulk += inserted
                self.skipped += len(new) - inserted  # logged by another process
                done, new = new, []
            except Exception as exc:  # rolled back: log them one by one instead
                self.bulk = False
                self.notes.append(f"batch insert disabled: {type(exc).__name__}: {exc}"[:500])
        for rec in new:
            try:
                self._create_run(rec)
                done.append(rec)
                self.logged += 1
            except Exception as exc:
                if len(self.errors) < 20:
                    self.errors.append(f"trial {rec['number']}: {type(exc).__name__}: {exc}"[:500])
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

    def _insert_runs(self, recs: list[dict[str, Any]]) -> int:
        """Trial runs in one transaction of MLflow's SQL store (:meth:`_write_runs`), under
        ids of :func:`trial_run_id`; runs another process inserted already are left alone.
        Returns how many were inserted (or restored)."""
        import sqlalchemy

        by_id = {trial_run_id(self.experiment_id, r["number"], r["start_ms"]): r for r in recs}
        for _ in range(2):
            try:
                return self._write_runs(by_id)
            except sqlalchemy.exc.IntegrityError:  # inserted meanwhile by another process
                pass
        return self._write_runs(by_id)

    def _write_runs(self, by_id: dict[str, dict[str, Any]]) -> int:
        """The rows ``create_run``, ``log_batch`` and ``set_terminated`` would write
        (finished status, run-name tag, metrics with their latest values) for the runs of
        ``by_id`` (run id -> record) not in the store yet, in one transaction."""
        import sqlalchemy
        from mlflow.store.tracking.dbmodels.models import (
            SqlLatestMetric,
            SqlMetric,
            SqlParam,
            SqlRun,
            SqlTag,
        )
        from mlflow.utils.uri import append_to_uri_path

        with self._engine().begin() as conn:
            there = dict(conn.execute(sqlalchemy.select(
                SqlRun.run_uuid, SqlRun.lifecycle_stage).where(
                SqlRun.run_uuid.in_(list(by_id)))).all())
            # a trial's run deleted since (by hand): restored, with fresh tags
            restore = [r for r, stage in there.items() if stage != "active"]
            if restore:
                conn.execute(sqlalchemy.update(SqlRun).where(
                    SqlRun.run_uuid.in_(restore)).values(
                    lifecycle_stage="active", deleted_time=None))
                conn.execute(sqlalchemy.delete(SqlTag).where(SqlTag.run_uuid.in_(restore)))
                conn.execute(SqlTag.__table__.insert(), [
                    {"key": k, "value": v, "run_uuid": r}
                    for r in restore for k, v in by_id[r]["tags"].items()])
            runs, tags, params, metrics = [], [], [], []
            for run_id, rec in by_id.items():
                if run_id in there:
                    continue
                runs.append({
                    "run_uuid": run_id, "name": rec["tags"]["mlflow.runName"],
                    "artifact_uri": append_to_uri_path(self.artifact_location, run_id,
                                                       "artifacts"),
                    "experiment_id": int(self.experiment_id), "source_type": "UNKNOWN",
                    "source_name": "", "entry_point_name": "",
                    "user_id": rec["tags"].get("mlflow.user", "unknown"),
                    "status": _STATUS.get(rec["state"], "FINISHED"),
                    "start_time": rec["start_ms"], "end_time": rec["end_ms"],
                    "deleted_time": None, "source_version": "", "lifecycle_stage": "active"})
                tags += [{"key": k, "value": v, "run_uuid": run_id}
                         for k, v in rec["tags"].items()]
                params += [{"key": k, "value": v, "run_uuid": run_id}
                           for k, v in rec["params"].items()]
                metrics += [{"key": k, "value": v, "timestamp": rec["end_ms"], "step": 0,
                             "is_nan": False, "run_uuid": run_id}
                            for k, v in rec["metrics"].items()]
            if runs:
                conn.execute(SqlRun.__table__.insert(), runs)
                conn.execute(SqlTag.__table__.insert(), tags)
            if params:
                conn.execute(SqlParam.__table__.insert(), params)
            if metrics:
                conn.execute(SqlMetric.__table__.insert(), metrics)
                conn.execute(SqlLatestMetric.__table__.insert(), metrics)
        return len(runs) + len(restore)

    def _op_artifacts(self, msg: dict[str, Any]) -> None:
        if msg.get("dir"):
            self.client.log_artifacts(self.parent_run_id, msg["dir"], msg.get("path"))
        if msg.get("metrics") or msg.get("tags"):
            self._log(self.parent_run_id, metrics=msg.get("metrics"), tags=msg.get("tags"))

    def _op_summary(self, msg: dict[str, Any]) -> None:
        out = Path(tempfile.mkdtemp(prefix="crossflow-summary-"))
        try:
            metrics, tags = render_summary(out, msg)
            self.client.log_artifacts(self.parent_run_id, str(out))
            self._log(self.parent_run_id, metrics=metrics, tags=tags)
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def _op_close(self, msg: dict[str, Any]) -> None:
        try:
            for runs in self._trial_runs().values():
                for run_id in duplicates(runs):
                    self.client.delete_run(run_id)
                    self.duplicates_removed += 1
        finally:
            self._log(self.parent_run_id, metrics={"n_trial_runs_logged": self.logged})
            self.client.set_terminated(self.parent_run_id, msg.get("status", "FINISHED"))


@contextlib.contextmanager
def _db_lock(uri: str):
    """An exclusive lock on ``<database>.lock`` for a SQLite URI (MLflow creates and migrates
    a new database on first use; two processes doing it at once corrupt the migration)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None
    if fcntl is None or not uri.startswith("sqlite:///"):
        yield
        return

    with open(uri[len("sqlite:///"):] + ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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


def _worker_main() -> None:
    """The logging process: JSON messages on stdin, JSON events on (a private copy of)
    stdout; ``mlflow``'s own output goes to stderr.  Whatever is waiting is handled at once,
    so trials that arrive while a batch is written go into the next batch."""
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
    log = _Logger()
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
        if not warm and inbox.empty() and not (closed or eof):
            warm = True  # idle: import what the summary needs now, off the critical path
            with contextlib.suppress(Exception):
                import matplotlib.backends.backend_agg  # noqa: F401
                import optuna.importance  # noqa: F401

                optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not closed and log.client is not None:  # stdin closed: the study process is gone
        log.handle_many([{"op": "close", "status": "KILLED"}])
    proto.write(json.dumps({"event": "stats", "cpu_s": time.process_time() - cpu0,
                            **log.stats()}) + "\n")
    proto.close()
    sys.stderr.flush()
    os._exit(0)  # all committed; skip the ~1 s interpreter teardown (MLflow's exit hooks)


# --------------------------------------------------------------------------- front end

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
    """

    def __init__(self, study_name: str, tracking_uri: str | None,
                 launch_params: dict[str, Any], search_space: dict,
                 artifact_root: str | None = None, *, study: Any = None,
                 mode: str = "process", bulk: bool = True) -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be 'process' or 'thread', not {mode!r}")
        self.study_name = study_name
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
                "tags": tags, "params": params, "bulk": self.bulk}
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
            self._thread.join()
            if self._proc is not None:
                self._proc.wait()
                self._reader.join()
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
        from crossflow.search.workers import child_env

        env = child_env()
        with tempfile.NamedTemporaryFile(prefix="crossflow-mlflow-", suffix=".log",
                                         delete=False) as err:
            self._stderr_path = err.name
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-c",
                     "from crossflow.search.tracking import _worker_main; _worker_main()"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                    text=True, start_new_session=True)
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
                        msgs.append(self._trial_msg(item[1], item[2]))
                    elif kind == "summary":
                        study = item[1]
                        msgs.append({
                            "op": "summary", "study_name": self.study_name,
                            "directions": [d.name.lower() for d in study.directions],
                            "metric_names": self._names(study), "sampler": self._sampler(study),
                            "best_design": item[2],
                            "trials": [_serialize(t) for t in study.get_trials(deepcopy=False)]})
                    elif kind == "sweep":  # every finished trial without a run
                        self._dispatch([m for m in msgs if m])
                        msgs = []
                        self._ready.wait(timeout=120)
                        known = self._known or {}
                        msgs += [self._trial_msg(item[1], t) for t in _finished(item[1])
                                 if not is_logged(known, t.number, _ms(t.datetime_start))]
                self._dispatch([m for m in msgs if m])
        finally:
            if self._proc is not None:
                with contextlib.suppress(BrokenPipeError, OSError, ValueError):
                    self._proc.stdin.close()
            self.stats["front_thread_cpu_s"] = time.thread_time() - cpu0

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
        if worker.get("errors"):
            warnings.warn("MLflow logging had errors (missing runs are back-filled by the "
                          f"next launch of this study): {worker['errors']}"
                          + (f"\nworker log {self._stderr_path}:\n{tail}" if tail else ""),
                          RuntimeWarning, stacklevel=3)
        if self._stderr_path and not (worker.get("errors") and tail):
            with contextlib.suppress(OSError):
                os.unlink(self._stderr_path)


def _yaml_scalar(text: str) -> Any:
    """Text params back to numbers where they are numbers (for best_design.yaml)."""
    for conv in (int, float):
        with contextlib.suppress(ValueError):
            return conv(text)
    return text


def launch_ui(tracking_uri: str | None = None, host: str = "127.0.0.1", port: int = 5000,
              workers: int = 1) -> int:
    """Run ``mlflow ui --backend-store-uri URI --host HOST --port PORT`` (default store:
    ``mlruns/mlflow.db`` here, artifacts in ``mlruns/artifacts``) until Ctrl-C; returns its
    exit code.  One server worker by default (MLflow's default, 4, is a lot for a laptop
    or this 2-core machine)."""
    import signal

    uri, artifacts = resolve_locations(tracking_uri)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--host", host, "--port", str(port), "--workers", str(workers)]
    if artifacts is not None and tracking_uri is None:
        cmd += ["--default-artifact-root", artifacts]
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:  # let the server shut its workers down, as on its own Ctrl-C
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.terminate()
            proc.wait()
        return 0
