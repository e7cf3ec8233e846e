"""Running a study: :func:`run_study` creates or resumes it and runs one launch, in this
process or in ``--workers K`` processes it supervises; :func:`join_study` adds a worker to a
launch (docs/architecture.md, Studies).  :class:`Launch` holds how a launch runs."""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from crossflow.errors import ConfigError
from crossflow.search.locations import check_userinfo, git_label, is_url, redact
from crossflow.search.study.progress import Progress
from crossflow.search.study.results import best_design
from crossflow.search.study.setup import (
    StudySetup,
    _rekey,
    check_precision_of,
    load_study,
    open_study,
)
from crossflow.search.study.spec import SAMPLER_NAMES, StudySpec


@dataclass(frozen=True)
class Launch:
    """How a launch runs (the keyword arguments of :func:`run_study`; a joining worker uses
    the storage, tracking, progress and heartbeat ones and :attr:`join` /
    :attr:`worker_index`)."""

    #: the study's total of finished trials to reach (default: the study file's)
    n_trials: int | None = None
    #: sampler name (default: the study file's) and its options (default: the file's when
    #: the sampler is the file's, else none)
    sampler: str | None = None
    sampler_options: Mapping[str, Any] | None = None
    #: the seed of launch 0 ("study": the study file's); launch k adds k
    seed: int | None | Literal["study"] = "study"
    #: Optuna storage URL or journal file (default: the study's)
    storage: str | None = None
    #: MLflow tracking URI (default: the study's)
    tracking_uri: str | None = None
    track: bool = True
    progress: bool = True
    #: worker processes to start on this launch (1: run in this process)
    workers: int = 1
    #: seconds between heartbeats of running trials on an RDB storage
    heartbeat_s: float | None = None
    #: (a joining worker) the launch to join (default: the latest)
    join: str | None = None
    #: (a joining worker) its index, which picks its seed (default: one of its own)
    worker_index: int | None = None


@dataclass
class RunResult:
    """What one :func:`run_study` launch did."""

    study: Any                   # the optuna.Study
    trials_run: int              # trials this launch finished
    total: int                   # trials in the study now (any state)
    interrupted: bool
    elapsed_s: float
    best: dict[str, Any] | None  # best_design(), None if nothing is feasible
    #: the total of finished trials the launch ran to, and those the study has now
    n_trials: int = 0
    finished: int = 0
    #: the study had its n_trials finished before the launch (nothing to run)
    was_complete: bool = False
    #: the trials were logged to MLflow
    tracked: bool = False
    #: finished trials of the study without an MLflow run after the launch (0 untracked)
    untracked: int = 0
    #: (a complete study) finished trials without an MLflow run that this launch logged
    backfilled: int = 0
    launch: Mapping[str, Any] = field(default_factory=dict)


def _tracker(setup: StudySetup, tracking_uri: str, launch: Mapping[str, Any]):
    from crossflow.search.tracking import StudyTracker

    return StudyTracker(study_name=setup.name, tracking_uri=tracking_uri,
                        launch_params=dict(launch), search_space=setup.describe(),
                        description=setup.spec.description)


def worker_seed(sampler: str, seed: int | None, index: int) -> int | None:
    """The sampler seed of worker ``index`` of a launch seeded ``seed``.  Worker 0 keeps the
    launch's seed (one worker is reproducible); a sampler whose record says
    ``shared_seed`` (``structured``, ``gd``) keeps it on every worker (the workers share
    one plan, or one set of chains, keyed by it);
    other samplers get distinct seeds, or the workers would propose the same points."""
    from crossflow.search.samplers import SAMPLERS, canonical

    info = SAMPLERS.get(canonical(sampler))
    if seed is None or (info is not None and info.shared_seed) or index == 0:
        return seed
    return (seed + 7919 * index) % 2**32  # numpy's seed range


