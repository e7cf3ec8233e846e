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
       on both halves (docs/search-benchmarks.md, "A ninth round").
    Every move is snapped to the AGE's step edges (:meth:`Problem.snap`).
    """
    best, fbest = start, f0
    used = 0
    coords = list(P.coords)
    if not coords or budget <= 0:
        return best, fbest
    steps = {c: step for c in coords}
    direction = {c: 1.0 for c in coords}
    gain = {c: 0.0 for c in coords}
    up_effect = {c: 0.0 for c in coords}   # f(up) − f: < 0 helps, > 0 hurts

    def moved(c: Coord, sign: float, size: float, at: Cont) -> Cont:
        return P.snap(at, P.move(at, c, sign * size), c, discrete)

    # 1. sensitivity, up then (for the flat ones) down
    ups = [moved(c, 1.0, steps[c], best) for c in coords][:budget]
    values = yield ups
    used += len(ups)
    flat = []
    for c, v in zip(coords, values, strict=False):
        up_effect[c] = v - fbest if math.isfinite(v) else math.inf
        if better(v, fbest):
            gain[c] = fbest - v
        elif same(v, fbest):
            flat.append(c)
        else:
            direction[c] = -1.0
    downs = [moved(c, -1.0, steps[c], best) for c in flat][:max(0, budget - used)]
    values_down: list[float] = []
    frozen = set(flat)
    if downs:
        values_down = yield downs
        used += len(downs)
        # a coordinate flat up rests until the end (its move down, when better, is kept):
        # it has no effect, or it has what it needs and only the others can use budget
        # better (letting the flat-up-better-down ones go on moved no median on the suite)
        for c, v in zip(flat, values_down, strict=False):
            if better(v, fbest):
                direction[c], gain[c] = -1.0, fbest - v
    for x, v in list(zip(ups, values, strict=False)) + list(zip(downs, values_down,
                                                                  strict=False)):
        if better(v, fbest):
            best, fbest = x, v
    live = [c for c in coords if c not in frozen] or coords
    resting: set[Coord] = set()

    fails = {c: 0 for c in coords}

    def candidates(c: Coord):
        """The moves of ``c`` in the order they are tried."""
        yield direction[c], lambda at: moved(c, direction[c], steps[c], at)
        yield -direction[c], lambda at: moved(c, -direction[c], steps[c], at)
        if c.index < 0:
            return
        mates = [d for d in live if d.block == c.block and d != c and d.index >= 0]
        cheap = sorted(mates, key=lambda d: -up_effect[d])[:donors]
        slack = P.slack(c.block)
        if best.simplexes[c.block][slack.index] > 1e-3:  # free budget first
            cheap.insert(0, slack)
        for d in cheap:
            yield 1.0, lambda at, d=d: P.snap_transfer(
                at, P.transfer(at, c, d, steps[c]), c, d, discrete)
        for r in sorted(mates, key=lambda d: up_effect[d])[:receivers]:
            yield -1.0, lambda at, r=r: P.transfer(at, r, c,
                                                           _shift(at, c, r, steps[c]))

    # 2. adaptive rounds
    wins = {c: 0 for c in coords}
    rounds = 0
    while used < budget:
        rounds += 1
        # a coordinate that never paid off in ``idle`` tries sits out two rounds of three
        order = sorted((c for c in live if c not in resting and (
            wins[c] > 0 or fails[c] < idle or rounds % 3 == 0)), key=lambda c: -gain[c])
        if not order:
            if all(steps[c] <= min_step for c in live):
                break
            resting.clear()
            for c in live:
                steps[c] = max(steps[c], 8 * min_step)
            continue
        improved_any = False
        origin = best
        for c in order:
            if used >= budget:
                break
            success = False
            for sign, make in candidates(c):
                if used >= budget:
                    break
                x = make(best)
                if x.key() == best.key():
                    continue
                (v,) = yield [x]
                used += 1
                if better(v, fbest):
                    success = True
                    improved_any = improved_any or v < fbest * (1 - revive_gain)
                    wins[c] += 1
                    gain[c] = max(gain[c], fbest - v)
                    best, fbest, direction[c] = x, v, sign
                    steps[c] = min(max_step, steps[c] * 2.0)
                    break
            if not success:
                fails[c] += 1
                steps[c] *= 0.5
                gain[c] *= 0.5
                if steps[c] < min_step:
                    resting.add(c)
        if improved_any:
            resting.clear()
        # Hooke and Jeeves's pattern move: the round's whole change made once more, for
        # as long as that improves (a valley the coordinates cross only one at a time)
        while pattern and improved_any and used < budget:
            x = _extrapolate(P, origin, best)
            if x.key() == best.key():
                break
            (v,) = yield [x]
            used += 1
            if not better(v, fbest):
                break
            origin, best, fbest = best, x, v
    return best, fbest


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
