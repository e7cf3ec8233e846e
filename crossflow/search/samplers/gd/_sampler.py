"""GDSampler: the paper's momentum-projected gradient descent as an Optuna sampler."""

from __future__ import annotations

import datetime
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, FloatDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from crossflow.search import encoding
from crossflow.search.samplers.gd._ledger import (
    BASE,
    CHAIN,
    FIXED,
    INDEPENDENT,
    MOVE,
    POINT,
    PROBE,
    ROLE,
    STATE,
    STEP,
    Ledger,
    Status,
    Step,
)
from crossflow.search.samplers.gd._moves import as_external, draw, neighbour
from crossflow.search.samplers.gd._simplex import mix_towards_vertex
from crossflow.search.samplers.gd._update import eq6_step, tiered_gradient
from crossflow.search.trials import all_trials, contains, set_trial_attrs, study_key, trial_key

_logger = optuna.logging.get_logger(__name__)

SEED = "gd:seed"
#: A step that changes nothing (no simplex moved by more than this, no move kept) is
#: stationary; a chain ends after this many stationary steps in a row.
_STILL = 1e-9
_STATIONARY_STEPS = 3
#: The largest finite-difference probe the adaptive probe grows to (a quarter of the way to
#: a vertex of the simplex).
_MAX_PROBE = 0.25
#: How long a new trial waits for lower-numbered running trials to claim their roles, and
#: how old (seconds since it started) an unclaimed running trial may be before it is
#: ignored (its worker died between creating it and claiming).
_CLAIM_WAIT = 10.0
# Tags of the keyed random streams: a chain's start, a step's moves, a dimension's draw.
_START, _MOVES, _DRAW = 0, 1, 2


