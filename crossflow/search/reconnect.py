"""Database calls that survive a lost connection: :func:`retrying` calls again with back-off
while the connection is lost, for up to :data:`RECONNECT_S` seconds, and a window that runs
out is :class:`StorageUnreachable` (one paragraph, exit 2).  Used by the study's RDB storage
(:mod:`crossflow.search.rdb`) and the MLflow logger's database writes
(:mod:`crossflow.search.tracking.logger`).  Imports SQLAlchemy only when an error is
examined."""

from __future__ import annotations

import threading
import time

from crossflow.errors import CrossflowError

#: The environment variable that sets :data:`RECONNECT_S` (seconds, > 0), for every
#: process of a launch (its workers inherit it): a shorter window for tests, a longer one
#: for a database whose failover takes minutes.
RECONNECT_ENV = "CROSSFLOW_RECONNECT_S"


def _reconnect_s(default: float = 60.0) -> float:
    import math
    import os

    try:
        seconds = float(os.environ.get(RECONNECT_ENV, default))
    except ValueError:
        return default
    return seconds if math.isfinite(seconds) and seconds > 0 else default


#: How long a storage call keeps retrying while the database cannot be reached (60 s, or
#: :data:`RECONNECT_ENV`).
RECONNECT_S = _reconnect_s()
#: Attempts to retry a storage call lost with its connection wait this long first (s),
#: doubling up to the last value.
_BACKOFF = (0.1, 0.2, 0.5, 1.0, 2.0)
#: Retries of an RDB storage call, over the whole process (for tests and ``study show``).
RECONNECTS = {"retries": 0}


def _connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) says the database connection was lost or could not
    be made — an error a retry can cure, unlike a constraint violation or bad data."""
    import sqlalchemy.exc as sa

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, sa.OperationalError | sa.InterfaceError | sa.TimeoutError):
            return True  # (TimeoutError: no pooled connection came free in time)
        if isinstance(exc, sa.DBAPIError) and exc.connection_invalidated:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


#: Whether this thread is inside a :func:`retrying` call: storage methods call one another
#: (``set_trial_param`` calls ``_set_trial_param``, both retried), and only the outermost
#: retries, so the time limit is ``reconnect_s`` however deep the calls go.
_RETRYING = threading.local()


def retrying(fn, reconnect_s: float = RECONNECT_S, *, recovered=None):
    """``fn()``, called again with back-off while it fails because the database connection
    was lost, for up to ``reconnect_s`` seconds.  ``recovered(exc)``, if given, is asked
    after an error that follows a lost connection whether the lost call had in fact done
    its work (then that is returned as True).  Inside another ``retrying`` call, ``fn()`` is
    called once (the outer call retries)."""
    if getattr(_RETRYING, "active", False):
        return fn()
    deadline = time.monotonic() + reconnect_s
    attempt = 0
    lost = False
    _RETRYING.active = True
    try:
        while True:
            try:
                return fn()
            except Exception as exc:
                if lost and recovered is not None and recovered(exc):
                    return True
                if not _connection_lost(exc) or time.monotonic() >= deadline:
                    raise
                lost = True
                RECONNECTS["retries"] += 1
                time.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
                attempt += 1
    finally:
        _RETRYING.active = False


class StorageUnreachable(CrossflowError):
    """The study's database did not answer for the whole reconnect window: the launch stops
    (exit 2) with one paragraph; every finished trial is in the database, so the same
    command resumes the study once it is back."""

    def __init__(self, where: str | None, seconds: float, exc: BaseException) -> None:
        reason = exc  # the driver's own error, innermost (SQLAlchemy's wraps it)
        for _ in range(8):
            inner = getattr(reason, "orig", None) or reason.__cause__
            if inner is None or inner is reason:
                break
            reason = inner
        lines = str(reason).strip().splitlines()
        why = " ".join(lines[0].split()) if lines else type(reason).__name__
        why = why if len(why) <= 200 else why[:199] + "…"
        name = f"the study's database {where}" if where else "the study's database"
        super().__init__(
            f"{name} did not answer for {seconds:g} s ({why}); the launch stops here. "
            "Every finished trial is kept in the database: once it answers again, run the "
            "same command and the study resumes where it stopped (a trial that was running "
            f"is run again). {RECONNECT_ENV} sets how long to wait (seconds).")


def _or_unreachable(storage, fn, recovered=None):
    """:func:`retrying` for ``storage``'s calls: a connection still lost when the window
    ends is :class:`StorageUnreachable` (the outermost call only: an inner one's error is
    the outer one's to retry)."""
    outer = not getattr(_RETRYING, "active", False)
    # once a window has run out, the next calls (Optuna recording the trial's end, the
    # clean-up on the way out) try once each: waiting a window again for each would hold
    # the launch's end for minutes; a call that gets through opens the window again
    gone = outer and getattr(storage, "_unreachable", False)
    try:
        result = retrying(fn, 0.0 if gone else storage.reconnect_s, recovered=recovered)
    except StorageUnreachable:
        raise
    except Exception as exc:
        if outer and _connection_lost(exc):
            storage._unreachable = True
            raise StorageUnreachable(getattr(storage, "shown_url", None),
                                     storage.reconnect_s, exc) from exc
        raise
    if gone:
        storage._unreachable = False
    return result
