"""The driver's local search: a cliff-aware exchange.

Each method is a generator ``method(problem, discrete, start, f0, budget, rng)`` that
yields batches of continuous points (:class:`~._problem.Cont`; a batch's points can be
evaluated side by side), receives their objective values (``inf`` when infeasible), spends
at most ``budget`` evaluations and returns ``(best point, best value)``.

* :func:`exchange` — an adaptive coordinate search (a pattern search whose steps double
  on success and halve on failure) whose every move lands on a step edge of the AGE
  (:meth:`~._problem.Problem.snap`), with pairwise exchanges between components: the
  plateau around an optimum is left only by moving budget between two components; after
  a round that improved, Hooke and Jeeves's pattern move (the round's change made again).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from crossflow.search.samplers.structured._problem import (
    Cont,
    Coord,
    Inner,
    Problem,
    better,
    same,
)


def exchange(P: Problem, discrete: Mapping[str, Any], start: Cont, f0: float, budget: int,
             rng: np.random.Generator, *, step: float = 0.2, min_step: float = 0.004,
             max_step: float = 1.5, donors: int = 2, idle: int = 3, receivers: int = 1,
             revive_gain: float = 1e-4, pattern: bool = True) -> Inner:
    """Cliff-aware adaptive coordinate exchange.

    1. Sensitivity: one move up of every coordinate (one batch), then a move down of those
       whose move up changed nothing; those rest for the rest of the run (no effect, or
       the component has what it needs).
    2. Rounds over the live coordinates, the most rewarding first.  For a coordinate, in
       order: its last good direction (the others share the change in proportion); the
       other direction; the coordinate up, paid for by the slack or by one of the
       ``donors`` components whose move up helped least; the coordinate down, given to the
       ``receivers`` components whose move up helped most.  Pairwise exchanges matter
       because the plateau around an optimum is left only by moving budget between two
       components (more register banks from L2's area without taking a bundle from the
       core).  A success doubles the coordinate's step; a failure halves it; a coordinate
       below ``min_step`` rests until another one improves, and one with no success in
       ``idle`` attempts sits out two rounds of three.
    3. After a round that improved, Hooke and Jeeves's pattern move (``pattern``; Hooke
       and Jeeves, J. ACM 8(2), 1961): the round's whole change made once more, repeated
       while it improves.  It lowered the suite's median gaps at 300 and 1000 evaluations
       on both halves (docs/search-history.md, "A ninth round").
    Every move is snapped to the AGE's step edges (:meth:`Problem.snap`).
    """
    if not P.coords or budget <= 0:
        return start, f0
    run = _Exchange(P, discrete, start, f0, budget, step=step, min_step=min_step,
                    max_step=max_step, donors=donors, idle=idle, receivers=receivers,
                    revive_gain=revive_gain)
    yield from run.sensitivity()
    while run.used < budget and not run.spent:
        improved = yield from run.round()
        if improved and pattern:
            yield from run.pattern_move()
    return run.best, run.fbest


class _Exchange:
    """One run of :func:`exchange`: its incumbent and each coordinate's step, direction,
    gain and record; its methods are the generators of the run's steps."""

    def __init__(self, P: Problem, discrete: Mapping[str, Any], start: Cont, f0: float,
                 budget: int, *, step: float, min_step: float, max_step: float, donors: int,
                 idle: int, receivers: int, revive_gain: float) -> None:
        self.P, self.discrete, self.budget = P, discrete, budget
        self.min_step, self.max_step, self.donors = min_step, max_step, donors
        self.idle, self.receivers, self.revive_gain = idle, receivers, revive_gain
        self.best, self.fbest, self.used = start, f0, 0
        self.coords = coords = list(P.coords)
        self.steps = {c: step for c in coords}
        self.direction = {c: 1.0 for c in coords}
        self.gain = {c: 0.0 for c in coords}
        self.up_effect = {c: 0.0 for c in coords}   # f(up) − f: < 0 helps, > 0 hurts
        self.fails = {c: 0 for c in coords}
        self.wins = {c: 0 for c in coords}
        self.live, self.resting, self.rounds = coords, set(), 0
        self.origin, self.spent = start, False  # where the last round began; steps spent

    def moved(self, c: Coord, sign: float, size: float, at: Cont) -> Cont:
        return self.P.snap(at, self.P.move(at, c, sign * size), c, self.discrete)

    def sensitivity(self):
        """1. One move up of every coordinate, then a move down of those flat up."""
        coords, fbest = self.coords, self.fbest
        ups = [self.moved(c, 1.0, self.steps[c], self.best) for c in coords][:self.budget]
        values = yield ups
        self.used += len(ups)
        flat = []
        for c, v in zip(coords, values, strict=False):
            self.up_effect[c] = v - fbest if math.isfinite(v) else math.inf
            if better(v, fbest):
                self.gain[c] = fbest - v
            elif same(v, fbest):
                flat.append(c)
            else:
                self.direction[c] = -1.0
        downs = [self.moved(c, -1.0, self.steps[c], self.best)
                 for c in flat][:max(0, self.budget - self.used)]
        values_down: list[float] = []
        if downs:
            values_down = yield downs
            self.used += len(downs)
            # a coordinate flat up rests until the end (its move down, when better, is
            # kept): it has no effect, or it has what it needs and only the others can use
            # budget better (letting the flat-up-better-down ones go on moved no median on
            # the suite)
            for c, v in zip(flat, values_down, strict=False):
                if better(v, fbest):
                    self.direction[c], self.gain[c] = -1.0, fbest - v
        for x, v in list(zip(ups, values, strict=False)) + list(zip(downs, values_down,
                                                                      strict=False)):
            if better(v, self.fbest):
                self.best, self.fbest = x, v
        frozen = set(flat)
        self.live = [c for c in coords if c not in frozen] or coords

    def candidates(self, c: Coord):
        """The moves of ``c`` in the order they are tried, as (sign, point from ``at``)."""
        P, steps, direction = self.P, self.steps, self.direction
        yield direction[c], lambda at: self.moved(c, direction[c], steps[c], at)
        yield -direction[c], lambda at: self.moved(c, -direction[c], steps[c], at)
        if c.index < 0:
            return
        mates = [d for d in self.live if d.block == c.block and d != c and d.index >= 0]
        cheap = sorted(mates, key=lambda d: -self.up_effect[d])[:self.donors]
        slack = P.slack(c.block)
        if self.best.simplexes[c.block][slack.index] > 1e-3:  # free budget first
            cheap.insert(0, slack)
        for d in cheap:
            yield 1.0, lambda at, d=d: P.snap_transfer(
                at, P.transfer(at, c, d, steps[c]), c, d, self.discrete)
        for r in sorted(mates, key=lambda d: self.up_effect[d])[:self.receivers]:
            yield -1.0, lambda at, r=r: P.transfer(at, r, c, _shift(at, c, r, steps[c]))

    def round(self):
        """2. One round over the live coordinates, the most rewarding first; returns
        whether it improved (``spent`` is set when every coordinate's step is spent)."""
        steps, live, resting = self.steps, self.live, self.resting
        self.rounds += 1
        # a coordinate that never paid off in ``idle`` tries sits out two rounds of three
        order = sorted((c for c in live if c not in resting and (
            self.wins[c] > 0 or self.fails[c] < self.idle or self.rounds % 3 == 0)),
            key=lambda c: -self.gain[c])
        if not order:
            if all(steps[c] <= self.min_step for c in live):
                self.spent = True
                return False
            resting.clear()
            for c in live:
                steps[c] = max(steps[c], 8 * self.min_step)
            return False
        improved_any = False
        self.origin = self.best
        for c in order:
            if self.used >= self.budget:
                break
            success = False
            for sign, make in self.candidates(c):
                if self.used >= self.budget:
                    break
                x = make(self.best)
                if x.key() == self.best.key():
                    continue
                (v,) = yield [x]
                self.used += 1
                if better(v, self.fbest):
                    success = True
                    improved_any = improved_any or v < self.fbest * (1 - self.revive_gain)
                    self.wins[c] += 1
                    self.gain[c] = max(self.gain[c], self.fbest - v)
                    self.best, self.fbest, self.direction[c] = x, v, sign
                    steps[c] = min(self.max_step, steps[c] * 2.0)
                    break
            if not success:
                self.fails[c] += 1
                steps[c] *= 0.5
                self.gain[c] *= 0.5
                if steps[c] < self.min_step:
                    resting.add(c)
        if improved_any:
            resting.clear()
        return improved_any

    def pattern_move(self):
        """3. Hooke and Jeeves's pattern move: the round's whole change (from ``origin``)
        made once more, for as long as that improves (a valley the coordinates cross only
        one at a time)."""
        origin = self.origin
        while self.used < self.budget:
            x = _extrapolate(self.P, origin, self.best)
            if x.key() == self.best.key():
                break
            (v,) = yield [x]
            self.used += 1
            if not better(v, self.fbest):
                break
            origin, self.best, self.fbest = self.best, x, v


#: A share's floor in :func:`_extrapolate` (the encoding clips far above it).
_TINY = 1e-300


def _extrapolate(P: Problem, a: Cont, b: Cont) -> Cont:
    """``b`` moved again by the change from ``a`` to ``b``: every simplex share multiplied
    by its ratio b / a (a step in the log-shares, the coordinates the exchange moves in),
    renormalised; every float range moved by b − a, clipped to its bounds."""
    simplexes = {}
    for name, y in b.simplexes.items():
        x = np.maximum(a.simplexes[name], _TINY)
        z = np.maximum(y, _TINY) ** 2 / x
        simplexes[name] = z / z.sum()
    floats = dict(b.floats)
    for c in P.coords:
        if c.index < 0:
            floats[c.name] = min(c.high, max(c.low, 2 * b.floats[c.name] - a.floats[c.name]))
    return Cont(simplexes, floats)


def _shift(at: Cont, frm: Coord, to: Coord, s: float) -> float:
    """The exp-scale of ``to`` that takes the share ``frm`` loses when scaled by exp(−s)."""
    x = at.simplexes[frm.block]
    amount = x[frm.index] * (1.0 - math.exp(-s))
    return math.log1p(amount / x[to.index])
