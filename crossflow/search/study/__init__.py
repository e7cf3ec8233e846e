"""Named studies (docs/architecture.md, Studies), one module per job:

* :mod:`~crossflow.search.study.spec` — the study file (``kind: study``) and its schema;
* :mod:`~crossflow.search.study.setup` — :func:`load_study` resolves a study (every
  reference loaded and checked, strategies enumerated) into a :class:`StudySetup`;
  :func:`open_study` opens its Optuna study;
* :mod:`~crossflow.search.study.launch` — :func:`run_study` creates or resumes the study
  and runs one launch (:class:`Launch`), :func:`join_study` adds a worker to it;
* :mod:`~crossflow.search.study.progress` — the progress line;
* :mod:`~crossflow.search.study.results` — :func:`best_design` / :func:`export_design`
  give the best design in a form ``crossflow predict`` accepts back;
  :func:`study_summary` and :func:`list_studies` what ``crossflow study show`` / ``list``
  print.

Every name is re-exported here: ``from crossflow.search.study import load_study``.
"""

from __future__ import annotations

from crossflow.search.storage import make_storage
from crossflow.search.study.guidance import (
    complete_line,
    next_steps,
    resume_command,
    searches_budgets_only,
)
from crossflow.search.study.launch import (
    Launch,
    RunResult,
    check_launch,
    check_seed,
    check_study,
    check_tracking_uri,
    join_study,
    run_study,
    worker_seed,
)
from crossflow.search.study.progress import Progress
from crossflow.search.study.results import (
    best_design,
    best_trial,
    best_trials,
    design_lines,
    export_design,
    infeasibility,
    infeasibility_lines,
    is_feasible,
    list_studies,
    pareto_front,
    pareto_position,
    study_summary,
    summary_lines,
    template_document,
)
from crossflow.search.study.setup import StudySetup, load_study, open_study
from crossflow.search.study.spec import OBJECTIVES, SAMPLER_NAMES, StudySpec

__all__ = [
    "OBJECTIVES", "SAMPLER_NAMES", "Launch", "Progress", "RunResult", "StudySetup",
    "StudySpec", "best_design", "check_launch", "check_seed", "check_study", "check_tracking_uri", "best_trial", "best_trials", "design_lines", "export_design", "infeasibility", "infeasibility_lines", "is_feasible",
    "complete_line", "join_study", "list_studies", "load_study", "make_storage", "next_steps", "open_study", "pareto_front",
    "pareto_position",
    "resume_command", "run_study", "searches_budgets_only", "study_summary", "summary_lines", "template_document",
    "worker_seed",
]
