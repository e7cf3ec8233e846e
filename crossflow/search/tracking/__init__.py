"""MLflow tracking of Optuna studies (docs/architecture.md, section "Tracking"; issue #4 item 6).

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
  work, on the other core: the trials waiting (up to :data:`LINGER_S`, at most
  ``batch_size`` of them) go into one transaction of MLflow's SQL store (~0.3 ms of CPU a
  run, see :class:`_Logger`); a tracking server
  gets ``create_run`` + one ``log_batch`` + ``set_terminated`` per run (~20 ms of Python CPU
  each, which in a thread would hold the GIL the sampler and CrossFlow need).  The worker
  also draws the summary plots, having imported matplotlib and Optuna's importance module
  (and drawn a first figure) while the study ran, once the parent run existed.  What is
  left is a fixed cost per launch, mostly imports (MLflow and matplotlib: ~3-4 s of CPU in
  the logging process, which keeps scikit-learn out: the importances are PED-ANOVA's); a
  new SQLite store is a copy of a cached empty one (:func:`.store.seed_sqlite`) rather
  than MLflow's ~60 migrations.
  ``mode="thread"`` keeps all this in a thread of this process (also the fallback when the
  process cannot start).
* **Complete.**  ``__exit__`` (also on Ctrl-C or an exception) sends every finished trial not
  yet sent — including one that Ctrl-C interrupted (Optuna records it FAIL without calling
  the callbacks) — and waits until the worker has logged them.  The worker runs in its own
  session, so a second Ctrl-C does not stop it: it finishes what it was sent and exits.
* **Checked, bounded, counted.**  A launch checks its tracking store before it creates the
  study (:mod:`.check`: unknown scheme, unreachable server, the study's own storage file,
  unwritable directory: exit 2).  Lost database connections are retried for up to
  :data:`.logger.RECONNECT_S`; HTTP requests are bounded (:data:`.logger.HTTP_BOUNDS`) and
  so is the drain at the end (:data:`.tracker.DRAIN_S`).  The end of a launch counts the
  finished trials without a run (:attr:`StudyTracker.missing_runs`, said on stderr;
  ``crossflow study run`` then exits 1); the next launch back-fills them (a launch of a
  complete study does only that: :func:`unlogged_trials`).
* **Exactly once.**  Runs are keyed by the tag ``trial_number``.  On start the worker reads
  the trial numbers already logged in the experiment; the tracker back-fills every finished
  trial of the study that has no run (a resumed study, or trials a crashed launch never
  logged) and skips the rest; at close it deletes any duplicate that concurrent launches on
  one study raced to create (keeping the smallest run id, so all launches agree).

``mlflow`` (and optuna, matplotlib) are imported inside functions, never when this module is
imported.

The package, by job: :mod:`.check` (the tracking store checked at launch start),
:mod:`.records` (pure: a trial as its run's params, metrics, tags),
:mod:`.paths` (tracking URI and artifact root, the SQLite first-use lock), :mod:`.store`
(the only module that touches MLflow internals: batched runs on SQL stores),
:mod:`.summary` (the parent run's artifacts; figures in :mod:`crossflow.search._plots`),
:mod:`.logger` (the logging process and its queue), :mod:`.tracker` (:class:`StudyTracker`)
and :mod:`.ui` (``crossflow ui``); :mod:`.dashboard` is ``crossflow dashboard``
(optuna-dashboard on a read-only view of the studies' Optuna storages).  Child processes go with their parent
(:mod:`crossflow.search.children`).
"""

from __future__ import annotations

from crossflow.search.tracking.logger import EXIT_GRACE_S, LINGER_S, _gather, _Logger, _worker_main
from crossflow.search.tracking.paths import _db_lock, resolve_locations
from crossflow.search.tracking.records import (
    CHAIN_ATTR,
    INFEASIBLE_REASON,
    METRIC_SUFFIXES,
    SAME_TRIAL_MS,
    _key,
    _plain,
    _text,
    decoded_params,
    duplicates,
    flatten,
    is_logged,
    trial_record,
    trial_run_id,
)
from crossflow.search.tracking.summary import render_summary
from crossflow.search.tracking.tracker import StudyTracker, unlogged_trials
from crossflow.search.tracking.ui import launch_ui, ui_command

__all__ = [
    "CHAIN_ATTR", "EXIT_GRACE_S", "INFEASIBLE_REASON", "LINGER_S", "METRIC_SUFFIXES",
    "SAME_TRIAL_MS", "StudyTracker", "decoded_params", "duplicates", "flatten", "is_logged",
    "launch_ui", "render_summary", "resolve_locations", "trial_record", "trial_run_id",
    "ui_command", "unlogged_trials",
    # private, imported by crossflow.search.compare and the logging process's entry point
    "_Logger", "_db_lock", "_gather", "_key", "_plain", "_text", "_worker_main",
]
