"""Inner continuous methods: the budget split of one discrete combination.

Each method is a generator ``method(problem, discrete, start, f0, budget, rng)`` that
yields batches of continuous points (:class:`~._problem.Cont`; a batch's points can be
evaluated side by side), receives their objective values (``inf`` when infeasible), spends
at most ``budget`` evaluations and returns ``(best point, best value)``.

* :func:`exchange` — the default of ``structured``: a cliff-aware adaptive coordinate
  search (each coordinate's step doubles while it improves — a line search — and halves
  when neither direction does); every move lands on a step edge of the AGE.
* :func:`gd` — the paper's eq. 6 (:func:`eq6`: normalised finite-difference gradient on
  each simplex, β-average in parameter space, exact projection; chains side by side, a
  line search along each step, coordinates a first pass shows to be flat frozen, each
  probe landed on its coordinate's next step edge when that is nearer than the mix, the
  step landed on a step edge), then :func:`exchange` across the cliffs where eq. 6 stalls.
* :func:`compass` — a compass search on the softmax logits (coarse steps first: the
  best-known search's refinement), then the exchange; the plan's restart of a stalled
  search.
* :func:`lattice` — scans of the whole-unit lattice of the area simplex
  (:mod:`crossflow.search.lattice`): the plan's last resort for a search stalled for good.
* :func:`cmaes` and :func:`tpe` — CMA-ES (the ``cmaes`` package) and Optuna's TPE, ask and
  tell on the encoded simplex parameters, as baselines for the inner search.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from crossflow.search import encoding
from crossflow.search.samplers.structured._eq6 import eq6
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
             max_step: float = 1.5, donors: int = 2, every: int = 3,
             saturate: bool = True, idle: int = 3, receivers: int = 1,
             revive_gain: float = 1e-4, units: int = 0, hop_patience: int = 0,
             hop_budget: int = 80, hop_gain: float = 1e-3, flat_limit: int = 2) -> Inner:
    """Cliff-aware adaptive coordinate exchange.

    1. Sensitivity: one move up of every coordinate (one batch), then a move down of those
       whose move up changed nothing.  Flat both ways: no effect, frozen.  Flat up and
       worse down (``saturate``): the component has what it needs, frozen too.
    2. Rounds over the live coordinates, the most rewarding first.  For a coordinate, in
       order: its last good direction (the others share the change in proportion); the
       other direction; the coordinate up, paid for by the slack or by one of the
       ``donors`` components whose move up helped least; the coordinate down, given to the
       ``receivers`` components whose move up helped most.  Pairwise exchanges matter
       because the plateau around an optimum is left only by moving budget between two
       components (more register banks from L2's area without taking a bundle from the
       core).  The rarely useful middle moves are tried every ``every``-th attempt only.
       A success doubles the coordinate's step; a failure halves it; a coordinate below
       ``min_step`` rests until another one improves, and one with no success in ``idle``
       attempts sits out two rounds of three.  A coordinate whose last ``flat_limit``
       moves all changed nothing is frozen for the rest of the run (the perimeter shares
       of ``paper-lstm-512`` took 27 of gd's 162 exchange moves before this rule: 1.21 →
       0.64 % at 300 evaluations).
    Every move is snapped to the AGE's step edges (:meth:`Problem.snap`).

    The defaults are the best of the variants measured on ``paper-lstm-512`` (budget 300
    and 600), ``gemm-64k`` and ``quickstart`` (1000): see the README's search section.
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
        # flat both ways: no effect; flat up and worse down: saturated (it has what it
        # needs; only the others can use budget better).  Both rest until the end.
        frozen = {c for c, v in zip(flat, values_down, strict=False)
                  if saturate or same(v, fbest)}
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
    flats = {c: 0 for c in coords}

    def candidates(c: Coord):
        """The moves of ``c`` in the order they are tried."""
        full = fails[c] % every == 0
        yield direction[c], lambda at: moved(c, direction[c], steps[c], at)
        if full:
            yield -direction[c], lambda at: moved(c, -direction[c], steps[c], at)
        if c.index < 0:
            return
        mates = [d for d in live if d.block == c.block and d != c and d.index >= 0]
        if full:
            cheap = sorted(mates, key=lambda d: -up_effect[d])[:donors]
            slack = P.slack(c.block)
            if best.simplexes[c.block][slack.index] > 1e-3:  # free budget first
                cheap.insert(0, slack)
            for d in cheap:
                yield 1.0, lambda at, d=d: P.snap_transfer(
                    at, P.transfer(at, c, d, steps[c]), c, d, discrete)
            # one more unit of c paid for by the largest shares: both sides' effects on
            # the units counted (a register bank per MCU from the core: fewer MCUs share)
            rich = sorted(mates, key=lambda d: -best.simplexes[c.block][d.index])[:units]
            for d in rich:
                yield 1.0, lambda at, d=d: P.unit_transfer(at, c, d, discrete)
        for r in sorted(mates, key=lambda d: up_effect[d])[:receivers]:
            yield -1.0, lambda at, r=r: P.transfer(at, r, c,
                                                           _shift(at, c, r, steps[c]))

    # 2. adaptive rounds
    wins = {c: 0 for c in coords}
    rounds = 0
    last_gain, tried = used, set()
    while used < budget:
        rounds += 1
        if hop_patience and used - last_gain >= hop_patience and \
                budget - used >= 2 * hop_budget:
            # stalled: hop to another lattice point (one unit exchanged between two
            # components) and search from there; kept when it ends better
            last_gain = used
            hops = [h for h in _unit_hops(P, best, discrete) if h.key() not in tried][:
                budget - used - hop_budget]
            tried.update(h.key() for h in hops)
            if hops:
                got = yield hops
                used += len(hops)
                v, i = min((v, i) for i, v in enumerate(got))
                if math.isfinite(v):
                    tally = [0]
                    x, v = yield from _counted(exchange(P, discrete, hops[i], v, hop_budget, rng,
                                               step=step, min_step=min_step,
                                               max_step=max_step, donors=donors,
                                               every=every, saturate=saturate, idle=idle,
                                               receivers=receivers,
                                               revive_gain=revive_gain, units=units),
                                               tally)
                    used += tally[0]
                    if better(v, fbest):
                        best, fbest = x, v
                        resting.clear()
                        for c in live:
                            steps[c] = max(steps[c], step)
                continue
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
                flats[c] = flats[c] + 1 if same(v, fbest) else 0
                if better(v, fbest):
                    success = True
                    improved_any = improved_any or v < fbest * (1 - revive_gain)
                    if v < fbest * (1 - hop_gain):
                        last_gain = used
                    wins[c] += 1
                    gain[c] = max(gain[c], fbest - v)
                    best, fbest, direction[c] = x, v, sign
                    steps[c] = min(max_step, steps[c] * 2.0)
                    break
            if not success and flat_limit and flats[c] >= flat_limit:
                # its last ``flat_limit`` moves changed nothing: no effect here, frozen
                # (out of ``live``) like the flat coordinates of the sensitivity pass
                live.remove(c)
                if not live:
                    break
                continue
            if not success:
                fails[c] += 1
                steps[c] *= 0.5
                gain[c] *= 0.5
                if steps[c] < min_step:
                    resting.add(c)
        if improved_any:
            resting.clear()
    return best, fbest


