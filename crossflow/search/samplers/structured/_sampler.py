"""StructuredSampler: the driver's plan as an Optuna sampler, rebuilt from the storage.

How trials share the plan (one worker or many, on one machine or several):

* The plan (:func:`._plan.plan`) is deterministic given its seed, its start and the values
  it receives, so every worker rebuilds it from the storage: the values of the trials that
  evaluated its points, in plan order.  A trial records the plan index of its point
  (``structured:slot``) and the point itself before it runs; a trial whose point is not
  the plan's at its index (a study begun with other ``sampler_options``, or by another
  version of the driver) is not replayed, and the plan's own point is evaluated there.
* A new trial takes the lowest point of the current batch that no live trial holds.  When
  every point of the batch is held, it takes the oldest one still unanswered and evaluates
  it too (a duplicate): so a worker never waits for another one — a worker that was killed
  holds its point only until another worker evaluates it again — and the batch completes
  with the first answer.  Two workers that claim at the same instant may evaluate the same
  point; that costs one evaluation, never a wrong plan.
* The plan has no budget (it is an anytime search), so ``--trials N`` on a finished study
  goes on where it stopped, and a resumed study replays exactly.  A plan that ends (a
  space with nothing continuous, screened) hands the study to Optuna's multivariate TPE,
  which learns from the screen's trials.
* A point of the plan that a trial it did not place has evaluated — the baseline trials
  (the template's split under each technology, which the screen prices again), or another
  sampler's — is answered from that trial (the model is deterministic), not made a trial
  again.
* Switched to from another sampler, the plan starts from the study's best trial (its point
  is stored as the study attribute ``structured.start`` so that every later replay starts
  from the same point).
* The plan's seed is the first launch's, stored as ``structured.seed``: a later launch
  (seeded ``seed + k``) or another ``--seed`` replays the plan whose points the study
  evaluated, not another one fed their values.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, TPESampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from crossflow.search import keys
from crossflow.search.keys import PHASE
from crossflow.search.samplers.structured._plan import Settings, plan
from crossflow.search.samplers.structured._problem import Problem, point_key
from crossflow.search.trials import (
    all_trials,
    contains,
    set_trial_attrs,
    stored_trial,
    study_key,
    trial_key,
)

#: The driver's trial and study attributes (named in :mod:`crossflow.search.keys`).
SLOT, POINT = keys.DRIVER_SLOT, keys.DRIVER_POINT
START, SEED, MEMORY = keys.DRIVER_START, keys.DRIVER_SEED, keys.DRIVER_MEMORY
#: Points of a batch priced ahead in one call.
CHUNK = 512
#: The phase of trials after the plan's end (sampled by TPE).
DONE = "tpe"


class StructuredSampler(BaseSampler):
    """Structure-aware search (see :mod:`crossflow.search.samplers.structured`).

    Args:
        setup: the study (a :class:`crossflow.search.study.StudySetup`); the driver reads
            its template, search space and workload to screen and to find the AGE's steps.
        seed: seed of the plan's random choices (every worker of a launch uses the same;
            a study keeps its first launch's, :data:`SEED`).
        screen_cap, top_k, contenders, race: the plan's settings
            (:class:`._plan.Settings`, where each is described).
    """

    def __init__(self, *, setup, seed: int | None = None,
                 screen_cap: int | str | None = Settings.screen_cap, top_k: int = Settings.top_k,
                 contenders: int = Settings.contenders, race: int = Settings.race) -> None:
        self._settings = Settings(screen_cap=screen_cap, top_k=top_k, contenders=contenders,
                                  race=race)
        self._setup = setup
        self._seed = 0 if seed is None else int(seed)
        # after the plan's end (a space with nothing continuous, screened), Optuna's
        # multivariate TPE goes on from the study's trials
        self._after = TPESampler(seed=seed, multivariate=True, constant_liar=True)
        self._init_state()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._gen = None
        self._batch: list[dict[str, Any]] = []
        self._canon_of: list[dict[str, Any]] | None = None   # the batch _canon is of
        self._canon: list[str] = []
        #: trial number -> key of the point it holds (set once, with its slot): a claim looks
        #: at every held slot of a batch, so each trial's key is made once, not per claim
        self._held_keys: dict[int, str] = {}
        #: the values of the current batch's first points, each from a complete trial (the
        #: model is deterministic: a point's value, once known, is its value)
        self._answered: list[float] = []
        self._phase = ""
        self._base = 0           # plan index of the current batch's first point
        self._priced = 0         # plan index up to which the batch is priced ahead
        self._study_key: tuple[int, int] | None = None
        self._points: dict[tuple[int, int], dict[str, Any]] = {}
        self._handed: set[tuple[int, int]] = set()   # trials TPE samples (the plan ended)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_gen", "_batch", "_points", "_handed", "_canon_of", "_canon",
                    "_held_keys", "_answered"):
            del state[key]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_state()

    @property
    def settings(self) -> Settings:
        return self._settings

    # ---- BaseSampler ------------------------------------------------------------------

    def reseed_rng(self) -> None:
        self._after.reseed_rng()

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        if trial_key(study, trial) in self._handed:
            return self._after.infer_relative_search_space(study, trial)
        return {}

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if trial_key(study, trial) in self._handed:
            return self._after.sample_relative(study, trial, search_space)
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
        return self._after.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        if len(study.directions) > 1:
            raise ValueError("the structured sampler optimises one objective; use nsga2 or "
                             "tpe for a multi-objective study")
        attrs = trial.system_attrs
        if "fixed_params" in attrs or SLOT in attrs:
            return  # an enqueued trial (the baseline), or a retry that keeps its point
        with self._lock:
            claim = self._claim(study, trial)
        if claim is None:  # the plan has ended: TPE's points
            set_trial_attrs(study, trial, user={PHASE: DONE})
            self._handed.add(trial_key(study, trial))
            return
        slot, point, phase = claim
        set_trial_attrs(study, trial, system={POINT: point, SLOT: slot}, user={PHASE: phase})
        self._points[trial_key(study, trial)] = point

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._points.pop(trial_key(study, trial), None)
        self._handed.discard(trial_key(study, trial))

    # ---- the plan, rebuilt from the storage --------------------------------------------

    def _claim(self, study: Study, trial: FrozenTrial
               ) -> tuple[int, dict[str, Any], str] | None:
        """The slot, point and phase of a new trial (see the module docstring); None when
        the plan has ended (a space without continuous dimensions, screened)."""
        holders: dict[int, list[FrozenTrial]] = {}
        known: dict[str, float] = {}   # point key -> value, of the trials not the plan's
        for t in all_trials(study):
            slot = t.system_attrs.get(SLOT)
            if slot is not None and t.number != trial.number:
                holders.setdefault(int(slot), []).append(t)
            elif slot is None and t.state == TrialState.COMPLETE:
                # a point the plan did not place (the baseline: the template's split under
                # each technology, which the screen prices again; another sampler's
                # trials): the model is deterministic, so its value answers the plan's
                known.setdefault(point_key(t.params), _value([t]))
        self._advance(study, holders, known)
        if not self._batch:
            return None
        # the answered points first in the batch are held or answered: none is free
        batch = range(self._base + len(self._answered), self._base + len(self._batch))
        slot = next((j for j in batch if not self._holding(holders, j)
                     and self._answer(known, j) is None), None)
        if slot is None:  # every point held: the oldest unanswered one again (its worker
            # may be gone)
            slot = min((j for j in batch if _value(self._holding(holders, j)) is None
                        and self._answer(known, j) is None),
                       key=lambda j: min(t.number for t in self._holding(holders, j)))
        self._prefetch(slot)
        return slot, self._batch[slot - self._base], self._phase

    def _advance(self, study: Study, holders: dict[int, list[FrozenTrial]],
                 known: dict[str, float]) -> None:
        """Feed every answered batch to the plan (from its start after a restart)."""
        if self._gen is None or self._study_key != study_key(study):
            self._start(study)
        while self._batch:
            values = list(self._answered)
            for j in range(self._base + len(values), self._base + len(self._batch)):
                trials = self._holding(holders, j)
                v = _value(trials)
                final = v is not None and any(t.state == TrialState.COMPLETE for t in trials)
                if v is None and (v := self._answer(known, j)) is not None:
                    final = True  # a complete trial the plan did not place
                if v is None:
                    return  # a point not yet answered: the batch waits for it
                if final and len(self._answered) == len(values):
                    # kept: a failed point's inf is not (a retry may still answer it)
                    self._answered.append(v)
                values.append(v)
            self._base += len(self._batch)
            self._answered = []
            try:
                self._phase, self._batch = self._gen.send(values)
            except StopIteration:  # nothing continuous, screened: TPE from here on
                self._phase, self._batch = DONE, []
            self._prefetch()

    def _answer(self, known: dict[str, float], slot: int) -> float | None:
        """The value of the point at ``slot`` (of the current batch) from a trial the plan
        did not place (``known``: point key -> value), None when no such trial evaluated it."""
        self._canonical()
        return known.get(self._canon[slot - self._base])

    def _canonical(self) -> None:
        if self._canon_of is not self._batch:   # once per batch, not per claim
            self._canon_of, self._canon = self._batch, [point_key(p) for p in self._batch]

    def _holding(self, holders: dict[int, list[FrozenTrial]], slot: int
                 ) -> list[FrozenTrial]:
        """The trials at ``slot`` (of the current batch) that evaluated this plan's point
        there.  A trial of another plan (a study begun with other ``sampler_options``, or
        by another version of the driver) holds the slot but not the point: it is neither
        waited for nor replayed, so the plan is never fed the value of another point."""
        trials = holders.get(slot)
        if not trials:
            return []
        self._canonical()
        point = self._canon[slot - self._base]
        return [t for t in trials if self._held_key(t) == point]

    def _held_key(self, trial: FrozenTrial) -> str:
        key = self._held_keys.get(trial.number)
        if key is None:
            key = self._held_keys[trial.number] = point_key(trial.system_attrs.get(POINT))
        return key

    def _start(self, study: Study) -> None:
        self._study_key = study_key(study)
        self._held_keys, self._answered = {}, []
        if START not in study.user_attrs:
            study.set_user_attr(START, _incumbent(study))
        if SEED not in study.user_attrs:
            study.set_user_attr(SEED, self._seed)
        seed = int(study.user_attrs[SEED])
        records: list[dict[str, Any]] = []
        self._gen = plan(Problem(self._setup), seed=seed, settings=self._settings,
                         start=study.user_attrs.get(START), records=records)
        self._base = 0
        self._phase, self._batch = next(self._gen)
        if records and MEMORY not in study.user_attrs:
            study.set_user_attr(MEMORY, records)
        self._prefetch()

    def _prefetch(self, at: int | None = None) -> None:
        """Price the batch's next :data:`CHUNK` points from plan index ``at`` (default: the
        batch's start) in one call (shared kernel prices and memory checks); the objective
        takes each result when its trial runs.  In chunks, so that a short launch on a
        large screen does not price points it will never reach."""
        start = self._base if at is None else at
        if at is None:
            self._priced = self._base
        if start < self._priced or len(self._batch) <= 1:
            return
        part = self._batch[start - self._base:start - self._base + CHUNK]
        self._priced = start + len(part)
        if len(part) > 1:
            from crossflow.search.objective import prefetch

            prefetch(self._setup, [self._setup.design(p) for p in part])


def _incumbent(study: Study) -> dict[str, Any] | None:
    """The parameters of the study's best feasible trial that the driver did not plan (of
    another sampler); None when there is none, or when the best is an enqueued point (the
    baseline: the template's split under each technology, which the plan's own screen
    covers), so that the driver never starts from a point worse than the study's
    incumbent."""
    done = [t for t in all_trials(study) if t.state == TrialState.COMPLETE and t.values
            and keys.is_feasible(t) and SLOT not in t.system_attrs]
    if not done:
        return None
    best = min(done, key=lambda t: (t.values[0], t.number))
    return None if "fixed_params" in best.system_attrs else dict(best.params)


def _value(trials: list[FrozenTrial]) -> float | None:
    """The value of a point from its trials (the first complete one; inf when infeasible
    or when every trial of it failed), None while one is pending or none was seen yet."""
    done = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.number)
    if done:
        t = done[0]
        return float(t.values[0]) if keys.is_feasible(t) and t.values else math.inf
    if not trials or any(t.state in (TrialState.RUNNING, TrialState.WAITING)
                         for t in trials):
        return None
    return math.inf