class GDSampler(BaseSampler):
    """Momentum-projected gradient descent over budget simplexes (DeepFlow §7, eq. 6).

    See :mod:`crossflow.search.samplers.gd` for the protocol.

    Args:
        simplexes:
            Simplex name -> its components, as in :mod:`crossflow.search.encoding`: the
            study suggests floats ``"{simplex}.{component}"`` and ``"{simplex}.slack"``.
        seed:
            Seed of the random starts and moves. One worker and one seed give the same
            trials every time; several workers with the same seed run the same chains.
        steps:
            T, the number of steps of each chain (the paper: 100).
        restarts:
            S, the number of chains, each from a random start (the paper: 10). When all
            have ended, further trials go to ``independent_sampler``.
        learning_rate:
            η, the length of each normalised step in fraction space. With the average the
            point moves (1 − β)·η per step: 0.02 with the defaults, so a chain can cross a
            simplex (diameter √2) in about 70 of its 100 steps and settles to within about
            that distance of an optimum.
        beta:
            β, the weight of the exponential average in parameter space (the paper: 0.9).
        probe:
            h, the weight of a finite-difference probe: probe i evaluates
            (1 − h)·W + h·e_i, a step of about h towards vertex i that stays on the
            simplex. 0.02 matches the distance a step moves.
        categorical_moves:
            Search the dimensions outside the simplexes (categoricals, integers, other
            floats) by one neighbour move per dimension per step. If False they keep the
            values of the chain's random start.
        independent_sampler:
            Samples trials that belong to no chain: enqueued trials' unfixed parameters,
            trials after every chain has ended, and trials started while every chain waits
            for running trials. Default: :class:`~optuna.samplers.RandomSampler` with
            ``seed``.
    """

    def __init__(
        self,
        *,
        simplexes: Mapping[str, Sequence[str]],
        seed: int | None = None,
        steps: int = 100,
        restarts: int = 10,
        learning_rate: float = 0.2,
        beta: float = 0.9,
        probe: float = 0.02,
        categorical_moves: bool = True,
        independent_sampler: BaseSampler | None = None,
    ) -> None:
        if not (isinstance(steps, int) and steps >= 1):
            raise ValueError(f"`steps >= 1` must hold, but got steps={steps!r}")
        if not (isinstance(restarts, int) and restarts >= 1):
            raise ValueError(f"`restarts >= 1` must hold, but got restarts={restarts!r}")
        if not learning_rate > 0:
            raise ValueError(f"`learning_rate > 0` must hold, but got "
                             f"learning_rate={learning_rate!r}")
        if not 0 <= beta < 1:
            raise ValueError(f"`0 <= beta < 1` must hold, but got beta={beta!r}")
        if not 0 < probe <= 1:
            raise ValueError(f"`0 < probe <= 1` must hold, but got probe={probe!r}")
        self._simplexes: dict[str, list[str]] = {}
        self._coordinate: dict[str, tuple[str, int]] = {}
        for name, components in simplexes.items():
            components = [components] if isinstance(components, str) else list(components)
            if not components or len(set(components)) != len(components) \
                    or encoding.SLACK in components:
                raise ValueError(
                    f"a simplex needs distinct components other than {encoding.SLACK!r}, "
                    f"but got {name!r}: {components}")
            self._simplexes[name] = components
            for i, param in enumerate(encoding.param_names(name, components)):
                if param in self._coordinate:
                    raise ValueError(f"parameter {param!r} belongs to two simplexes")
                self._coordinate[param] = (name, i)
        self._independent = independent_sampler or RandomSampler(seed=seed)
        self._seed = int(np.random.SeedSequence().entropy % 2**63 if seed is None else seed)
        self._steps = steps
        self._restarts = restarts
        self._learning_rate = float(learning_rate)
        self._beta = float(beta)
        self._probe = float(probe)
        self._categorical_moves = bool(categorical_moves)
        self._init_caches()

    # Caches only: everything that matters is read back from the storage.
    def _init_caches(self) -> None:
        self._lock = threading.Lock()
        self._points: dict[tuple[int, int], tuple[int, dict[str, Any]] | None] = {}
        self._studies: dict[tuple[int, int], _StudyCache] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_points", "_studies"):
            del state[key]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_caches()

    # ---- BaseSampler -------------------------------------------------------------------

    def reseed_rng(self) -> None:
        # The chains' random streams are keyed by (seed, chain, step) and stored with the
        # trials, so workers need not differ; only the independent sampler is reseeded.
        self._independent.reseed_rng()

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        # Every value comes from the trial's planned point, parameter by parameter, so
        # nothing needs the relative interface (and the first trials know no space yet).
        return {}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        self._check_single_objective(study)
        return {name: self.sample_independent(study, trial, name, dist)
                for name, dist in search_space.items()}

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        self._check_single_objective(study)
        planned = self._planned(study, trial)
        if planned is None:
            return self._independent.sample_independent(
                study, trial, param_name, param_distribution)
        chain_seed, point = planned
        if param_name in point:
            value = _fit(param_distribution, point[param_name])
            if contains(param_distribution, value):
                return as_external(param_distribution, value)
        # A dimension the plan does not know yet (the chain's start, or a conditional
        # parameter): one random draw per chain and name, the same in every trial of the
        # chain, so it stays fixed while the chain probes the other dimensions.
        rng = np.random.default_rng([chain_seed, _DRAW, zlib.crc32(param_name.encode())])
        return draw(param_distribution, rng)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._independent.before_trial(study, trial)
        if len(study.directions) > 1:
            return  # sample_* raise the error
        attrs = dict(trial.system_attrs)
        if ROLE not in attrs:  # (a retry by RetryHeartbeatStaleTrialCallback keeps its copied role)
            claim = {ROLE: FIXED} if "fixed_params" in attrs else self._claim(study, trial)
            set_trial_attrs(study, trial, system=claim)  # gd:role last: it marks the claim
            attrs.update(claim)
        self._points[_key(study, trial)] = _plan_of(attrs)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._points.pop(_key(study, trial), None)
        self._independent.after_trial(study, trial, state, values)

    # ---- the protocol ------------------------------------------------------------------

    def _check_single_objective(self, study: Study) -> None:
        if len(study.directions) > 1:
            raise ValueError(
                "GDSampler optimises a single objective, but the study has "
                f"{len(study.directions)} (directions={[d.name for d in study.directions]}); "
                "use NSGAIISampler or TPESampler for a multi-objective study")

    def _planned(self, study: Study, trial: FrozenTrial) -> tuple[int, dict[str, Any]] | None:
        key = _key(study, trial)
        if key not in self._points:  # not planned in this process: read the storage
            self._points[key] = _plan_of(trial.system_attrs)
        return self._points[key]

    def _settled_trials(self, study: Study, trial: FrozenTrial,
                        start: int) -> list[FrozenTrial]:
        """The study's trials from number ``start`` on, once every lower-numbered running
        trial has claimed its role.

        Trial numbers are handed out atomically by the storage, so "claim in trial-number
        order" gives each worker a consistent view: a trial plans from the claims of all
        trials before it and none after it (two workers never claim the same role)."""
        deadline = time.monotonic() + _CLAIM_WAIT
        delay = 0.001
        while True:
            trials = all_trials(study)
            if trials and trials[-1].number == len(trials) - 1:  # index == number
                trials = trials[min(start, len(trials)):]
            now = datetime.datetime.now()
            unclaimed = any(
                t.state == TrialState.RUNNING and t.number < trial.number
                and ROLE not in t.system_attrs and t.datetime_start is not None
                and (now - t.datetime_start).total_seconds() < _CLAIM_WAIT
                for t in trials)
            if not unclaimed or time.monotonic() > deadline:
                return trials
            time.sleep(delay)
            delay = min(2 * delay, 0.05)

    def _claim(self, study: Study, trial: FrozenTrial) -> dict[str, Any]:
        """The role of a new trial: the first free role of the first chain that has one."""
        cache = self._studies.setdefault(study_key(study), _StudyCache())
        trials = self._settled_trials(study, trial, cache.watermark)
        with self._lock:  # (the caches; the claim order is the trial-number order)
            ledger = Ledger.read(trials, skip=trial.number, ignore_chains=cache.ended)
            claim = self._first_free_role(study, ledger, cache)
            cache.advance(trials, ledger, trial.number)
        if claim[ROLE] == INDEPENDENT and len(cache.ended) == self._restarts \
                and not cache.told_exhausted:
            cache.told_exhausted = True
            _logger.info(f"GDSampler: all {self._restarts} chains have ended; further "
                         "trials are sampled by the independent sampler")
        return claim

    def _first_free_role(self, study: Study, ledger: Ledger,
                         cache: _StudyCache) -> dict[str, Any]:
        ended = cache.ended
        sign = -1.0 if study.direction == StudyDirection.MAXIMIZE else 1.0
        for chain in range(self._restarts):
            if chain in ended:
                continue
            steps = ledger.chains.get(chain)
            if not steps:
                return self._assign(chain, 0, BASE, self._start(chain), True)
            t = max(steps)
            step = steps[t]
            state = step.state()
            if state is None:  # its opening claim is still being written
                continue
            status = {role: step.status(role) for role in self._roles(state)}
            free = [role for role, s in status.items() if s is Status.FREE]
            if free:
                return self._assign(chain, t, free[0], state, False)
            if any(s is Status.PENDING for s in status.values()):
                continue  # wait for this chain's running trials; try the next chain
            following = self._next_state(steps, t, state, sign) if t + 1 < self._steps \
                else None
            if following is None:
                ended.add(chain)
                continue
            role = next(iter(self._roles(following)))
            return self._assign(chain, t + 1, role, following, True)
        return {ROLE: INDEPENDENT}

    def _assign(self, chain: int, step: int, role: str, state: dict[str, Any],
                first: bool) -> dict[str, Any]:
        claim: dict[str, Any] = {CHAIN: chain, STEP: step, SEED: state["seed"],
                                 POINT: self._point(state, role)}
        if first:  # the first trial claimed in a step carries the chain's state
            claim[STATE] = state
        claim[ROLE] = role
        return claim

    def _roles(self, state: Mapping[str, Any]) -> list[str]:
        """A step's roles: its base (unless the point was evaluated the step before), one
        probe per simplex coordinate (the slack included), one move per dimension."""
        roles = [] if state.get("alias") else [BASE]
        for simplex in state["fractions"]:
            roles += [PROBE + p
                      for p in encoding.param_names(simplex, self._simplexes[simplex])]
        return roles + [MOVE + name for name, _, _ in state["moves"]]

    def _point(self, state: Mapping[str, Any], role: str) -> dict[str, Any]:
        """The planned parameter values of a role (encoded simplex values, discrete values)."""
        fractions = {s: np.asarray(w, dtype=float) for s, w in state["fractions"].items()}
        discrete = dict(state["discrete"])
        if role.startswith(PROBE):
            simplex, i = self._coordinate[role[len(PROBE):]]
            fractions[simplex] = mix_towards_vertex(fractions[simplex], i,
                                                    state.get("probe", self._probe))
        elif role.startswith(MOVE):
            name = role[len(MOVE):]
            discrete[name] = next(v for n, v, _ in state["moves"] if n == name)
        point: dict[str, Any] = {}
        for simplex, w in fractions.items():
            names = encoding.param_names(simplex, self._simplexes[simplex])
            point.update(zip(names, encoding.encode(w.tolist()), strict=True))
        point.update(discrete)
        return point

    def _chain_seed(self, chain: int) -> int:
        return int(np.random.SeedSequence([self._seed, chain]).generate_state(1)[0])

    def _start(self, chain: int) -> dict[str, Any]:
        """A chain's step 0: uniform (Dirichlet(1, …, 1)) fractions on every simplex (step 1
        drops those the objective did not suggest); the other dimensions are drawn when
        first suggested."""
        seed = self._chain_seed(chain)
        rng = np.random.default_rng([seed, _START])
        fractions = {simplex: rng.dirichlet(np.ones(len(components) + 1)).tolist()
                     for simplex, components in self._simplexes.items()}
        return {"seed": seed, "fractions": fractions, "momentum": fractions, "discrete": {},
                "moves": [], "directions": {}, "stationary": 0, "alias": None,
                "probe": self._probe}

    def _next_state(self, steps: Mapping[int, Step], t: int, state: Mapping[str, Any],
                    sign: float) -> dict[str, Any] | None:
        """Step t + 1 from the finished step t (None: the chain has converged)."""
        step = steps[t]
        base_at = state.get("alias") or [t, BASE]
        base = steps[base_at[0]].result(base_at[1])
        f0 = steps[base_at[0]].loss(base_at[1], sign)

        fractions, momentum, moved = {}, {}, 0.0
        probe = state.get("probe", self._probe)
        flat = True
        for simplex, w in state["fractions"].items():
            names = encoding.param_names(simplex, self._simplexes[simplex])
            g = tiered_gradient(f0, [step.loss(PROBE + n, sign) for n in names], probe)
            flat = flat and not np.any(g)
            w_new, m_new = eq6_step(w, state["momentum"][simplex], g,
                                    learning_rate=self._learning_rate, beta=self._beta)
            moved = max(moved, float(np.max(np.abs(w_new - np.asarray(w)))))
            fractions[simplex], momentum[simplex] = w_new.tolist(), m_new.tolist()

        discrete = dict(state["discrete"])
        distributions: dict[str, BaseDistribution] = {}
        if base is not None and base.params:
            # The dimensions the base suggested (drawn at random when new) make the chain's
            # discrete point; when the base completed, what it did not suggest (simplexes
            # included) is dropped.
            if base.state == TrialState.COMPLETE:
                fractions = {s: w for s, w in fractions.items()
                             if any(n in base.params for n in
                                    encoding.param_names(s, self._simplexes[s]))}
                momentum = {s: momentum[s] for s in fractions}
                discrete = {}
            for name, value in base.params.items():
                if name not in self._coordinate:
                    discrete[name] = value
                    distributions[name] = base.distributions[name]

        # Neighbour moves: keep the best one that lowers the loss; a direction that did
        # not help is reversed for the next step.
        directions = dict(state["directions"])
        kept, best = None, f0
        for name, value, kind in state["moves"]:
            f = step.loss(MOVE + name, sign)
            if kind != "jump":
                went = 1 if kind == "+" else -1
                directions[name] = went if f < f0 else -went
            if f < best:
                kept, best = (name, value), f
        if kept is not None:
            discrete[kept[0]] = kept[1]

        # A flat step with room to widen its probes is not stationary: it looks further.
        widening = flat and probe < _MAX_PROBE
        stationary = 0 if (moved > _STILL or kept is not None or widening
                           or set(fractions) != set(state["fractions"])) \
            else state["stationary"] + 1
        if stationary >= _STATIONARY_STEPS:
            return None

        moves = []
        if self._categorical_moves:
            rng = np.random.default_rng([state["seed"], _MOVES, t + 1])
            for name in sorted(discrete):
                if name not in distributions:
                    continue
                direction = directions.setdefault(name, 1 if rng.random() < 0.5 else -1)
                proposal = neighbour(distributions[name], discrete[name], direction, t + 1,
                                     rng)
                if proposal is not None:
                    moves.append([name, proposal[0], proposal[1]])
        # The model is piecewise constant in the budgets (whole MCUs, banks, devices,
        # links): when no probe changed the loss, the next step probes twice as far (up to
        # _MAX_PROBE); once probes see a slope again, they come back towards the set size.
        probe = min(2 * probe, _MAX_PROBE) if flat else max(self._probe, probe / 2)
        following = {"seed": state["seed"], "fractions": fractions, "momentum": momentum,
                     "discrete": discrete, "moves": moves, "directions": directions,
                     "stationary": stationary, "alias": None, "probe": probe}
        # The new base point may be one that step t evaluated already (no simplex moved,
        # and the kept move or nothing changed the rest): reuse that trial, do not repeat it.
        if moved <= _STILL:
            at = base_at if kept is None else [t, MOVE + kept[0]]
            trial_at = steps[at[0]].result(at[1])
            if trial_at is not None and steps[at[0]].status(at[1]) is Status.DONE \
                    and trial_at.params == self._point(following, BASE):
                following["alias"] = at
        if not self._roles(following):
            return None  # nothing left to evaluate
        return following