def _counted(gen: Inner, tally: list[int]) -> Inner:
    """``gen`` run through, its evaluations added to ``tally[0]``."""
    try:
        batch = next(gen)
        while True:
            got = yield batch
            tally[0] += len(batch)
            batch = gen.send(got)
    except StopIteration as end:
        return end.value


def _unit_hops(P: Problem, at: Cont, discrete: Mapping[str, Any]) -> list[Cont]:
    """Every lattice neighbour of ``at`` one unit exchange away: for each pair of
    components of a simplex, one more unit of the first paid for by the second, and one
    unit fewer of the second with what it frees given to the first
    (:meth:`Problem.unit_transfer`); those that change nothing left out."""
    out, seen = [], {at.key()}
    for to in P.coords:
        for frm in P.coords:
            if to.index < 0 or frm.block != to.block or frm == to:
                continue
            for drop in (False, True):
                x = P.unit_transfer(at, to, frm, discrete, drop=drop)
                if x.key() not in seen:
                    seen.add(x.key())
                    out.append(x)
    return out


def _shift(at: Cont, frm: Coord, to: Coord, s: float) -> float:
    """The exp-scale of ``to`` that takes the share ``frm`` loses when scaled by exp(−s)."""
    x = at.simplexes[frm.block]
    amount = x[frm.index] * (1.0 - math.exp(-s))
    return math.log1p(amount / x[to.index])


