"""Matplotlib figures and tables for a study's MLflow parent run (private to tracking.py).

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot, so the
caller's backend (an interactive session) is never changed and no display is needed.
"""

from __future__ import annotations

import csv
import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from optuna.trial import TrialState

# matplotlib and optuna at the top: tracking.py imports this module only when it draws a
# study's figures, so `import crossflow.search...` never loads it.


def _figure(width: float = 7.0, height: float = 4.2):
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


def history_png(path: Path, trials: Sequence[Any], directions: Sequence[str],
                names: Sequence[str], title: str) -> None:
    """Objective value per trial (complete trials) and the best so far, one panel per
    objective; pruned / failed / infeasible trials as ticks along the bottom."""
    fig = _figure(7.0, 3.2 * len(names) + 0.8)
    done = [t for t in trials if t.state.name == "COMPLETE" and t.values is not None]
    other = [t.number for t in trials if t.state.name != "COMPLETE"]
    for i, (name, direction) in enumerate(zip(names, directions, strict=True)):
        ax = fig.add_subplot(len(names), 1, i + 1)
        pts = sorted((t.number, t.values[i]) for t in done if math.isfinite(t.values[i]))
        if pts:
            x = np.array([p[0] for p in pts])
            y = np.array([p[1] for p in pts])
            best = np.minimum.accumulate(y) if direction == "minimize" else np.maximum.accumulate(y)
            ax.scatter(x, y, s=10, alpha=0.6, label=f"{name} (complete)")
            ax.step(x, best, where="post", color="C3", label=f"best so far ({direction})")
            if y.min() > 0 and y.max() / y.min() > 100:
                ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no complete trial with a finite value", ha="center",
                    va="center", transform=ax.transAxes)
        if other:
            ax.plot(other, [0.0] * len(other), "|", color="0.4", markersize=8,
                    transform=ax.get_xaxis_transform(),
                    label=f"pruned / failed / infeasible ({len(other)})")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.axes[-1].set_xlabel("trial number")
    fig.suptitle(f"{title}: optimisation history ({len(trials)} trials)")
    fig.tight_layout()
    fig.savefig(path)


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    return ranks


def fallback_importances(trials: Sequence[Any], target: Callable[[Any], float]) -> dict[str, float]:
    """|Spearman rank correlation| of each numeric parameter with the target, and the
    correlation ratio (eta) of the target's ranks over each categorical parameter's values."""
    rows = [(t.params, target(t)) for t in trials]
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
        if all(isinstance(x, int | float) and not isinstance(x, bool) for x in xs):
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


def importance_png(path: Path, study: Any, names: Sequence[str], title: str) -> str:
    """Parameter importances as a bar chart; returns the method used.

    ``optuna.importance.get_param_importances`` (Optuna's default evaluator) when at least
    two trials are complete and it succeeds; otherwise a rank-correlation fallback, named
    as such on the figure; with fewer than two complete trials a figure saying so."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    multi = len(names) > 1

    def target(t):
        return t.values[0]

    method, note, scores = "none", "", {}
    if len(complete) >= 2:
        try:
            # imported only here: the fANOVA evaluator costs ~0.5 s to load and a study
            # with fewer than two complete trials never needs it; import_module gives the
            # module itself, not the package's lazy proxy (tests patch the module)
            importance = importlib.import_module("optuna.importance")
            scores = importance.get_param_importances(study, target=target if multi else None)
            method = "optuna.importance.get_param_importances"
        except Exception as exc:  # too few distinct values, dynamic spaces, ...
            note = f"Optuna importance unavailable: {type(exc).__name__}: {exc}"[:160]
            scores = fallback_importances(complete, target)
            method = "fallback: |Spearman rho| / correlation ratio (not fANOVA/PED-ANOVA)"
    fig = _figure(7.0, max(2.5, 0.35 * len(scores) + 1.6))
    ax = fig.add_subplot(1, 1, 1)
    if scores:
        keys = list(scores)[:30][::-1]
        ax.barh(keys, [scores[k] for k in keys], color="C0")
        ax.set_xlabel(f"importance for {names[0]}")
        ax.tick_params(axis="y", labelsize=7)
    else:
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"parameter importance needs >= 2 complete trials\n"
                f"(this study has {len(complete)})", ha="center", va="center",
                transform=ax.transAxes)
    fig.suptitle(f"{title}: parameter importance\nmethod: {method}"
                 + (f"\n{note}" if note else ""), fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return method
