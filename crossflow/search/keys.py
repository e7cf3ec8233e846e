"""The names CrossFlow writes on Optuna trials and studies, and the one reader of each.

Every module that writes or reads a trial attribute imports its name from here, so a
rename is one edit and no two readers can disagree on what a missing attribute means.
"""

from __future__ import annotations

from typing import Any

#: User attribute: whether the design can run (bool).  Written for every evaluated trial.
FEASIBLE = "feasible"
#: User attribute: why the design cannot run (text); absent when it can.
REASON = "infeasible_reason"
#: User attribute: how far from feasible (0 feasible, > 0 memory need / capacity − 1, else 1).
CONSTRAINT = "infeasibility"
#: System attribute: the chain a paper-``gd`` trial belongs to.
CHAIN = "gd:chain"
#: User attributes of the decoded design: ``<simplex>_fractions`` (every component's
#: fraction of a budget simplex, fixed ones included), the strategy and the mapping order
#: evaluated.  The technology choices and other named dimensions are the trial's parameters.
FRACTIONS_SUFFIX = "_fractions"
STRATEGY = "strategy"
MAPPING_ORDER = "mapping_order"
#: Prefix of the readable design ``crossflow dashboard`` shows on each trial
#: (``design.area.core = 43.7 %``): made when shown from the attributes above and the
#: parameters, never stored.
DESIGN_PREFIX = "design."
#: Study user attribute: the objectives' names, in the order of the trials' values.
OBJECTIVES = "objectives"
#: User attribute: the phase of the structured driver that proposed the trial.
PHASE = "driver_phase"
#: System attributes of a structured driver's trial: the plan's index of its point, and
#: the point (every parameter).
DRIVER_SLOT = "structured:slot"
DRIVER_POINT = "structured:point"
#: Study user attributes of the structured driver: its plan's start point (None: the
#: template's), its seed, and its memory-only verdicts (the combinations never evaluated).
DRIVER_START = "structured.start"
DRIVER_SEED = "structured.seed"
DRIVER_MEMORY = "structured.memory_rejected"
#: User attributes: the worker that ran a trial (host:pid), a trial that found no slot.
WORKER = "worker"
SURPLUS = "surplus"
#: MLflow tag: the trial number a run belongs to.
TRIAL_NUMBER_TAG = "trial_number"


def is_feasible(trial: Any) -> bool:
    """Whether a (frozen) trial holds a feasible design.

    The one reading of :data:`FEASIBLE`: a trial that says ``False`` is infeasible, as is
    one with a violated constraint (a constraint value > 0).  A
    completed trial without the attribute — written by a CrossFlow before it recorded
    feasibility, or enqueued by hand — counts as feasible when it has values."""
    if trial.user_attrs.get(FEASIBLE) is False:
        return False
    if any(c > 0 for c in (getattr(trial, "constraints", None) or {}).values()):
        return False
    return trial.values is not None