def gd(P: Problem, discrete: Mapping[str, Any], start: Cont, f0: float, budget: int,
       rng: np.random.Generator, *, polish: float = 0.8, **options: Any) -> Inner:
    """Eq. 6 (:func:`eq6`) for the descent, then — past a fraction ``1 − polish`` of the
    budget, or once its steps stall — the cliff-aware :func:`exchange` from the best point
    for the rest: finite differences see no gradient across a cliff (the model is
    piecewise constant in whole units), which is where eq. 6 stalls.  ``polish`` 0.8 is
    the best of 0.5–0.9 measured with edge probes (README's search section).  Options
    that eq. 6 does not take go to the exchange."""
    first = int(budget * (1.0 - polish))
    mine = inspect.signature(eq6).parameters
    x, fx = yield from eq6(P, discrete, start, f0, first, rng,
                           **{k: v for k, v in options.items() if k in mine})
    rest = budget - first
    if rest > 0:
        x, fx = yield from exchange(P, discrete, x, fx, rest, rng,
                                    **{k: v for k, v in options.items() if k not in mine})
    return x, fx


def cmaes(P: Problem, discrete: Mapping[str, Any], start: Cont, f0: float, budget: int,
          rng: np.random.Generator, *, sigma: float = 0.5, **_: Any) -> Inner:
    """CMA-ES (package ``cmaes``) on the encoded simplex parameters and scaled floats,
    from ``start``; one generation is one batch."""
    from cmaes import CMA

    names, x0, bounds = _encoded(P, start)
    opt = CMA(mean=x0, sigma=sigma, bounds=bounds, seed=int(rng.integers(2**31)))
    best, fbest, used = start, f0, 0
    while used + opt.population_size <= budget:
        xs = [opt.ask() for _ in range(opt.population_size)]
        pts = [_decode(P, start, names, x) for x in xs]
        got = yield pts
        used += len(pts)
        tell = []
        for x, p, v in zip(xs, pts, got, strict=True):
            tell.append((x, v if math.isfinite(v) else 1e30))
            if better(v, fbest):
                best, fbest = p, v
        opt.tell(tell)
    return best, fbest


def tpe(P: Problem, discrete: Mapping[str, Any], start: Cont, f0: float, budget: int,
        rng: np.random.Generator) -> Inner:
    """Optuna's multivariate TPE, ask and tell in memory, seeded with ``start``."""
    import optuna

    names, x0, bounds = _encoded(P, start)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(
        multivariate=True, seed=int(rng.integers(2**31))))
    dists = {n: optuna.distributions.FloatDistribution(lo, hi)
             for n, (lo, hi) in zip(names, bounds, strict=True)}
    study.add_trial(optuna.trial.create_trial(
        params=dict(zip(names, (float(v) for v in x0), strict=True)), distributions=dists,
        value=f0 if math.isfinite(f0) else 1e30))
    best, fbest = start, f0
    for _ in range(budget):
        trial = study.ask(dists)
        x = np.array([trial.params[n] for n in names])
        p = _decode(P, start, names, x)
        (v,) = yield [p]
        study.tell(trial, v if math.isfinite(v) else 1e30)
        if better(v, fbest):
            best, fbest = p, v
    return best, fbest


