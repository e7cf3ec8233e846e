"""The paper's eq. 6 inside the structured driver: the descent half of the ``gd`` inner
method (:func:`crossflow.search.samplers.structured._inner.gd` runs it, then the exchange).

A normalised finite-difference gradient on each budget simplex (its probes landed on the
coordinate's next AGE step edge when that is nearer than the mixing probe), β-averaging in
parameter space, exact projection onto each simplex, a line search along the step and
chains side by side (the README's search section says where this departs from the paper
and why).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from crossflow.search.samplers.gd._simplex import mix_towards_vertex, project_onto_simplex
from crossflow.search.samplers.gd._update import eq6_step, simplex_gradient
from crossflow.search.samplers.structured._problem import SAME, Cont, Coord, Inner, Problem, better


def eq6(P: Problem, discrete: Mapping[str, Any], start: Cont, f0: float, budget: int,
        rng: np.random.Generator, *, chains: int = 1, learning_rate: float = 0.1,
       beta: float = 0.5, probe: float = 0.05, line: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0),
       spread: float = 0.15, edge_probes: bool = True) -> Inner:
    """The paper's eq. 6 made practical (see the module docstring).

    Chains: the first starts at ``start``, the others at random exchanges of it of
    relative size ``spread`` (a restart near the screened optimum, not a random point).
    One step of every chain is one batch: the mixing probes of its live coordinates
    (:func:`~crossflow.search.samplers.gd._update.simplex_gradient`; floats by forward
    differences), then the line search — the normalised step at each multiple of the
    chain's learning rate in ``line`` — then the β-average of the best line point with the
    chain's average, projected onto each simplex, snapped to the AGE's step edges.  A chain
    whose line search finds nothing better halves its learning rate.
    """
    best, fbest = start, f0
    used = 0
    states = [start]
    for _ in range(chains - 1):
        x = start
        for c in P.coords:
            x = P.move(x, c, float(rng.normal(0.0, spread)))
        states.append(x)
    values = [f0]
    if len(states) > 1:
        extra = yield states[1:]
        used += len(states) - 1
        values += list(extra)
    rates = [learning_rate] * len(states)
    averages = [_flat(P, s) for s in states]
    frozen: set[Coord] = set()
    first = True
    while used < budget:
        batch: list[Cont] = []
        plans = []
        for k, x in enumerate(states):
            probes = [c for c in P.coords if c not in frozen]
            pts = [_probe(P, x, c, probe, discrete if edge_probes else None)
                   for c in probes]
            plans.append((k, probes, len(batch), len(pts)))
            batch += pts
        batch = batch[:max(0, budget - used)]
        if not batch:
            break
        got = yield batch
        used += len(batch)
        if len(got) < sum(n for *_, n in plans):
            for x, v in zip(batch, got, strict=False):
                if better(v, fbest):
                    best, fbest = x, v
            break
        directions = []
        for k, probes, at, n in plans:
            fx = values[k]
            diffs = got[at:at + n]
            if first:  # freeze coordinates that are flat for every chain
                flat = {c for c, v in zip(probes, diffs, strict=True)
                        if abs(v - fx) <= SAME * abs(fx)}
                frozen = flat if k == 0 else frozen & flat
            directions.append(_direction(P, states[k], probes, fx, diffs, probe,
                                         batch[at:at + n]))
            for x, v in zip(batch[at:at + n], diffs, strict=True):
                if better(v, fbest):
                    best, fbest = x, v
        if len(frozen) == len(P.coords):
            frozen = set()
        first = False
        # line search along each chain's normalised direction
        line_batch, owners = [], []
        for k, d in enumerate(directions):
            for mult in line:
                line_batch.append(_step(P, states[k], d, rates[k] * mult, discrete))
                owners.append((k, mult))
        line_batch = line_batch[:max(0, budget - used)]
        if not line_batch:
            break
        got = yield line_batch
        used += len(line_batch)
        new_states = []
        for k in range(len(states)):
            mine = [(v, x, m) for (o, m), x, v in zip(owners, line_batch, got, strict=False)
                    if o == k]
            if not mine:
                new_states.append(None)
                continue
            v, x, m = min(mine, key=lambda t: t[0])
            if better(v, fbest):
                best, fbest = x, v
            if not better(v, values[k]):
                rates[k] *= 0.5
                new_states.append(None)
                continue
            rates[k] = min(0.5, rates[k] * m) if m > 1 else rates[k] * max(m, 0.5)
            w, averages[k] = _average(P, averages[k], x, beta)
            new_states.append((P.snap(states[k], w, _main(P, states[k], w), discrete), v, x))
        moves = [(k, s) for k, s in enumerate(new_states) if s is not None]
        if moves:
            got = yield [s[0] for _, s in moves][:max(0, budget - used)]
            used += len(got)
            for (k, (w, v_line, x_line)), v in zip(moves, got, strict=False):
                if better(v, fbest):
                    best, fbest = w, v
                # eq. 6 keeps the averaged point; if it lost what the line found, the
                # line point is where the chain goes on from
                states[k], values[k] = (w, v) if v <= v_line else (x_line, v_line)
        if all(r < 1e-3 for r in rates):
            break
    return best, fbest


def _probe(P: Problem, x: Cont, c: Coord, h: float,
           discrete: Mapping[str, Any] | None = None) -> Cont:
    """The forward-difference probe of ``c``: a mix of ``h`` towards its vertex (floats:
    h of the range).  With ``discrete``, the mix goes to the next step edge of ``c``
    instead when that is nearer (the difference then measures the unit it buys, not a
    plateau or a cliff crossed part-way)."""
    if c.index < 0:
        return P.move(x, c, h)
    mixed = Cont({**x.simplexes, c.block: mix_towards_vertex(x.simplexes[c.block], c.index,
                                                             h)}, x.floats)
    if discrete is None:
        return mixed
    w = x.simplexes[c.block][c.index]
    edge = P.snap(x, P.move(x, c, 1e-6), c, discrete)
    if edge.simplexes[c.block][c.index] - w < mixed.simplexes[c.block][c.index] - w:
        return edge
    return mixed


def _direction(P: Problem, x: Cont, probes: list[Coord], fx: float, values: list[float],
               h: float, points: list[Cont] | None = None) -> dict[str, np.ndarray | float]:
    """Per simplex the normalised descent direction in its tangent space (the slack's
    component is 0 for no probe); per float the sign of its forward difference.  With
    ``points`` (the probes), each difference is divided by its own mixing weight (a probe
    landed on a step edge mixes less than ``h``)."""
    out: dict[str, Any] = {}
    for block, w in x.simplexes.items():
        n = len(w)
        d = np.zeros(n)
        probed = [(c, v, p) for c, v, p in zip(probes, values, points or [None] * len(probes),
                                               strict=True) if c.block == block]
        if not probed:
            continue
        full = np.full(n, fx)
        for c, v, p in probed:
            if p is not None and math.isfinite(v) and math.isfinite(fx):
                # the mixing weight of this probe: (w_i' - w_i) / (1 - w_i)
                hi = (p.simplexes[block][c.index] - w[c.index]) / (1.0 - w[c.index])
                v = fx + (v - fx) * h / hi if hi > 0 else fx
            full[c.index] = v
        g = simplex_gradient(fx, list(full), h)
        norm = float(np.linalg.norm(g))
        if norm > 0:
            d = -g / norm
        out[block] = d
    for c, v in zip(probes, values, strict=True):
        if c.index < 0 and math.isfinite(v) and math.isfinite(fx):
            out[c.name] = -math.copysign(1.0, v - fx) if v != fx else 0.0
    return out


def _step(P: Problem, x: Cont, d: Mapping[str, Any], eta: float,
          discrete: Mapping[str, Any]) -> Cont:
    simplexes = dict(x.simplexes)
    for block, w in x.simplexes.items():
        if block in d:
            simplexes[block] = np.maximum(project_onto_simplex(w + eta * d[block]), 1e-6)
            simplexes[block] /= simplexes[block].sum()
    floats = dict(x.floats)
    for c in P.coords:
        if c.index < 0 and c.name in d:
            floats[c.name] = min(c.high, max(c.low, floats[c.name] + eta * d[c.name]
                                             * (c.high - c.low)))
    return Cont(simplexes, floats)


def _flat(P: Problem, x: Cont) -> dict[str, np.ndarray]:
    return {b: np.array(w) for b, w in x.simplexes.items()}


def _average(P: Problem, avg: dict[str, np.ndarray], x: Cont, beta: float
             ) -> tuple[Cont, dict[str, np.ndarray]]:
    """eq. 6's average M ← βM + (1−β)W′ and W = proj(M), per simplex."""
    simplexes, new_avg = {}, {}
    for block, w in x.simplexes.items():
        proj, m = eq6_step(w, avg[block], np.zeros_like(w), learning_rate=0.0, beta=beta)
        simplexes[block] = np.maximum(proj, 1e-6) / np.maximum(proj, 1e-6).sum()
        new_avg[block] = m
    return Cont(simplexes, x.floats), new_avg


def _main(P: Problem, before: Cont, after: Cont) -> Coord:
    """The coordinate a step moved most (the one snapped to its step edge)."""
    best, size = P.coords[0], -1.0
    for c in P.coords:
        if c.index < 0:
            continue
        delta = abs(math.log(after.simplexes[c.block][c.index] /
                             before.simplexes[c.block][c.index]))
        if delta > size:
            best, size = c, delta
    return best
