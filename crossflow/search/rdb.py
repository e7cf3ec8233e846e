"""The study's RDB storage (``postgresql://…``, ``sqlite:///…``): Optuna's RDBStorage whose
database calls survive a lost connection (:mod:`crossflow.search.reconnect`), that takes
trials a heartbeat left behind, and that makes few round trips per trial
(:class:`ResilientRDBStorage`'s docstring says how; docs/speed.md what it gains).

The class subclasses Optuna's, so it is built on first use
(:func:`resilient_rdb_storage_class`; nothing here imports optuna at module import time)
and found by pickle under this module's name (the module's ``__getattr__``).  Opening one
is :func:`crossflow.search.storage.make_storage`'s job; the SQL of what a trial does most
is :mod:`crossflow.search.rdb_sql`.  With :mod:`crossflow.search.trials`, these are the
modules that reach into Optuna's RDB internals (``optuna.storages._rdb``)."""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from typing import Any

from crossflow.search import rdb_sql
from crossflow.search.keys import WORKER
from crossflow.search.locations import redact
from crossflow.search.reconnect import (
    RECONNECT_S,
    StorageUnreachable,
    _or_unreachable,
    retrying,
)


def _retrying(name: str, method):
    """``method`` of :class:`ResilientRDBStorage`, retried while the connection is lost."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        recovered = None
        if name == "set_trial_state_values":
            def recovered(exc):
                return _already_set(self, args, kwargs, exc)
        return _or_unreachable(self, lambda: method(self, *args, **kwargs), recovered)

    return call


def _already_set(storage, args, kwargs, exc: BaseException) -> bool:
    """After a lost connection, whether the trial already has the state the retried
    ``set_trial_state_values`` call asked for (its commit went through before the loss)."""
    from optuna.exceptions import UpdateFinishedTrialError

    if not isinstance(exc, UpdateFinishedTrialError | RuntimeError):
        return False
    trial_id = kwargs.get("trial_id", args[0] if args else None)
    state = kwargs.get("state", args[1] if len(args) > 1 else None)
    try:
        return storage.get_trial(trial_id).state == state
    except Exception:  # noqa: BLE001 - the original error is the one to report
        return False


#: RDBStorage methods that talk to the database (public ones and those _CachedStorage and the
#: heartbeat use).
_DB_METHODS = (
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
    "get_study_id_from_name", "get_study_name_from_id", "get_study_directions",
    "get_study_user_attrs", "get_study_system_attrs", "get_all_studies", "create_new_trial",
    "set_trial_param", "get_trial_id_from_study_id_trial_number",
    "get_trial_number_from_id", "get_trial_param", "set_trial_state_values",
    "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr",
    "get_trial", "get_all_trials", "get_n_trials", "get_best_trial", "get_trial_params",
    "get_trial_user_attrs", "get_trial_system_attrs", "record_heartbeat", "_get_trials",
    "_get_stale_trial_ids", "_create_new_trial",
    "_set_trial_param", "_get_best_trial_id",
)
#: A RUNNING trial that never recorded a heartbeat (its worker died between creating it and
#: starting its heartbeat, or a lost connection duplicated it) is stale after this long
#: (s; worker clocks may differ, so longer than a grace period).
UNBEATEN_S = 30.0
#: Reads of a study's trials by one process within this many seconds of one another share
#: one query, unless the process has written to a trial other than its own running ones
#: since (:meth:`ResilientRDBStorage._get_trials`).  Optuna reads the study three times a
#: trial (for a waiting trial, then twice in TPE); what another worker wrote in the meantime
#: is seen by the next read after the window, as if the read had been that much earlier.
SHARED_READ_S = 0.2
#: Trials this process finished that it keeps a copy of: Optuna reads a trial back once
#: right after it ends (its callbacks and log line).
FINISHED_KEPT = 8


#: Attempts at opening a fresh database whose schema other workers create at the same time.
SCHEMA_RACE_ATTEMPTS = 5


def _first_open(open_storage) -> None:
    """``open_storage()`` (Optuna's RDBStorage set-up: it creates the schema and stamps its
    version when the database has none), again after a short random pause when it lost a
    race with another worker creating the same schema: two first launches on a fresh
    database both see no tables, both create them, and the second one's version stamp or
    type violates a unique constraint.  The retry finds the schema made."""
    import random

    import sqlalchemy.exc as sa

    for attempt in range(SCHEMA_RACE_ATTEMPTS):
        try:
            return open_storage()
        except (sa.IntegrityError, sa.ProgrammingError) as exc:
            text = str(exc).lower()
            if attempt + 1 == SCHEMA_RACE_ATTEMPTS or not any(
                    k in text for k in ("unique", "already exists", "duplicate")):
                raise
            time.sleep(random.uniform(0.05, 0.3))


def _drop_teardown_noise(record) -> bool:
    """A logging filter for psycopg's logger: drops its warning that closing a pipeline or
    copy failed while another error was being raised (the server is gone).  That other
    error is the one the launch handles (:mod:`crossflow.search.reconnect` retries it or
    says the database did not answer); the warning would print before that paragraph."""
    return not str(record.msg).startswith("error ignored terminating")


def _resilient_class():
    import logging

    from optuna.storages import RDBStorage
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    psycopg_log = logging.getLogger("psycopg")
    if _drop_teardown_noise not in psycopg_log.filters:
        psycopg_log.addFilter(_drop_teardown_noise)

    class _Retrying(RDBStorage):
        reconnect_s: float = RECONNECT_S

    for name in _DB_METHODS:
        setattr(_Retrying, name, _retrying(name, getattr(RDBStorage, name)))

    class ResilientRDBStorage(_Retrying):
        """Optuna's RDBStorage whose database calls survive a lost connection for up to
        ``reconnect_s`` seconds (see the module docstring), and which writes what the trials
        this process runs record in few transactions instead of one round trip each (on
        PostgreSQL those round trips were most of a trial: ~13 parameters and a dozen user
        attributes, and Optuna reading the running trial back four times):

        * a running trial's **parameters** wait in the process until the trial's next write
          of another kind (its constraints, a system or intermediate value, its end), then
          go in one transaction; a parameter whose name the study has not seen in this
          process is written at once (its distribution is checked against the database's);
        * its **user attributes** wait until it finishes, except ``worker``, written at
          once (so a running trial's process can be found from anywhere);
        * its **system attributes**, which samplers share across workers (the ``gd``
          sampler's claims, the driver's points), are written at once;
        * reading it back (``get_trial``, and the running trials among ``get_all_trials``)
          gives this process's copy, with everything it has recorded, without a query; so
          does Optuna's read of it right after it ends (the last :data:`FINISHED_KEPT`);
        * its end goes in one transaction with whatever still waits.

        The writes of a trial this process runs, the reads of a study's trials and the
        heartbeats are plain SQL statements (SQLAlchemy Core) instead of Optuna's ORM
        objects, which were most of the CPU time a trial's storage calls cost: with four
        workers on two cores that time is what limits the trials per second.

        Another storage on the same database sees the parameters once the trial has
        evaluated and everything once it has finished.  A worker killed before then leaves
        a trial whose retry (Optuna's heartbeat callback) has no parameters to copy and is
        sampled anew."""

        def __init__(self, url: str, *, reconnect_s: float = RECONNECT_S, **kwargs: Any):
            self.reconnect_s = reconnect_s
            self.shown_url = redact(url)
            self._user_attrs: dict[int, dict[str, Any]] = {}
            #: parameters not yet written: trial id -> (name, internal value, distribution)
            self._params: dict[int, list[tuple[str, float, Any]]] = {}
            #: the study of each trial of ``_running``
            self._study_of: dict[int, int] = {}
            #: the last read of each study's trials (see _get_trials): (when, the trial ids
            #: asked for, the id after which every trial was asked for, the trials)
            self._reads: dict[int, tuple] = {}
            #: counts the times ``_reads`` was forgotten: a read that began before is not kept
            self._epoch = 0
            #: when this process last asked the database for a study's stale trials
            self._stale_asked: dict[int, float] = {}
            #: the RUNNING trials this process runs, as it knows them: only theirs are held
            #: back (another trial's write goes at once, so a missing or finished trial
            #: raises as Optuna's contract says)
            self._running: dict[int, Any] = {}
            #: the last FINISHED_KEPT trials this process finished, as it wrote them
            self._finished: dict[int, Any] = {}
            #: guards the above and the copies in ``_running``: the MLflow logger's thread
            #: reads the study while the trial's thread records
            self._held = threading.RLock()
            # the first connection too (a worker started while the database restarts)
            retrying(lambda: _first_open(lambda: RDBStorage.__init__(self, url, **kwargs)),
                     reconnect_s)

        #: User attributes written at once all the same: which worker runs a trial (so a
        #: running trial's process can be found from anywhere).
        immediate_user_attrs = frozenset({WORKER})

        def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
            if trial_id not in self._running:
                super().set_trial_user_attr(trial_id, key, value)
            elif key in self.immediate_user_attrs:
                self._flush(trial_id, user_attrs=False, user=(key, value))
            with self._recorded(trial_id) as own:
                if own is not None:
                    own.user_attrs[key] = value
                    if key not in self.immediate_user_attrs:
                        self._user_attrs.setdefault(trial_id, {})[key] = value

        def _set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                             distribution, previous_distribution) -> None:
            from optuna.distributions import check_distribution_compatibility

            own = self._running.get(trial_id)
            at_once = own is None or previous_distribution is None or param_name in own.params
            if at_once:
                # not ours, a name new to this process (the database has the study's
                # distribution), or a repeat: written at once, after what waits
                self._flush(trial_id, user_attrs=False)
                super()._set_trial_param(trial_id, param_name, param_value_internal,
                                         distribution, previous_distribution)
            else:
                check_distribution_compatibility(previous_distribution, distribution)
            with self._recorded(trial_id) as own:
                if own is not None:
                    if not at_once:
                        self._params.setdefault(trial_id, []).append(
                            (param_name, param_value_internal, distribution))
                    own.params[param_name] = distribution.to_external_repr(
                        param_value_internal)
                    own.distributions[param_name] = distribution

        def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
            if trial_id in self._running:  # with the parameters waiting, if any
                self._flush(trial_id, user_attrs=False, system=(key, value))
            else:
                super().set_trial_system_attr(trial_id, key, value)
            with self._recorded(trial_id) as own:
                if own is not None:
                    own.system_attrs[key] = value

        def set_trial_intermediate_value(self, trial_id: int, step: int,
                                         intermediate_value: float) -> None:
            self._flush(trial_id, user_attrs=False)
            super().set_trial_intermediate_value(trial_id, step, intermediate_value)
            with self._recorded(trial_id) as own:
                if own is not None:
                    own.intermediate_values[step] = intermediate_value

        def _create_new_trial(self, study_id: int, template_trial=None):
            import copy

            from optuna.trial import TrialState

            trial = super()._create_new_trial(study_id, template_trial)
            if trial.state == TrialState.RUNNING:
                with self._held:
                    self._running[trial._trial_id] = copy.deepcopy(trial)
                    self._study_of[trial._trial_id] = study_id
            # the next read sees every trial created before this one (and an enqueued one)
            self.forget_reads()
            return trial

        @contextlib.contextmanager
        def _recorded(self, trial_id: int):
            """After a write to ``trial_id``: this process's copy of it, held for updating,
            or None when the process does not run it (then the shared reads are forgotten:
            the next read must see the write)."""
            with self._held:
                own = self._running.get(trial_id)
                if own is None:
                    self.forget_reads()
                yield own

        def forget_reads(self) -> None:
            """The next read of any study asks the database (see :meth:`_get_trials`)."""
            with self._held:
                self._reads.clear()
                self._epoch += 1

        def _flush(self, trial_id: int, *, user_attrs: bool = True,
                   system: tuple[str, Any] | None = None, user: tuple[str, Any] | None = None,
                   finish: tuple[Any, Any, Any] | None = None) -> bool:
            """Write what waits of ``trial_id`` (its parameters; with ``user_attrs``, its user
            attributes too), the ``system`` or ``user`` attribute (key, value) if given, and
            with ``finish`` = (state, values, naive UTC time) its end, in one transaction of
            SQLAlchemy Core statements (the ORM objects Optuna builds for the same writes
            were most of the CPU time they cost).  False, with nothing written, when
            ``finish`` is given and the trial is no longer running; a trial that cannot be
            updated otherwise raises as Optuna's contract says."""
            with self._held:
                params = self._params.pop(trial_id, None)
                attrs = dict(self._user_attrs.pop(trial_id, None) or {}) if user_attrs else {}
            if user is not None:
                attrs[user[0]] = user[1]
            if not params and not attrs and system is None and finish is None:
                return True
            return _or_unreachable(self, functools.partial(
                rdb_sql.write_trial, self.engine, trial_id, self.check_trial_is_updatable,
                params=params or (), system=system, attrs=attrs, finish=finish))

        def set_trial_state_values(self, trial_id: int, state, values=None) -> bool:
            try:
                return self._set_state(trial_id, state, values)
            finally:
                self.forget_reads()  # a trial started or ended: the next read sees it

        def _set_state(self, trial_id: int, state, values) -> bool:
            from optuna.trial import TrialState

            if state == TrialState.RUNNING:  # a WAITING trial this process takes up
                taken = values is None and self._take_waiting(trial_id)
                if not taken:  # Optuna's answer: False, or the error its contract says
                    taken = super().set_trial_state_values(trial_id, state, values)
                if taken:
                    trial, study_id = super().get_trial(trial_id), self._study_id_of(trial_id)
                    with self._held:
                        self._running[trial_id], self._study_of[trial_id] = trial, study_id
                return taken
            if state.is_finished() and trial_id in self._running:
                # the end and everything that waits in one transaction, and this process's
                # copy of the finished trial kept for Optuna's read of it right after
                stored = rdb_sql.utc_now()
                if self._flush(trial_id, finish=(state, values, stored)):
                    with self._held:
                        own = self._running.pop(trial_id, None)
                        self._study_of.pop(trial_id, None)
                        if own is not None:
                            own.state, own.values = state, list(values) if values else None
                            own.datetime_complete = rdb_sql.local_time(stored)
                            self._finished[trial_id] = own
                            while len(self._finished) > FINISHED_KEPT:
                                del self._finished[next(iter(self._finished))]
                    return True
            self._flush(trial_id)
            with self._held:
                self._running.pop(trial_id, None)
                self._study_of.pop(trial_id, None)
            return super().set_trial_state_values(trial_id, state, values)

        def delete_study(self, study_id: int) -> None:
            super().delete_study(study_id)
            with self._held:
                self.forget_reads()
                self._finished.clear()
                for trial_id in [i for i, s in self._study_of.items() if s == study_id]:
                    for held in (self._running, self._study_of, self._params,
                                 self._user_attrs):
                        held.pop(trial_id, None)

        def _study_id_of(self, trial_id: int) -> int:
            def read() -> int:
                with _create_scoped_session(self.scoped_session) as session:
                    return models.TrialModel.find_or_raise_by_id(trial_id, session).study_id

            return _or_unreachable(self, read)

        def _take_waiting(self, trial_id: int) -> bool:
            """WAITING -> RUNNING in one conditional UPDATE: True for exactly one of the
            processes that take the trial at once.  (Optuna reads the state, then writes
            it, under SELECT ... FOR UPDATE, which SQLite ignores: two workers popping one
            enqueued trial together both got it, both ran it, and the second to finish
            raised "Cannot tell a COMPLETE trial".)"""
            import sqlalchemy
            from optuna.trial import TrialState

            def take() -> bool:
                with _create_scoped_session(self.scoped_session, True) as session:
                    done = session.execute(
                        sqlalchemy.update(models.TrialModel)
                        .where(models.TrialModel.trial_id == trial_id,
                               models.TrialModel.state == TrialState.WAITING)
                        .values(state=TrialState.RUNNING, datetime_start=rdb_sql.utc_now())
                        .execution_options(synchronize_session=False))
                    return done.rowcount == 1

            return _or_unreachable(self, take)

        def record_heartbeat(self, trial_id: int) -> None:
            """A heartbeat (Optuna's heartbeat thread): one the database did not take within
            the window is skipped, not raised in that thread as a traceback; the trial's
            own next storage call ends the launch with :class:`StorageUnreachable`."""
            with contextlib.suppress(StorageUnreachable):
                if self.engine.name not in rdb_sql.UPSERT_DIALECTS:
                    super().record_heartbeat(trial_id)
                    return
                _or_unreachable(self, functools.partial(rdb_sql.beat, self.engine, trial_id))

        def _get_trials(self, study_id: int, states, included_trial_ids: set[int],
                        trial_id_greater_than: int) -> list:
            """Optuna's query (the trials of ``included_trial_ids`` up to
            ``trial_id_greater_than``, and every one after it), except that this process's
            own running trials are its copies, not read (with few workers they are most of
            what the query returns, six queries each), and that reads within
            :data:`SHARED_READ_S` of one another share one query (Optuna reads a study's
            trials three times a trial) unless this process has written since."""
            import copy

            wanted = {i for i in included_trial_ids if i <= trial_id_greater_than}

            def pick(trial) -> bool:
                return ((trial._trial_id in wanted or trial._trial_id > trial_id_greater_than)
                        and (states is None or trial.state in states))

            while True:
                with self._held:
                    own = sorted(i for i, s in self._study_of.items() if s == study_id)
                    memo, epoch = self._reads.get(study_id), self._epoch
                now = time.monotonic()
                if memo is None or not (now - memo[0] <= SHARED_READ_S
                                        and trial_id_greater_than >= memo[2]
                                        and all(i in memo[1] or i > memo[2] for i in wanted)):
                    rows = _or_unreachable(self, functools.partial(
                        rdb_sql.read_trials, self.engine, study_id, wanted,
                        trial_id_greater_than, own))
                    memo = (now, wanted, trial_id_greater_than, rows)
                    with self._held:
                        if epoch == self._epoch:  # (else a trial started or ended meanwhile)
                            self._reads[study_id] = memo
                with self._held:
                    if all(i in self._running for i in own):
                        trials = [copy.deepcopy(t) for t in map(self._running.get, own)
                                  if pick(t)]
                        break
                # one of this process's trials ended while the database was read (another
                # thread): the read left it out as running here, so read again
            trials += [copy.deepcopy(t) for t in memo[3] if t._trial_id not in own and pick(t)]
            return sorted(trials, key=lambda trial: trial._trial_id)

        def get_trial(self, trial_id: int):
            import copy

            with self._held:
                own = self._running.get(trial_id) or self._finished.get(trial_id)
                if own is not None:
                    return copy.deepcopy(own)
            return super().get_trial(trial_id)

        def get_trial_params(self, trial_id: int) -> dict[str, Any]:
            with self._held:
                own = self._running.get(trial_id)
                if own is not None:
                    return dict(own.params)
            return super().get_trial_params(trial_id)

        def get_trial_param(self, trial_id: int, param_name: str) -> float:
            with self._held:
                own = self._running.get(trial_id)
                if own is not None and param_name in own.params:
                    return own.distributions[param_name].to_internal_repr(
                        own.params[param_name])
            return super().get_trial_param(trial_id, param_name)

        def get_trial_user_attrs(self, trial_id: int) -> dict[str, Any]:
            with self._held:
                own = self._running.get(trial_id)
                if own is not None:
                    return dict(own.user_attrs)
            return super().get_trial_user_attrs(trial_id)

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            """Optuna's stale trials (no heartbeat for the grace period), and RUNNING trials
            older than :data:`UNBEATEN_S` that never had one (Optuna skips those, and one
            would hold a slot of the budget for ever).  Optuna asks before every trial; a
            trial turns stale only after missing heartbeats, so a process asks the database
            at most once a heartbeat interval (none found in between)."""
            from datetime import timedelta

            import sqlalchemy
            from optuna.trial import TrialState

            now = time.monotonic()
            if now - self._stale_asked.get(study_id, -math.inf) < (self.heartbeat_interval or 0):
                return []
            self._stale_asked[study_id] = now

            stale = super()._get_stale_trial_ids(study_id)
            cutoff = rdb_sql.utc_now() - timedelta(  # naive UTC, as starts are stored
                seconds=max(UNBEATEN_S, 2 * (self.grace_period or 0)))
            t = models.TrialModel.__table__.c
            hb = models.TrialHeartbeatModel.__table__.c

            def unbeaten() -> list[int]:
                with self.engine.connect() as conn:
                    return list(conn.execute(
                        sqlalchemy.select(t.trial_id).where(
                            t.study_id == study_id, t.state == TrialState.RUNNING,
                            t.datetime_start < cutoff,
                            ~sqlalchemy.exists().where(hb.trial_id == t.trial_id))).scalars())

            return stale + [i for i in _or_unreachable(self, unbeaten) if i not in stale]

        def count_live(self, study_id: int) -> int:
            """Trials COMPLETE, PRUNED, RUNNING or WAITING: one COUNT query (Optuna's
            get_n_trials loads every trial)."""
            import sqlalchemy
            from optuna.trial import TrialState

            live = [TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING,
                    TrialState.WAITING]

            def count() -> int:
                with self.engine.connect() as conn:
                    return int(conn.execute(
                        sqlalchemy.select(sqlalchemy.func.count(models.TrialModel.trial_id))
                        .where(models.TrialModel.study_id == study_id,
                               models.TrialModel.state.in_(live))).scalar_one())

            return _or_unreachable(self, count)

        def __getstate__(self):
            state = super().__getstate__()
            state["reconnect_s"] = self.reconnect_s
            state["_user_attrs"] = {}
            state["_params"] = {}
            state["_study_of"] = {}
            state["_reads"] = {}
            state["_stale_asked"] = {}
            state["_running"] = {}
            state["_finished"] = {}
            del state["_held"]
            return state

        def __setstate__(self, state):
            super().__setstate__(state)
            self._held = threading.RLock()

    # pickled by name (crossflow.search.rdb.ResilientRDBStorage, see __getattr__ below)
    ResilientRDBStorage.__module__ = __name__
    ResilientRDBStorage.__qualname__ = "ResilientRDBStorage"
    return ResilientRDBStorage


@functools.cache
def resilient_rdb_storage_class():
    """The :class:`ResilientRDBStorage` class (built on first use: it subclasses Optuna's)."""
    return _resilient_class()


def __getattr__(name: str):
    if name == "ResilientRDBStorage":  # built on first use (pickle finds it by this name)
        return resilient_rdb_storage_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
