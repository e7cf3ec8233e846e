"""The convergence plot of ``crossflow compare`` (:mod:`crossflow.search.compare`): best-so-far
gap to the reference vs evaluations, median and min–max band per sampler."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np


def best_so_far(values) -> np.ndarray:
    """The running minimum (``inf`` until the first feasible design)."""
    return np.minimum.accumulate(np.asarray(values, dtype=float))


#: How an objective reads on an axis: (words, unit).
_HUMAN = {"iteration_time_s": ("iteration time", "s"), "energy_J": ("energy", "J"),
          "power_W": ("power", "W"), "memory_per_device_bytes": ("memory per device", "B")}



#: Line style and marker per sampler, in legend order: a curve drawn over another (two
#: samplers that stay on the same design) still shows both.
_STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1, 1, 1)), "v"),
           ((0, (1, 1)), "P"), ((0, (8, 2)), "X"))
#: Budgets above this get a log evaluation axis (the early evaluations are most of the
#: story); at or below it a linear axis reads better.
LOG_X_ABOVE = 200


def plot(path: Path, name: str, runs, reference: float | None, known: dict[str, Any]) -> None:
    """Best-so-far vs evaluations, median and min–max band per sampler: as the gap to the
    reference in % (log scale, 1 % and 5 % marked) when there is one, else the value with
    its unit.  Each sampler has its own colour, line style and marker; the first sampler is
    drawn thickest and lowest, so one that lies on another's line shows around it.  The
    evaluation axis is linear up to :data:`LOG_X_ABOVE` evaluations, logarithmic above."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    relative = reference is not None and reference > 0
    objective = known.get("objective", "objective")
    what, unit = _HUMAN.get(objective, (objective.replace("_", " "), ""))
    samplers = list(dict.fromkeys(r["sampler"] for r in runs))
    budget = max(len(r["values"]) for r in runs)
    if not relative and not any(math.isfinite(v) for r in runs for v in r["values"]):
        ax.text(0.5, 0.5, "no sampler found a feasible design", transform=ax.transAxes,
                ha="center", va="center")
    for i, sampler in enumerate(samplers):
        curves = np.array([best_so_far(r["values"]) for r in runs if r["sampler"] == sampler])
        if not np.isfinite(curves).any():  # nothing to draw (markevery fails on no points)
            ax.plot([], [], color=f"C{i}", linestyle="none", marker="x",
                    label=f"{sampler}: no feasible design ({len(curves)} seeds)")
            continue
        if relative:  # the gap in %, floored so that reaching the reference stays visible
            curves = np.maximum(100.0 * (curves / reference - 1.0), 0.01)
        x = np.arange(1, curves.shape[1] + 1)
        # the median is inf (not drawn) until most seeds have a feasible design, so it
        # stays monotone; the band spans the seeds that have one
        med = np.median(curves, axis=0)
        finite = np.where(np.isinf(curves), np.nan, curves)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lo = np.nanmin(finite, axis=0)
        hi = curves.max(axis=0)
        med, hi = (np.where(np.isinf(a), np.nan, a) for a in (med, hi))
        color = f"C{i}"
        style, marker = _STYLES[i % len(_STYLES)]
        ax.plot(x, med, color=color, linestyle=style, linewidth=max(1.2, 3.0 - 0.6 * i),
                drawstyle="steps-post", zorder=3 + i, marker=marker, markersize=6,
                markerfacecolor="white" if i % 2 else color, markeredgecolor=color,
                # markers every tenth of the axis, staggered so that two samplers on one
                # line show both (fractions of the axis: even on a log axis)
                markevery=(0.02 + 0.1 * i / len(samplers), 0.1),
                label=f"{sampler} (median of {len(curves)} seeds)")
        ax.fill_between(x, lo, hi, color=color, alpha=0.12, linewidth=0, step="post",
                        zorder=1)
    if relative:
        for tol, dash in ((1.0, "--"), (5.0, ":")):
            ax.axhline(tol, color="0.3", linestyle=dash, linewidth=1, zorder=2,
                       label=f"{tol:g} % from the reference")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} %"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        label = "best known" if known.get("value") == reference else "best found"
        ax.set_ylabel(f"best {what} so far: gap to the {label}\n"
                      f"({reference:.4g} {unit}), % (log scale)".replace(" )", ")"))
    else:
        ax.set_ylabel(f"best feasible {what} so far ({unit})" if unit
                      else f"best feasible {what} so far")
    if budget > LOG_X_ABOVE:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_xlabel("model evaluations (trials), log scale")
    else:
        ax.set_xlabel("model evaluations (trials)")
    ax.set_xlim(1, budget)
    ax.set_title(f"{name}: best design so far (median, min–max band over seeds)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
