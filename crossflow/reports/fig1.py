"""Fig. 1 (paper §2): compute-intensity spread of the 64K³ GEMM over device counts and
parallelism strategies.

For each device count N (64 … 65,536, powers of 4) every RC / CR kernel-parallel strategy
``enumerate_strategies`` finds for ``gemm-64k`` is priced twice on the case-study chip
(``deepflow-case-study``, N12 / HBM2):

* the **per-device shard** (RC-kp1-kp2: m/kp1 × k × n/kp2; CR-kp1: m × k/kp1 × n) through
  the single-device kernel model, which searches the tiling: computation intensity =
  FLOPs / DRAM bytes of the chosen tiling (the paper's definition), and the shard's
  achieved FLOP/s;
* the **distributed GEMM** on N case-study nodes on a square-ish 2-D torus (the
  ``deepflow-case-study-512`` system's settings with N nodes): achieved FLOP/s per device
  including the kernel-parallel communication.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

import crossflow
from crossflow.config.loader import load_spec
from crossflow.parallel import enumerate_strategies
from crossflow.reports import _common as C

HARDWARE = "deepflow-case-study"
WORKLOAD = "gemm-64k"
KIND_COLOURS = {"RC": "tab:blue", "CR": "tab:orange"}
KIND_MARKERS = {"RC": "o", "CR": "s"}
KIND_NAMES = {"RC": "RC: m and n split (kp1 × kp2)", "CR": "CR: k split (kp1)"}


def _dims(n: int) -> list[int]:
    a = 2 ** (int(math.log2(n)) // 2)
    return [a, n // a]


def _system(n: int) -> dict:
    return {"kind": "system", "name": f"deepflow-case-study-torus-{n}",
            "device": HARDWARE, "devices_per_node": 1, "num_nodes": n,
            "inter": {"topology": "torus", "dims": _dims(n),
                      "collective": {"efficiency": 1.0, "step_latency_us": 0}},
            "collective_launch_us": 0}


def _shard(w, s) -> dict:
    if s.kp_type == "CR":
        m, k, n = w.m, math.ceil(w.k / s.kp1), w.n
    else:
        m, k, n = math.ceil(w.m / s.kp1), w.k, math.ceil(w.n / s.kp2)
    return {"kind": "gemm", "m": m, "k": k, "n": n, "precision": w.precision}


def compute(quick: bool) -> list[dict]:
    w = load_spec(WORKLOAD, "workloads")
    counts = [64, 4096] if quick else [64, 256, 1024, 4096, 16384, 65536]
    rows = []
    for n in counts:
        system = _system(n)
        strategies = enumerate_strategies(w, n)
        if quick:
            strategies = strategies[:: max(1, len(strategies) // 3)]
        for s in strategies:
            shard = _shard(w, s)
            k = crossflow.predict(workload=shard, hardware=HARDWARE).to_dict()
            dram = k["bytes_per_level"]["DRAM"]
            d = crossflow.predict(workload=WORKLOAD, hardware=HARDWARE, system=system,
                                  parallelism=str(s))
            rows.append({
                "devices": n, "strategy": str(s), "kp_type": s.kp_type,
                "shard_mkn": (shard["m"], shard["k"], shard["n"]),
                "intensity_flop_per_B": k["flops"] / dram,
                "shard_tflops": k["achieved_flops_per_s"] / 1e12,
                "shard_bottleneck": k["bottleneck"],
                "dist_tflops_per_device": (d.achieved_flops_per_s or 0.0) / 1e12,
                "dist_time_s": d.time_s, "feasible": d.feasible,
                "comm_share": (d.breakdown.get("kernel_parallel_comm_s", 0.0) / d.time_s
                               if d.feasible and d.time_s else float("nan")),
            })
    return rows


def _plain(ax) -> None:
    """Plain-number labels (1, 2, 5, 10, …) on a log y axis; 1, 10, 100, … only when it
    spans three decades or more."""
    lo, hi = ax.get_ylim()
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0) if hi / lo < 1e3 else (1.0,)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.4g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _short(strategy: str) -> str:
    return strategy.replace("-d1-p1", "")


def _plots(rows: list[dict], out: Path) -> list[str]:
    counts = sorted({r["devices"] for r in rows})
    kinds = [k for k in KIND_COLOURS if any(r["kp_type"] == k for r in rows)]
    figs = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, label, feasible_only in (
            (axes[0], "intensity_flop_per_B", "computation intensity (FLOP / DRAM byte)",
             False),
            (axes[1], "dist_tflops_per_device",
             "achieved TFLOP/s per device (incl. communication)", True)):
        sel = [[r for r in rows if r["devices"] == n and (r["feasible"] or not feasible_only)]
               for n in counts]
        ax.boxplot([[r[key] for r in rs] for rs in sel], whis=(0, 100), showfliers=False,
                   medianprops={"color": "black", "linewidth": 1.5})
        ax.set_xticks(range(1, len(counts) + 1), [f"{n:,}" for n in counts])
        for i, rs in enumerate(sel, start=1):
            for j, r in enumerate(rs):
                ax.scatter(i + 0.06 * ((j % 7) - 3), r[key], s=16, alpha=0.75, zorder=3,
                           color=KIND_COLOURS[r["kp_type"]],
                           marker=KIND_MARKERS[r["kp_type"]])
        ax.set_yscale("log")
        _plain(ax)
        ax.set_xlabel("devices (N)")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    handles = [Line2D([], [], ls="", marker=KIND_MARKERS[k], color=KIND_COLOURS[k],
                      label=f"one {k} strategy") for k in kinds]
    handles.append(Line2D([], [], color="black", lw=1.5,
                          label="median; box: quartiles; whiskers: min–max"))
    axes[0].legend(handles=handles, fontsize=8, loc="lower left")
    axes[0].set_title("per-device shard of the 64K³ GEMM (best tiling)")
    axes[1].set_title("distributed 64K³ GEMM on an N-node 2-D torus")
    figs.append(C.save_figure(fig, out, "fig1_left_intensity_vs_devices.png"))

    nmax = counts[-1]
    sel = sorted((r for r in rows if r["devices"] == nmax),
                 key=lambda r: (r["kp_type"], r["shard_mkn"]))
    fig, ax = plt.subplots(figsize=(max(7, 0.6 * len(sel)), 5))
    vals = [r["intensity_flop_per_B"] for r in sel]
    bars = ax.bar(range(len(sel)), vals, color=[KIND_COLOURS[r["kp_type"]] for r in sel])
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in vals], fontsize=8, padding=2)
    ax.set_xticks(range(len(sel)),
                  [f"{_short(r['strategy'])}\n{_shape(r['shard_mkn'])}" for r in sel],
                  fontsize=7, **({} if len(sel) <= 8 else
                                 {"rotation": 60, "ha": "right", "rotation_mode": "anchor"}))
    ax.set_ylim(0, max(vals) * 1.12)
    ax.set_ylabel("computation intensity (FLOP / DRAM byte)")
    ax.set_xlabel("strategy and per-device shard m × k × n")
    ax.set_title(f"computation intensity per strategy at {nmax:,} devices")
    ax.legend(handles=[Patch(color=KIND_COLOURS[k], label=KIND_NAMES[k]) for k in kinds],
              fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    figs.append(C.save_figure(fig, out, "fig1_right_strategies.png"))
    return figs


def _shape(mkn: tuple[int, int, int]) -> str:
    return " × ".join(f"{d // 1024}K" if d >= 1024 and d % 1024 == 0 else str(d)
                      for d in mkn)


def _stats(vals: list[float]) -> tuple[float, float, float]:
    return min(vals), statistics.median(vals), max(vals)


def report(out: Path, quick: bool) -> dict:
    rows = compute(quick)
    figs = _plots(rows, out)
    with open(out / "fig1_points.csv", "w", newline="", encoding="utf-8") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    counts = sorted({r["devices"] for r in rows})
    lines = ["| devices | strategies | intensity min / median / max (FLOP/B) | max/min "
             "| TFLOP/s per device (distributed) min / median / max | best strategy |",
             "|---|---|---|---|---|---|"]
    metrics = {}
    for n in counts:
        rs = [r for r in rows if r["devices"] == n]
        lo, med, hi = _stats([r["intensity_flop_per_B"] for r in rs])
        fl = [r["dist_tflops_per_device"] for r in rs if r["feasible"]]
        flo, fmed, fhi = _stats(fl) if fl else (float("nan"),) * 3
        best = max(rs, key=lambda r: r["dist_tflops_per_device"])["strategy"]
        lines.append(f"| {n} | {len(rs)} | {lo:,.0f} / {med:,.0f} / {hi:,.0f} | "
                     f"{hi / lo:.1f}× | {flo:.3g} / {fmed:.3g} / {fhi:.3g} | {best} |")
        metrics[f"intensity_median_{n}"] = med
        metrics[f"intensity_spread_{n}"] = hi / lo
        metrics[f"tflops_per_device_median_{n}"] = fmed
    md = _markdown(rows, counts, lines, metrics, quick)
    return {"markdown": md, "figures": figs, "files": ["fig1_points.csv"], "metrics": metrics}


def _names(rs: list[dict]) -> str:
    names = [f"{_short(r['strategy'])} ({_shape(r['shard_mkn'])})" for r in rs]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _bound(mkn: tuple[int, int, int]) -> float:
    """Intensity of a shard whose operands and result each cross DRAM once: 2mkn FLOPs over
    2(mk + kn + mn) bytes (fp16) — the most any tiling of that shape can reach."""
    m, k, n = mkn
    return m * k * n / (m * k + k * n + m * n)


def _markdown(rows: list[dict], counts: list[int], lines: list[str], metrics: dict,
              quick: bool) -> str:
    """The report's text: every number and every verdict below is read off ``rows``."""
    n0, n1 = counts[0], counts[-1]
    at0 = [r for r in rows if r["devices"] == n0]
    at1 = [r for r in rows if r["devices"] == n1]
    med0 = metrics[f"intensity_median_{n0}"]
    med1 = metrics[f"intensity_median_{n1}"]
    sp0 = metrics[f"intensity_spread_{n0}"]
    sp1 = metrics[f"intensity_spread_{n1}"]
    i0 = [r["intensity_flop_per_B"] for r in at0]
    i1 = [r["intensity_flop_per_B"] for r in at1]
    abs0, abs1 = max(i0) - min(i0), max(i1) - min(i1)
    hi1, lo1 = max(i1), min(i1)
    top1 = [r for r in at1 if r["intensity_flop_per_B"] >= 0.99 * hi1]
    low1 = [r for r in at1 if r["intensity_flop_per_B"] <= 1.01 * lo1]
    low_dim = min(min(r["shard_mkn"]) for r in low1)
    low_bound = _bound(low1[0]["shard_mkn"])
    peak = max(r["intensity_flop_per_B"] for r in rows)
    at_peak = [r for r in rows if r["intensity_flop_per_B"] >= 0.995 * peak]
    peak_shapes = sorted({r["shard_mkn"] for r in at_peak}, key=lambda m: m[0] * m[1] * m[2])
    small, large = peak_shapes[0], peak_shapes[-1]
    bound = _bound(large)
    if large[0] * large[2] >= 2 * small[0] * small[2]:
        peak_text = (f"shards as different as {_shape(small)} and {_shape(large)} both reach "
                     f"≈ {peak:,.0f} FLOP/B, though the larger one's shape would allow "
                     f"{bound:,.0f} FLOP/B if each operand crossed DRAM once")
    else:
        peak_text = (f"the best shard, {_shape(large)}, reaches ≈ {peak:,.0f} FLOP/B of the "
                     f"{bound:,.0f} FLOP/B its shape would allow if each operand crossed "
                     "DRAM once")
    peak_text += (': tiling-limited, like the paper\'s "different tiling strategies"'
                  if peak < 0.8 * bound else ": close to its shape's limit")
    t0 = metrics[f"tflops_per_device_median_{n0}"]
    t1 = metrics[f"tflops_per_device_median_{n1}"]
    tfall, ifall = t0 / t1, med0 / med1
    best1 = max(at1, key=lambda r: r["dist_tflops_per_device"])
    comm1 = best1["comm_share"]

    falls = "**Agrees.**" if med1 < med0 else "**Differs.**"
    if abs0 > abs1 and sp1 > sp0:
        spread = ("**Agrees on a linear axis, not on a log axis.** The absolute spread "
                  f"(max − min) is {abs0:,.0f} FLOP/B at {n0} devices and {abs1:,.0f} at {n1}, "
                  "so on a linear axis the low-parallelism boxes are the wide ones, as in "
                  "the paper; the *relative* spread (max/min) grows instead, "
                  f"{sp0:.1f}× at {n0} to {sp1:.1f}× at {n1}, because at high N the "
                  "strategies range from balanced shards to degenerate ones.")
    elif abs0 > abs1:
        spread = (f"**Agrees.** Both the absolute spread ({abs0:,.0f} FLOP/B at {n0} devices, "
                  f"{abs1:,.0f} at {n1}) and the relative one ({sp0:.1f}× vs {sp1:.1f}×) are "
                  "largest at the low device count.")
    else:
        spread = (f"**Differs.** The absolute spread grows from {abs0:,.0f} FLOP/B at {n0} "
                  f"devices to {abs1:,.0f} at {n1} (relative: {sp0:.1f}× to {sp1:.1f}×).")
    differs = "**Agrees:**" if hi1 > 2 * lo1 else "**Differs:**"
    faster = "faster" if tfall > ifall else "slower"
    return f"""# Fig. 1 — computation intensity of the 64K³ GEMM vs devices and strategies

**Command:** `crossflow report fig1-gemm-64k{' --quick' if quick else ''}` ·
hardware `{HARDWARE}` (N12 / HBM2 case-study node) · workload `{WORKLOAD}` (fp16) ·
strategies from `enumerate_strategies` (every RC-kp1-kp2 and CR-kp1 using exactly N devices{
', every few of them in quick mode' if quick else ''})
· systems: N nodes on a 2-D torus with the `deepflow-case-study-512` settings.

Left: each dot is one strategy's per-device shard (its best tiling) or, on the right panel,
the whole distributed GEMM (infeasible strategies left out); boxes span the quartiles,
whiskers the minimum and maximum.  Right: every strategy at {n1:,} devices, with its shard
m × k × n, on a linear axis.

![intensity vs devices](fig1_left_intensity_vs_devices.png)

![strategies at the largest count](fig1_right_strategies.png)

{chr(10).join(lines)}

Points: `fig1_points.csv` (per strategy: shard shape, intensity, shard and distributed FLOP/s,
communication share).

## CrossFlow beside the paper

| paper (§2, Fig. 1) | CrossFlow |
|---|---|
| Intensity is much smaller at higher degrees of parallelism. | {falls} Median intensity goes from {med0:,.0f} FLOP/B at {n0} devices to {med1:,.0f} FLOP/B at {n1} ({ifall:.0f}× lower). |
| A large spread at every device count, "particularly for lower parallelism degrees". | {spread} |
| The spread comes from "different parallelization strategies as well as different tiling strategies". | **Differs by construction:** CrossFlow's kernel model returns only the *best* tiling of each shard (an exhaustive search), so the spread here is over strategies alone; the paper's boxes also hold sub-optimal tilings, which widen them (most at low device counts, where shards are large and many tilings fit). |
| At 64K devices the best design point differs by strategy (Fig. 1 right). | {differs} at {n1} devices {_names(top1)} {'keeps' if len(top1) == 1 else 'keep'} the highest intensity ({hi1:,.0f} FLOP/B), while {_names(low1)} — a shard dimension of {low_dim} — fall to {lo1:,.0f} FLOP/B ({hi1 / lo1:.0f}× lower). |

Why the numbers are what they are: intensity is FLOPs over the **DRAM bytes of the chosen
tiling**.  For large shards (low N) it is capped by the case-study chip's on-chip memory,
which bounds the L2 tile: {peak_text}.  For small shards (high N) it is capped by the shard's
smallest dimension (shape-limited: an m × k × n shard reaches at most mkn / (mk + kn + mn)
FLOP/B in fp16, {low_bound:,.0f} for {_shape(low1[0]['shard_mkn'])}, against
{lo1:,.0f} reached).  The median distributed FLOP/s per device falls {tfall:.0f}× from
{n0} to {n1} devices, {faster} than the median intensity ({ifall:.0f}×); the kernel-parallel
communication over the torus is {comm1:.0%} of the best strategy's time at {n1} devices.
"""