def compass(P: Problem, discrete: Mapping[str, Any], start: Cont, f0: float, budget: int,
            rng: np.random.Generator, *, step: float = 1.0, min_step: float = 1 / 64,
            snap: bool = False, then: str | None = "exchange", **_: Any) -> Inner:
    """A compass search on the softmax encoding (the best-known search's refinement):
    every coordinate moved by ±``step`` (a logit: one share scaled by e^±step, the others
    in proportion), the first improvement kept, the step halved after a round with none;
    from ``min_step`` on, ``then`` (the exchange) for the rest."""
    best, fbest, used = start, f0, 0
    while step >= min_step and used < budget:
        improved = False
        for c in P.coords:
            for sign in (1.0, -1.0):
                if used >= budget:
                    break
                x = P.move(best, c, sign * step)
                if snap:
                    x = P.snap(best, x, c, discrete)
                if x.key() == best.key():
                    continue
                (v,) = yield [x]
                used += 1
                if better(v, fbest):
                    best, fbest, improved = x, v, True
                    break
        if not improved:
            step /= 2
    if then and used < budget:
        best, fbest = yield from METHODS[then](P, discrete, best, fbest, budget - used, rng)
    return best, fbest


def lattice(P: Problem, discrete: Mapping[str, Any], start: Cont, f0: float, budget: int,
            rng: np.random.Generator, *, core_radius: int = 8, radius: int = 1,
            then: str | None = "exchange", **_: Any) -> Inner:
    """Scans of the integer lattice of the area simplex
    (:class:`crossflow.search.lattice.AreaLattice`): the design named by its whole units
    (core bundles, banks per instance, DRAM devices, link ports), one count at a time,
    every value within ``core_radius`` bundles (``radius`` units for the others) of the
    point's own in one batch, each built at the smallest area split that buys it (the
    finest SRAM level taking the rest, the power split held); the best is kept and the
    sweep goes on until a whole sweep improves nothing.  A count vector over budget costs
    no evaluation.  Then ``then`` (the exchange) re-tunes the split for the rest.

    The time is jagged in whole units (quickstart: 439 and 441 bundles are worse than
    437, 443 better), which a local move cannot cross: a scan sees every count nearby.
    """
    from crossflow.search.lattice import AreaLattice

    best, fbest, used = start, f0, 0
    seen = {best.key()}
    idle: set[str] = set()
    while used < budget:
        lat = AreaLattice(P.setup, P.params(best, discrete))
        todo = [c for c in lat.coarse if c not in idle] if lat.ok else []
        if not todo:
            break
        for c in todo:
            r = core_radius if c == "core" else radius
            batch = []
            for n in range(lat.counts[c] - r, lat.counts[c] + r + 1):
                p = lat.point({c: n})
                if p is None:
                    continue
                x, _ = P.split(p)
                if x.key() not in seen:
                    seen.add(x.key())
                    batch.append(x)
            batch = batch[:budget - used]
            if not batch:
                idle.add(c)
                continue
            got = yield batch
            used += len(batch)
            v, i = min((v, i) for i, v in enumerate(got))
            if better(v, fbest):
                best, fbest = batch[i], v
                idle.clear()
                break               # the lattice moved: rebuilt around the new point
            idle.add(c)
    if then and used < budget:
        best, fbest = yield from METHODS[then](P, discrete, best, fbest, budget - used, rng)
    return best, fbest


METHODS = {"exchange": exchange, "gd": gd, "cmaes": cmaes, "tpe": tpe, "compass": compass,
           "lattice": lattice}


# ---- helpers ------------------------------------------------------------------------------

def _encoded(P: Problem, x: Cont) -> tuple[list[str], np.ndarray, np.ndarray]:
    names, values, bounds = [], [], []
    for block, w in x.simplexes.items():
        enc = encoding.encode(list(w / w.sum()))
        for i, v in enumerate(enc):
            names.append(f"{block}#{i}")
            values.append(v)
            bounds.append((-encoding.SPAN, encoding.SPAN))
    for c in P.coords:
        if c.index < 0:
            names.append(c.name)
            values.append(x.floats[c.name])
            bounds.append((c.low, c.high))
    return names, np.array(values, dtype=float), np.array(bounds, dtype=float)


def _decode(P: Problem, like: Cont, names: list[str], x: np.ndarray) -> Cont:
    simplexes: dict[str, list[float]] = {}
    floats = dict(like.floats)
    for n, v in zip(names, x, strict=True):
        if "#" in n:
            simplexes.setdefault(n.split("#")[0], []).append(float(v))
        else:
            floats[n] = float(v)
    return Cont({b: np.array(encoding.decode(v)) for b, v in simplexes.items()}, floats)
