"""StructuredSampler: the driver's plan as an Optuna sampler, rebuilt from the storage."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from crossflow.search.keys import PHASE
from crossflow.search.samplers.structured._inner import METHODS
from crossflow.search.samplers.structured._plan import plan
from crossflow.search.samplers.structured._problem import Problem
from crossflow.search.storage import (
    contains,
    set_trial_attrs,
    stored_trial,
    study_key,
    trial_key,
)

#: Trial system attribute: the plan's index of the point the trial evaluates.
SLOT = "structured:slot"
#: Trial system attribute: the point (every parameter).
POINT = "structured:point"
#: Trial user attribute: the plan's phase (screen, orders, search, rescreen, polish).
#: Study user attributes: the budget the plan was made for, and its memory-only verdicts.
BUDGET = "structured.budget"
MEMORY = "structured.memory_rejected"
#: How long a worker waits for other workers' trials of the current batch.
_WAIT_S = 600.0


class StructuredSampler(BaseSampler):
    """Structure-aware search (see :mod:`crossflow.search.samplers.structured`).

    Args:
        setup: the study (a :class:`crossflow.search.study.StudySetup`); the driver reads
            its template, search space and workload to screen and to find the AGE's steps.
        seed: seed of the plan's random choices (every worker of a launch uses the same).
        inner: the inner method for the budget split: ``exchange`` (cliff-aware adaptive
            coordinate exchange, the default), ``gd`` (the paper's eq. 6 with line search
            and side-by-side chains), ``cmaes`` or ``tpe``.
        inner_options: keyword arguments of the inner method.
        top_k: how many of the best screened combinations get every mapping-order class.
        rescreen: how many combinations are screened again at the split found.
        budget: evaluations the plan is made for; default the launch's ``n_trials`` less
            the trials already in the study (the template's baseline trials), else 300.
    """

    def __init__(self, *, setup, seed: int | None = None, inner: str = "exchange",
                 inner_options: Mapping[str, Any] | None = None, top_k: int = 3,
                 rescreen: int = 8, budget: int | None = None) -> None:
        if inner not in METHODS:
            raise ValueError(f"unknown inner method {inner!r}; one of {', '.join(METHODS)}")
        if not (isinstance(top_k, int) and top_k >= 1):
            raise ValueError(f"`top_k >= 1` must hold, but got top_k={top_k!r}")
        if not (isinstance(rescreen, int) and rescreen >= 0):
            raise ValueError(f"`rescreen >= 0` must hold, but got rescreen={rescreen!r}")
        if budget is not None and not (isinstance(budget, int) and budget >= 1):
            raise ValueError(f"`budget >= 1` must hold, but got budget={budget!r}")
        self._setup = setup
        self._seed = 0 if seed is None else int(seed)
        self._inner = inner
        self._inner_options = dict(inner_options or {})
        self._top_k = top_k
        self._rescreen = rescreen
        self._budget = budget
        self._fallback = RandomSampler(seed=seed)
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._problem: Problem | None = None
        self._gen = None
        self._batch: list[dict[str, Any]] = []
        self._phase = ""
        self._base = 0           # plan index of the current batch's first point
        self._records: list[dict[str, Any]] = []
        self._study_key: tuple[int, int] | None = None
        self._points: dict[int, dict[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_problem", "_gen", "_batch", "_records", "_points"):
            del state[key]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    # ---- BaseSampler ------------------------------------------------------------------

    def reseed_rng(self) -> None:
        self._fallback.reseed_rng()

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        point = self._points.get(trial_key(study, trial))
        if point is None:  # planned in another process, or a retry: read the storage
            point = stored_trial(study, trial).system_attrs.get(POINT)
        if point is not None and param_name in point:
            value = point[param_name]
            if contains(param_distribution, value):
                return value
        return self._fallback.sample_independent(study, trial, param_name,
                                                 param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if len(study.directions) > 1:
            raise ValueError("the structured sampler optimises one objective; use nsga2 or "
                             "tpe for a multi-objective study")
        attrs = trial.system_attrs
        if "fixed_params" in attrs or SLOT in attrs:
            return  # an enqueued trial (the baseline), or a retry that keeps its point
        with self._lock:
            slot, point = self._claim(study, trial)
            phase = self._phase
        set_trial_attrs(study, trial, system={POINT: point, SLOT: slot}, user={PHASE: phase})
        self._points[trial_key(study, trial)] = point

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._points.pop(trial_key(study, trial), None)

    # ---- the plan, rebuilt from the storage --------------------------------------------

    def _claim(self, study: Study, trial: FrozenTrial) -> tuple[int, dict[str, Any]]:
        """The trial's point: the plan's point number k for the k-th trial the driver
        proposes (trial numbers are given out atomically by the storage, so workers never
        take the same point).  A point of a batch the plan has not made yet waits for the
        batch before it to finish (other workers are evaluating it)."""
        slot = sum(1 for t in study.get_trials(deepcopy=False)
                   if t.number < trial.number and _proposed(t))
        deadline = time.monotonic() + _WAIT_S
        while True:
            self._advance(study, self._holders(study, exclude=trial.number), trial.number)
            if slot < self._base + len(self._batch):
                return slot, self._batch[slot - self._base]
            if time.monotonic() > deadline:
                raise RuntimeError("the structured sampler waited 600 s for other workers' "
                                   "trials of its current batch")
            time.sleep(0.05)

    def _holders(self, study: Study, exclude: int) -> dict[int, list[FrozenTrial]]:
        out: dict[int, list[FrozenTrial]] = {}
        for t in study.get_trials(deepcopy=False):
            slot = t.system_attrs.get(SLOT)
            if slot is not None and t.number != exclude:
                out.setdefault(int(slot), []).append(t)
        return out

    def _advance(self, study: Study, holders: Mapping[int, list[FrozenTrial]],
                 current: int) -> None:
        """Feed every finished batch to the plan (from its start after a restart)."""
        if self._gen is None or self._study_key != study_key(study):
            self._start(study, current)
        while True:
            values = [_value(holders.get(self._base + j, [])) for j in range(len(self._batch))]
            if any(v is None for v in values):
                return
            self._base += len(self._batch)
            self._phase, self._batch = self._gen.send(values)
            self._prefetch()

    def _start(self, study: Study, current: int) -> None:
        self._study_key = study_key(study)
        self._problem = Problem(self._setup)
        budget = study.user_attrs.get(BUDGET)
        if budget is None:
            budget = self._budget or _launch_budget(study, current)
            study.set_user_attr(BUDGET, int(budget))
        self._records = []
        self._gen = plan(self._problem, budget=int(budget), seed=self._seed, inner=self._inner,
                         inner_options=self._inner_options, top_k=self._top_k,
                         rescreen=self._rescreen, records=self._records)
        self._base = 0
        self._phase, self._batch = next(self._gen)
        if self._records and MEMORY not in study.user_attrs:
            study.set_user_attr(MEMORY, self._records)
        self._prefetch()

    def _prefetch(self) -> None:
        """Price the new batch in one call (shared kernel prices and memory checks); the
        objective takes each result when its trial runs."""
        if len(self._batch) > 1:
            from crossflow.search.objective import prefetch

            prefetch(self._setup, [self._setup.design(p) for p in self._batch])


def _launch_budget(study: Study, current: int) -> int:
    launches = {k: v for k, v in study.user_attrs.items() if k.startswith("launch.")}
    if not launches:
        return 300
    total = int(launches[max(launches)].get("n_trials") or 300)
    outside = sum(1 for t in study.get_trials(deepcopy=False)
                  if SLOT not in t.system_attrs and t.number != current)
    return max(1, total - outside)


def _proposed(trial: FrozenTrial) -> bool:
    """A trial the driver proposed (not an enqueued one, nor the retry of a failed one)."""
    return "fixed_params" not in trial.system_attrs and "failed_trial" not in trial.system_attrs


def _value(trials: list[FrozenTrial]) -> float | None:
    """The value of a point from its trials (the first complete one; inf when infeasible
    or when every trial of it failed), None while one is pending or none was seen yet."""
    from crossflow.search.study import is_feasible

    done = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.number)
    if done:
        t = done[0]
        return float(t.values[0]) if is_feasible(t) and t.values else math.inf
    if not trials or any(t.state in (TrialState.RUNNING, TrialState.WAITING)
                         for t in trials):
        return None
    return math.inf

