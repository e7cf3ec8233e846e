"""Studies: named co-optimisation searches on Optuna, tracked in MLflow (docs/architecture.md,
Studies).

::

    import crossflow
    from crossflow.search import load_study, run_study

    setup = load_study("quickstart")         # studies/quickstart.yaml, resolved and checked
    result = run_study(setup, track=False)   # resumes if the storage has the study
    result.best["objectives"]                # {'iteration_time_s': 0.00654...}
    crossflow.predict(**result.best["predict"])   # the best design, predicted again

Layering: optuna and mlflow are imported only inside this package, and only when a study is
opened or run — importing ``crossflow`` or loading a study file does not import them.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "StudySpec": "crossflow.search.study",
    "StudySetup": "crossflow.search.study",
    "load_study": "crossflow.search.study",
    "run_study": "crossflow.search.study",
    "open_study": "crossflow.search.study",
    "best_design": "crossflow.search.study",
    "export_design": "crossflow.search.study",
    "list_studies": "crossflow.search.study",
    "study_summary": "crossflow.search.study",
    "SearchSpaceSpec": "crossflow.search.space",
    "SearchSpace": "crossflow.search.space",
    "Design": "crossflow.search.space",
    "Objective": "crossflow.search.objective",
    "make_sampler": "crossflow.search.samplers",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'crossflow.search' has no attribute {name!r}")
