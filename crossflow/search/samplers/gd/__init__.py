"""The ``gd`` sampler: DeepFlow's momentum-projected gradient descent (paper §7, eq. 6).

:class:`GDSampler` searches budget simplexes (area, power, perimeter fractions, encoded as in
:mod:`crossflow.search.encoding`) by projected gradient descent in fraction space, and the
other dimensions of a study (parallelism strategy, mapping order, technology, micro-batch
size, …) by neighbour moves, with every model evaluation — finite-difference probes
included — one Optuna trial, so it compares with TPE, CMA-ES and random search at equal
numbers of evaluations.

Algorithm:
    A *chain* starts from a random point: uniform (Dirichlet(1, …, 1)) fractions on each
    simplex, the slack counted as a coordinate so that "Σ fractions ≤ 1" becomes
    "Σ = 1, slack ≥ 0", and a uniform random value of every other dimension. Each *step*
    t evaluates, as separate trials:

    * the *base* W_t;
    * one *probe* per simplex coordinate i (the slack included): (1 − h)·W + h·e_i, a move
      of weight h towards vertex i. It stays on the simplex, so no probe is an invalid
      budget, and it can grow a coordinate that is 0. (The reference implementation
      multiplied x_i by 1.5 without renormalising: its probes left the simplex and a
      coordinate at 0 could never grow.) With d_i = (f(probe_i) − f(W))/h, the vector
      g = d − mean(d) is the gradient projected onto the simplex's tangent space;
    * one neighbour *move* per other dimension, the simplexes held at W_t (from step 1 on:
      step 0 learns which dimensions the objective suggests).

    Then, per simplex, eq. 6: W' = W_t − η·g/‖g‖, M_{t+1} = β·M_t + (1 − β)·W',
    W_{t+1} = Project(M_{t+1}), the exact Euclidean projection onto the simplex (Held et al.
    1974; Duchi et al. 2008), with M_0 = W_0; and the best move that lowered the loss is
    kept. A chain runs ``steps`` (T) steps, or ends earlier after three steps in a row
    that change nothing. ``restarts`` (S) chains run; the best trial of the study is the
    answer. When a new base point is one that step t already evaluated (nothing moved), that
    trial stands for the base instead of a repeat.

    Losses, compared lexicographically as (tier, value): a feasible trial's objective
    value (negated when the study maximises); worse, a complete trial with a violated
    ``trial.set_constraint`` (how the study runner records an infeasible design), graded
    by its total violation so that from an infeasible point the differences lead towards
    feasibility; worst, +inf with no grading, a pruned trial (a runner may prune an
    infeasible design, with user attribute ``infeasible_reason``) or a failed one.
    Differences across tiers are infinite, and infinite differences take the limit of the
    normalised gradient: the worse probes alone set the direction (away from them), or
    from a worse base the better probes do (towards them); no information at all is a
    zero gradient. An infeasible point never ends a chain (the reference stopped at the
    first infinite time). A failed trial (state FAIL: the objective raised, returned NaN,
    or the worker was interrupted or died) is claimed once more before it counts as +inf,
    so an interrupted run resumes without corrupting a gradient. (Also unlike the
    reference: the exact projection, not "clamp at 0.01 and rescale"; M_0 = W_0, not 0; a
    zero gradient takes no step instead of dividing by 0.)

Dimensions outside the simplexes:
    They have no gradient. A chain holds them fixed while it probes the simplexes and
    moves each by one neighbour per step, keeping the best improving move: a coordinate
    search over the orders the search space defines (strategies by degree, technology
    nodes by size; the next or previous choice in the direction that last helped), with a
    random other choice every third step for categoricals of more than three choices,
    whose list order need not mean closeness (the 24 mapping orders). Integers and other
    floats move one point of a grid of about 20 points over their range (their own step
    when coarser; geometric with ``log=True``) — delegating them to an independent sampler
    would change them between a base and its probes, or never optimise them.

Storage protocol:
    The sampler keeps nothing in memory that matters: each new trial rebuilds the chains
    from the study's trials, so a study resumes in a new process and several worker
    processes (or machines) share one study. Trial system attributes:

    * ``gd:chain`` (int), ``gd:step`` (int) and ``gd:role`` (``"base"``,
      ``"probe:{simplex}.{component}"``, ``"move:{param}"``; ``"independent"`` for a trial
      outside the chains, ``"fixed"`` for an enqueued one);
    * ``gd:point``: the planned parameter values (encoded simplex values and the other
      dimensions), which the sampler returns when the objective suggests them;
    * ``gd:seed``: the chain's seed, for dimensions first suggested mid-chain;
    * ``gd:state`` on the first trial claimed in a step: the chain's state there — W and M
      per simplex, the other dimensions, the step's moves, the move directions.

    A role is *taken* while one of its trials is running or waiting, *done* when one
    completed or was pruned (or failed twice), *free* otherwise. A new trial, in
    ``before_trial``, takes the first free role of the lowest chain that has one; a step
    whose roles are all done yields the next step's state (computed from the stored
    losses, the same in every process); a chain whose step waits for running trials is
    skipped, so spare workers start the next chain; with every chain ended or waiting the
    trial goes to ``independent_sampler``. Claims happen in trial-number order (numbers
    are unique in every storage): a trial waits until every lower-numbered running trial
    has written its ``gd:role`` (written last), so no two workers take the same role. An
    unclaimed running trial older than 10 s is ignored (its worker died); a study must
    not mix GDSampler with other samplers across workers. A trial re-enqueued by
    :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` keeps the role it copies.

    Random streams are keyed by (seed, chain, step), so one worker and one seed give the
    same trials every time, before and after a restart, and with one seed several
    workers run the same chains in a different interleaving.

Example:

    .. code-block:: python

        import optuna
        from crossflow.search.samplers.gd import GDSampler

        sampler = GDSampler(simplexes={"area": ["core", "L2", "dram_ctrl"]}, seed=0)
        study = optuna.create_study(sampler=sampler)
        study.optimize(objective, n_trials=2000)

Single-objective studies only (minimise or maximise); a multi-objective study raises
``ValueError``.
"""

from crossflow.search.samplers.gd._sampler import GDSampler

__all__ = ["GDSampler"]
