"""Multi-objective: iteration time vs energy per iteration (and vs power) for the LSTM case.

512 case-study nodes (N12, HBM2, NDR-x8, 300 W per node, 850 mm² chip) at the strategy and
mapping order the Fig. 10 parallelism search picks (RC-32-16-d1-p1, kp2-kp1-dp-lp); the area,
power and perimeter simplexes are searched for two objectives, time and energy, by NSGA-II
and by multi-objective TPE at the same number of model evaluations.  The ``structured``
sampler optimises one objective, so it runs twice at that budget, once minimising the
iteration time and once the energy: the two ends of the front.  Power per node is the
energy per iteration over the iteration time, over the 512 nodes.  The paper has no such
figure; the report shows the trade-off the budget split offers.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from crossflow.reports import _common as C
from crossflow.search.keys import is_feasible
from crossflow.search.samplers import PARETO
from crossflow.search.study import pareto_front as front

STRATEGY, ORDER = "RC-32-16-d1-p1", "kp2-kp1-dp-lp"
#: Single-objective runs of the structured sampler: label -> the objective it minimises.
STRUCTURED = {"structured (time)": "iteration_time_s", "structured (energy)": "energy_J"}
OBJECTIVES = ["iteration_time_s", "energy_J"]
COLOURS = {"nsga2": "tab:blue", "tpe": "tab:orange", "structured (time)": "tab:green",
           "structured (energy)": "tab:red"}


def _run(sampler: str, n_trials: int, storage_dir: Path, objectives: list[str] = OBJECTIVES,
         name: str | None = None) -> list[tuple[float, float]]:
    """(time s, energy J) of every feasible trial of a budget search for ``objectives``."""
    name = name or f"case-pareto-{sampler}"
    r = C.run_budget_study(C.budget_study(
        name, {"logic_node": "N12"}, C.SYSTEM, STRATEGY, n_trials, storage_dir,
        mapping_order=ORDER, objectives=objectives, sampler=sampler))
    return [(t.user_attrs["iteration_time_s"], t.user_attrs["energy_J"])
            for t in r.study.get_trials(deepcopy=False)
            if t.values is not None and is_feasible(t)]


def run_all(n_trials: int, storage_dir: Path) -> dict[str, list[tuple[float, float]]]:
    """Every run of the report: the two multi-objective samplers, then the structured
    sampler once per objective, each with ``n_trials`` model evaluations."""
    results = {s: _run(s, n_trials, storage_dir) for s in PARETO}
    for label, objective in STRUCTURED.items():
        results[label] = _run("structured", n_trials, storage_dir, [objective],
                              name=f"case-pareto-structured-{objective}")
    return results


def end_point(label: str, pts: list[tuple[float, float]]) -> tuple[float, float] | None:
    """A structured run's result: its fastest design (time run) or its least-energy design
    (energy run), ties broken by the other objective."""
    if not pts:
        return None
    if STRUCTURED[label] == "energy_J":
        return min(pts, key=lambda p: (p[1], p[0]))
    return min(pts)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points (both objectives minimised), each once, sorted by the first
    (:func:`crossflow.search.study.pareto_front` picks them)."""
    unique = sorted(set(points))
    return [unique[i] for i in front(unique)]


def _time_axis(ax, times: list[float]) -> None:
    """Iteration time on a log axis with plain-number ticks when it spans more than 3×,
    else linear (a log axis over a narrow range has no readable ticks)."""
    if times and max(times) > 3 * min(times):
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(LogLocator(subs=(2, 5)))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("iteration time (s, log scale)")
    else:
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("iteration time (s)")
    ax.grid(True, alpha=0.3, which="both")


