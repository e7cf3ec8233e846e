"""The summary of a study for its MLflow parent run: ``trials.csv``, ``best_design.yaml``,
the optimisation history and the parameter importances (PNG), and summary metrics/tags.

Drawn by the logger (:mod:`.logger`) from a JSON snapshot of the study's trials, so it runs
in the logging process, off the study's critical path.  No MLflow here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from crossflow.search.children import forked
from crossflow.search.tracking.records import (
    _MAX_TAG,
    _deserialize,
    _key,
    _text,
    _yaml_scalar,
    trial_record,
)

#: How long a figure's child may take (a 300-trial summary draws in ~0.3 s) before it is
#: killed and the figure drawn in the logging process itself.
FIGURE_TIMEOUT_S = 60.0


def search_space_of(space: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The search-space description (``simplexes``, ``dimensions``) in what a tracker was
    given: a study's description (``StudySetup.describe()``, under ``search_space``) or the
    description itself; None when it has neither."""
    if not isinstance(space, Mapping):
        return None
    inner = space.get("search_space", space)
    return inner if isinstance(inner, Mapping) and "simplexes" in inner else None


def render_summary(out: Path, msg: Mapping[str, Any], *, fork: bool = False
                   ) -> tuple[dict[str, float], dict[str, str]]:
    """Write the summary artifacts of a study (``msg``: see ``StudyTracker.finish``) into
    ``out``; return the parent run's (metrics, tags).  ``fork``: draw the two figures in
    child processes meanwhile (:func:`crossflow.search.children.forked`; a figure whose
    child fails or takes over :data:`FIGURE_TIMEOUT_S` is drawn here) — for the logging
    process, which has one thread doing the work and has imported what the figures need;
    a process whose other threads may hold a lock (the import lock, say) must not fork."""
    from crossflow.search import _plots

    names, directions, title = msg["metric_names"], msg["directions"], msg["study_name"]
    trials = [_deserialize(d) for d in msg["trials"]]
    finished = [t for t in trials if t.state.is_finished()]

    def draw_importance() -> str:
        return _plots.importance_png(
            out / "param_importances.png", finished, names, title, directions=directions,
            space=search_space_of(msg.get("space")))

    def draw_history() -> str:
        _plots.history_png(out / "optimization_history.png", trials, directions, names, title)
        return ""

    # the study has ended, so the second core is free, and the summary is most of the wait
    # between a tracked study's last trial and its end
    if fork:
        draw_importance = forked(draw_importance, FIGURE_TIMEOUT_S)
        draw_history = forked(draw_history, FIGURE_TIMEOUT_S)
    try:
        metrics, tags = _tables(out, msg, trials, finished)
    finally:
        importance = draw_importance()
        draw_history()
    tags["importance_method"] = importance
    return metrics, tags


def _tables(out: Path, msg: Mapping[str, Any], trials: list[Any], finished: list[Any]
            ) -> tuple[dict[str, float], dict[str, str]]:
    """``trials.csv`` and ``best_design.yaml``; the parent run's metrics and tags."""
    import optuna

    from crossflow.search import _plots

    names, directions = msg["metric_names"], msg["directions"]
    _plots.write_csv(out / "trials.csv", [trial_record(t, msg["sampler"], names)
                                          for t in finished])
    metrics: dict[str, float] = {"n_trials": float(len(trials))}
    for state in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING"):
        metrics[f"n_trials_{state.lower()}"] = float(sum(t.state.name == state for t in trials))
    # an in-memory copy of the study for its best trial(s) (numbers kept in a system
    # attribute: add_trials renumbers); states, values and system attributes (constraints)
    # are all Optuna's choice depends on, and add_trials deep-copies each trial twice
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line
    try:
        study = optuna.create_study(directions=directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    study.add_trials([_deserialize({**d, "params": {}, "distributions": {}, "user_attrs": {}},
                                   **{"crossflow:number": d["number"]})
                      for d in msg["trials"] if d["state"] in ("COMPLETE", "PRUNED", "FAIL")])
    by_number = {t.number: t for t in trials}
    tags: dict[str, str] = {}
    best = None
    try:
        if len(directions) == 1:
            best = by_number[study.best_trial.system_attrs["crossflow:number"]]
            metrics[f"best_{_key(names[0])}"] = float(best.values[0])
            tags["best_trial_number"] = str(best.number)
        else:
            front = sorted(t.system_attrs["crossflow:number"] for t in study.best_trials)
            metrics["n_pareto_trials"] = float(len(front))
            tags["pareto_trial_numbers"] = _text(front, _MAX_TAG)
    except (ValueError, RuntimeError):  # no complete trial
        pass
    design = msg["best_design"]
    if design is None and best is not None:
        rec = trial_record(best, msg["sampler"], names)
        design = {"trial_number": best.number, "values": best.values,
                  "params": {k: _yaml_scalar(v) for k, v in rec["params"].items()}}
    with (out / "best_design.yaml").open("w") as fh:
        yaml.safe_dump(design if design is not None else
                       {"best_design": None, "note": "no complete trial"}, fh, sort_keys=False)
    return metrics, tags
