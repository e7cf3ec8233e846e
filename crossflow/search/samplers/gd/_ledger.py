"""Reading the chains back from the study's storage: the sampler's only memory.

Every trial the sampler plans carries system attributes (see the package docstring):
``gd:chain``, ``gd:step``, ``gd:role``, ``gd:point`` (the planned parameter values), and
on a step's base trial ``gd:state`` (the chain's state W, M, discrete values, moves).
:class:`Ledger` groups the study's trials by (chain, step, role) and says for each role
whether it is done (with its loss), pending (a trial is running or waiting) or free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from optuna.trial import FrozenTrial, TrialState

# SURPLUS: a trial the study runner did not evaluate because other workers had taken the
# whole budget: not an attempt of its role
from crossflow.search.keys import CHAIN, SURPLUS

STEP = "gd:step"
ROLE = "gd:role"
POINT = "gd:point"
STATE = "gd:state"

BASE = "base"
PROBE = "probe:"
MOVE = "move:"
#: Roles of trials outside the chains.
INDEPENDENT = "independent"
FIXED = "fixed"

#: A role whose trials failed (state FAIL) this many times counts as done with loss +inf;
#: fewer, and it is claimed again (an interrupted or killed trial is FAIL too, and must be
#: redone on resume, not read as an infeasible design).
MAX_ATTEMPTS = 2

_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
_PENDING = (TrialState.RUNNING, TrialState.WAITING)


class Status(Enum):
    FREE = "free"
    PENDING = "pending"
    DONE = "done"


#: Tiers of a loss (tier, value), compared lexicographically: a feasible trial's value,
#: else a complete trial's total constraint violation, else no information.
FEASIBLE, VIOLATED, UNKNOWN = 0, 1, 2


def loss(trial: FrozenTrial, sign: float) -> tuple[int, float]:
    """What the chain minimises, as (tier, value).

    * (FEASIBLE, sign·value) for a complete trial with no violated constraint (sign = −1
      when the study maximises);
    * (VIOLATED, Σ positive constraint values) for a complete trial with a violated
      ``trial.set_constraint`` (how the study runner records an infeasible design): worse
      than any feasible trial, graded among infeasible ones by the violation, so that from
      an infeasible point the finite differences lead towards feasibility;
    * (UNKNOWN, 0) — +inf with no grading — for a pruned trial (a runner may prune an
      infeasible design, with a user attribute ``infeasible_reason``), a failed one, or a
      NaN value.
    """
    if trial.state != TrialState.COMPLETE or trial.value is None:
        return UNKNOWN, 0.0
    violation = sum(max(float(c), 0.0) for c in trial.constraints.values())
    if violation > 0:
        return VIOLATED, violation
    if math.isnan(violation):
        return UNKNOWN, 0.0
    value = sign * float(trial.value)
    return (UNKNOWN, 0.0) if math.isnan(value) else (FEASIBLE, value)


@dataclass
class Step:
    """The trials of one step of one chain, by role."""

    attempts: dict[str, list[FrozenTrial]] = field(default_factory=dict)

    def state(self) -> dict[str, Any] | None:
        """The chain's state at this step (stored on the first trial claimed in the step)."""
        for trials in self.attempts.values():
            for trial in trials:
                if STATE in trial.system_attrs:
                    return trial.system_attrs[STATE]
        return None

    def status(self, role: str) -> Status:
        trials = self.attempts.get(role, ())
        if any(t.state in _FINISHED for t in trials):
            return Status.DONE
        if any(t.state in _PENDING for t in trials):
            return Status.PENDING
        if sum(t.state == TrialState.FAIL for t in trials) >= MAX_ATTEMPTS:
            return Status.DONE
        return Status.FREE

    def result(self, role: str) -> FrozenTrial | None:
        """The trial that stands for a done role: the first complete one, else the first
        pruned one, else the first failed one (None if the role has no trial)."""
        trials = self.attempts.get(role, ())
        for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
            for t in trials:
                if t.state == state:
                    return t
        return None

    def loss(self, role: str, sign: float) -> tuple[int, float]:
        trial = self.result(role)
        return (UNKNOWN, 0.0) if trial is None else loss(trial, sign)


@dataclass
class Ledger:
    """The study's chain trials: chain -> step -> role -> trials."""

    chains: dict[int, dict[int, Step]] = field(default_factory=dict)

    @classmethod
    def read(cls, trials: Iterable[FrozenTrial], *, skip: int | None = None,
             ignore_chains: set[int] | frozenset[int] = frozenset()) -> Ledger:
        ledger = cls()
        for t in trials:
            attrs = t.system_attrs
            chain = attrs.get(CHAIN)
            if chain is None or chain in ignore_chains or t.number == skip \
                    or ROLE not in attrs:  # (a claim being written: gd:role comes last)
                continue
            if t.user_attrs.get(SURPLUS):  # never evaluated: the study's budget was full
                continue
            steps = ledger.chains.setdefault(chain, {})
            step = steps.setdefault(attrs[STEP], Step())
            step.attempts.setdefault(attrs[ROLE], []).append(t)
        return ledger