def _plot(results: dict[str, list[tuple[float, float]]], out: Path, n_trials: int) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    for label, pts in results.items():
        colour = COLOURS.get(label, "tab:gray")
        xs, ys = [p[0] for p in pts], [p[1] / 1e3 for p in pts]
        watts = [p[1] / p[0] / C.DEVICES for p in pts]
        if label in STRUCTURED:
            a.scatter(xs, ys, s=12, alpha=0.5, color=colour, marker="x", linewidths=0.8)
            b.scatter(xs, watts, s=12, alpha=0.5, color=colour, marker="x", linewidths=0.8,
                      label=label)
            end = end_point(label, pts)
            if end is not None:
                goal = "min time" if STRUCTURED[label] == "iteration_time_s" else "min energy"
                a.scatter([end[0]], [end[1] / 1e3], s=220, marker="*", color=colour,
                          edgecolor="black", linewidths=0.8, zorder=5,
                          label=f"structured, {goal}: {end[0]:.3f} s, {end[1] / 1e3:.1f} kJ")
                b.scatter([end[0]], [end[1] / end[0] / C.DEVICES], s=220, marker="*",
                          color=colour, edgecolor="black", linewidths=0.8, zorder=5)
            continue
        front = pareto_front(pts)
        a.scatter(xs, ys, s=8, alpha=0.3, color=colour)
        a.plot([p[0] for p in front], [p[1] / 1e3 for p in front], marker="o", ms=4,
               color=colour, label=f"{label} front: {len(front)} Pareto "
                                   f"design{'' if len(front) == 1 else 's'}")
        b.scatter(xs, watts, s=8, alpha=0.3, color=colour, label=label)
    together = pareto_front([p for pts in results.values() for p in pts])
    if len(together) > 1:
        a.plot([p[0] for p in together], [p[1] / 1e3 for p in together], color="black",
               ls="--", lw=1, zorder=4, label=f"front of all runs: {len(together)} designs")
    # the view: every front and star with a margin; far-off designs are counted, not shown
    shown = together + [p for pts in results.values() for p in pareto_front(pts)]
    hidden = 0
    if shown:
        t_lo, t_hi = min(p[0] for p in shown) / 1.15, max(p[0] for p in shown) * 1.3
        e_lo, e_hi = min(p[1] for p in shown) / 1.15, max(p[1] for p in shown) * 1.35
        everything = [p for pts in results.values() for p in pts]
        hidden = sum(1 for p in everything
                     if not (t_lo <= p[0] <= t_hi and e_lo <= p[1] <= e_hi))
        a.set_xlim(t_lo, t_hi)
        a.set_ylim(e_lo / 1e3, e_hi / 1e3)
        b.set_xlim(t_lo, t_hi)
    a.set_ylabel("dynamic energy per iteration (kJ, all 512 nodes)")
    a.set_title("time vs energy (faint: every feasible design"
                + (f"; {hidden} off the view)" if hidden else ")"))
    b.set_ylabel("dynamic power per node (W)")
    b.set_title("time vs power")
    times = [p[0] for p in shown]
    for ax in (a, b):
        _time_axis(ax, times)
        for handle in ax.legend(fontsize=8).legend_handles:
            handle.set_alpha(1.0)
    fig.suptitle("LSTM case study, 512 nodes: budget split, time vs energy "
                 f"({n_trials} model evaluations per run)")
    return C.save_figure(fig, out, "pareto.png")


def report(out: Path, quick: bool) -> dict:
    n_trials = 12 if quick else 300
    results = run_all(n_trials, out / "optuna")
    fig = _plot(results, out, n_trials)
    rows = ["| sampler (objectives) | feasible designs | Pareto designs | fastest (s, kJ) | "
            "least energy (s, kJ) |", "|---|---|---|---|---|"]
    metrics = {}
    for label, pts in results.items():
        front = pareto_front(pts)
        goal = f"min {STRUCTURED[label]}" if label in STRUCTURED else "time, energy"
        name = "structured" if label in STRUCTURED else label
        if not front:
            rows.append(f"| {name} ({goal}) | 0 | 0 | — | — |")
            continue
        fast, frugal = front[0], front[-1]
        rows.append(f"| {name} ({goal}) | {len(pts)} | {len(front)} | {fast[0]:.3f}, "
                    f"{fast[1] / 1e3:.1f} | {frugal[0]:.3f}, {frugal[1] / 1e3:.1f} |")
        key = label.replace(" (", "_").replace(")", "")
        metrics[f"{key}_pareto_size"] = len(front)
        metrics[f"{key}_fastest_s"] = fast[0]
        metrics[f"{key}_least_energy_J"] = frugal[1]
    together = pareto_front([p for pts in results.values() for p in pts])
    if together:
        rows.append(f"| all four runs together | {sum(map(len, results.values()))} | "
                    f"{len(together)} | {together[0][0]:.3f}, {together[0][1] / 1e3:.1f} | "
                    f"{together[-1][0]:.3f}, {together[-1][1] / 1e3:.1f} |")
        metrics["combined_pareto_size"] = len(together)
    md = f"""# Multi-objective: iteration time vs energy, LSTM case study

**Command:** `crossflow report pareto-lstm-512{' --quick' if quick else ''}` · workload
`{C.WORKLOAD}` on `{C.SYSTEM}` ({C.TEMPLATE} chip at {C.CHIP_AREA_MM2} mm², N12, 300 W per
node) · strategy `{STRATEGY}`, mapping order `{ORDER}` · area, power and perimeter simplexes
searched for (iteration time, energy per iteration) by NSGA-II and multi-objective TPE, and
by the single-objective `structured` sampler once per objective (minimum iteration time,
minimum energy: the two ends of the front); {n_trials} model evaluations per run.

![Pareto fronts](pareto.png)

{chr(10).join(rows)}

## CrossFlow beside the paper

The paper's design-space exploration (§7, §9) minimises iteration time only and reports no
time–energy trade-off, so there is nothing to agree or disagree with; CrossFlow adds the
front as a multi-objective extension of its case study.

**Reading it.**  Energy here is dynamic energy (the kernels' FLOPs and bytes at the
technology's energies, plus the bytes sent over links), so it falls when the budget split
moves power into cheaper traffic (on-chip memory instead of DRAM, fewer link bytes) and rises
with the FLOPs the design can run; static power is not modelled.  The paper reports no
multi-objective result to compare with; the fronts show how much time a lower-energy split
costs on this system.  Every run sees the same budget of evaluations; the fronts show which
multi-objective sampler explores the trade-off better at that budget (a sampler that spends
its evaluations on infeasible splits — over the 16 GiB per node, or a budget too small for
one unit — has few feasible designs to build a front from).  The two structured runs (stars)
each push one objective alone, starting from the template's split, so they mark how far the
front's ends reach: a multi-objective front whose fastest (least-energy) end lies right of
(above) the structured star has not found the end of the trade-off.
"""
    return {"markdown": md, "figures": [fig], "files": [], "metrics": metrics}
