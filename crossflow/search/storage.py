"""Optuna storages for studies, made to survive workers that die and databases that blink.

* A path (no ``://``) is an Optuna **journal file**: one machine, any number of worker
  processes (the default, ``mlruns/optuna/<study>.journal``).
* A URL is an Optuna **RDB storage** (``postgresql://…`` for workers on many machines;
  ``sqlite:///…`` works on one), opened as :class:`~crossflow.search.rdb.ResilientRDBStorage`:

  - *heartbeats*: every running trial records one each ``heartbeat_s`` seconds; a trial
    whose worker stopped beating for ``GRACE_BEATS`` × ``heartbeat_s`` (SIGKILL, a lost
    machine) is set FAIL by the next worker that starts a trial, and Optuna's
    :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` enqueues a copy with the same
    parameters (and the ``gd`` sampler's role; a trial killed before it evaluated has none
    written yet, see below, and its retry is sampled anew), so nothing is lost and no
    RUNNING trial is left behind;
  - *reconnects*: a storage call that fails because the connection to the database was
    lost (server restart, network blip, failover) is retried with back-off for up to
    ``reconnect_s`` seconds (SQLAlchemy's ``pool_pre_ping`` replaces dead pooled
    connections), so a database away for a few seconds does not end the study; one away
    longer ends the launch with :class:`StorageUnreachable` (one paragraph, exit 2);
  - *few round trips*: a running trial's parameters and user attributes are written in one
    transaction each instead of one per value, the trials a process runs are read from its
    own copies, and close reads of a study share one query
    (:data:`~crossflow.search.rdb.SHARED_READ_S`): 1.6-2x
    the trials per second of Optuna's own storage on PostgreSQL (docs/speed.md).

Opening a storage is this module's job (:func:`make_storage`), with what the worker code
needs of one (:func:`fail_trial`, :func:`retry_trial`, :func:`fresh_reads`,
:func:`live_below`, :func:`claim_trials`).  The parts live beside it: the RDB storage's
class is :mod:`crossflow.search.rdb` (with :mod:`crossflow.search.trials` the only modules
that reach into Optuna's RDB internals), the reconnect window
:mod:`crossflow.search.reconnect`, the journal file's backend
:mod:`crossflow.search.journal`, and whether a storage can hold studies at all
(:func:`check_storage`, made before anything is opened or created)
:mod:`crossflow.search.storage_check`.  ``tests/test_storage_contract.py`` runs Optuna's
own storage contract on the storages made here.  Nothing here imports optuna at module
import time.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from crossflow.errors import ConfigError
from crossflow.search.locations import is_url, redact

# the reconnect window and the RDB storage's class (their home was this module: importable
# from here too)
from crossflow.search.reconnect import RECONNECT_ENV as RECONNECT_ENV
from crossflow.search.reconnect import RECONNECT_S, _connection_lost
from crossflow.search.reconnect import RECONNECTS as RECONNECTS
from crossflow.search.reconnect import StorageUnreachable as StorageUnreachable
from crossflow.search.reconnect import retrying as retrying

# the checks made before a storage is opened (their home was this module: still importable)
from crossflow.search.storage_check import STORAGES as STORAGES
from crossflow.search.storage_check import _engine_kwargs, check_storage
from crossflow.search.storage_check import existing_tables as existing_tables

#: Seconds between two heartbeats of a running trial (RDB storages).  A killed worker's
#: trial is retried after about GRACE_BEATS heartbeats; each beat is one small UPDATE.
HEARTBEAT_S = 10
#: Heartbeats a trial may miss before it is taken as dead (Optuna's grace period).
GRACE_BEATS = 3
#: The longest heartbeat asked for: a dead worker's trial waits ~GRACE_BEATS of them before
#: it is retried, so an hour's beat already leaves it for three hours.
MAX_HEARTBEAT_S = 3600


def check_heartbeat(seconds: float | None, key: str = "--heartbeat") -> None:
    """A heartbeat of 1 to :data:`MAX_HEARTBEAT_S` seconds (None: the default), or a
    ConfigError naming ``key`` (NaN and infinity included)."""
    if seconds is not None and not 1 <= seconds <= MAX_HEARTBEAT_S:
        raise ConfigError(f"must be from 1 to {MAX_HEARTBEAT_S} seconds (a dead worker's "
                          f"trial is retried after about {GRACE_BEATS} heartbeats)",
                          key=key, value=seconds, allowed=f"1 to {MAX_HEARTBEAT_S}")


def __getattr__(name: str):
    if name == "ResilientRDBStorage":  # built on first use (crossflow.search.rdb)
        from crossflow.search.rdb import resilient_rdb_storage_class

        return resilient_rdb_storage_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_storage(url: str, *, heartbeat_s: float | None = None,
                 reconnect_s: float = RECONNECT_S, for_reading: bool = False):
    """An Optuna storage for ``url``: an RDB URL (``://``) gives a
    :class:`ResilientRDBStorage` with heartbeats every ``heartbeat_s`` seconds (default
    :data:`HEARTBEAT_S`) and stale-trial retry; anything else is a journal file path
    (created with its folder).  ``for_reading``: the caller only reads (``study show``,
    ``study best``), so an existing journal this process cannot write is opened read-only
    rather than refused."""
    import optuna

    from crossflow.search.rdb import resilient_rdb_storage_class

    check_storage(url, for_reading=for_reading)
    check_heartbeat(heartbeat_s, key="heartbeat_s")
    if is_url(url):
        if url.startswith("sqlite:///"):
            path = Path(url[len("sqlite:///"):])
            if str(path) not in ("", ":memory:"):
                path.parent.mkdir(parents=True, exist_ok=True)
        from optuna.storages import RetryHeartbeatStaleTrialCallback

        beat = max(1, round(heartbeat_s if heartbeat_s is not None else HEARTBEAT_S))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            try:
                return resilient_rdb_storage_class()(
                    url, reconnect_s=reconnect_s, engine_kwargs=_engine_kwargs(url),
                    heartbeat_interval=beat, grace_period=GRACE_BEATS * beat,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                        max_retry=2))
            except ImportError as exc:
                raise ConfigError(f"the database driver is missing ({exc})", key="storage",
                                  value=redact(url)) from None
            except Exception as exc:
                if _connection_lost(exc):
                    raise ConfigError(f"cannot connect to the database "
                                      f"({str(exc).strip().splitlines()[0]})",
                                      key="storage", value=redact(url)) from None
                raise
    from optuna.storages import JournalStorage

    from crossflow.search.journal import ReadOnlyJournalBackend, SafeJournalBackend, writable

    path = Path(url)
    if for_reading and path.is_file() and not writable(path):
        return JournalStorage(ReadOnlyJournalBackend(str(path)))
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(SafeJournalBackend(str(path)))


# --- what the worker code needs of a study's storage ---------------------------------------


def fail_trial(study, trial) -> bool:
    """Set the RUNNING ``trial`` of ``study`` FAIL.  False when it had already finished
    (another worker failed it first)."""
    from optuna.trial import TrialState

    try:
        return study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL) \
            is not False
    except RuntimeError:  # the trial is finished: no longer updatable
        return False


def retry_trial(study, trial, *, max_retry: int = 2) -> None:
    """Enqueue a copy of the failed ``trial`` (same parameters, its ``gd`` role kept) as
    Optuna's heartbeat retry does, at most ``max_retry`` times per original trial."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    RetryHeartbeatStaleTrialCallback(max_retry=max_retry)(
        study, study._storage.get_trial(trial._trial_id))


