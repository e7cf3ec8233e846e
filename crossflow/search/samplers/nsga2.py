"""``nsga2``: Optuna's NSGA-II that does not spend a trial on a design the study holds.

NSGA-II draws each child by crossover and mutation of its parents; in a space of a few
thousand discrete designs (a Megatron parallelism space) many children are a parent again,
or an earlier child: ``gpt3-175b-a100-pareto`` evaluated 423 distinct designs in 639
trials.  The model is deterministic, so such a trial adds nothing but its cost.  Here a
child that repeats a design already in the study (finished, running or waiting) is drawn
again, up to :data:`TRIES` times; after that the repeat is kept (the region is exhausted,
and a trial must be spent on something).

The child is completed before the check: the parameters NSGA-II leaves out of it (those it
mutates, and all of them in the first generation) are drawn here as Optuna would draw them
afterwards — by the sampler's own random sampler, independently per parameter — so the
design is whole when it is compared.  This reads two attributes of Optuna's sampler
(``_child_generation_strategy``, ``_random_sampler``), which the sampler contract tests
(tests/test_sampler_contract.py) exercise.
"""

from __future__ import annotations

from typing import Any

import optuna

from crossflow.search.trials import all_trials

#: Children drawn for one trial before a repeat of a stored design is accepted.
TRIES = 20


class DistinctNSGAIISampler(optuna.samplers.NSGAIISampler):
    """:class:`optuna.samplers.NSGAIISampler` whose children are designs the study does not
    hold yet, when one can be drawn in :data:`TRIES` attempts (see the module docstring)."""

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        if not search_space:
            return {}
        generation = self.get_trial_generation(study, trial)
        parents = self.get_parent_population(study, generation)
        names = sorted(search_space)
        held = {_design(t.params, names) for t in all_trials(study)
                if t.number != trial.number and all(n in t.params for n in names)}
        params: dict[str, Any] = {}
        for _ in range(TRIES):
            child = (self._child_generation_strategy(study, search_space, parents)
                     if parents else {})
            params = {n: child[n] if n in child else self._random_sampler.sample_independent(
                study, trial, n, search_space[n]) for n in names}
            if _design(params, names) not in held:
                break
        return params


def _design(params: dict[str, Any], names: list[str]) -> tuple:
    return tuple(params[n] for n in names)
