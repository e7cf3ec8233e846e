"""``structured``: a search driver that uses what CrossFlow knows about its own model.

A study's space has two very different parts.  The discrete choices (parallelism
strategy, device-mapping order, technology) are worth ~8× on the paper's LSTM case study,
and most of them can be ruled out without pricing a kernel: a strategy that does not fit
in memory does not fit whatever the budget split, and mapping orders that differ only in
where size-1 grid dimensions sit give the same time.  The budget split is worth the rest
(~2×), and the AGE makes it piecewise constant: whole bundles, banks, DRAM devices and
link ports, with cliffs where one more unit of one component costs a unit of another.

So the driver (:mod:`._plan`) is built from standard parts:

1. an exact screen of the discrete choices at the start split — memory-only checks first
   (no evaluation; the rejected ones are stored on the study as
   ``structured.memory_rejected``), then every feasible combination in one mapping order,
   then every class of equivalent mapping orders for the best few — or, where more than
   16 fit, a seeded 16 of them and a variable neighbourhood descent over every
   combination and order class from their best (the descent of the strategy-only spaces,
   below);
2. axial probes of the best combination's split (one budget component raised to half and to
   four fifths of its simplex: the axial design of mixture experiments), which find the
   basins a local search from the template's split does not reach;
3. a successive-halving race of local searches of the budget split (a pattern search whose
   moves land on the AGE's step edges, :mod:`._inner`) among the best few combinations and
   the best probe;
4. the winner's local search — where mapping orders are searched, followed by a turn of
   CMA-ES from its best point, whose best it goes on from (the split there trades compute
   against links along ridges no one share follows) — restarted from its best point
   while it gains (a restart that
   finds nothing within five evaluations per coordinate ends), with a second, wider bracket
   of the race once it has taken as many evaluations as came before, where the space
   searches mapping orders (every strategy in the
   winner's mapping order, the best few that did not race probed, the best raced against
   the winner's record), then the race's losers
   resumed the same way; once no local search gains any more, variable
   neighbourhood search (each budget share of the incumbent halved and doubled in turn, a
   local search from each), and IPOP-CMA-ES from the incumbent when no shake wins.

In a space with nothing continuous (a parallelism study on a fixed machine) steps 2-4 are
a variable neighbourhood descent over the combinations instead, from the screen's best
(neighbours: one or two choices changed, a strategy's degrees read from its name, a
mapping order in another class counting as two; then three), and again from each next
screened point out of reach of where the descents ended, after which Optuna's
multivariate TPE goes on from every trial.

Every point it evaluates is an Optuna trial (logged to MLflow like any other), and it
evaluates each design once: a point whose chip (the AGE's whole units, generated in ~0.2 ms
against 1-5 ms for a whole evaluation) and discrete choices it has already priced is
answered from its memo, not made a trial again; after the screen, a point that is no design
(the AGE cannot build its chip, or its strategy is over memory there: the memory-only checks
of step 1) is answered infeasible without a trial.  Its four
settings (:class:`._plan.Settings`) are keyword arguments, settable from a study's
``sampler_options``.  :class:`StructuredSampler` rebuilds the plan from the study's
storage, so a study resumes, is extended or switched to this sampler, and runs on several
workers without any worker waiting for another (:mod:`._sampler`).
"""

from crossflow.search.samplers.structured._plan import Settings
from crossflow.search.samplers.structured._sampler import StructuredSampler

__all__ = ["Settings", "StructuredSampler"]
