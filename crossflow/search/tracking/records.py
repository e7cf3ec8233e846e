"""Trial records: an Optuna trial as the params, metrics and tags of its MLflow run.

Pure data (no MLflow, no I/O): what :mod:`.store` inserts and what the public API path
(``create_run`` + ``log_batch``) logs are both built here, so both paths log the same run.
The naming rules (decoded fractions as params, unit-suffixed metrics, penalties apart) are
described in ``docs/architecture.md`` (section "Tracking").
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from crossflow.search.keys import (
    CHAIN,
    FEASIBLE,
    FRACTIONS_SUFFIX,
    MAPPING_ORDER,
    REASON,
    STRATEGY,
    SURPLUS,  # a trial never evaluated: it gets no run
    TRIAL_NUMBER_TAG,
)
from crossflow.search.locations import redact_text

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

# MLflow's validation limits (mlflow.utils.validation; pinned by tests/test_tracking_store.py)
_MAX_PARAM = 6000   # MAX_PARAM_VAL_LENGTH
_MAX_TAG = 8000     # MAX_TAG_VAL_LENGTH
_MAX_KEY = 250      # MAX_ENTITY_KEY_LENGTH
_PER_BATCH = 100    # MAX_PARAMS_TAGS_PER_BATCH
#: Optuna trial state -> MLflow run status
_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}


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


def _tag_text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else _text(v, _MAX_TAG)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _ms(dt: datetime | None) -> int | None:
    return int(dt.timestamp() * 1000) if dt is not None else None


#: Tag prefix of a trial's raw Optuna parameters that the design replaces (the softmax
#: logits of a budget simplex): kept with the run, apart from the design it shows.
ENCODING_PREFIX = "encoding."


#: The runs-table view of a study's experiment, kept as MLflow's "shared view state" (an
#: experiment tag): ``…/#/experiments/<id>/runs?viewStateShareKey=crossflow`` opens the
#: table with the objectives and the design as columns.  MLflow's own default is Source,
#: Models and Dataset, none of which a study fills.
VIEW_KEY = "crossflow"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
#: At most this many design columns (a budget's fractions are many).
VIEW_PARAMS = 8


def runs_view(objectives: list[str], space: Mapping[str, Any] | None) -> dict[str, Any]:
    """The runs-table view (MLflow's UI state: column ids ``metrics.`name```) of a study:
    its objectives, then the design's named dimensions (technology, strategy, mapping
    order), then up to three fractions of each budget, and whether the design is
    feasible.  ``space``: the ``search_space``
    part of the study's description (:meth:`StudySetup.describe`)."""
    space = dict(space or {})
    design = [str(d) for d in (space.get("dimensions") or {})]
    for simplex, spec in (space.get("simplexes") or {}).items():
        design += [f"{simplex}{FRACTIONS_SUFFIX}.{c}"
                   for c in list((spec or {}).get("components") or [])[:3]]
    columns = ([f"metrics.`{_key(o)}`" for o in objectives]
               + [f"params.`{_key(p)}`" for p in design[:VIEW_PARAMS]]
               + [f"tags.`{FEASIBLE}`"])
    # no sort by the objective: MLflow sorts only top-level runs, and the launch's trial
    # runs, listed under it, would lose their nesting without being sorted
    return {"selectedColumns": columns}


