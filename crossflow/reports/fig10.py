"""Fig. 10 (paper §9.2): co-optimising parallelism and hardware architecture per logic node.

Per logic node (N12 … N1; HBM2, NDR-x8, 300 W, 850 mm², 512 nodes on the 16 × 32 torus):

1. **baseline** — the template's budget split with Fig. 9's data-parallel-heavy strategy
   (``RC-1-16-d32-p1``, default mapping order);
2. **parallelism search** — the same chip, every strategy for 512 devices, then all 24
   mapping orders for every feasible one;
3. **+ architecture search** — the area / power / perimeter budgets searched (the
   ``structured`` sampler, an Optuna study through ``run_study``) at the strategy and (best) mapping order of step 2;
   the study's first trial is the template's split, so step 3 is never worse than step 2.

The model-architecture step of the paper's figure (changing the LSTM itself) is not
reproduced.  The report also checks the case-study chip against the paper's §9 technology
numbers (:func:`crossflow.arch.paper_check.paper_check`), at the template's split and at the
split the N12 search found, and says with the AGE's numbers why they differ.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator

import crossflow
from crossflow.arch.paper_check import paper_check
from crossflow.reports import _common as C

LOGIC = ["N12", "N7", "N5", "N3", "N2", "N1"]


def compute(out: Path, quick: bool) -> list[dict]:
    logic = ["N12", "N3"] if quick else LOGIC
    n_trials = 6 if quick else 200
    rows = []
    for lg in logic:
        hw = C.arch({"logic_node": lg})
        base = crossflow.predict(workload=C.WORKLOAD, hardware=hw, system=C.SYSTEM,
                                 parallelism=C.DATA_PARALLEL_BASELINE)
        par = C.parallelism_search(hw, C.SYSTEM, top=2 if quick else None,
                                   limit=12 if quick else None)
        archs = C.architecture_search(f"case-fig10-{lg}", {"logic_node": lg}, C.SYSTEM,
                                      par["strategy"], n_trials, out / "optuna")
        bp = crossflow.predict(workload=C.WORKLOAD, hardware=hw, system=C.SYSTEM,
                               parallelism=par["strategy"], mapping_order=par["mapping_order"])
        comm = sum(v for k, v in bp.breakdown.items() if k.endswith("comm_s")
                   or k in ("dp_allreduce_s", "pp_p2p_s"))
        design = archs["design"] or {}
        searched = C.arch({"logic_node": lg, **{k: design[k] for k in (
            "area_fractions", "power_fractions", "perimeter_fractions") if k in design}})
        rows.append({"logic": lg, "baseline_s": base.time_s,
                     "comm_share_at_best_strategy": comm / bp.time_s,
                     "template_inter_GBps": hw.links["inter"].bandwidth_Bps / 1e9,
                     "searched_inter_GBps": searched.links["inter"].bandwidth_Bps / 1e9,
                     "template_TFLOPS": hw.peak_flops["fp16"] / 1e12,
                     "searched_TFLOPS": searched.peak_flops["fp16"] / 1e12,
                     "parallelism_s": par["time_s"], "strategy": par["strategy"],
                     "mapping_order": par["mapping_order"],
                     "strategies_evaluated": par["evaluated"],
                     "arch_s": min(archs["time_s"], par["time_s"]),
                     "arch_trials": archs["trials"], "arch_design": archs["design"]})
    return rows


def _plot(rows: list[dict], out: Path) -> str:
    logic = [r["logic"] for r in rows]
    ref = rows[0]["baseline_s"]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    w = 0.27
    for i, (key, label) in enumerate((("baseline_s", "baseline (data-parallel-heavy)"),
                                      ("parallelism_s", "parallelism search"),
                                      ("arch_s", "parallelism + architecture search"))):
        bars = ax.bar([j + (i - 1) * w for j in x], [ref / r[key] for r in rows], w,
                      label=label)
        ax.bar_label(bars, labels=[f"{ref / r[key]:.2f}×" for r in rows], fontsize=7,
                     padding=1)
    ax.set_xticks(list(x), logic)
    ax.set_xlabel("logic node")
    ax.set_ylabel(f"speed-up over the {rows[0]['logic']} baseline (×, log scale)")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.set_title("LSTM case study, 512 nodes, HBM2 / NDR-x8: co-optimisation")
    return C.save_figure(fig, out, "fig10_cooptimization.png")


def report(out: Path, quick: bool) -> dict:
    rows = compute(out, quick)
    fig = _plot(rows, out)
    C.write_json(out, "fig10_points.json", rows)
    table = ["| node | baseline (s) | parallelism search (s) | ×  | + architecture (s) | × over "
             "parallelism | strategy, order |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['logic']} | {r['baseline_s']:.3f} | {r['parallelism_s']:.3f} | "
                     f"{r['baseline_s'] / r['parallelism_s']:.2f}× | {r['arch_s']:.3f} | "
                     f"{r['parallelism_s'] / r['arch_s']:.2f}× | {r['strategy']}, "
                     f"{r['mapping_order']} |")
    par_gain = [r["baseline_s"] / r["parallelism_s"] for r in rows]
    arch_gain = [r["parallelism_s"] / r["arch_s"] for r in rows]
    mature = [g for r, g in zip(rows, arch_gain, strict=True) if r["logic"] in ("N12", "N7")]
    adv = [g for r, g in zip(rows, arch_gain, strict=True)
           if r["logic"] not in ("N12", "N7")]
    trials = rows[0]["arch_trials"]
    strategies = ", ".join(sorted({f"`{r['strategy']}` ({r['mapping_order']})" for r in rows}))
    inter_t = rows[0]["template_inter_GBps"]
    comm_lines = " / ".join(f"{r['comm_share_at_best_strategy']:.0%}" for r in rows)
    heading = ("Why the architecture gain grows with the node instead of shrinking."
               if arch_gain[-1] > arch_gain[0] else "What the architecture search changes.")
    inter_lines = " / ".join(f"{r['searched_inter_GBps']:.0f}" for r in rows)
    tflops_lines = " / ".join(f"{r['searched_TFLOPS']:.0f}" for r in rows)
    tflops_t = " / ".join(f"{r['template_TFLOPS']:.0f}" for r in rows)

    def rng(v):
        return f"{min(v):.2f}–{max(v):.2f}×" if v else "n/a"

    md = f"""# Fig. 10 — co-optimising parallelism and architecture per technology node

