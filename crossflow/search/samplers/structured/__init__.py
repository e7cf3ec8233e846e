"""``structured``: a search driver that uses what CrossFlow knows about its own model.

A study's space has two very different parts.  The discrete choices (parallelism
strategy, device-mapping order, technology) are worth ~8× on the paper's LSTM case study,
and most of them can be ruled out without pricing a kernel: a strategy that does not fit
in memory does not fit whatever the budget split, and mapping orders that differ only in
where size-1 grid dimensions sit give the same time.  The budget split is worth the rest
(~2×), and the AGE makes it piecewise constant: whole bundles, banks, DRAM devices and
link ports, with cliffs where one more unit of one component costs a unit of another.

So the driver (:mod:`._plan`):

1. screens the discrete choices at the template's split — memory-only checks first (no
   evaluation; the rejected ones are stored on the study as ``structured.memory_rejected``),
   then every feasible combination, then every class of mapping orders for the best few;
2. searches the best combination's budget split with an inner method (:mod:`._inner`:
   ``exchange`` by default — a cliff-aware adaptive coordinate search whose moves land on
   the AGE's step edges, :mod:`crossflow.arch.cliffs` — or ``gd``, ``cmaes``, ``tpe``,
   ``compass``); a search that stalls is raced by a compass search from the template's
   split (another basin), the better one going on;
3. re-screens the best combinations at the split found, and gives the rest of the budget
   to the winner.

Every point it evaluates is an Optuna trial (logged to MLflow like any other).  The plan is
deterministic given the seed, the budget and the values, so :class:`StructuredSampler`
rebuilds it from the study's storage: it resumes after Ctrl-C and runs on several workers
(the points of one batch are evaluated side by side; a worker with nothing to take waits
for the batch to finish).  A batch is priced in one call (shared kernel prices) and the
objective takes each result as its trial runs.

The ``gd`` sampler name is this driver with the inner method ``gd`` (the paper's eq. 6);
the paper's plain method, from random starts, is ``gd-paper``
(:mod:`crossflow.search.samplers.gd`).
"""

from crossflow.search.samplers.structured._sampler import StructuredSampler

__all__ = ["StructuredSampler"]