def run_study(setup: StudySetup, *, n_trials: int | None = None, sampler: str | None = None,
              seed: int | None | Literal["study"] = "study",
              sampler_options: Mapping[str, Any] | None = None, storage: str | None = None,
              tracking_uri: str | None = None, track: bool = True,
              progress: bool = True, workers: int = 1,
              heartbeat_s: float | None = None) -> RunResult:
    """Create or resume the study and run it until it has ``n_trials`` (default: the
    study's) finished trials; Ctrl-C stops it cleanly after logging what finished.

    ``n_trials`` counts the study's total, so re-running resumes.  Launch k (0 for the
    first) seeds its sampler with ``seed + k``: a fresh single-worker study is reproducible
    for its seed, and a resumed or extra worker does not replay the first launch's draws.
    Each trial is logged as an MLflow child run (``track``) off the critical path.

    ``workers`` > 1 runs that many ``crossflow study worker`` processes on this launch (see
    :mod:`crossflow.search.workers`); the study must then be one the workers can load by
    name or file (not an inline mapping).  ``heartbeat_s``: seconds between heartbeats of
    running trials on an RDB storage (a dead worker's trial is retried after about three).
    See :class:`Launch` for each argument.
    """
    options = Launch(n_trials=n_trials, sampler=sampler, seed=seed,
                     sampler_options=sampler_options, storage=storage,
                     tracking_uri=tracking_uri, track=track, progress=progress,
                     workers=workers, heartbeat_s=heartbeat_s)
    if workers < 1:
        raise ConfigError("must be >= 1", key="--workers", value=workers)
    return _quietly(_run, setup, options)


def join_study(setup: StudySetup, *, storage: str | None = None, launch: str | None = None,
               worker_index: int | None = None, tracking_uri: str | None = None,
               track: bool = True, progress: bool = True,
               heartbeat_s: float | None = None) -> RunResult:
    """``crossflow study worker``: join a launch of an existing study (default: its latest)
    and run its trials until the launch's ``n_trials`` are finished, with the launch's
    sampler, options and seed (see :func:`worker_seed`; a worker without an index gets a
    seed of its own)."""
    options = Launch(storage=storage, join=launch, worker_index=worker_index,
                     tracking_uri=tracking_uri, track=track, progress=progress,
                     heartbeat_s=heartbeat_s)
    return _quietly(_join, setup, options)


def _quietly(fn, setup: StudySetup, options: Launch) -> RunResult:
    import optuna

    verbosity = optuna.logging.get_verbosity()
    # the progress line replaces Optuna's log lines; a trial fails only on a bug (the
    # objective records infeasible designs), and then the exception is raised
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():
            # CMA-ES ranks infeasible trials by their penalty values, not by constraints
            warnings.filterwarnings("ignore", message="Constraints have been set, but CmaEs")
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            return fn(setup, options)
    finally:
        optuna.logging.set_verbosity(verbosity)


#: The seeds Optuna's samplers take (numpy's range).
SEEDS = "an integer from 0 to 4294967295 (2**32 - 1), or none"
#: MLflow tracking URI schemes.  Not ``file://`` or a bare folder: MLflow 3's file store is
#: in maintenance mode and refuses new runs, which a launch would find only at its end.
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
#: What a tracking URI may be, for messages.
TRACKING_ALLOWED = ("sqlite:///FILE.db (a local store), postgresql://..., mysql://..., "
                    "mssql://..., or an MLflow server's http(s)://... or databricks://...")