**Command:** `crossflow report fig10-cooptimization{' --quick' if quick else ''}` · workload
`{C.WORKLOAD}` · system `{C.SYSTEM}` · chip `{C.TEMPLATE}` at {C.CHIP_AREA_MM2} mm², 300 W,
HBM2, NDR-x8, logic node per row.  Baseline: the template's budget split with
`{C.DATA_PARALLEL_BASELINE}` (Fig. 9's strategy: pure data parallelism does not fit 16 GiB).
Parallelism search: all {rows[0]['strategies_evaluated']} strategies enumerated for 512
devices, all 24 mapping orders for every feasible one.  Architecture search: a `structured` study of
{trials} trials over the area, power and perimeter simplexes at that strategy (best mapping
order per trial; journals under `optuna/`).

![co-optimisation](fig10_cooptimization.png)

{chr(10).join(table)}

## CrossFlow beside the paper

| paper (§9.2, Fig. 10) | CrossFlow |
|---|---|
| Parallelism search alone gives ~2×. | {'**Agrees.**' if min(par_gain) >= 1.5 and max(par_gain) <= 3 else '**Disagrees: larger.**' if min(par_gain) > 3 else '**Partly.**'} {rng(par_gain)} over the nodes. |
| Architecture search on top gives meaningful benefit at N12 / N7 … | {rng(mature)} at N12 / N7. |
| … and only 20–30% at advanced nodes. | {rng(adv)} beyond N7. |
| Model-architecture co-optimisation ≈ two node generations. | Not reproduced (the LSTM is fixed). |

**Why the parallelism gain is larger.**  The baseline is Fig. 9's data-parallel-heavy
strategy (a kernel-parallel group of 16 inside a 32-way data-parallel group), and on the
512-node torus with NDR-x8 links its per-time-step activation exchange and its gradient
all-reduce dominate the iteration (~89 % communication at N12, Fig. 9).  The parallelism
search picks {strategies} (no data parallelism: no gradient all-reduce; the 2-D kernel grid
mapped onto the physical torus by the best order).  The size of that gain is set by how
expensive CrossFlow's X-Y-routed torus collectives with per-port link shares are relative
to compute; the paper's baseline was presumably cheaper to communicate (ideal rings at the
full link rate), so its parallelism gain is smaller.

