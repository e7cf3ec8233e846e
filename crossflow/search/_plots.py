"""Figures and tables for a study's MLflow parent run (private to
:mod:`crossflow.search.tracking.summary`), in the terms a systems architect reasons in.

* The optimisation history shows **feasible designs only**: an infeasible design's value is
  the study's penalty (~1e12, :data:`crossflow.search.objective.PENALTY`), not a time or an
  energy, and on a shared axis it would squash every real value.  Infeasible, pruned and
  failed trials are counted in the legend and marked as rows of ticks under the axis.
  Values carry their unit (seconds, joules, with an SI prefix chosen for the data).
* Parameter importance is computed on the **decoded design**
  (:func:`crossflow.search.tracking.records.decoded_params`): budget fractions, strategy,
  mapping order, technology choices — not the encoded simplex coordinates (``area.slack``,
  softmax logits) the sampler sees — and on feasible designs only (for the same reason).

The inputs of each figure are computed by a function of their own (:func:`history_series`,
:func:`importance_inputs`) that the tests check; the drawing functions only draw them.
Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot, so the
caller's backend (an interactive session) is never changed and no display is needed.
"""

from __future__ import annotations

import csv
import math
import textwrap
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossflow.search.keys import is_feasible

#: Parameter and metric names -> what an architect calls them (with the unit).
_LABELS = {
    "strategy": "parallelism strategy",
    "mapping_order": "mapping order",
    "logic_node": "logic technology node",
    "dram": "DRAM technology",
    "intra_link": "intra-node link technology",
    "inter_link": "inter-node link technology",
    "tdp_W": "TDP (W)",
    "chip_area_mm2": "chip area (mm²)",
    "node_area_mm2": "node area (mm²)",
    "micro_batch_size": "micro-batch size",
    "schedule": "pipeline schedule",
    "zero1": "ZeRO-1 optimiser sharding",
    "overlap_grad_reduce": "overlap gradient reduction",
}
#: Budget components (``arch.age``) -> readable names.
_COMPONENTS = {"dram_ctrl": "DRAM controller", "intra_links": "intra-node links",
               "inter_links": "inter-node links", "registers": "registers", "core": "core"}
#: Unit suffixes of metric names -> (quantity, unit).
_UNITS = (("_flops_per_s", "FLOP/s"), ("_bytes", "B"), ("_s", "s"), ("_J", "J"), ("_W", "W"))
_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"),
             (1e-6, "µ"), (1e-9, "n"))


def unit_of(name: str) -> tuple[str, str]:
    """(quantity, unit) of a metric name with a unit suffix: ``iteration_time_s`` ->
    ("iteration time", "s"); ("value", "") for a name without one."""
    for suffix, unit in _UNITS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[:-len(suffix)].replace("_", " "), unit
    return name.replace("_", " "), ""


def si_scale(values: Sequence[float], unit: str) -> tuple[float, str]:
    """(factor, prefixed unit) so that ``values / factor`` reads without exponents: the
    largest prefix not above the median magnitude (seconds -> ms, µs; FLOP/s -> TFLOP/s)."""
    mags = [abs(v) for v in values if v and math.isfinite(v)]
    if not unit or not mags:
        return 1.0, unit
    mid = float(np.median(mags))
    for factor, prefix in _PREFIXES:
        if mid >= factor:
            return factor, prefix + unit
    return _PREFIXES[-1][0], _PREFIXES[-1][1] + unit


def label(name: str) -> str:
    """What an architect calls a (decoded) parameter or a metric, with its unit:
    ``area_fractions.dram_ctrl`` -> "area fraction: DRAM controller", ``iteration_time_s`` ->
    "iteration time (s)", ``memory.capacity`` -> "memory capacity"."""
    if name in _LABELS:
        return _LABELS[name]
    simplex, dot, comp = name.partition("_fractions.")
    if dot:
        return f"{simplex.replace('_', ' ')} fraction: {_COMPONENTS.get(comp, comp)}"
    if name.startswith("memory."):
        return "memory " + name[len("memory."):].replace("_", " ")
    quantity, unit = unit_of(name)
    return f"{quantity} ({unit})" if unit else quantity


def constant_note(constant: Sequence[str], width: int = 110) -> str:
    """The parameters no feasible design varied, every one named, wrapped to ``width``: the
    components of a simplex after its name ("area fraction: inter-node links, intra-node
    links; power fraction: ...")."""
    groups: dict[str, list[str]] = {}
    for key in constant:
        head, sep, tail = label(key).partition(": ")
        groups.setdefault(head if sep else "", []).append(tail if sep else head)
    parts = [f"{head}: {', '.join(names)}" if head else ", ".join(names)
             for head, names in groups.items()]
    return textwrap.fill("constant, not shown: " + "; ".join(parts), width=width,
                         break_on_hyphens=False)