def trial_record(trial: Any, sampler: str, metric_names: list[str]) -> dict[str, Any]:
    """Everything the child run of ``trial`` (an Optuna ``FrozenTrial``) holds, as plain
    data: ``params`` (text), ``metrics`` (float), ``tags`` (text), times (ms).

    Params are the design only (:func:`decoded_params`: budget fractions such as
    ``area_fractions.core``, ``strategy``, ``mapping_order``, technology choices), so the
    run page and the runs table's parameter columns read as the design; a scalar user
    attribute named like a parameter replaces it too.  A raw parameter the design replaces
    (the simplex logit ``area.core``) is the tag ``encoding.<name>``; other user
    attributes (``bottleneck``, ``worker``, ``baseline``) are outcomes and bookkeeping,
    tags as well.  Metrics are the trial's values (named by ``metric_names``) and the
    numeric user attributes whose names end in a unit (:data:`METRIC_SUFFIXES`);
    non-finite values are left out.  An infeasible trial's values (the study's graded
    penalty) are ``penalty.<name>``."""
    metrics: dict[str, float] = {}
    user = trial.user_attrs
    params = decoded_params(trial)
    outcomes: dict[str, Any] = {}
    for k, v in user.items():
        if k in (INFEASIBLE_REASON, CHAIN_ATTR) or k in (STRATEGY, MAPPING_ORDER):
            continue
        if k.endswith(METRIC_SUFFIXES) and _is_number(v):
            if math.isfinite(v):
                metrics[_key(k)] = float(v)
        elif k.endswith(FRACTIONS_SUFFIX) and isinstance(v, Mapping):
            continue  # in the design
        elif k in trial.params and not isinstance(v, Mapping):
            params[k] = v
        elif isinstance(v, Mapping):
            outcomes.update({f"{k}.{sk}": sv for sk, sv in v.items()})
        else:
            outcomes[k] = v
    encodings = {f"{ENCODING_PREFIX}{k}": v for k, v in trial.params.items()
                 if k not in params or params[k] != v}
    tags = {_key(k): _tag_text(v) for k, v in {**outcomes, **encodings}.items()}
    values = trial.values or []
    constraints = getattr(trial, "constraints", None) or {}
    infeasible = user.get(FEASIBLE) is False or any(c > 0 for c in constraints.values())
    for name, v in zip(metric_names, values, strict=False):
        if v is not None and math.isfinite(v):
            # an infeasible design's value is the study's penalty, not a time or an energy:
            # kept apart, so a metric column and its sorting show real values only
            metrics.setdefault(_key(f"penalty.{name}" if infeasible else name), float(v))
    state = trial.state.name
    tags.update({TRIAL_NUMBER_TAG: str(trial.number), "state": state, "sampler": sampler,
                 "mlflow.runName": f"trial-{trial.number:05d}"})
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



def _yaml_scalar(text: str) -> Any:
    """Text params back to numbers where they are numbers (for best_design.yaml)."""
    for conv in (int, float):
        with contextlib.suppress(ValueError):
            return conv(text)
    return text


def decoded_params(trial: Any, space: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The design a trial stands for, in the terms an architect reasons in: budget
    fractions (``area_fractions.core``, a share of the chip), ``strategy``,
    ``mapping_order``, technology choices and the other named dimensions, as values (floats,
    strings) rather than MLflow text.

    The encoded simplex coordinates (``area.core``, ``area.slack``: softmax logits, see
    :mod:`crossflow.search.encoding`) are replaced by the fractions they decode to: the
    trial's ``<simplex>_fractions`` user attribute (what the objective recorded), else — a
    trial that failed before recording — decoded from its parameters with ``space`` (the
    ``search_space`` part of the study's description: simplex components, fixed fractions,
    share).  Scalar user attributes without a unit suffix (``strategy``, ``mapping_order``)
    overlay the parameters of the same name; outcomes (``bottleneck``, metrics, the
    infeasibility reason, bookkeeping) are not parameters and are left out."""
    from crossflow.search import encoding

    params: dict[str, Any] = dict(trial.params)
    user = trial.user_attrs
    simplexes: dict[str, Mapping[str, Any]] = dict((space or {}).get("simplexes") or {})
    for k, v in user.items():
        if k.endswith(FRACTIONS_SUFFIX) and isinstance(v, Mapping):
            simplexes.setdefault(k[:-len(FRACTIONS_SUFFIX)], {})
    for simplex, spec in simplexes.items():
        raw = {k: v for k, v in params.items() if k.startswith(f"{simplex}.")}
        for k in raw:
            del params[k]
        fractions = user.get(f"{simplex}{FRACTIONS_SUFFIX}")
        if not isinstance(fractions, Mapping):
            comps = list(spec.get("components") or [])
            names = encoding.param_names(simplex, comps)
            if not comps or any(n not in raw for n in names):
                continue
            share = float(spec.get("share", 1.0))
            fractions = {**dict(spec.get("fixed") or {}),
                         **{c: f * share for c, f in
                            encoding.decode_params(raw, simplex, comps).items()}}
        for comp, frac in fractions.items():
            params[f"{simplex}{FRACTIONS_SUFFIX}.{comp}"] = float(frac)
    for k in (STRATEGY, MAPPING_ORDER):
        if k in user and user[k] is not None:
            params[k] = user[k]
    return params