def check_seed(seed: Any, *, key: str = "seed", file: str | None = None) -> None:
    """A ConfigError naming ``key`` unless ``seed`` is None or in numpy's seed range."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                             or not 0 <= seed < 2**32):
        raise ConfigError("not a sampler seed", file=file, key=key, value=seed,
                          allowed=SEEDS)


def check_tracking_uri(uri: str, *, key: str = "tracking_uri") -> None:
    """A ConfigError naming ``key`` unless ``uri`` has an MLflow tracking scheme MLflow 3
    can log runs to (the tracking store itself is checked when the tracker starts)."""
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError("an empty tracking URI", key=key, value=uri,
                          allowed=TRACKING_ALLOWED)
    if "://" not in uri or uri.split("://", 1)[0].lower() == "file":
        folder = uri.split("://", 1)[1] if "://" in uri else uri
        raise ConfigError("MLflow's file store (a folder) is in maintenance mode and refuses "
                          "new runs: every trial would go unlogged", key=key, value=uri,
                          allowed=f"sqlite:///{Path(folder, 'mlflow.db').as_posix()} (a "
                          f"store in that folder), or {TRACKING_ALLOWED}")
    check_userinfo(uri, key=key)
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower()
    if scheme not in TRACKING_SCHEMES:
        raise ConfigError(f"unknown tracking URI scheme {scheme!r}", key=key,
                          value=redact(uri), allowed=TRACKING_ALLOWED)


def check_launch(storage: str, tracking_uri: str | None, *, storage_key: str = "storage",
                 tracking_key: str = "tracking_uri") -> None:
    """Every location of a launch checked before anything is created: the storage
    (:func:`~crossflow.search.storage.check_storage`), the tracking URI's scheme, and that
    the two are not one database (Optuna's and MLflow's tables would mix), then the tracking
    store itself (:func:`crossflow.search.tracking.check.check_tracking`)."""
    from crossflow.search.storage import check_storage

    if tracking_uri is not None:
        check_tracking_uri(tracking_uri, key=tracking_key)
        if is_url(storage) and _same_database(storage, tracking_uri):
            raise ConfigError("the study storage and the MLflow tracking URI are the same "
                              "database; give each its own", key=storage_key,
                              value=redact(storage), allowed="another storage (a journal "
                              "file, the default) or another tracking URI")
    check_storage(storage, key=storage_key)
    if tracking_uri is not None:  # the store itself: reachable, writable, not the storage
        from crossflow.search.tracking.check import check_tracking

        check_tracking(tracking_uri, storage, key=tracking_key)


def check_study(source: str | Path | Mapping[str, Any] | StudySpec) -> StudySetup:
    """What ``crossflow check`` does with a study file: resolve it as ``study run`` will
    (:func:`load_study`: every reference loaded, a system's device too) and build its
    sampler with its options and seed, so whatever the run would choke on is reported
    now.  Nothing is created."""
    from crossflow.search.samplers import make_sampler

    errors: list[ConfigError] = []  # each check below is independent: all are reported
    try:
        setup = load_study(source, problems=errors)
    except ConfigError as exc:  # with the sampler's refused options, if any
        raise ConfigError.together([exc, *errors]) from None
    if not errors:  # (the options the sampler refused already)
        try:
            make_sampler(setup.spec.sampler, seed=setup.spec.seed,
                         options=setup.spec.sampler_options, space=setup.space,
                         n_objectives=len(setup.objectives), setup=setup)
        except ConfigError as exc:
            errors.append(_rekey(exc, "sampler_options", setup.file))
    try:
        check_precision_of(setup)
    except ConfigError as exc:
        errors.append(exc)
    # the study file's own locations, as `study run` checks them (nothing is created)
    from crossflow.search.storage import check_storage

    for given, check in ((setup.spec.storage, lambda: check_storage(setup.storage)),
                         (setup.spec.tracking_uri,
                          lambda: check_tracking_uri(setup.spec.tracking_uri))):
        try:
            if given is not None:
                check()
        except ConfigError as exc:
            errors.append(_rekey(exc, exc.key, setup.file))
    if errors:
        raise ConfigError.together(errors)
    return setup



def _same_database(a: str, b: str) -> bool:
    def norm(url: str) -> str:
        if url.startswith("sqlite:///"):
            return "sqlite:" + str(Path(url[len("sqlite:///"):]).resolve())
        return url.split("?")[0].rstrip("/")

    return norm(a) == norm(b)


def _storage_url(setup: StudySetup, storage: str | None) -> str:
    """The storage URL, a journal file as an absolute path (workers may start elsewhere)."""
    url = storage if storage is not None else setup.storage
    if not url.strip():  # (resolved, '' would be the current folder)
        raise ConfigError("an empty storage", key="storage", value=url,
                          allowed="a journal file path or a database URL")
    return url if is_url(url) else str(Path(url).resolve())


def _run(setup: StudySetup, options: Launch) -> RunResult:
    from crossflow import __version__
    from crossflow.search.samplers import check_objectives, check_options, make_sampler

    total = options.n_trials if options.n_trials is not None else setup.spec.n_trials
    if total < 1:
        raise ConfigError("must be >= 1", key="n_trials", value=total)
    from crossflow.search.samplers import canonical

    sampler_name = canonical(options.sampler or setup.spec.sampler)
    if sampler_name not in SAMPLER_NAMES:
        raise ConfigError("unknown sampler", key="sampler", value=sampler_name,
                          allowed=", ".join(SAMPLER_NAMES))
    sampler_options = options.sampler_options
    if sampler_options is None:
        sampler_options = setup.spec.sampler_options if sampler_name == setup.spec.sampler \
            else {}
    check_options(sampler_name, sampler_options)
    check_objectives(sampler_name, len(setup.objectives))  # before anything is created
    check_precision_of(setup)  # as `crossflow check` does: every trial would be refused
    base_seed = setup.spec.seed if options.seed == "study" else options.seed
    check_seed(base_seed, key="seed", file=setup.file if options.seed == "study" else None)
    url = _storage_url(setup, options.storage)
    uri = options.tracking_uri or setup.tracking_uri
    try:
        check_launch(url, uri if options.track else None)
    except ConfigError as exc:  # a location the study file gave: name the file
        given = {"storage": options.storage, "tracking_uri": options.tracking_uri}
        if exc.key in given and given[exc.key] is None:
            raise _rekey(exc, exc.key, setup.file) from None
        raise
    # the sampler is built once before the study is created: options it rejects end the
    # launch with nothing made
    make_sampler(sampler_name, seed=base_seed, options=sampler_options, space=setup.space,
                 n_objectives=len(setup.objectives), setup=setup)
    # the baselines by the launch that created the study only: first launches racing on a
    # fresh storage each saw no trials and enqueued them again, and a copy that came after
    # the budget was taken stayed WAITING for good
    study = open_study(setup, url, heartbeat_s=options.heartbeat_s,
                       on_create=lambda study: setup.enqueue_baselines(study, total))
    from crossflow.search.workers import census

    before = census(study, total, heartbeats=is_url(url))
    if before.finished:
        return _complete(setup, study, total, before.done, uri, options)

    workers = _worker_count(study, total, options.workers, heartbeats=is_url(url))
    index = sum(1 for k in study.user_attrs if k.startswith("launch."))
    launch_seed = None if base_seed is None else (base_seed + index) % 2**32
    launch = {
        "study": setup.name, "launch": index, "sampler": sampler_name,
        "sampler_options": dict(sampler_options), "seed": launch_seed,
        "n_trials": total, "objectives": list(setup.objectives), "storage": redact(url),
        "workers": workers, "crossflow_version": __version__,
        "git_revision": git_label(), "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "pid": os.getpid(),
    }
    if not uri.startswith(("sqlite:", "file:")) and "://" in uri:
        launch["tracking_uri"] = redact(uri)  # where workers that join log (a server, a DB)
    key = f"launch.{index:04d}.{uuid.uuid4().hex[:8]}"
    study.set_user_attr(key, launch)
    if workers > 1:
        return _supervise(setup, study, url, key, launch, uri, options)
    study.sampler = make_sampler(sampler_name, seed=launch_seed, options=sampler_options,
                                 space=setup.space, n_objectives=len(setup.objectives),
                                 setup=setup)
    return _work(setup, study, launch, total, uri, options, summary=True)


def _complete(setup: StudySetup, study, total: int, done: int, tracking_uri: str,
              options: Launch) -> RunResult:
    """A launch of a study that already has ``total`` finished trials: nothing runs and no
    launch is recorded, since a recorded launch would shift the seed of the launch that
    extends the study (launch k seeds ``seed + k``) and log an MLflow parent run with
    nothing under it.  Only finished trials without an MLflow run (a store that was down,
    a launch with ``--no-tracking``) are logged, under a parent run of their own."""
    t0 = time.perf_counter()
    untracked, tracked, backfilled = 0, False, 0
    if options.track:
        from crossflow.search.tracking import unlogged_trials

        try:
            missing = unlogged_trials(study, setup.name, tracking_uri)
        except Exception:  # a store that cannot be read: the tracker says what is missing
            missing = [-1]
        if missing:  # (-1: not known)
            launches = sorted(k for k in study.user_attrs if k.startswith("launch."))
            last = dict(study.user_attrs[launches[-1]]) if launches else {}
            launch = {**last, "study": setup.name, "n_trials": total, "backfill": True,
                      "started": datetime.now(UTC).isoformat(timespec="seconds"),
                      "host": socket.gethostname(), "pid": os.getpid()}
            with _tracker(setup, tracking_uri, launch) as tracker:
                tracker.sweep(study)
            untracked, tracked = len(tracker.missing_runs), True
            backfilled = tracker.stats.get("worker", {}).get("runs_logged", 0)
    return RunResult(study, 0, len(study.get_trials(deepcopy=False)), False,
                     time.perf_counter() - t0, best_design(setup, study), n_trials=total,
                     finished=done, was_complete=True, tracked=tracked, untracked=untracked,
                     backfilled=backfilled)


def cpu_count() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _worker_count(study, total: int, asked: int, *, heartbeats: bool) -> int:
    """The worker processes a launch starts: at most one per trial left (a note says so
    when that is fewer than asked); a warning when they are more than the CPUs."""
    if asked <= 1:
        return 1
    from crossflow.search.workers import census

    left = max(0, total - census(study, total, heartbeats=heartbeats).done)
    k = max(1, min(asked, left))
    if k < asked:
        print(f"crossflow: note: {left} of {total} trials left: starting {k} worker "
              f"process{'es' if k != 1 else ''}, not {asked}", file=sys.stderr)
    cpus = cpu_count()
    if k > cpus:
        print(f"crossflow: warning: {k} worker processes on {cpus} CPUs: they share them, "
              "so the launch is no faster than with fewer (each trial is slower)",
              file=sys.stderr)
    return k


def _join(setup: StudySetup, options: Launch) -> RunResult:
    from crossflow.search.samplers import make_sampler
    from crossflow.search.tracking.check import check_tracking

    url = _storage_url(setup, options.storage)
    study = open_study(setup, url, create=False, heartbeat_s=options.heartbeat_s)
    launches = {k: v for k, v in study.user_attrs.items() if k.startswith("launch.")}
    if not launches:
        raise ConfigError(f"study {setup.name!r} has no launch to join: start it with "
                          f"'crossflow study run {setup.name} --storage URL' first",
                          key="storage", value=redact(url))
    launch_key = options.join
    if launch_key is None:
        launch_key = max(launches)
    elif launch_key not in launches:
        raise ConfigError("no such launch in the study", key="--launch", value=launch_key,
                          allowed=", ".join(sorted(launches)))
    launch = launches[launch_key]
    worker_index = options.worker_index
    if worker_index is None:  # a worker joining from anywhere: a seed of its own
        worker_index = 1 + (os.getpid() * 1_000_003 + time.time_ns()) % 99_991
    seed = worker_seed(launch["sampler"], launch.get("seed"), worker_index)
    study.sampler = make_sampler(launch["sampler"], seed=seed,
                                 options=launch.get("sampler_options") or {},
                                 space=setup.space, n_objectives=len(setup.objectives),
                                 setup=setup)
    joined = {**launch, "worker_index": worker_index, "seed": seed, "role": "worker",
              "host": socket.gethostname(), "pid": os.getpid()}
    uri = options.tracking_uri or launch.get("tracking_uri") or setup.tracking_uri
    if options.track:
        check_tracking(uri, url, key="--tracking-uri" if options.tracking_uri else "tracking_uri")
    return _work(setup, study, joined, int(launch["n_trials"]), uri, options, summary=False)


def _work(setup: StudySetup, study, launch: Mapping[str, Any], total: int, tracking_uri: str,
          options: Launch, *, summary: bool) -> RunResult:
    """Run trials in this process until the study has ``total`` finished ones."""
    from crossflow.search.objective import Objective
    from crossflow.search.workers import GracefulStop, census, work

    heartbeats = is_url(str(launch["storage"]))
    start = census(study, total, heartbeats=heartbeats)
    bar = Progress(setup.name, study, total, options.progress and not start.finished)
    interrupted = False
    t0 = time.perf_counter()
    tracking = _tracker(setup, tracking_uri, launch) if options.track else nullcontext()
    with tracking as tracker:
        stop = GracefulStop()
        callbacks: list[Any] = [bar]
        if tracker is not None:
            callbacks.insert(0, tracker)  # logged before any stop
        try:
            with stop:
                work(study, Objective(setup), total, callbacks=callbacks, stop=stop,
                     heartbeats=heartbeats)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            bar.close()
        interrupted = interrupted or stop.requested
        best = best_design(setup, study)
        if tracker is not None and summary:
            tracker.finish(study, best_design=best)
    end = census(study, total, heartbeats=heartbeats)
    return RunResult(study, bar.done - bar.start_done, len(study.get_trials(deepcopy=False)),
                     interrupted, time.perf_counter() - t0, best, n_trials=total,
                     finished=end.done, was_complete=start.finished, tracked=options.track,
                     launch=dict(launch),
                     untracked=len(tracking.missing_runs) if options.track else 0)


def _supervise(setup: StudySetup, study, url: str, key: str, launch: Mapping[str, Any],
               tracking_uri: str, options: Launch) -> RunResult:
    """``study run --workers K``: K worker processes on launch ``key``, their trials logged to
    MLflow from the storage by one tracker here, one progress line, Ctrl-C forwarded."""
    from crossflow.search.workers import census, check_workers, start_workers, supervise

    total, k = int(launch["n_trials"]), int(launch["workers"])
    start = census(study, total, heartbeats=is_url(url))
    bar = Progress(f"{setup.name} ({k} workers)", study, total,
                   options.progress and not start.finished)
    t0 = time.perf_counter()
    tracking = _tracker(setup, tracking_uri, launch) if options.track else nullcontext()
    with tracking as tracker:
        procs = start_workers(setup.file or setup.name, url, key, k,
                              heartbeat_s=options.heartbeat_s)

        def tick() -> None:
            if tracker is not None:
                tracker.sweep(study)
            bar.poll(study)

        interrupted = supervise(procs, tick=tick)
        tick()
        bar.close()
        end = census(study, total, heartbeats=is_url(url))
        for line in check_workers(procs, interrupted=interrupted, finished=end.finished,
                                  study=study):
            print(f"crossflow: warning: {line}", file=sys.stderr)
        best = best_design(setup, study)
        if tracker is not None:
            tracker.finish(study, best_design=best)
    return RunResult(study, end.done - start.done, len(study.get_trials(deepcopy=False)),
                     interrupted, time.perf_counter() - t0, best, n_trials=total,
                     finished=end.done, was_complete=start.finished, tracked=options.track,
                     launch=dict(launch),
                     untracked=len(tracking.missing_runs) if options.track else 0)
