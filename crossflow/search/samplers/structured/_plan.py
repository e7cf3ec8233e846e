"""The driver's plan: screen the discrete choices, search the split, re-screen, polish.

:func:`plan` is a generator: it yields batches of points (parameter dicts; the points of a
batch may be evaluated side by side), each with the name of its phase, and receives their
values (``inf`` for an infeasible
design).  It is deterministic given its seed, its budget and the values it receives, so
the sampler can rebuild it from a study's storage by replaying the recorded values.

Phases, for a budget of B evaluations (every point yielded is one evaluation: one trial):

1. **Memory screen** (no evaluation): every discrete combination (strategy × technology ×
   other categoricals) is checked for memory at the template's split; the rejected ones are
   recorded in ``records`` (the sampler stores them with the study), never evaluated.
2. **Discrete screen**: every memory-feasible combination at the template's split, in one
   mapping order (the first of its order classes).  More than B/2 of them: a seeded random
   subset of that size (the template's own combination always in).
3. **Order screen**: the ``top_k`` best combinations in one representative of every other
   class of equivalent mapping orders (orders differing only where size-1 grid dimensions
   sit give the same time).
4. **Inner search** of the budget split with the inner method (:mod:`._inner`).  With room
   for it (``trial`` evaluations per contender), the ``contenders`` best combinations each
   get a first installment (40 % of the search, shared) from the template's split — a
   combination that needs another split (more link power, say) shows it there — in two
   halves: after the first, a contender more than ``drop`` times the leader's value is
   dropped (successive halving: quickstart's N7 and N12 nodes, 1.45× and 1.95× behind);
   the best of them goes on, to 3/4 of what is left after reserving the re-screen.  A
   winner that stalls (no relative gain of ``stall_gain`` in ``patience`` evaluations) with
   a third of that or more left is raced by the ``restart`` method (the compass) from the
   template's split for the rest of the phase; the better run goes on.  Stalled for good,
   the run's best point gets the ``unstick`` method (a scan of the whole-unit lattice
   around it, :func:`._inner.lattice`, then the exchange from the scan's best point), and
   the search goes on from a better point it finds.
5. **Re-screen** at the split found: the best ``rescreen`` combinations of phases 2-3
   again (each in its best order); the winner gets the rest of the budget (inner search
   again, from the split found).
6. **Polish** (past B, when a study is extended): inner searches from the best point with
   smaller steps, for ever.

Runs of phases 4-6 share a memo: a point already evaluated is answered from it, not
evaluated again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator, Mapping
from typing import Any

import numpy as np

from crossflow.search.samplers.structured._inner import METHODS
from crossflow.search.samplers.structured._problem import Cont, Problem
from crossflow.search.space import MAPPING_ORDER

Plan = Generator[tuple[str, list[dict[str, Any]]], list[float], None]
#: The phase of each batch (stored on its trials as the user attribute ``driver_phase``).
SCREEN, ORDERS, SEARCH, RESCREEN, POLISH = "screen", "orders", "search", "rescreen", "polish"


def plan(P: Problem, *, budget: int, seed: int, inner: str = "exchange",
         inner_options: Mapping[str, Any] | None = None, top_k: int = 3,
         rescreen: int = 8, contenders: int = 3, trial: int = 300,
         polish: tuple[str, ...] = ("gd", "exchange"), restart: str | None = "compass",
         patience: int = 80, stall_gain: float = 1e-3, unstick: str | None = "lattice",
         drop: float | None = 1.25,
         records: list[dict[str, Any]] | None = None) -> Plan:
    rng = np.random.default_rng(seed)
    method = METHODS[inner]
    options = dict(inner_options or {})
    used = 0
    x0, base_discrete = P.start()
    combos = P.combos()

    # 1. memory screen
    feasible = []
    for combo, verdict in zip(combos, P.memory_checks(x0, combos), strict=True):
        if verdict is not None and not verdict.feasible:
            if records is not None:
                records.append({**combo, "need_bytes": verdict.need_bytes,
                                "capacity_bytes": verdict.capacity_bytes})
            continue
        feasible.append(combo)
    if not feasible:
        feasible = combos  # nothing fits: evaluate anyway (infeasible trials say why)
    cap = max(1, budget // 2)
    if len(feasible) > cap:
        own = {k: v for k, v in base_discrete.items() if k != MAPPING_ORDER}
        keep = [c for c in feasible if c == own]
        others = [c for c in feasible if c != own]
        picks = rng.choice(len(others), size=cap - len(keep), replace=False)
        feasible = keep + [others[i] for i in sorted(picks)]

    # 2. discrete screen at the template's split
    points = [{**c, **_order(P, c, P.canonical_order(c))} for c in feasible]
    values = yield SCREEN, [P.params(x0, d) for d in points]
    used += len(points)
    ranked = sorted(((v, i) for i, v in enumerate(values)), key=lambda t: t[0])
    best_value = {i: v for v, i in ranked}
    best_order = {i: P.canonical_order(feasible[i]) for i in range(len(feasible))}

    # 3. order classes of the best combinations
    if P.has_order:
        top = [i for v, i in ranked[:top_k] if math.isfinite(v)]
        batch, owners = [], []
        for i in top:
            for order in P.order_classes(feasible[i])[1:]:
                batch.append({**feasible[i], **_order(P, feasible[i], order)})
                owners.append((i, order))
        room = max(0, budget - used - 1)
        batch, owners = batch[:room], owners[:room]
        if batch:
            got = yield ORDERS, [P.params(x0, d) for d in batch]
            used += len(batch)
            for (i, order), v in zip(owners, got, strict=True):
                if v < best_value[i]:
                    best_value[i], best_order[i] = v, order
    ranking = sorted(best_value, key=best_value.__getitem__)

    def combo(i: int) -> dict[str, Any]:
        return {**feasible[i], **_order(P, feasible[i], best_order[i])}

    # 4. inner search: with room for it (``trial`` evaluations each), the best
    # ``contenders`` combinations each get a first installment from the template's split
    # (a combination that needs another split — more link power, say — shows it there),
    # then the best of them goes on; paused at 3/4 for 5. the re-screen
    k = max(1, min(contenders, len(ranking), (budget - used) // trial))
    reserve = min(rescreen, len(ranking) - k, max(0, (budget - used) // 10))
    total = budget - used - reserve
    finite = [i for i in ranking if math.isfinite(best_value[i])][:k] or ranking[:1]
    memo: dict[str, float] = {}
    runs = {i: _Run(method(P, combo(i), x0, best_value[i], total, rng, **options), P,
                    combo(i), x0, best_value[i], memo=memo) for i in finite}
    if len(runs) > 1:
        share = total * 2 // (5 * len(runs))          # 40 % of the search, shared
        first = share if drop is None else share // 2
        for run in runs.values():
            used += yield from run.until(first)
        if drop is not None:
            lead = min(r.value for r in runs.values())
            for i in [i for i, r in runs.items() if r.value > drop * lead]:
                runs.pop(i).close()
            if len(runs) > 1:
                for run in runs.values():
                    used += yield from run.until(share - first)
    winner = min(runs, key=lambda i: runs[i].value)
    for i, other in runs.items():
        if i != winner:
            other.close()
    run = runs[winner]
    discrete, x, fx = run.discrete, run.best, run.value
    limit = (max(0, budget - used - reserve - (budget - used - reserve) // 4) if reserve
             else budget - used)
    # a run that stalls (no gain of ``stall_gain`` in ``patience`` evaluations) with at
    # least as much left races a ``restart`` method from the template's split for the rest
    # of this phase: another basin (quickstart: fewer MCUs at a higher voltage), found by
    # coarser moves; the better run goes on.  Stalled for good, its best point gets the
    # ``unstick`` method (a lattice scan: a count the local moves cannot reach —
    # quickstart: 443 bundles where 439 and 441 are worse — then the exchange from the
    # scan's best point), and the search goes on from a better point found there.
    left = limit
    n = yield from run.until(left, patience=patience, gain=stall_gain)
    used, left = used + n, left - n
    raced, unstuck, parked = restart is None, set(), None
    while left > 0 and (run.stalled or run.done):
        if not raced and left >= max(patience, limit // 3):
            raced, parked = True, run
            run = _Run(METHODS[restart](P, run.discrete, x0, best_value[winner], left, rng),
                       P, run.discrete, x0, best_value[winner], memo=memo)
            n = yield from run.until(left, patience=patience, gain=stall_gain)
            used, left = used + n, left - n
            continue
        run, parked = _better(run, parked), None    # the race is over
        if unstick is not None and run.best.key() not in unstuck:
            # the lattice scan, then (its ``then``) the exchange from its best point for
            # the rest of the phase; it goes on if it ends better
            unstuck.add(run.best.key())
            scan = _Run(METHODS[unstick](P, run.discrete, run.best, run.value, left, rng),
                        P, run.discrete, run.best, run.value, memo=memo)
            m = yield from scan.until(left)
            used, left = used + m, left - m
            if scan.value < run.value:
                run.close()
                run = _Run(method(P, run.discrete, scan.best, scan.value, left, rng,
                                  **options), P, run.discrete, scan.best, scan.value,
                           memo=memo)
                n = yield from run.until(left, patience=patience, gain=stall_gain)
                used, left = used + n, left - n
                continue
            scan.close()
        n = yield from run.until(left)
        used, left = used + n, left - n
        break
    run = _better(run, parked)
    x, fx = run.best, run.value
    if reserve > 0:
        others = [i for i in ranking if i not in runs][:reserve]
        batch = [combo(i) for i in others]
        got = (yield RESCREEN, [P.params(x, d) for d in batch]) if batch else []
        used += len(batch)
        switched = False
        for d, v in zip(batch, got, strict=True):
            if v < fx:
                discrete, fx, switched = d, v, True
        if switched:  # another combination wins at this split: search its split instead
            run.close()
            run = _Run(method(P, discrete, x, fx, budget - used, rng, **options), P,
                       discrete, x, fx, memo=memo)
        used += yield from run.until(budget - used)
        x, fx = run.best, run.value

    # 6. converged before the budget is spent, or a study extended past it: turns of eq. 6
    # (a gradient step moves every coordinate at once, which can leave a plateau that
    # single and pairwise moves cannot) and the exchange, each from the best point
    turn = 0
    while True:
        name = polish[turn % len(polish)]
        turn += 1
        left = budget - used if used < budget else 100
        limit = min(left, 120) if name != "exchange" else left
        run = _Run(METHODS[name](P, discrete, x, fx, limit, rng), P, discrete, x, fx,
                   POLISH, memo=memo)
        n = yield from run.until(limit)
        used += n
        x, fx = run.best, run.value
        if n == 0:  # nothing left to try: a random exchange of every coordinate
            moved = x
            for c in P.coords:
                moved = P.move(moved, c, float(rng.normal(0.0, 0.1)))
            (v,) = yield POLISH, [P.params(moved, discrete)]
            used += 1
            if v < fx:
                x, fx = moved, v


def _better(run: _Run, other: _Run | None) -> _Run:
    """The better of two runs (``run`` on a tie); the other one is closed."""
    if other is None or other is run:
        return run
    if other.value < run.value:
        run, other = other, run
    other.close()
    return run


def _order(P: Problem, combo: Mapping[str, Any], order: str | None) -> dict[str, Any]:
    return {MAPPING_ORDER: order} if P.has_order and order is not None else {}


class _Run:
    """An inner method run in installments (see :func:`plan`, phases 4-5): batches of its
    continuous points become parameter dicts of the combination ``discrete``.  A point
    that a run of the plan has already evaluated (``memo``: parameters → value) is not
    evaluated again: the method gets the recorded value."""

    def __init__(self, gen, P: Problem, discrete: Mapping[str, Any], x: Cont, fx: float,
                 phase: str = SEARCH, memo: dict[str, float] | None = None):
        self.gen, self.P, self.discrete, self.phase = gen, P, dict(discrete), phase
        self.best, self.value = x, fx
        self.memo = memo if memo is not None else {}
        self.pending: list[Cont] | None = None
        self.done = self.stalled = False

    def until(self, limit: int, patience: int = 0, gain: float = 0.0):
        """Evaluate up to ``limit`` points (yields batches, receives values); returns how
        many were evaluated.  With ``patience``, stops early (``stalled``) after that many
        evaluations without a relative gain of ``gain``."""
        used = 0
        last, mark = 0, self.value
        self.stalled = False
        while not self.done and used < limit:
            if patience and used - last >= patience:
                self.stalled = True
                break
            try:
                if self.pending is None:
                    self.pending = next(self.gen)
                if not self.pending:
                    break
                params = [self.P.params(b, self.discrete) for b in self.pending]
                keys = [json.dumps(p, sort_keys=True, default=str) for p in params]
                fresh: dict[str, int] = {}
                for i, k in enumerate(keys):
                    if k not in self.memo and k not in fresh:
                        fresh[k] = i
                cut = len(fresh) > limit - used
                if cut and used > 0:
                    # the batch waits for the next installment (cut, the run would end)
                    break
                todo = list(fresh.items())[:limit - used]
                if todo:
                    got = yield self.phase, [params[i] for _, i in todo]
                    used += len(todo)
                    self.memo.update(zip((k for k, _ in todo), got, strict=True))
                if cut:  # cut short: the method cannot go on
                    for k, i in todo:
                        if self.memo[k] < self.value:
                            self.best, self.value = self.pending[i], self.memo[k]
                    self.close()
                    break
                values = [self.memo[k] for k in keys]
                for b, v in zip(self.pending, values, strict=True):
                    if v < self.value:
                        self.best, self.value = b, v
                if self.value < mark * (1.0 - gain):
                    last, mark = used, self.value
                self.pending = self.gen.send(values)
            except StopIteration as end:
                self.done = True
                if end.value is not None and end.value[1] < self.value:
                    self.best, self.value = end.value
        return used

    def close(self) -> None:
        self.gen.close()
        self.done = True
