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
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from crossflow.errors import ConfigError, InfeasibleDesignError
from crossflow.search.space import Design

#: The objective value of an infeasible design, times (1 + infeasibility).
PENALTY = 1e12
FEASIBLE = "feasible"
REASON = "infeasible_reason"
CONSTRAINT = "infeasibility"


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
    from crossflow.predict import predict

    t0 = time.perf_counter()
    try:
        arch = setup.arch(design)
    except InfeasibleDesignError as exc:
        return Evaluation(None, False, str(exc), 1.0, design.mapping_order,
                          time.perf_counter() - t0)
    except ConfigError as exc:  # e.g. a technology a searched level cannot be built in
        return Evaluation(None, False, f"invalid hardware: {exc}", 1.0, design.mapping_order,
                          time.perf_counter() - t0)
    try:
        p = predict(workload=setup.workload, hardware=arch, system=setup.system,
                    parallelism=setup.parallelism(design), mapping_order=design.mapping_order)
    except ConfigError as exc:  # a combination that does not fit (strategy x micro-batch)
        return Evaluation(None, False, f"invalid combination: {exc}", 1.0,
                          design.mapping_order, time.perf_counter() - t0)
    except InfeasibleDesignError as exc:
        return Evaluation(None, False, str(exc), 1.0, design.mapping_order,
                          time.perf_counter() - t0)
    order = (p.details or {}).get("mapping_order", design.mapping_order)
    order = None if order == "local" else order  # one device: nothing was mapped
    dt = time.perf_counter() - t0
    if p.feasible:
        return Evaluation(p, True, None, 0.0, order, dt)
    capacity = arch.main_memory.total_capacity_B
    need = p.memory_per_device_bytes or 0.0
    violation = need / capacity - 1.0 if capacity > 0 and need > capacity else 1.0
    return Evaluation(p, False, p.reason or "infeasible", violation, order, dt)


class Objective:
    """``study.optimize(Objective(setup))``: suggest, decode, evaluate, record."""

    def __init__(self, setup) -> None:
        self.setup = setup

    def __call__(self, trial) -> float | list[float]:
        setup = self.setup
        params = setup.space.suggest(trial)
        design = setup.design(params)
        ev = evaluate(setup, design)
        record(trial, design, ev)
        values = ev.values(setup.objectives)
        return values[0] if len(values) == 1 else values


def record(trial, design: Design, ev: Evaluation) -> None:
    """Store a trial's decoded design and outcome as user attributes and its constraint."""
    trial.set_user_attr(FEASIBLE, ev.feasible)
    if not ev.feasible:
        trial.set_user_attr(REASON, ev.reason)
    for simplex, fractions in design.fractions.items():
        trial.set_user_attr(f"{simplex}_fractions", dict(fractions))
    if design.strategy is not None:
        trial.set_user_attr("strategy", design.strategy)
    if ev.mapping_order is not None:
        trial.set_user_attr("mapping_order", ev.mapping_order)
    if ev.feasible:
        p = ev.prediction
        trial.set_user_attr("iteration_time_s", float(p.time_s))
        trial.set_user_attr("energy_J", float(p.energy_J))
        trial.set_user_attr("memory_per_device_bytes", float(p.memory_per_device_bytes))
        trial.set_user_attr("bottleneck", p.bottleneck)
    trial.set_user_attr("eval_time_s", ev.eval_time_s)
    infeasibility = ev.infeasibility if math.isfinite(ev.infeasibility) else 1e6
    trial.set_constraint(CONSTRAINT, infeasibility)
