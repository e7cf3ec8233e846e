"""The driver's plan: screen the discrete choices, probe the split's axes, race local
searches, a compass search after them, restart them, variable neighbourhood search,
IPOP-CMA-ES.

:func:`plan` is a generator: it yields batches of points (parameter dicts; the points of a
batch may be evaluated side by side), each with the name of its phase, and receives their
values (``inf`` for an infeasible design).  It is deterministic given its seed, its start
and the values it receives, so the sampler rebuilds it from a study's storage by replaying
the recorded values.  It has no budget: it is an *anytime* search (a study extended with
``--trials N`` goes on where it stopped, and every budget sees the same first N points).

Phases (every point yielded is one model evaluation, one trial):

1. **Memory screen** (no evaluation): every discrete combination (strategy × technology ×
   other categoricals) is checked for memory at the start split, and for a parallelism the
   configuration refuses (an expert-parallel degree that does not divide its group); the
   rejected ones are recorded in ``records`` (the sampler stores them with the study),
   never evaluated.
2. **Screen**: every memory-feasible combination at the start split, each in one mapping
   order (the first of its classes of equivalent orders); more than ``screen_cap`` of
   them (by default 256 where a budget split is searched next, 32 where TPE takes over
   after the screen), a seeded subset of that size (the start's own combination always
   in).
3. **Order classes**: the ``top_k`` best combinations in one order of every other class,
   and more combinations, best first, until those orders number a quarter of the screen
   (``ORDERS_SHARE``).
   Where a budget split is searched and more than :data:`SCREEN_DESCENT` combinations fit
   in memory, phases 2 and 3 are instead a seeded subset of that many combinations and a
   variable neighbourhood descent over every combination in every order class from the
   subset's best (:func:`_screen_descent`): a few dozen evaluations instead of a hundred
   or two, which the race and the search have.
   A space with nothing continuous ends the plan there, after every other order class of
   every combination when ``screen_cap`` is ``all``, and otherwise after variable
   neighbourhood descents over the combinations (:func:`_descend`) from the best of the
   screen: the combinations one or two choices away from the incumbent (a strategy's
   degrees read from its name: ``t8-d48-p4`` is two from ``t4-d48-p8``; a mapping order in
   another class counts as two), then three; then again from each next screened point
   out of reach of where the descents so far ended; the
   sampler goes on with TPE, which learns from every trial of the plan.  TPE sees a
   strategy as one categorical of hundreds of names and cannot tell that ``t4-p8`` is next
   to ``t8-p4``; the descent can.
4. **Axial probes**: the best combination at the start split with one budget component
   raised to half and to four fifths of its simplex (:func:`_axial`, the axial design of
   mixture experiments); the best probe, when it beats the start, is a start of its own in the
   race (one no better would race a twin of the first contender).  It is how the
   plan reaches a basin the template's split is far from (an L2 that holds the weights).
   The other contenders are priced at the best probe's split too, and each starts the race
   from there where it is better there than at the start split: the race judges after a
   few evaluations, so the best start wins it, and a combination compared at the template's
   split against the first one at its probe's is compared with a handicap.
5. **Race** (successive halving): the ``contenders`` best (combination, order) pairs, each
   from the better of the start split and the best probe's, and the best axial probe each
   run the local search
   (:func:`._inner.exchange`, a pattern search whose moves land on the AGE's step edges),
   in installments of ``race`` evaluations per coordinate; after each installment the
   worse half is dropped and the installment doubles, until one is left.  A pair that
   needs another split (more link power, say) shows it here.  Where no mapping order is
   searched, a compass search (:mod:`crossflow.search.compass`) from the best start races
   too (:data:`COMPASS_RACE`).
6. **Search**: the winner's local search runs to its end, and runs again from its best
   point with its first steps (a restart of the pattern search) for as long as a run
   gains (a restart that has not gained after ``RESTART_TRIAL`` evaluations per coordinate
   ends).  Once this search has taken ``TIER`` times the evaluations of phases 2-5 (in a
   space that searches mapping orders), a
   second bracket of the race (:func:`_tier`, as Hyperband runs brackets of successive
   halving, the later one wider): every order class of every combination (when they
   number no more than a screen; else every combination in the lead's mapping order, a
   good order for one strategy being often good for its neighbours), then the axial
   probes of the ``TIER_PROBES`` best pairs that did not race (from the start split and
   from the simplexes' centroid, :data:`CENTROID`), and the one with the best
   probe (or start) run in doubling installments against the record
   of the local search running then (the winner's first run, or a restart of it, whose
   record begins where the restart began) at equal evaluations — dropped as soon as it
   falls behind, the lead once it keeps up for as many evaluations as that run has had.
   Each strategy has a split of its own, and one that is second at the template's can be
   first at its own.
   Where mapping orders are searched, the winner's first local search, when it ends, hands
   its best point to a turn of CMA-ES (:data:`EARLY_CMA`, below), whose best the local
   search goes on from when it is better.
   A local search that ends at a new incumbent shakes it (:func:`_shake`, variable
   neighbourhood search): each budget share halved and doubled in turn, and the core moved
   to the bundle counts near its own where a GEMM's tiles fill whole waves (:data:`WAVES`),
   the local search for a while from each shake, best shake first, and the first that beats
   the incumbent leads (run to its end, shaken again).  When no shake wins and the run
   gained, it runs again from its best point; when a run gains nothing, the race's losers
   go on where they stopped, best first, each the same way (a multi-start local search
   whose starts the race ranked).  When every one has ended, variable neighbourhood search
   from the incumbent again, shares halved and doubled, then quartered and quadrupled.  The
   best design known often sits in another basin of the AGE's whole units than the one a
   local search settles in (on three single-chip studies of the suite, about half the L1
   banks with the power split following): one share moved a long way, the others adapting
   to it by local search, reaches such a basin, where no move of the local search's size
   does (docs/search-history.md, "An eleventh round" and "A twelfth round").
   Where no mapping order is searched, the compass, when it won the race, runs until its
   step is spent and the local search goes on from its end; when it lost, it goes on once
   the winner's first local search has ended, and the local search goes on from the
   compass's end when that is better (:data:`COMPASS_RACE`): two local searches of
   different moves from one start end in different basins of the AGE's whole units,
   either one the better.
   When no shake wins, CMA-ES (Hansen's, the ``cmaes`` package) from the incumbent, in
   the simplexes' natural coordinates (the softmax logits), until it stalls; then the
   local search again from the best point; and so on, CMA-ES's population doubled at
   every turn (IPOP-CMA-ES).  For ever.

A point whose design the plan has already priced — the same discrete choices on the same
chip (:meth:`~._problem.Problem.design_key`: many budget splits build one chip) — is
answered from its memo, not evaluated again; and after the screen, a point that is no
design to price (:meth:`~._problem.Problem.refused`: the AGE cannot build its chip, or
its strategy is over memory there, the checks of phase 1) is answered infeasible without
a trial.

One module of ~990 lines, the schedule with the run objects it drives (:class:`_Local`,
:class:`_Compass`, :class:`_Cma`, :class:`_Asker`): ``benchmarks/bench_plan.py`` measures a
variant by setting this module's constants and its ``exchange`` for one run, and the run
objects read them from here; split, each variant would have to be set in two modules.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from crossflow.search import encoding
from crossflow.search.compass import compass
from crossflow.search.objective import Invalid, fitting
from crossflow.search.orders import without_order
from crossflow.search.samplers.structured import _neighbours as neighbours
from crossflow.search.samplers.structured._inner import exchange
from crossflow.search.samplers.structured._problem import (
    _FLOOR,
    Cont,
    Coord,
    Problem,
    better,
)
from crossflow.search.space import MAPPING_ORDER

Plan = Generator[tuple[str, list[dict[str, Any]]], list[float], None]
#: The phase of each batch (stored on its trials as the user attribute ``driver_phase``).
SCREEN, ORDERS, AXIAL_PHASE, RACE, SEARCH, COMPASS, CMA, VNS, DESCENT = (
    "screen", "orders", "axial", "race", "search", "compass", "cma", "vns", "descent")


@dataclass(frozen=True)
class Settings:
    """The driver's every knob, each settable from a study's ``sampler_options``.

    Each default is the median-best of the variants run on the tuning half of the
    benchmark suite (``benchmarks/bench_plan.py``; docs/search-benchmarks.md has the
    table); a knob that moved no median there was removed.
    """

    #: combinations priced in the first screen (a seeded subset beyond); ``"all"``: every
    #: one at once, and in a space with nothing continuous every order class of each;
    #: None: :data:`SCREEN_CAP` where there is a budget split to search after the screen
    #: (and where more than :data:`SCREEN_DESCENT` combinations fit, that many and a
    #: descent instead), :data:`TPE_START` where the screen only starts TPE off
    screen_cap: int | Literal["all"] | None = None
    #: best combinations priced in every class of mapping orders
    top_k: int = 4
    #: best (combination, order) pairs raced by successive halving
    contenders: int = 2
    #: the race's first installment, in evaluations per searched coordinate (doubled at
    #: every halving)
    race: int = 1

    def __post_init__(self) -> None:
        for name in ("top_k", "contenders", "race"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"`{name} >= 1` must hold, but got {name}={value!r}")
        cap = self.screen_cap
        if cap not in ("all", None) and not (isinstance(cap, int) and not isinstance(cap, bool)
                                             and cap >= 1):
            raise ValueError(f"`screen_cap >= 1`, 'all' or null must hold, but got "
                             f"screen_cap={cap!r}")

    def cap(self, continuous: bool) -> int | None:
        """The screen's size (None: every combination) in a space with or without
        something continuous to search after it."""
        if self.screen_cap == "all":
            return None
        if self.screen_cap is None:
            return SCREEN_CAP if continuous else TPE_START
        return int(self.screen_cap)


# The constants below that steer the search were each chosen by the median over the
# benchmark suite's studies (on its tuning half, the checking half reported, never one
# run); GAIN and REFUSED_IN_A_ROW are bounds, not tuned.  Each comment says what the
# constant is for, and the section of docs/search-history.md named beside it has the
# variants tried and their figures; docs/search-benchmarks.md lists them with a reason each.

#: The screen's default size where a budget split is searched after it: a smaller screen
#: misses the combinations whose basin is far from the template's split, a larger one
#: finds nothing more (docs/search-history.md, "How the driver's settings were chosen").
SCREEN_CAP = 256
#: ... and where nothing continuous follows (strategy-only spaces): there the screen only
#: gives TPE its first points, and TPE and the descent learn more from the rest
#: ("Strategy-only spaces").
TPE_START = 32


#: CMA-ES's first step, in the logits (range ±SPAN): a sixteenth of their range.  Every
#: turn starts from an incumbent a local search has fitted, so the step is a local one (as
#: in BIPOP-CMA-ES's small-step regime), not Hansen's quarter of the range for a start
#: that knows nothing ("A forty-third round").
SIGMA0 = encoding.SPAN / 8
#: CMA-ES generations in a row that do not beat the incumbent before a turn counts as
#: stalled (besides CMA-ES's own stopping rules) and the local search takes over again:
#: judged against the incumbent, not the run's own best, so that a turn that finds nothing
#: costs a few generations ("How the driver's settings were chosen", "A forty-third
#: round").
PATIENCE = 5
#: The axial probes' shares (:func:`_axial`): a component raised to half its simplex, and
#: to four fifths of it; the best probe races beside the combinations.  They reach the
#: basins the template's split is far from (an L2 that holds the weights); one share alone
#: misses some of them ("A fifth round").
AXIAL = (0.5, 0.8)
#: The second bracket (:func:`_tier`) starts once the search after the race (the winner's
#: first local search and its restarts) has taken this many times the evaluations of the
#: screen, order classes, probes and race (phases 2-5), in a space that searches mapping
#: orders.  The bracket is where a strategy the template's split misranks gets its own split
#: (in the lead's mapping order, with its axial probes); the sooner it comes, the shorter the
#: record it has to keep up with, and the fewer evaluations the winner has had to prove
#: itself.  Without mapping orders it never won and cost evaluations early ("A fifteenth
#: round", "A nineteenth round").  0 turns it off.
TIER = 1
#: Where no mapping order is searched (budgets, and technology if any, on one chip or with
#: a fixed strategy), a compass search (:mod:`crossflow.search.compass`) from the best start
#: races beside the local searches.  When it wins the race it runs until its step is spent
#: and the local search goes on from its end; when it loses, it goes on once the winner's
#: first local search has ended, and when it then ends better the local search goes on from
#: its end (the run it beat waits with the race's losers).  The compass moves one share by a
#: factor e at first and so crosses whole-unit cliffs the local search's step-edge moves
#: settle before; which of the two does better, and how soon, differs from study to study,
#: which is what a race decides.  In a space that searches strategies the race and the
#: second bracket need those evaluations, and the bracket (:data:`TIER`) is the second
#: opinion instead ("A twenty-sixth round", "A twenty-eighth round", "A thirtieth round").
COMPASS_RACE = True
#: The second bracket probes (:func:`_probe`) this many of the best pairs that did not race,
#: and races the one whose probe is best: the template's split ranks strategies by how they
#: do there, and a strategy whose basin is far from it shows only in its probes
#: ("An eighteenth round").
TIER_PROBES = 3
#: The second bracket's probes are taken from the simplexes' centroid too (every component
#: and the slack an equal share, where a global search such as Optuna's CMA-ES starts): the
#: centroid and its own axial points, beside the start split's.  A strategy whose best
#: design gives most of the area to one unit and almost none to the others (the long LSTMs'
#: L2 that holds the weights) is a corner that neither the template's split nor its axial
#: points are near; from the centroid one share at four fifths is that corner.  It halves
#: the worst co-design study at 1000 evaluations and lowers both halves' medians there, for
#: a few more evaluations in the bracket (the median at 300 rises by less than its
#: interval; "A fifty-first round", "A fifty-second round", "A fifty-third round").
CENTROID = True
#: A restart of the local search (from its best point, with its first steps) is a test of
#: whether steps that large still find something there: one that has not beaten its start
#: after this many evaluations per searched coordinate ends, and the search goes on to the
#: race's losers (then variable neighbourhood search).  Restarts that gain do so early; one
#: that finds nothing would otherwise run until its steps are spent ("A seventeenth
#: round").  0 turns it off.
RESTART_TRIAL = 5
#: Phase 3 prices every other order class of the ``top_k`` best combinations, and of more,
#: best first, until those classes number this share of the combinations screened: a
#: strategy whose first order class is poor can be the best in another ("A fourteenth
#: round").
ORDERS_SHARE = 0.25
#: A relative gain below this is no gain (the model's own noise floor is far below).
GAIN = 1e-6
#: Variable neighbourhood search (:func:`_shake`): each simplex share of the incumbent
#: multiplied by each of these factors, one at a time; then by their squares, and so on, up
#: to the power ``KICK_LEVELS``; () leaves IPOP-CMA-ES alone after the local searches.  A
#: local search settles in the basin of the AGE's whole units nearest its start; one share
#: moved a long way, the others adapting to it by local search, reaches the next basin.  A
#: new incumbent is shaken at the first level as soon as its local search ends, before
#: restarts and the race's losers, since the next whole unit is usually near ("A twelfth
#: round", "A twenty-fifth round").
KICKS: tuple[float, ...] = (0.5, 2.0)
#: A new incumbent's shakes (the first level, as soon as its local search ends) are searched
#: from the best this many only, so that a basin with nothing better near it costs at most
#: EARLY_SHAKES x KICK_EVALS evaluations per coordinate before the run restarts
#: ("A twenty-fifth round").
EARLY_SHAKES = 4
KICK_LEVELS = 2
#: Points after the screen that are no design to price (:meth:`Problem.refused`) answered
#: infeasible in a row before the next one is priced anyway (a bound, so that a search in
#: a space of almost nothing but such points still makes trials).
REFUSED_IN_A_ROW = 1000
#: In a space with nothing continuous the plan ends with a variable neighbourhood descent
#: over the combinations from the screen's best (:func:`_descend`) before the sampler hands
#: the study to TPE; these are its neighbourhoods, by how many choices a combination differs
#: in from the incumbent: up to 2, then 3 (a pipeline degree that changes takes its virtual
#: stages with it, so the best neighbour is often three choices away; "A twenty-first
#: round").
DESCENT_REACH: tuple[int, ...] = (2, 3)
#: The local search's evaluations after a shake, per searched coordinate, before the next
#: shake is tried (the search from a shake that beats the incumbent goes on to its end).
KICK_EVALS = 20
#: Wave-edge shakes, beside the shares halved and doubled: the incumbent's core moved to
#: each of the six bundle counts nearest its own at which a GEMM's work tiles fill whole
#: waves, ceil(T / w) for T a power of two (1) or three times one (3: sides of 1536, 12288)
#: and up to 8 waves (:meth:`Problem.wave_shakes`), the other units kept or made room
#: for.  One bundle below such an edge costs a whole wave (255 bundles price 6.5 % above
#: 256 on ``gpt-600m-1chip-n7-300w``), and the edge a better design sits on is often
#: several shares away from the incumbent's, where neither a local move nor one share
#: halved or doubled reaches ("A forty-first round").
WAVES: tuple[int, ...] = (1, 3)
#: Where a budget split is searched and more combinations than this fit in memory (and the
#: study leaves ``screen_cap`` at its default), the screen is a seeded subset of this many
#: and one variable neighbourhood descent over every combination in every order class from
#: its best (:func:`_screen_descent`), instead of every combination and the order classes
#: of the best: the descent sees that ``RC-64-16`` is next to ``RC-128-8`` and reaches the
#: best combinations at the start split in a third to a half of the evaluations, which the
#: race and the search then have ("A forty-second round").  0 turns it off.
SCREEN_DESCENT = 16
#: Where mapping orders are searched (a strategy co-designed with the split), a turn of
#: CMA-ES from the winner's best point as soon as its first local search ends, before its
#: shakes, restarts and the race's losers; the local search goes on from CMA-ES's best when
#: that is better.  There the split trades compute against links and memory, and the
#: better designs lie along ridges no one share (or pair of shares) follows: on
#: ``v100-gemm-32k-64`` the best-known design differs from the driver's end in the area and
#: the power split together (either alone prices worse) and the straight line between the
#: two descends all the way, which is what CMA-ES's covariance learns.  Without mapping
#: orders (one chip, or a fixed strategy) the shakes find the AGE's next whole unit sooner
#: than the same turn ("A forty-third round"; "A thirty-seventh round" for CMA-ES instead
#: of the shakes).  False turns it off.
EARLY_CMA = True


def plan(P: Problem, *, seed: int, settings: Settings = Settings(),
         start: Mapping[str, Any] | None = None,
         records: list[dict[str, Any]] | None = None) -> Plan:
    """The driver's points for ``P`` (see the module docstring).  ``start`` (a point of the
    study, e.g. the best trial of another sampler) replaces the template's split and
    technology as the start."""
    S = settings
    rng = np.random.default_rng(seed)
    x0, d0 = P.split(start) if start is not None else P.start()
    ask = _Asker(P)

    # 1. memory screen; 2. screen at the start split; 3. order classes of the best
    cap = S.cap(bool(P.coords))
    every, feasible = _memory_screen(P, x0, d0, cap, rng, records)
    if P.coords and S.screen_cap is None and 0 < SCREEN_DESCENT < len(every):
        feasible, value, order, ranking = yield from _screen_descent(P, ask, x0, d0, every,
                                                                     rng)
    else:
        value, order, ranking = yield from _screen(P, ask, x0, d0, feasible, S.top_k)
    if not P.coords:
        # nothing continuous to search: with ``screen_cap: all``, every other order class
        # too, else a descent over the combinations; the plan ends there (the sampler hands
        # the study to TPE, which learns from the plan's trials)
        if cap is None:
            yield from _exhaust(P, ask, x0, [feasible[i] for i in ranking], len(feasible))
        elif math.isfinite(value[ranking[0]]):
            yield from _descend(P, ask, x0, every, [
                P.with_order(feasible[i], order[i]) for i in ranking if math.isfinite(value[i])])
        return

    def combo(i: int) -> dict[str, Any]:
        return P.with_order(feasible[i], order[i])

    # 4. the axial probes of the best combination, whose best is a start in 5. the race:
    # successive halving of local searches
    tops = [i for i in ranking[:S.contenders] if math.isfinite(value[i])] or ranking[:1]
    starts = [(i, x0, value[i]) for i in tops]
    if AXIAL:
        # a probe no better than its start would race a twin of the first contender (a
        # share the design does not use: the perimeter of a chip its links do not fill)
        probe = yield from _probe(P, ask, combo(tops[0]), x0, value[tops[0]])
        if probe is not None:
            # the other contenders start from the probe's split where they are better there:
            # a race judged after a few evaluations is won by the best start, so each
            # combination starts from the best split known for it (docs/search-history.md,
            # "A forty-sixth round")
            others = tops[1:]
            got = yield from ask.points(AXIAL_PHASE, [(combo(i), probe[0]) for i in others])
            moved = {i: v for i, v in zip(others, got, strict=True) if better(v, value[i])}
            starts = [(i, probe[0], moved[i]) if i in moved else (i, x, f)
                      for i, x, f in starts]
            starts.append((tops[0], *probe))
    runs, lead, compass = yield from _race(P, ask, S, [(combo(i), x, f) for i, x, f in starts],
                                           rng)
    dropped = sorted((r for r in runs if r is not lead and r is not compass),
                     key=lambda r: r.value)

    # 6. the search: the local search to its end (where mapping orders are searched, then a
    # turn of CMA-ES from its best: EARLY_CMA), and again from its best point for as long
    # as that gains; then each loser of the race the same way, best first; then variable
    # neighbourhood search from the incumbent; when no shake wins, CMA-ES from the
    # incumbent (its population doubled at every turn: IPOP-CMA-ES) and the local search
    # again from the best point found
    popsize = None
    ended: list[_Local] = []
    before, tiered = ask.total, not (TIER and P.has_order)  # why orders only: TIER
    raced = {_pair_key(r.discrete) for r in runs}
    shaken = math.inf  # the value of the incumbent last shaken
    cma_early = False
    compass_due = compass is not None
    while True:
        while not lead.done:
            yield from lead.advance(ask, COMPASS if lead is compass else SEARCH,
                                    len(P.coords) or 1)
            if not tiered and ask.total - before >= TIER * before:
                tiered = True
                won = yield from _tier(P, ask, S, x0, feasible, value, order, raced, lead,
                                       cap, rng)
                if won is not None:
                    dropped.append(lead)
                    lead = won
        if compass_due:
            compass_due = False
            if lead is not compass:
                # the winner's first local search has ended: the compass goes on to its end
                while not compass.done:
                    yield from compass.advance(ask, COMPASS, len(P.coords) or 1)
            if lead is compass or compass.value < lead.value * (1 - GAIN):
                # the compass won the race, or ended better than the local search that did:
                # the local search goes on from its end, its gain counted from where the
                # compass began (the run it beat waits with the race's losers)
                if lead is not compass:
                    dropped.insert(0, lead)
                lead = _Local(P, compass.discrete, compass.best, compass.value, rng)
                lead.start = compass.start
                continue
        if EARLY_CMA and P.has_order and not cma_early:
            cma_early = True
            x, fx, popsize = yield from _cma_turn(P, ask, lead, rng, popsize)
            if fx < lead.value * (1 - GAIN):
                lead = _Local(P, lead.discrete, x, fx, rng)
                continue
        if KICKS and lead.value < shaken:
            # a new incumbent is shaken once (each share halved and doubled) before it is
            # restarted or the race's losers go on: see KICKS
            shaken = lead.value
            found = yield from _shake(P, ask, lead, rng, list(KICKS), EARLY_SHAKES)
            if found is not None:
                lead = found
                continue
        if lead.gained:
            # it gained: again from its best point, with its first steps
            lead = _Local(P, lead.discrete, lead.best, lead.value, rng, restart=True)
            continue
        ended.append(lead)
        if dropped:  # the race's losers, best first, before anything new
            lead = dropped.pop(0)
            continue
        lead = min(ended, key=lambda r: r.value)
        ended = []
        if KICKS:
            # variable neighbourhood search: the smallest shakes first, larger ones while
            # none of a size beats the incumbent; past the largest, a turn of IPOP-CMA-ES
            found = None
            for k in range(1, KICK_LEVELS + 1):
                found = yield from _shake(P, ask, lead, rng, [f ** k for f in KICKS])
                if found is not None:
                    break
            if found is not None:
                lead = found
                continue
        x, fx, popsize = yield from _cma_turn(P, ask, lead, rng, popsize)
        lead = _Local(P, lead.discrete, x, fx, rng)


def _cma_turn(P: Problem, ask: _Asker, lead: _Local, rng: np.random.Generator,
              popsize: int | None):
    """A turn of IPOP-CMA-ES from the incumbent ``lead``'s best point until it stalls;
    returns the best split and value (the incumbent's when it found nothing better) and the
    next turn's population (doubled)."""
    cma = _Cma(P, lead.discrete, lead.best, lead.value, rng, popsize=popsize)
    while not cma.stalled():
        yield from cma.generation(ask, CMA)
    return cma.best, cma.value, 2 * cma.cma.population_size


def _memory_screen(P: Problem, x0: Cont, d0: Mapping[str, Any], cap: int | None,
                   rng: np.random.Generator, records: list[dict[str, Any]] | None
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Phase 1 (no evaluation): every memory-feasible combination at the start split, and
    those the screen prices — a seeded subset of ``cap`` where there are more (the start's
    own combination always in).  The refused ones, with why, go to ``records``."""
    combos = P.combos()
    own = dict(without_order(d0))
    feasible, refused = fitting(combos, P.memory_checks(x0, combos))
    if records is not None:
        for combo, verdict in refused:  # refused by the configuration, or over memory
            why = ({"reason": verdict.reason} if isinstance(verdict, Invalid) else
                   {"need_bytes": verdict.need_bytes,
                    "capacity_bytes": verdict.capacity_bytes})
            records.append({**combo, **why})
    return feasible, (_subset(feasible, own, cap, rng) if cap is not None else feasible)


def _subset(combos: list[dict[str, Any]], own: dict[str, Any], n: int,
            rng: np.random.Generator) -> list[dict[str, Any]]:
    """A seeded subset of ``n`` of ``combos`` (all of them when they are no more), the
    start's own combination ``own`` always in."""
    if len(combos) <= n:
        return combos
    keep = [c for c in combos if c == own]
    others = [c for c in combos if c != own]
    picks = rng.choice(len(others), size=n - len(keep), replace=False)
    return keep + [others[i] for i in sorted(picks)]


def _screen(P: Problem, ask: _Asker, x0: Cont, d0: Mapping[str, Any],
            feasible: list[dict[str, Any]], top_k: int):
    """Phases 2 and 3: every combination at the start split in one mapping order (the
    start's own for its own combination), then every other order class of the best; returns
    each combination's best value and order, and the combinations' ranking by it."""
    order = dict(enumerate(_first_order(P, c, d0) for c in feasible))
    value = dict(enumerate((yield from ask(SCREEN, x0, [P.with_order(c, order[i])
                                                       for i, c in enumerate(feasible)]))))
    ranking = sorted(value, key=value.__getitem__)
    if P.has_order:
        k = _ordered(P, feasible, value, ranking, top_k)
        pairs = [(i, o) for i in ranking[:k] if math.isfinite(value[i])
                 for o in P.order_classes(feasible[i]) if o != order[i]]
        got = yield from ask(ORDERS, x0, [P.with_order(feasible[i], o) for i, o in pairs])
        for (i, o), v in zip(pairs, got, strict=True):
            if v < value[i]:
                value[i], order[i] = v, o
        ranking = sorted(value, key=value.__getitem__)
    return value, order, ranking


def _race(P: Problem, ask: _Asker, S: Settings,
          starts: list[tuple[dict[str, Any], Cont, float]], rng: np.random.Generator):
    """Phase 5, successive halving: a local search from each of ``starts`` (combination,
    split, value) — and, where no mapping order is searched, a compass search from the best
    of them (:data:`COMPASS_RACE`) — in installments of ``race`` evaluations per coordinate,
    the worse half dropped after each and the installment doubled, until one is left.
    Returns the runs, the one left and the compass search (None without one)."""
    runs = [_Local(P, c, x, f, rng) for c, x, f in starts]
    compass = None
    if COMPASS_RACE and not P.has_order:
        c, x, f = min(starts, key=lambda t: t[2])
        compass = _Compass(P, c, x, f, rng)
        runs.append(compass)
    alive = list(range(len(runs)))
    installment = S.race * max(1, len(P.coords))
    while len(alive) > 1:
        for i in alive:
            yield from runs[i].advance(ask, RACE, installment)
        alive = sorted(alive, key=lambda i: runs[i].value)[:math.ceil(len(alive) / 2)]
        installment *= 2
    return runs, runs[alive[0]], compass


def _first_order(P: Problem, combo: Mapping[str, Any], d0: Mapping[str, Any]) -> Any:
    """The mapping order a screen prices ``combo`` in: the start's own for the start's
    combination, else the first of its classes of equivalent orders."""
    own = d0.get(MAPPING_ORDER)
    if own is not None and dict(combo) == dict(without_order(d0)):
        return own
    return P.canonical_order(combo)


def _screen_descent(P: Problem, ask: _Asker, x0: Cont, d0: Mapping[str, Any],
                    every: list[dict[str, Any]], rng: np.random.Generator):
    """Phases 2 and 3 where the combinations are many (:data:`SCREEN_DESCENT`): a seeded
    subset of them at the start split, each in one mapping order (the start's own for its
    own combination), then a variable neighbourhood descent (:func:`_vnd`) over every
    combination in every order class from the subset's best.  Returns the combinations
    priced (the descent's neighbourhoods), each one's best value and order, and their
    ranking, as :func:`_screen` does for the combinations it is given."""
    points = [P.with_order(c, _first_order(P, c, d0))
              for c in _subset(every, dict(without_order(d0)), SCREEN_DESCENT, rng)]
    got = yield from ask(SCREEN, x0, points)
    seen = {_pair_key(p): (p, v) for p, v in zip(points, got, strict=True)}
    j = int(np.argmin(got))
    if math.isfinite(got[j]):
        parts = [neighbours.parts(c) for c in every]
        yield from _vnd(P, ask, x0, every, parts, points[j], seen)
    best: dict[str, tuple[float, Any, dict[str, Any]]] = {}
    for p, v in seen.values():
        c = dict(without_order(p))
        k = _pair_key(c)
        if k not in best or v < best[k][0]:
            best[k] = (v, p.get(MAPPING_ORDER), c)
    combos = list(best.values())
    value = {i: v for i, (v, _, _) in enumerate(combos)}
    order = {i: o for i, (_, o, _) in enumerate(combos)}
    return ([c for _, _, c in combos], value, order, sorted(value, key=value.__getitem__))


def _descend(P: Problem, ask: _Asker, x: Cont, pool: list[dict[str, Any]],
             starts: list[dict[str, Any]]):
    """Multi-start variable neighbourhood descent over the combinations (a space with
    nothing continuous): from the best of ``starts`` (the screened points, best first),
    then from each next one further than the last neighbourhood from where every descent
    so far ended — a point nearer would be in that descent's reach, and the descent from
    it would likely end in the same place — until the starts run out.  One descent ends
    where the best of its neighbours is no better; the optimum of a Megatron space can sit
    four choices from that place with nothing feasible between (Llama-2 13B on 64 H100s: a
    tensor degree halved, the data degree doubled, sequence parallelism dropped and the
    micro-batch from 4 to 1 — each step alone over memory or refused by the interleaved
    schedule), where a descent from another screened point reaches it."""
    parts = [neighbours.parts(c) for c in pool]
    ends: list[dict[str, Any]] = []
    for start in starts:
        if not any(neighbours.between(P, end, start) <= DESCENT_REACH[-1] for end in ends):
            ends.append((yield from _vnd(P, ask, x, pool, parts, start)))


def _vnd(P: Problem, ask: _Asker, x: Cont, pool: list[dict[str, Any]], parts: list[dict],
         start: dict[str, Any], seen: dict[str, tuple[dict[str, Any], float]] | None = None):
    """A variable neighbourhood descent from ``start`` (Hansen and Mladenovic); returns
    where it ends (and puts every point it prices, with its value, in ``seen`` when
    given).  The first neighbourhood of the incumbent: every point of ``pool`` at
    distance 1 or 2 (:func:`._neighbours.between`: the choices a combination differs in,
    one more for a mapping order outside the incumbent's class — so one choice changed in
    another order class, or two, as a strategy keeps its device count by moving a factor
    from one degree to another); when none of it is better, the next neighbourhood
    (:data:`DESCENT_REACH`).
    Each is one batch; its best point, when it beats the incumbent, is the next incumbent,
    and the descent goes on from the first neighbourhood."""
    best = dict(start)
    (fbest,) = yield from ask(DESCENT, x, [best])
    near = 0
    while near < len(DESCENT_REACH):
        if not near:  # a new incumbent: every neighbour's distance from it, once
            away = neighbours.away(P, pool, parts, best, DESCENT_REACH[-1])
        low = DESCENT_REACH[near - 1] if near else 0
        batch = [point for point, d in away if low < d <= DESCENT_REACH[near]]
        got = yield from ask(DESCENT, x, batch)
        if seen is not None:
            seen.update((_pair_key(p), (p, v)) for p, v in zip(batch, got, strict=True))
        j = int(np.argmin(got)) if got else -1
        if j >= 0 and better(got[j], fbest):
            best, fbest, near = batch[j], got[j], 0
        else:
            near += 1
    return best


def _pair_key(discrete: Mapping[str, Any]) -> str:
    """A (combination, mapping order) pair as a set member."""
    return repr(sorted(discrete.items()))


def _tier(P: Problem, ask: _Asker, S: Settings, x0: Cont, feasible: list[dict[str, Any]],
          value: dict[int, float], order: dict[int, Any], raced: set[str], lead: _Local,
          cap: int | None, rng: np.random.Generator):
    """A second bracket of the race, once the search after it has taken TIER times what
    came before it (``lead``: the local search running then): every order class of every
    combination (when they number no more than a screen; else every combination in the
    lead's order), then the axial probes of the TIER_PROBES best pairs that did not race, and
    the pair with the best probe (or start) run in doubling installments, dropped as soon as
    it is worse than the lead was after as many evaluations of its own; when it keeps up
    until it has had as many as the lead, it is returned (it leads), else None."""
    pairs = {}
    for i, c in enumerate(feasible):
        for o in P.order_classes(c):
            pairs[_pair_key(P.with_order(c, o))] = (i, o)
    if len(pairs) <= (cap or SCREEN_CAP):
        more = list(pairs.values())
    elif lead.discrete.get(MAPPING_ORDER) is not None:
        # too many to price every class: every combination in the lead's order (the class
        # with the same dimensions of size > 1 in the same sequence)
        more = [(i, P.same_class(c, lead.discrete[MAPPING_ORDER])) for i, c in enumerate(feasible)]
    else:
        more = []
    todo = [(i, o) for i, o in more if o is not None and o != order[i]
            and math.isfinite(value[i])]
    got = yield from ask(ORDERS, x0, [P.with_order(feasible[i], o) for i, o in todo])
    priced = {_pair_key(P.with_order(feasible[i], o)): v
              for (i, o), v in zip(todo, got, strict=True)}
    for i in value:  # each combination in its best order so far (the start's own, say)
        k = _pair_key(P.with_order(feasible[i], order[i]))
        priced[k], pairs[k] = value[i], (i, order[i])
    fresh = sorted((k for k in priced if k not in raced and math.isfinite(priced[k])),
                   key=priced.__getitem__)[:TIER_PROBES]
    if not fresh:
        return None
    probed = []  # (value, pair, split): each pair from the better of its start and probe
    for k in fresh:
        i, o = pairs[k]
        d = P.with_order(feasible[i], o)
        x, f = (yield from _probe(P, ask, d, x0, priced[k], CENTROID)) or (x0, priced[k])
        raced.add(k)
        probed.append((f, d, x))
    f, d, x = min(probed, key=lambda p: p[0])
    run = _Local(P, d, x, f, rng)
    n = S.race * max(1, len(P.coords))
    while not run.done and run.used < lead.used:
        yield from run.advance(ask, RACE, n)
        if not run.value < lead.value_at(run.used):
            return None
        n *= 2
    return run if run.value < lead.value else None


def _probe(P: Problem, ask: _Asker, discrete: Mapping[str, Any], x0: Cont, f0: float,
           centroid: bool = False):
    """The axial probes (:func:`_axial`) of ``discrete`` from ``x0`` (and with ``centroid``
    the simplexes' centroid and its axial probes too), one batch; the best as (split,
    value) when it beats ``f0`` (the value at ``x0``), else None."""
    xs = [y for _, _, y in _axial(P, x0, AXIAL)]
    if centroid:
        mid = Cont({b: np.full(len(v), 1.0 / len(v)) for b, v in x0.simplexes.items()},
                   x0.floats)
        xs += [mid] + [y for _, _, y in _axial(P, mid, AXIAL)]
    got = yield from ask.points(AXIAL_PHASE, [(discrete, x) for x in xs])
    if not got:
        return None
    j = int(np.argmin(got))
    return (xs[j], got[j]) if better(got[j], f0) else None


def _ordered(P: Problem, feasible: list[dict[str, Any]], value: dict[int, float],
             ranking: list[int], top_k: int) -> int:
    """How many of the best combinations (``ranking``) get every order class priced: the
    ``top_k`` best, and more, best first, until their other classes number
    ORDERS_SHARE of the combinations screened; none infeasible at the start split."""
    extra = 0
    for n, i in enumerate(ranking):
        if not math.isfinite(value[i]):
            return n
        extra += len(P.order_classes(feasible[i])) - 1
        if n + 1 >= top_k and extra >= ORDERS_SHARE * len(feasible):
            return n + 1
    return len(ranking)


def _shake(P: Problem, ask: _Asker, lead: _Local, rng: np.random.Generator,
           factors: list[float], limit: int | None = None):
    """Variable neighbourhood search's shake and local search (Mladenovic and Hansen,
    Comput. Oper. Res. 24(11), 1997): every simplex share of the incumbent multiplied by
    each of ``factors``, and its core at each wave edge (:data:`WAVES`; one batch), then,
    best shake first (the ``limit`` best, when given), the local search for KICK_EVALS
    evaluations per coordinate from each; the first that beats the incumbent is returned
    (its search goes on as the lead), None when none does."""
    x, fx = lead.best, lead.value
    xs = [y for _, _, y in _shakes(P, x, factors)]
    if WAVES:
        xs += P.wave_shakes(x, lead.discrete, WAVES)
    got = yield from ask.points(VNS, [(lead.discrete, y) for y in xs])
    for i in sorted(range(len(xs)), key=got.__getitem__)[:limit]:
        if not math.isfinite(got[i]):
            break
        run = _Local(P, lead.discrete, xs[i], got[i], rng)
        yield from run.advance(ask, VNS, KICK_EVALS * len(P.coords))
        if run.value < fx * (1 - GAIN):
            run.start = fx
            return run
    return None


def _shakes(P: Problem, x: Cont, factors: list[float]) -> list[tuple[Coord, float, Cont]]:
    """(coordinate, factor, point) of every shake of ``x``: each simplex share multiplied by
    each of ``factors``, the others (slack included) scaled in proportion; a share the
    factor would take to the encoding's floor or near the whole budget is not shaken."""
    out = []
    for c in P.coords:
        if c.index < 0:
            continue
        share = x.simplexes[c.block][c.index]
        out += [(c, f, P.with_share(x, c, share * f)) for f in factors
                if 2 * _FLOOR < share * f < 0.98]
    return out


def _axial(P: Problem, x: Cont, shares: tuple[float, ...]) -> list[tuple[Coord, float, Cont]]:
    """(coordinate, share, point) of every axial point of the split ``x`` (as
    :func:`_shakes` gives its shakes): one component of one simplex raised to each of
    ``shares``, the others (slack included) scaled down in proportion — the axial design of
    mixture experiments (Cornell, *Experiments with Mixtures*, 3rd ed., Wiley 2002), taken
    from the start split instead of the centroid.  A design in which one unit dominates
    (L2 large enough to hold the weights, the core with most of the power) sits in another
    basin of the AGE's whole-unit cliffs than the template's, and a local search from the
    template does not cross to it."""
    out = []
    for c in P.coords:
        if c.index < 0:
            continue
        for f in shares:
            if x.simplexes[c.block][c.index] < f:
                out.append((c, f, P.with_share(x, c, f)))
    return out


def _exhaust(P: Problem, ask: _Asker, x: Cont, combos: list[dict[str, Any]], size: int):
    """Every combination at ``x`` in its first order, then every order class of each (the
    points already evaluated are answered from the memo), in batches of ``size``; the plan
    ends with it."""
    points = [P.with_order(c, P.canonical_order(c)) for c in combos]
    points += [P.with_order(c, o) for c in combos for o in P.order_classes(c)]
    for k in range(0, len(points), size):
        yield from ask(SCREEN, x, points[k:k + size])


class _Asker:
    """Turns continuous points into the plan's batches, answering repeats from the memo."""

    def __init__(self, P: Problem) -> None:
        self.P, self.memo = P, {}     # design key -> value
        self.fresh = 0    # points the last batch evaluated (the others were repeats)
        self.total = 0    # points evaluated so far
        self.refused = 0  # points refused in a row since a batch was last evaluated

    def __call__(self, phase: str, x: Cont, discretes: list[dict[str, Any]]):
        return (yield from self.points(phase, [(d, x) for d in discretes]))

    def points(self, phase: str, pairs: list[tuple[Mapping[str, Any], Cont]]):
        params = [self.P.params(x, d) for d, x in pairs]
        keys = [self.P.design_key(p) for p in params]
        fresh: dict[str, int] = {}
        for i, k in enumerate(keys):
            if k not in self.memo and k not in fresh:
                fresh[k] = i
        if phase not in (SCREEN, ORDERS):
            # no design to price (no chip, or over memory): infeasible without a trial; a
            # search that proposes nothing else for long is priced anyway, so that the
            # plan always goes on to yield
            for k, i in list(fresh.items()):
                if self.refused < REFUSED_IN_A_ROW and self.P.refused(params[i]):
                    self.memo[k] = math.inf
                    self.refused += 1
                    del fresh[k]
        self.fresh = len(fresh)
        self.total += len(fresh)
        if fresh:
            self.refused = 0
            got = yield phase, [params[i] for i in fresh.values()]
            self.memo.update(zip(fresh, got, strict=True))
        return [self.memo[k] for k in keys]


class _Local:
    """The cliff-aware exchange (:func:`._inner.exchange`) of one combination, run in
    installments."""

    def __init__(self, P: Problem, discrete: Mapping[str, Any], x: Cont, fx: float,
                 rng: np.random.Generator, *, restart: bool = False) -> None:
        self.discrete, self.best, self.value, self.start = dict(discrete), x, fx, fx
        self.origin = x  # where it started
        self.gen = exchange(P, self.discrete, x, fx, 10**9, rng)
        self.batch: list[Cont] | None = None
        self.done = False
        # the exchange ends when its steps are spent, but can circle among points already
        # evaluated first: this many batches in a row of repeats only end it too
        self.patience, self.repeats = 4 * max(1, len(P.coords)), 0
        self.used, self.history = 0, [(0, fx)]  # (evaluations, best value) after each batch
        # a restart that has not gained after this many evaluations ends (RESTART_TRIAL)
        self.trial = RESTART_TRIAL * max(1, len(P.coords)) if restart else 0

    @property
    def gained(self) -> bool:
        """Whether it has beaten its start (by more than :data:`GAIN`)."""
        return self.value < self.start * (1 - GAIN)

    def value_at(self, n: int) -> float:
        """Its best value after its first ``n`` evaluations."""
        return self.history[bisect.bisect_right(self.history, n, key=lambda h: h[0]) - 1][1]

    def advance(self, ask: _Asker, phase: str, n: int):
        """Evaluate at least ``n`` points (whole batches), or until the search ends."""
        used = 0
        while used < n and not self.done:
            try:
                self.batch = next(self.gen) if self.batch is None else self.batch
                got = yield from ask.points(phase, [(self.discrete, b) for b in self.batch])
                used += ask.fresh
                self.used += ask.fresh
                self.repeats = 0 if ask.fresh else self.repeats + 1
                if self.repeats >= self.patience:
                    self.done = True
                for b, v in zip(self.batch, got, strict=True):
                    if v < self.value:
                        self.best, self.value = b, v
                self.history.append((self.used, self.value))
                if self.trial and self.used >= self.trial and not self.gained:
                    self.done = True
                self.batch = self.gen.send(got)
            except StopIteration:
                self.done = True


class _Compass(_Local):
    """A compass search (:func:`crossflow.search.compass.compass`) of one combination's
    split in the simplexes' natural coordinates (:func:`_vector`), run in installments as
    :class:`_Local` is; it ends when its step is spent."""

    def __init__(self, P: Problem, discrete: Mapping[str, Any], x: Cont, fx: float,
                 rng: np.random.Generator) -> None:
        super().__init__(P, discrete, x, fx, rng)
        self.gen = self._batches(P, x, fx)

    @staticmethod
    def _batches(P: Problem, x: Cont, fx: float):
        v = _vector(P, x)
        search = compass(v, fx, np.full(len(v), -encoding.SPAN),
                         np.full(len(v), encoding.SPAN), gain=GAIN)
        try:
            y = next(search)
            while True:  # one point per batch: the compass polls opportunistically
                (got,) = yield [_point(P, y, x)]
                y = search.send(got)
        except StopIteration:  # its step is spent
            return


def _vector(P: Problem, x: Cont) -> np.ndarray:
    """``x`` in the simplexes' natural coordinates: each simplex as its softmax logits
    (:mod:`crossflow.search.encoding`, ±SPAN), each float range scaled to the same span."""
    out: list[float] = []
    for name in P.simplexes:
        w = np.maximum(x.simplexes[name], 0.0)
        out += encoding.encode(list(w / w.sum()))
    for c in P.coords:
        if c.index < 0:
            out.append(-encoding.SPAN + 2 * encoding.SPAN * (x.floats[c.name] - c.low)
                       / (c.high - c.low))
    return np.array(out, dtype=float)


def _point(P: Problem, v: np.ndarray, like: Cont) -> Cont:
    """The split whose natural coordinates are ``v`` (:func:`_vector`); floats that are not
    searched are ``like``'s."""
    simplexes, k = {}, 0
    for name, s in P.simplexes.items():
        n = len(s.param_names)
        simplexes[name] = np.array(encoding.decode(list(v[k:k + n])))
        k += n
    floats = dict(like.floats)
    for c in P.coords:
        if c.index < 0:
            floats[c.name] = c.low + (float(v[k]) + encoding.SPAN) / (2 * encoding.SPAN) \
                * (c.high - c.low)
            k += 1
    return Cont(simplexes, floats)


def cma_es(P: Problem, x: Cont, sigma: float, seed: int, popsize: int | None = None,
           **options: Any):
    """CMA-ES (Hansen's, the ``cmaes`` package) from the split ``x`` in the natural
    coordinates of :func:`_vector`, bounded to them; ``options`` go to ``cmaes.CMA`` (the
    benchmarks' baselines try its variants, e.g. ``lr_adapt``)."""
    from cmaes import CMA

    mean = _vector(P, x)
    bounds = np.tile([-encoding.SPAN, encoding.SPAN], (len(mean), 1))
    # a mean on a bound has no room to sample around it
    mean = np.clip(mean, -encoding.SPAN + 1e-6, encoding.SPAN - 1e-6)
    return CMA(mean=mean, sigma=sigma, bounds=bounds, seed=seed, population_size=popsize,
               **options)


def told(xs: list[np.ndarray], values: list[float]) -> list[tuple[np.ndarray, float]]:
    """(sample, value) pairs for CMA-ES's ``tell``, an infeasible design (inf) worse than
    any design of the generation."""
    finite = [v for v in values if math.isfinite(v)]
    worst = 10 * max(finite) if finite else 1e30
    return [(x, v if math.isfinite(v) else worst) for x, v in zip(xs, values, strict=True)]


class _Cma:
    """CMA-ES on the budget split of one combination, in the natural coordinates of
    :func:`_vector`."""

    def __init__(self, P: Problem, discrete: Mapping[str, Any], x: Cont, fx: float,
                 rng: np.random.Generator, popsize: int | None = None) -> None:
        self.P, self.discrete, self.like = P, dict(discrete), x
        self.best, self.value = x, fx
        self.cma = cma_es(P, x, SIGMA0, int(rng.integers(2**31)), popsize)
        self.idle = 0

    def generation(self, ask: _Asker, phase: str):
        """One generation: its points in one batch, their values told to CMA-ES."""
        xs = [self.cma.ask() for _ in range(self.cma.population_size)]
        got = yield from ask.points(phase, [(self.discrete, _point(self.P, x, self.like))
                                            for x in xs])
        self.tell(xs, got)

    def tell(self, xs: list[np.ndarray], values: list[float]) -> None:
        improved = False
        for x, v in zip(xs, values, strict=True):
            if v < self.value * (1 - GAIN):
                self.best, self.value, improved = _point(self.P, x, self.like), v, True
        self.idle = 0 if improved else self.idle + 1
        self.cma.tell(told(xs, values))

    def stalled(self) -> bool:
        return self.idle >= PATIENCE or self.cma.should_stop()


__all__ = ["Plan", "Settings", "plan"]
