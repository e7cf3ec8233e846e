"""The objective of a study: a trial's parameters -> a design -> CrossFlow -> values.

Infeasible designs (an AGE budget that cannot build one unit, memory over capacity, a
strategy that does not fit a searched micro-batch size, …) never stop a study.  They are
COMPLETE trials with

* the user attributes ``feasible: false`` and ``infeasible_reason`` (the model's message),
* the Optuna constraint ``infeasibility`` > 0 (``trial.set_constraint``; 0 for feasible
  trials): by how much memory is over capacity (need / capacity − 1), else 1,
* every objective value :data:`PENALTY` · (1 + infeasibility) — finite, above any real
  value, and graded.

Why COMPLETE with a penalty, not FAIL or PRUNED: samplers learn nothing from failed trials
(TPE and CMA-ES drop them, so they keep proposing the infeasible region), and pruned trials
without intermediate values carry no information either.  A COMPLETE trial with a
constraint is what Optuna's constraint handling reads — TPE puts infeasible trials in its
"bad" group ordered by violation, NSGA-II uses constrained domination — and the graded
penalty value lets samplers that ignore constraints (CMA-ES, which ranks by value; the
``gd`` sampler's finite differences) rank infeasible points below feasible ones and less
infeasible ones first.  Best-trial queries skip infeasible trials (``study.best_trial``
does so by the constraint; :func:`crossflow.search.study.best_trial` by the attribute).

Other user attributes: ``{area,power,perimeter}_fractions`` (every component's decoded
fraction, fixed ones included), ``strategy`` and ``mapping_order`` (the ones evaluated; the
order the model chose when the study fixes ``mapping_order: best``), for feasible trials
``iteration_time_s``, ``energy_J``, ``memory_per_device_bytes`` and ``bottleneck``, and
``eval_time_s`` (seconds spent in CrossFlow for the trial).

A design whose memory per device is over capacity is rejected by the memory-only check
(:func:`crossflow.distributed.memory_check`) before any kernel is priced: its Evaluation
has ``memory_only=True`` and the same reason and infeasibility as a full evaluation gives.
:func:`evaluate_many` evaluates many designs at once, one AGE call and one batch prediction
(:func:`crossflow.distributed.predict_many`) per distinct chip.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from crossflow.distributed import MEMORY_CHECK, memory_check, predict_many
from crossflow.errors import ConfigError, InfeasibleDesignError
from crossflow.search.keys import (
    CONSTRAINT,
    FEASIBLE,
    FRACTIONS_SUFFIX,
    MAPPING_ORDER,
    REASON,
    STRATEGY,
)
from crossflow.search.space import Design

#: The objective value of an infeasible design, times (1 + infeasibility).
PENALTY = 1e12


@dataclass(frozen=True)
class Evaluation:
    """The outcome of one design: the prediction, or why it cannot run."""

    prediction: Any            # crossflow.Prediction, None when the hardware was not built
    feasible: bool
    reason: str | None
    #: 0 when feasible; > 0 how far from feasible (memory need / capacity − 1, else 1)
    infeasibility: float
    mapping_order: str | None = None
    eval_time_s: float = 0.0
    #: True when the memory-only check rejected the design (memory over capacity): no
    #: kernel was priced and nothing simulated (see crossflow.distributed.memory_check)
    memory_only: bool = False

    def values(self, objectives: tuple[str, ...]) -> list[float]:
        if not self.feasible:
            return [PENALTY * (1.0 + self.infeasibility)] * len(objectives)
        return [metric(self.prediction, name) for name in objectives]


def metric(prediction, name: str) -> float:
    """An objective from a feasible prediction (all minimised)."""
    if name == "iteration_time_s":
        return float(prediction.time_s)
    if name == "energy_J":
        return float(prediction.energy_J)
    if name == "power_W":
        return float(prediction.energy_J) / float(prediction.time_s)
    if name == "memory_per_device_bytes":
        return float(prediction.memory_per_device_bytes)
    raise ValueError(f"unknown objective {name!r}")


def evaluate(setup, design: Design) -> Evaluation:
    """Build and run ``design`` of study ``setup`` (a StudySetup).  Never raises for a
    design that cannot run: that is an infeasible Evaluation with the reason."""
    return evaluate_many(setup, [design])[0]


def evaluate_many(setup, designs: Sequence[Design]) -> list[Evaluation]:
    """:func:`evaluate` of each design, sharing what designs on the same chip share.

    Designs with the same hardware (the same AGE overrides: budget fractions and
    technologies) are one chip: it is generated once and all their (strategy, mapping
    order) candidates go through one :func:`crossflow.distributed.predict_many` call, which
    prices each kernel once and rejects memory-infeasible strategies before pricing
    anything.  Returns the Evaluations ``evaluate`` would, in order; each design's
    ``eval_time_s`` is its chip's time divided among the chip's designs.
    """
    results: list[Evaluation | None] = [None] * len(designs)
    groups: dict[str, list[int]] = {}
    for i, design in enumerate(designs):
        groups.setdefault(design.chip_key(), []).append(i)
    for members in groups.values():
        t0 = time.perf_counter()
        design = designs[members[0]]
        outcome: list[Evaluation] = []
        try:
            arch = setup.arch(design)
        except InfeasibleDesignError as exc:
            outcome = [Evaluation(None, False, str(exc), 1.0, designs[i].mapping_order)
                       for i in members]
        except ConfigError as exc:  # e.g. a technology a searched level cannot be built in
            outcome = [Evaluation(None, False, f"invalid hardware: {exc}", 1.0,
                                  designs[i].mapping_order) for i in members]
        else:
            candidates = [(setup.parallelism(designs[i]), designs[i].mapping_order)
                          for i in members]
            predictions = predict_many(setup.workload, arch, setup.system, candidates,
                                       return_exceptions=True)
            outcome = [_outcome(arch, p, designs[i]) for i, p in zip(members, predictions,
                                                                      strict=True)]
        share = (time.perf_counter() - t0) / len(members)
        for i, ev in zip(members, outcome, strict=True):
            results[i] = replace(ev, eval_time_s=share)
    return results  # type: ignore[return-value]


def _outcome(arch, p, design: Design) -> Evaluation:
    """The Evaluation of one prediction (or the ConfigError predict_many returned)."""
    if isinstance(p, ConfigError):  # a combination that does not fit (strategy x micro-batch)
        return Evaluation(None, False, f"invalid combination: {p}", 1.0, design.mapping_order)
    if isinstance(p, InfeasibleDesignError):
        return Evaluation(None, False, str(p), 1.0, design.mapping_order)
    order = (p.details or {}).get("mapping_order", design.mapping_order)
    order = None if order == "local" else order  # one device: nothing was mapped
    if p.feasible:
        return Evaluation(p, True, None, 0.0, order)
    capacity = arch.main_memory.total_capacity_B
    need = p.memory_per_device_bytes or 0.0
    violation = need / capacity - 1.0 if capacity > 0 and need > capacity else 1.0
    memory_only = (p.details or {}).get("rejected_by") == MEMORY_CHECK
    return Evaluation(p, False, p.reason or "infeasible", violation, order,
                      memory_only=memory_only)


class Objective:
    """``study.optimize(Objective(setup))``: suggest, decode, evaluate, record."""

    def __init__(self, setup) -> None:
        self.setup = setup

    def __call__(self, trial) -> float | list[float]:
        setup = self.setup
        params = setup.space.suggest(trial)
        design = setup.design(params)
        ev = _PREFETCHED.pop(_design_key(setup, design), None) or evaluate(setup, design)
        record(trial, design, ev)
        values = ev.values(setup.objectives)
        return values[0] if len(values) == 1 else values


#: Evaluations priced ahead by :func:`prefetch`, taken by the trial that evaluates them.
_PREFETCHED: dict[str, Evaluation] = {}
_PREFETCH_LIMIT = 50_000


def prefetch(setup, designs: Sequence[Design]) -> None:
    """Price ``designs`` in one :func:`evaluate_many` call (shared chips, kernel prices and
    memory checks); each result is taken by the trial that evaluates that design in this
    process (a sampler that plans a batch of trials calls this first).  The model is
    deterministic, so a trial's outcome is the same as :func:`evaluate` would give; its
    ``eval_time_s`` is its share of the batch."""
    todo = [d for d in designs if _design_key(setup, d) not in _PREFETCHED]
    if not todo:
        return
    if len(_PREFETCHED) + len(todo) > _PREFETCH_LIMIT:
        _PREFETCHED.clear()
    for design, ev in zip(todo, evaluate_many(setup, todo), strict=True):
        _PREFETCHED[_design_key(setup, design)] = ev


def _design_key(setup, design: Design) -> str:
    return json.dumps([setup.name, design.chip_key(), design.strategy, design.mapping_order,
                       dict(design.parallelism)], sort_keys=True, default=repr)


@dataclass(frozen=True)
class Invalid:
    """The verdict on a combination the configuration refuses whatever the chip (an
    expert-parallel degree that does not divide its group, a strategy whose stages do not
    divide the layers): the trial would be infeasible, so a screen need not spend one."""

    reason: str
    feasible: bool = False


def memory_verdicts(setup, designs: Sequence[Design]) -> list:
    """The memory-only verdict (:class:`crossflow.distributed.MemoryCheck`) of each design:
    no kernel priced, each chip generated once (designs grouped as in
    :func:`evaluate_many`); :class:`Invalid` for one whose parallelism the configuration
    refuses; None for a design whose chip cannot be built or that runs on one device."""
    out: list = [None] * len(designs)
    groups: dict[str, list[int]] = {}
    for i, design in enumerate(designs):
        if design.strategy is not None:
            groups.setdefault(design.chip_key(), []).append(i)
    for members in groups.values():
        try:
            arch = setup.arch(designs[members[0]])
        except (InfeasibleDesignError, ConfigError):
            continue
        for i in members:
            try:
                out[i] = memory_check(setup.workload, arch, setup.parallelism(designs[i]),
                                      setup.system)
            except ConfigError as exc:
                out[i] = Invalid(f"invalid combination: {exc}")
    return out


def fitting(items: Sequence, verdicts: Sequence) -> tuple[list, list]:
    """``items`` split by their :func:`memory_verdicts`: those no verdict refuses, and the
    (item, verdict) pairs it does.  When it refuses every one, all are kept: a search then
    prices them anyway, so that each infeasible result says why."""
    kept, refused = [], []
    for item, verdict in zip(items, verdicts, strict=True):
        if verdict is None or verdict.feasible:
            kept.append(item)
        else:
            refused.append((item, verdict))
    return (kept or list(items)), refused


def record(trial, design: Design, ev: Evaluation) -> None:
    """Store a trial's decoded design and outcome as user attributes and its constraint."""
    trial.set_user_attr(FEASIBLE, ev.feasible)
    if not ev.feasible:
        trial.set_user_attr(REASON, ev.reason)
    for simplex, fractions in design.fractions.items():
        trial.set_user_attr(f"{simplex}{FRACTIONS_SUFFIX}", dict(fractions))
    if design.strategy is not None:
        trial.set_user_attr(STRATEGY, design.strategy)
    if ev.mapping_order is not None:
        trial.set_user_attr(MAPPING_ORDER, ev.mapping_order)
    if ev.feasible:
        p = ev.prediction
        trial.set_user_attr("iteration_time_s", float(p.time_s))
        trial.set_user_attr("energy_J", float(p.energy_J))
        trial.set_user_attr("memory_per_device_bytes", float(p.memory_per_device_bytes))
        trial.set_user_attr("bottleneck", p.bottleneck)
    trial.set_user_attr("eval_time_s", ev.eval_time_s)
    infeasibility = ev.infeasibility if math.isfinite(ev.infeasibility) else 1e6
    trial.set_constraint(CONSTRAINT, infeasibility)