def _figure(width: float = 7.0, height: float = 4.2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def write_csv(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """One row per trial: number, state, times, then every metric, parameter and tag that
    any trial has (the same names as the trial's MLflow child run)."""
    metric_keys = sorted({k for r in records for k in r["metrics"]})
    param_keys = sorted({k for r in records for k in r["params"]})
    tag_keys = sorted({k for r in records for k in r["tags"]}
                      - {"trial_number", "state", "mlflow.runName"})
    header = (["number", "state", "datetime_start_ms", "datetime_complete_ms"] + metric_keys
              + param_keys + tag_keys)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for r in sorted(records, key=lambda r: r["number"]):
            writer.writerow(
                [r["number"], r["state"], r["start_ms"], r["end_ms"]]
                + [r["metrics"].get(k, "") for k in metric_keys]
                + [r["params"].get(k, "") for k in param_keys]
                + [r["tags"].get(k, "") for k in tag_keys])


def _feasible_complete(trials: Sequence[Any]) -> list[Any]:
    return [t for t in trials if t.state.name == "COMPLETE" and t.values is not None
            and is_feasible(t) and all(v is not None and math.isfinite(v) for v in t.values)]


def history_series(trials: Sequence[Any], directions: Sequence[str],
                   names: Sequence[str]) -> list[dict[str, Any]]:
    """What the optimisation history draws, one dict per objective: ``x``/``y`` the trial
    numbers and values of the complete feasible trials (penalties excluded), ``best`` the
    best so far along them, ``scale``/``unit`` (values are drawn as ``y / scale`` in
    ``unit``), ``ylabel``, ``log`` (log axis when the values span more than 100x), and the
    trial numbers of the ``infeasible`` (complete, valued by a penalty), ``pruned`` and
    ``failed`` trials."""
    feasible = _feasible_complete(trials)
    feasible_ids = {t.number for t in feasible}
    infeasible = sorted(t.number for t in trials if t.state.name == "COMPLETE"
                        and t.number not in feasible_ids)
    pruned = sorted(t.number for t in trials if t.state.name == "PRUNED")
    failed = sorted(t.number for t in trials if t.state.name == "FAIL")
    out = []
    for i, (name, direction) in enumerate(zip(names, directions, strict=True)):
        pts = sorted((t.number, float(t.values[i])) for t in feasible)
        x = np.array([p[0] for p in pts], dtype=int)
        y = np.array([p[1] for p in pts], dtype=float)
        best = (np.minimum.accumulate(y) if direction == "minimize"
                else np.maximum.accumulate(y)) if len(y) else y
        quantity, unit = unit_of(name)
        scale, shown = si_scale(y.tolist(), unit)
        out.append({"name": name, "direction": direction, "x": x, "y": y, "best": best,
                    "scale": scale, "unit": shown,
                    "ylabel": f"{quantity} ({shown})" if shown else quantity,
                    "log": bool(len(y) and y.min() > 0 and y.max() / y.min() > 100),
                    "infeasible": infeasible, "pruned": pruned, "failed": failed})
    return out


def history_png(path: Path, trials: Sequence[Any], directions: Sequence[str],
                names: Sequence[str], title: str) -> list[dict[str, Any]]:
    """The optimisation history (:func:`history_series`), one panel per objective: each
    feasible design's value and the best so far; infeasible / pruned / failed trials as
    rows of ticks under the axis, counted in the legend.  Returns the series drawn."""
    series = history_series(trials, directions, names)
    fig = _figure(7.5, 4.0 * len(series) + 0.6)
    grid = fig.add_gridspec(2 * len(series), 1, height_ratios=[5, 1] * len(series))
    numbers = [t.number for t in trials]
    for i, s in enumerate(series):
        ax = fig.add_subplot(grid[2 * i])
        if len(s["y"]):
            y, best = s["y"] / s["scale"], s["best"] / s["scale"]
            ax.scatter(s["x"], y, s=12, alpha=0.6, color="C0",
                       label=f"feasible design ({len(y)})")
            ax.step(s["x"], best, where="post", color="C3", lw=1.6,
                    label=f"best so far ({'lowest' if s['direction'] == 'minimize' else 'highest'}"
                          f": {best[-1]:.4g} {s['unit']})")
            if s["log"]:
                ax.set_yscale("log")
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.55, "no feasible complete design yet", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_ylabel(s["ylabel"])
        ax.grid(alpha=0.3, which="both" if s["log"] else "major")
        ax.set_title(f"{unit_of(s['name'])[0]} ({s['direction']})", fontsize=9)
        ax.tick_params(labelbottom=False)
        # the trials without a value to plot: one row of ticks each, counted
        rows = [("infeasible", s["infeasible"], "C1"), ("pruned", s["pruned"], "0.5"),
                ("failed", s["failed"], "C7")]
        strip = fig.add_subplot(grid[2 * i + 1], sharex=ax)
        for j, (_, nums, color) in enumerate(rows):
            strip.plot(nums, [j] * len(nums), "|", color=color, markersize=8)
        strip.set_yticks(range(len(rows)),
                         [f"{what} ({len(nums)})" for what, nums, _ in rows], fontsize=7)
        strip.set_ylim(-0.6, len(rows) - 0.4)
        strip.grid(axis="x", alpha=0.3)
        if numbers:
            strip.set_xlim(min(numbers) - 1, max(numbers) + 1)
        if i == len(series) - 1:
            strip.set_xlabel("trial number (infeasible: valued by the study's penalty, "
                             "not plotted)", fontsize=8)
    fig.suptitle(f"{title}: optimisation history ({len(trials)} trials)")
    fig.tight_layout()
    fig.savefig(path)
    return series


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    return ranks


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def fallback_importances(rows: Sequence[tuple[Mapping[str, Any], float]]) -> dict[str, float]:
    """|Spearman rank correlation| of each numeric parameter with the target, and the
    correlation ratio (eta) of the target's ranks over each categorical parameter's values;
    ``rows``: (parameters, target value) per trial."""
    rows = [(p, v) for p, v in rows if math.isfinite(v)]
    if len(rows) < 2:
        return {}
    y = _ranks(np.array([v for _, v in rows]))
    out: dict[str, float] = {}
    for name in sorted({k for p, _ in rows for k in p}):
        pairs = [(p[name], yi) for (p, _), yi in zip(rows, y, strict=True) if name in p]
        if len(pairs) < 2:
            continue
        xs, ys = [p[0] for p in pairs], np.array([p[1] for p in pairs])
        if all(_is_number(x) for x in xs):
            xr = _ranks(np.array(xs, dtype=float))
            if xr.std() == 0 or ys.std() == 0:
                out[name] = 0.0
                continue
            out[name] = float(abs(np.corrcoef(xr, ys)[0, 1]))
        else:
            groups: dict[str, list[float]] = {}
            for x, yi in zip(xs, ys, strict=True):
                groups.setdefault(str(x), []).append(yi)
            total = ((ys - ys.mean()) ** 2).sum()
            between = sum(len(g) * (np.mean(g) - ys.mean()) ** 2 for g in groups.values())
            out[name] = float(math.sqrt(between / total)) if total > 0 else 0.0
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def importance_inputs(trials: Sequence[Any], space: Mapping[str, Any] | None = None,
                      ) -> tuple[list[dict[str, Any]], list[tuple[float, ...]], list[str]]:
    """(decoded parameters, values, constant parameter names) of the complete feasible
    trials: the parameters every such trial has
    (:func:`~crossflow.search.tracking.records.decoded_params`), without those that take a
    single value (they explain nothing; returned apart)."""
    from crossflow.search.tracking.records import decoded_params

    done = _feasible_complete(trials)
    params = [decoded_params(t, space) for t in done]
    common = set.intersection(*(set(p) for p in params)) if params else set()
    constant = sorted(k for k in common if len({repr(p[k]) for p in params}) < 2)
    keep = sorted(common - set(constant))
    return ([{k: p[k] for k in keep} for p in params], [tuple(t.values) for t in done],
            constant)


def _distributions(params: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Optuna distributions spanning the decoded values: a float range for numbers, the
    choices seen (as text) otherwise."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    out: dict[str, Any] = {}
    for k in params[0]:
        vals = [p[k] for p in params]
        if all(_is_number(v) for v in vals):
            out[k] = FloatDistribution(float(min(vals)), float(max(vals)))
        else:
            out[k] = CategoricalDistribution(sorted({str(v) for v in vals}))
    return out


#: What the importance plot measures, and with which evaluator: PED-ANOVA (Watanabe et al.,
#: "PED-ANOVA: Efficiently Quantifying Hyperparameter Importance in Arbitrary Subspaces",
#: IJCAI 2023; Optuna's ``PedAnovaImportanceEvaluator``) scores how much each parameter's
#: distribution in the best 10 % of the designs differs from its distribution in all of
#: them — which knobs a good design must get right, the question a co-design study asks.
#: It is Optuna 5's default evaluator, named here so that the plot's meaning does not
#: follow a library default; it takes ~0.05 s on 300 trials, where fANOVA (a random
#: forest, "share of the variance explained") takes ~10 s and needs scikit-learn.
IMPORTANCE_METHOD = "PED-ANOVA (optuna.importance.PedAnovaImportanceEvaluator)"


def importance_scores(params: Sequence[Mapping[str, Any]], target: Sequence[float],
                      direction: str) -> tuple[dict[str, float], str, str]:
    """(importance per decoded parameter, method, note): Optuna's PED-ANOVA evaluator
    (:data:`IMPORTANCE_METHOD`) on an in-memory study of the decoded designs; where it
    fails, the rank-correlation :func:`fallback_importances`."""
    import optuna

    if len(params) < 2 or not params[0]:
        return {}, "none", ""
    values = [{k: (float(v) if _is_number(v) else str(v)) for k, v in p.items()}
              for p in params]
    fallback = "fallback: |Spearman rho| / correlation ratio (not PED-ANOVA)"
    dists = _distributions(params)
    try:
        from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            study = optuna.create_study(direction=direction)
        finally:
            optuna.logging.set_verbosity(verbosity)
        study.add_trials([optuna.trial.create_trial(params=v, distributions=dists, value=y)
                          for v, y in zip(values, target, strict=True)])
        with warnings.catch_warnings():  # PED-ANOVA is flagged experimental
            warnings.simplefilter("ignore")
            scores = get_param_importances(study, evaluator=PedAnovaImportanceEvaluator())
        return dict(scores), IMPORTANCE_METHOD, ""
    except Exception as exc:  # a degenerate distribution, ...
        note = f"Optuna importance unavailable: {type(exc).__name__}: {exc}"[:160]
        return fallback_importances(list(zip(values, target, strict=True))), fallback, note


def importance_png(path: Path, trials: Sequence[Any], names: Sequence[str], title: str,
                   directions: Sequence[str] | None = None,
                   space: Mapping[str, Any] | None = None) -> str:
    """Importance of each decoded design parameter (:func:`importance_inputs`,
    :func:`importance_scores`) for each objective, as bar charts with readable names
    (:func:`label`); returns the method used (that of the first objective; "none", with a
    figure saying why, under two complete feasible trials)."""
    directions = list(directions or ["minimize"] * len(names))
    params, values, constant = importance_inputs(trials, space)
    panels = []
    for i, name in enumerate(names):
        scores, method, note = importance_scores(params, [v[i] for v in values],
                                                 directions[i])
        panels.append((name, scores, method, note))
    n_bars = max((min(20, len(p[1])) for p in panels), default=0)
    head = f"{title}: what drives the objectives ({len(params)} feasible designs)"
    if constant:
        head += "\n" + constant_note(constant)
    extra = 0.17 * head.count("\n")  # the heading's lines, at 9 pt
    fig = _figure(8.0, max(2.6, (0.32 * n_bars + 1.4) * len(panels) + 0.6) + extra)
    for i, (name, scores, method, note) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        if scores:
            keys = list(scores)[:20][::-1]
            ax.barh([label(k) for k in keys], [scores[k] for k in keys], color="C0")
            ax.set_xlabel(
                f"importance for reaching the best 10 % of designs by {unit_of(name)[0]}"
                if method == IMPORTANCE_METHOD else
                f"importance for {unit_of(name)[0]} (|rank correlation|)", fontsize=8)
            ax.tick_params(axis="y", labelsize=8)
            ax.set_xlim(0, max(1e-9, max(scores.values())) * 1.1)
            ax.grid(axis="x", alpha=0.3)
            ax.set_title(f"method: {method}" + (f"\n{note}" if note else ""), fontsize=7)
        else:
            ax.set_axis_off()
            ax.text(0.5, 0.5, "parameter importance needs >= 2 complete feasible trials\n"
                    f"with varying parameters (this study has {len(params)})",
                    ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(head, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return panels[0][2] if panels else "none"


__all__ = ["fallback_importances", "history_png", "history_series", "importance_inputs",
           "importance_png", "importance_scores", "label", "si_scale", "unit_of",
           "write_csv"]
