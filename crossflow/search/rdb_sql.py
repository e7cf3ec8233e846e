"""The SQL of the study's RDB storage (:mod:`crossflow.search.rdb`) for what a trial does
most: its writes and its end, the reads of a study's trials, heartbeats.  Each is a few
SQLAlchemy Core statements on Optuna's tables instead of Optuna's ORM objects, which were
most of the CPU time a trial's storage calls cost (docs/speed.md); what they write and read
is what Optuna's own RDBStorage writes and reads (tests/test_storage_contract.py).  Imports
optuna and SQLAlchemy only when called."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Any

#: Dialects with INSERT ... ON CONFLICT (others: a DELETE, then an INSERT).
UPSERT_DIALECTS = ("postgresql", "sqlite")


def write_trial(engine, trial_id: int, check_updatable: Callable[[int, Any], None], *,
                params: Sequence[tuple[str, float, Any]] = (),
                system: tuple[str, Any] | None = None, attrs: dict[str, Any] | None = None,
                finish: tuple[Any, Any, Any] | None = None) -> bool:
    """In one transaction: ``trial_id``'s ``params`` (name, internal value, distribution;
    names it does not have yet), its ``system`` attribute (key, value), its user ``attrs``,
    and with ``finish`` = (state, values, naive UTC time) its end.  Without ``finish`` the
    trial must be updatable (``check_updatable(trial_id, state)`` raises as Optuna's
    contract says).  With it, the end is a conditional UPDATE of a RUNNING trial; False, with
    nothing written, when the trial is no longer running (True if it already has that
    state: a retried call whose first commit went through)."""
    import sqlalchemy
    from optuna.distributions import distribution_to_json
    from optuna.storages._rdb import models
    from optuna.trial import TrialState

    t = models.TrialModel.__table__
    with engine.begin() as conn:
        if finish is None:
            state = conn.execute(sqlalchemy.select(t.c.state).where(
                t.c.trial_id == trial_id)).scalar_one_or_none()
            if state is None:
                raise KeyError(f"No trial with trial_id {trial_id} exists.")
            check_updatable(trial_id, state)
        else:
            state, values, when = finish
            ended = conn.execute(
                sqlalchemy.update(t)
                .where(t.c.trial_id == trial_id, t.c.state == TrialState.RUNNING)
                .values(state=state, datetime_complete=when)).rowcount
            if ended != 1:  # (rolled back: nothing of this is written)
                return conn.execute(sqlalchemy.select(t.c.state).where(
                    t.c.trial_id == trial_id)).scalar_one_or_none() == state
            stored = [models.TrialValueModel.value_to_stored_repr(v) for v in values or ()]
            if stored:
                conn.execute(sqlalchemy.insert(models.TrialValueModel.__table__), [
                    {"trial_id": trial_id, "objective": k, "value": value, "value_type": kind}
                    for k, (value, kind) in enumerate(stored)])
        if params:
            conn.execute(sqlalchemy.insert(models.TrialParamModel.__table__), [
                {"trial_id": trial_id, "param_name": name, "param_value": value,
                 "distribution_json": distribution_to_json(distribution)}
                for name, value, distribution in params])
        if system is not None:
            _upsert(conn, models.TrialSystemAttributeModel, trial_id, dict([system]))
        if attrs:
            _upsert(conn, models.TrialUserAttributeModel, trial_id, attrs)
    return True


def _upsert(conn, model, trial_id: int, attrs: dict[str, Any]) -> None:
    """Set the attributes ``attrs`` of ``trial_id`` in ``model``'s table."""
    import sqlalchemy

    table = model.__table__
    rows = [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
            for k, v in attrs.items()]
    if conn.engine.name in UPSERT_DIALECTS:
        insert = import_module(f"sqlalchemy.dialects.{conn.engine.name}").insert(table)
        conn.execute(insert.on_conflict_do_update(
            index_elements=[table.c.trial_id, table.c.key],
            set_={"value_json": insert.excluded.value_json}), rows)
        return
    conn.execute(sqlalchemy.delete(table).where(table.c.trial_id == trial_id,
                                                table.c.key.in_(list(attrs))))
    conn.execute(sqlalchemy.insert(table), rows)