**{heading}**  At the best
strategy (template chip) communication is still {comm_lines} of the iteration (N12 → N1), and the AGE prices inter-node link
bandwidth out of the area / power / perimeter budgets.  The search moves budget to the
inter links: their bandwidth goes from {inter_t:.0f} GB/s (template) to {inter_lines} GB/s
per node (N12 → N1), while peak fp16 goes {tflops_lines} TFLOP/s (searched) against
{tflops_t} (template).  Trading some compute (which logic scaling makes plentiful) for
link bandwidth pays off more at advanced nodes, where communication is the larger share of
the iteration — hence a gain that rises with the node.  The paper found the opposite because in its model advanced nodes were bound by cache
capacity / bandwidth (which re-splitting the budget cannot fix cheaply), not by the network.
The searches are short ({trials} `structured` trials per node), so the architecture gains are lower
bounds.  The model was not tuned to the paper.
"""
    sec9, sec9_metrics = section9(rows[0])
    md += "\n" + sec9
    metrics = {f"parallelism_gain_{r['logic']}": g for r, g in zip(rows, par_gain, strict=True)}
    metrics.update(sec9_metrics)
    metrics.update({f"arch_gain_{r['logic']}": g
                    for r, g in zip(rows, arch_gain, strict=True)})
    return {"markdown": md, "figures": [fig], "files": ["fig10_points.json"],
            "metrics": metrics}


def _bw(bps: float) -> str:
    if bps >= 1e12:
        return f"{bps / 1e12:.2f} TB/s"
    return f"{bps / 1e9:.0f} GB/s" if bps >= 10e9 else f"{bps / 1e9:.3g} GB/s"


def section9(row: dict) -> tuple[str, dict]:
    """The §9 check: :func:`crossflow.arch.paper_check.paper_check` at the template's split
    and at the split the search found for ``row`` (a logic node), as markdown with the
    reasons for every disagreement, in numbers."""
    base = {"chip_area_mm2": C.CHIP_AREA_MM2, "logic_node": row["logic"]}
    design = row.get("arch_design") or {}
    split = {k: design[k] for k in ("area_fractions", "power_fractions",
                                    "perimeter_fractions") if k in design}
    tmpl = paper_check(C.TEMPLATE, overrides=base)
    srch = paper_check(C.TEMPLATE, overrides={**base, **split}) if split else None
    lines = ["| technology | paper | AGE, template split | ratio | units (bound by) | "
             "per unit: nominal → AGE | V | power budget | AGE, searched split |",
             "|---|---|---|---|---|---|---|---|---|"]
    metrics: dict[str, float] = {}
    for i, r in enumerate(tmpl):
        name = r["technology"] or "intra"
        other = srch[i] if srch else None
        other_txt = "—" if other is None or "age_Bps" not in other else (
            f"{_bw(other['age_Bps'])} ({other['ratio']:.2f}×, {other['units']:,} units)")
        if "age_Bps" not in r:
            lines.append(f"| {name} | {_bw(r['paper_Bps'])} | cannot build: "
                         f"{r['infeasible']} | | | | | | {other_txt} |")
            continue
        metrics[f"sec9_ratio_{name}"] = r["ratio"]
        lines.append(
            f"| {name} | {_bw(r['paper_Bps'])} | {_bw(r['age_Bps'])} | {r['ratio']:.2f} | "
            f"{r['units']:,} ({r['count_limit']}) | {_bw(r['unit_nominal_Bps'])} → "
            f"{_bw(r['age_unit_Bps'])} | {r['voltage_V']:.3f} | {r['power_budget_W']:.0f} W | "
            f"{other_txt} |")
    why = []
    for r in tmpl:
        if "age_Bps" not in r or abs(r["ratio"] - 1) <= 0.1:
            continue
        name = r["technology"]
        if r["kind"] == "inter":
            why.append(
                f"* **{name}: {r['ratio']:.2f}× the paper.**  The paper's figure is one x8 port "
                f"at nominal rate ({_bw(r['unit_nominal_Bps'])}, {r['unit_nominal_power_W']:.1f} W "
                f"with both directions busy).  The AGE builds as many ports as the budgets pay "
                f"for: {r['units']} ports, bound by {r['count_limit']}, under "
                f"{r['power_budget_W']:.0f} W, run at {r['voltage_V']:.3f} V "
                f"({r['unit_ratio']:.2f} of nominal frequency) — {_bw(r['age_unit_Bps'])} each, "
                f"{_bw(r['age_Bps'])} in all.  Bandwidth per watt rises as the voltage falls, so "
                f"more, slower ports win.")
        elif r["kind"] == "dram":
            need = r["units"] * r["unit_nominal_power_W"]
            count = (f"{r['units']} stacks, as the paper's 4" if r["units"] == 4 else
                     f"{r['units']} stacks, not the paper's 4: the package around the "
                     f"{C.CHIP_AREA_MM2} mm² chip has room for {r['units']} "
                     f"(bound by {r['count_limit']})")
            power = (f"at nominal rate they need {need:.0f} W and the template's DRAM power "
                     f"share gives {r['power_budget_W']:.0f} W, so the AGE runs them at "
                     f"{r['voltage_V']:.3f} V, {r['unit_ratio']:.2f}× the nominal rate"
                     + (" (over-driven)" if r["unit_ratio"] > 1 else ""))
            why.append(
                f"* **{name}: {r['ratio']:.2f}× the paper.**  {count}; {power}: "
                f"{r['units']} × {r['unit_ratio']:.2f} / 4 = {r['units'] * r['unit_ratio'] / 4:.2f}.  "
                f"The paper swept its memories at their nominal bandwidth, as if package room "
                f"and power were there.")
        else:
            why.append(
                f"* **intra-package links: {r['ratio']:.2f}× the paper's 2 TB/s.**  "
                f"{r['units']:,} ports ({r['count_limit']}-bound) at {r['voltage_V']:.3f} V under "
                f"{r['power_budget_W']:.0f} W.")
    searched_txt = ""
    if srch:
        inter = next((r for r in srch if r["kind"] == "inter" and "age_Bps" in r
                      and r["technology"] == "NDR-x8"), None)
        dram = next((r for r in srch if r["kind"] == "dram" and "age_Bps" in r
                     and r["technology"] == "HBM2"), None)
        same = inter and dram and all(
            abs(a.get("age_Bps", 0) - b.get("age_Bps", 0)) < 1e-3 * b.get("age_Bps", 1)
            for a, b in zip(srch, tmpl, strict=True))
        if same:
            searched_txt = (f"\nThe {row['logic']} search kept a split that builds the same "
                            f"links and memory (third column = second).\n")
        elif inter and dram:
            searched_txt = (
                f"\nAt the split the {row['logic']} search found, the chip moves further from "
                f"the paper's labels: {inter['units']} NDR-x8 ports under "
                f"{inter['power_budget_W']:.0f} W give {_bw(inter['age_Bps'])} "
                f"({inter['ratio']:.1f}× the paper's figure) while the {dram['units']} HBM2 stacks get "
                f"{dram['power_budget_W']:.0f} W and deliver {_bw(dram['age_Bps'])} "
                f"({dram['ratio']:.2f}×): for this 512-node LSTM the search buys network "
                f"bandwidth with DRAM power.\n")
    text = f"""
## The case-study chip against the paper's §9 numbers

The paper labels each §9 technology with one bandwidth.  The technology library is
calibrated so that those are the *nominal* figures (one x8 port; 4 HBM stacks); the AGE then
builds as many devices / ports as the {row['logic']} chip's area, perimeter and power budgets
allow and runs them at the voltage the power budget pays for
(`crossflow.arch.paper_check.paper_check`, bandwidth per direction; "AGE" is what CrossFlow
simulates with):

{chr(10).join(lines)}

Where CrossFlow disagrees with the paper, and why:

{chr(10).join(why) if why else "* Nowhere by more than 10 %."}
{searched_txt}
No constant was tuned to the paper: the differences come from what the budgets buy, not from
the technology numbers (reproducing the paper's DRAM figures would take a larger DRAM power
share, a budget choice of the study).
"""
    return text, metrics