class _StudyCache:
    """What one process may remember about a study to save work, never to decide: chains
    known to have ended (they stay ended) and the watermark, a trial number below which
    every trial is finished and irrelevant (ended chains, steps long past)."""

    def __init__(self) -> None:
        self.ended: set[int] = set()
        self.watermark = 0
        self.told_exhausted = False

    def advance(self, trials: Sequence[FrozenTrial], ledger: Ledger, current: int) -> None:
        mark = current
        for t in trials:
            if t.state in (TrialState.RUNNING, TrialState.WAITING):
                mark = min(mark, t.number)
                break
        for chain, steps in ledger.chains.items():
            if chain in self.ended:
                continue
            # A step's base may stand for the next ones (alias) while nothing changes:
            # at most _STATIONARY_STEPS steps back.
            recent = max(steps) - _STATIONARY_STEPS - 1
            for number, step in steps.items():
                if number >= recent:
                    mark = min(mark, *(t.number for ts in step.attempts.values() for t in ts))
        self.watermark = max(self.watermark, mark)


def _key(study: Study, trial: FrozenTrial) -> tuple[int, int]:
    return trial_key(study, trial)


def _plan_of(attrs: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
    if attrs.get(ROLE) in (None, INDEPENDENT, FIXED) or POINT not in attrs:
        return None
    return int(attrs[SEED]), attrs[POINT]


def _fit(distribution: BaseDistribution, value: Any) -> Any:
    """A planned simplex value clipped into a float distribution that is narrower than
    [-SPAN, SPAN] (and onto its grid)."""
    if isinstance(distribution, FloatDistribution) and isinstance(value, (int, float)) \
            and not isinstance(value, bool) and not distribution.log:
        value = min(max(float(value), distribution.low), distribution.high)
        if distribution.step is not None:
            k = round((value - distribution.low) / distribution.step)
            value = min(distribution.low + k * distribution.step, distribution.high)
    return value