def beat(engine, trial_id: int) -> None:
    """``trial_id``'s heartbeat: its row inserted, or its time moved on, in one statement
    (PostgreSQL and SQLite; the caller uses Optuna's own elsewhere)."""
    import sqlalchemy
    from optuna.storages._rdb import models

    table = models.TrialHeartbeatModel.__table__
    insert = import_module(f"sqlalchemy.dialects.{engine.name}").insert(table).values(
        trial_id=trial_id, heartbeat=sqlalchemy.func.now())
    with engine.begin() as conn:
        conn.execute(insert.on_conflict_do_update(index_elements=[table.c.trial_id],
                                                  set_={"heartbeat": sqlalchemy.func.now()}))


def read_trials(engine, study_id: int, wanted: set[int], after: int,
                own: Sequence[int]) -> list:
    """Optuna's read of a study's trials (those of ``wanted`` and every one after ``after``,
    but ``own``): one query for the trials and one for each kind of record they hold, made
    into FrozenTrials as Optuna's model makes them.  Optuna's KeyError when there is no such
    study."""
    import sqlalchemy
    from optuna.storages._rdb import models
    from optuna.trial import FrozenTrial
    from sqlalchemy.orm import Session

    t = models.TrialModel.__table__
    where = [t.c.study_id == study_id]
    if own:
        where.append(t.c.trial_id.notin_(own))
    where.append(sqlalchemy.or_(t.c.trial_id.in_(wanted), t.c.trial_id > after)
                 if wanted else t.c.trial_id > after)
    chosen = sqlalchemy.select(t.c.trial_id).where(*where)

    def records(conn, model, order: str, *columns: str) -> dict[int, list]:
        c = model.__table__.c
        out: dict[int, list] = {}
        for row in conn.execute(sqlalchemy.select(c.trial_id, *(c[k] for k in columns))
                                .where(c.trial_id.in_(chosen)).order_by(c[order])):
            out.setdefault(row[0], []).append(row[1:])
        return out

    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.select(
            t.c.trial_id, t.c.number, t.c.state, t.c.datetime_start,
            t.c.datetime_complete).where(*where).order_by(t.c.trial_id)).all()
        if not rows:
            models.StudyModel.find_or_raise_by_id(study_id, Session(bind=conn))
            return []
        params = records(conn, models.TrialParamModel, "param_id", "param_name",
                         "param_value", "distribution_json")
        values = records(conn, models.TrialValueModel, "objective", "value", "value_type")
        users = records(conn, models.TrialUserAttributeModel, "key", "key", "value_json")
        systems = records(conn, models.TrialSystemAttributeModel, "key", "key", "value_json")
        steps = records(conn, models.TrialIntermediateValueModel, "step", "step",
                        "intermediate_value", "intermediate_value_type")
    value = models.TrialValueModel.stored_repr_to_value
    step_value = models.TrialIntermediateValueModel.stored_repr_to_intermediate_value
    trials = []
    for trial_id, number, state, start, complete in rows:
        dists = {name: _distribution(text) for name, _, text in params.get(trial_id, ())}
        vals = [value(v, kind) for v, kind in values.get(trial_id, ())]
        trials.append(FrozenTrial(
            number=number, state=state, value=None, values=vals or None,
            datetime_start=local_time(start), datetime_complete=local_time(complete),
            params={name: dists[name].to_external_repr(v)
                    for name, v, _ in params.get(trial_id, ())},
            distributions=dists,
            user_attrs={k: json.loads(v) for k, v in users.get(trial_id, ())},
            system_attrs={k: json.loads(v) for k, v in systems.get(trial_id, ())},
            intermediate_values={k: step_value(v, kind)
                                 for k, v, kind in steps.get(trial_id, ())},
            trial_id=trial_id))
    return trials


@functools.lru_cache(maxsize=1024)
def _distribution(text: str):
    """Optuna's distribution of its JSON text (a study's trials share a few)."""
    from optuna.distributions import json_to_distribution

    return json_to_distribution(text)


def utc_now():
    """Now as Optuna's trial model stores a time: naive UTC."""
    from datetime import UTC, datetime

    return datetime.now(UTC).replace(tzinfo=None)


def local_time(stored):
    """The naive local datetime Optuna's trial model gives for a naive UTC one it stored."""
    from datetime import UTC

    return None if stored is None else stored.replace(tzinfo=UTC).astimezone().replace(
        tzinfo=None)