def fresh_reads(study) -> None:
    """The next read of ``study``'s trials by this process asks the database (an RDB storage
    shares reads within :data:`~crossflow.search.rdb.SHARED_READ_S`): for the budget's
    census, which must count every trial another worker has started or ended."""
    backend = getattr(study._storage, "_backend", study._storage)
    forget = getattr(backend, "forget_reads", None)
    if forget is not None:
        forget()


def live_below(study, total: int) -> bool:
    """Cheaply, whether ``study`` has fewer than ``total`` live trials (COMPLETE, PRUNED,
    RUNNING, WAITING) by one COUNT query; False when the storage cannot tell that (then a
    full census is needed)."""
    backend = getattr(study._storage, "_backend", study._storage)
    count = getattr(backend, "count_live", None)
    return count is not None and count(study._study_id) < total


def claim_trials(study, key: str, value: str) -> None:
    """Record ``key = value`` as a user attribute of every trial this process starts on
    ``study``, the moment Optuna creates it: before the sampler proposes its point (the
    sampler's ``before_trial``, which Optuna calls first, is wrapped on this instance)."""
    sampler = study.sampler
    if getattr(sampler, "_crossflow_claims", None) == (key, value):
        return
    before = type(sampler).before_trial

    def before_trial(study, trial) -> None:
        study._storage.set_trial_user_attr(trial._trial_id, key, value)
        before(sampler, study, trial)

    sampler.before_trial = before_trial
    sampler._crossflow_claims = (key, value)

