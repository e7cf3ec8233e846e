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

import math
from pathlib import Path

from crossflow.reports import _common as C

HARDWARE = "deepflow-case-study"
WORKLOAD = "gemm-64k"


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
    import crossflow
    from crossflow.config.loader import load_spec
    from crossflow.parallel import enumerate_strategies

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


def _plots(rows: list[dict], out: Path) -> list[str]:
    import matplotlib.pyplot as plt

    counts = sorted({r["devices"] for r in rows})
    figs = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "intensity_flop_per_B",
                            "computation intensity (FLOP / DRAM byte)"),
                           (axes[1], "dist_tflops_per_device",
                            "achieved TFLOP/s per device (with comm.)")):
        data = [[r[key] for r in rows if r["devices"] == n and r["feasible"]] for n in counts]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(counts) + 1), [str(n) for n in counts])
        for i, vals in enumerate(data, start=1):
            ax.scatter([i + 0.08 * ((j % 5) - 2) for j in range(len(vals))], vals, s=12,
                       alpha=0.6, color="tab:blue")
        ax.set_yscale("log")
        ax.set_xlabel("devices")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title("64K³ GEMM: spread over RC/CR strategies")
    axes[1].set_title("distributed 64K³ GEMM on an N-node torus")
    figs.append(C.save_figure(fig, out, "fig1_left_intensity_vs_devices.png"))

    nmax = counts[-1]
    sel = [r for r in rows if r["devices"] == nmax]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(sel)), 4.5))
    colors = ["tab:blue" if r["kp_type"] == "RC" else "tab:orange" for r in sel]
    ax.bar(range(len(sel)), [r["intensity_flop_per_B"] for r in sel], color=colors)
    ax.set_xticks(range(len(sel)), [r["strategy"].replace("-d1-p1", "") for r in sel],
                  rotation=70, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("computation intensity (FLOP / DRAM byte)")
    ax.set_title(f"per strategy at {nmax} devices (blue RC, orange CR)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    figs.append(C.save_figure(fig, out, "fig1_right_strategies.png"))
    return figs


def _stats(vals: list[float]) -> tuple[float, float, float]:
    import statistics
    return min(vals), statistics.median(vals), max(vals)


def report(out: Path, quick: bool) -> dict:
    import csv

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
                     f"{hi / lo:.1f}× | {flo:.1f} / {fmed:.1f} / {fhi:.1f} | {best} |")
        metrics[f"intensity_median_{n}"] = med
        metrics[f"intensity_spread_{n}"] = hi / lo
        metrics[f"tflops_per_device_median_{n}"] = fmed
    n0, n1 = counts[0], counts[-1]
    med0 = metrics[f"intensity_median_{n0}"]
    med1 = metrics[f"intensity_median_{n1}"]
    sp0 = metrics[f"intensity_spread_{n0}"]
    sp1 = metrics[f"intensity_spread_{n1}"]
    i0 = [r["intensity_flop_per_B"] for r in rows if r["devices"] == n0]
    i1 = [r["intensity_flop_per_B"] for r in rows if r["devices"] == n1]
    abs0, abs1 = max(i0) - min(i0), max(i1) - min(i1)
    hi0, hi1 = max(i0), max(i1)
    best1 = max((r for r in rows if r["devices"] == n1),
                key=lambda r: r["dist_tflops_per_device"])
    comm1 = best1["comm_share"]
    md = f"""# Fig. 1 — computation intensity of the 64K³ GEMM vs devices and strategies

**Command:** `crossflow report fig1-gemm-64k{' --quick' if quick else ''}` ·
hardware `{HARDWARE}` (N12 / HBM2 case-study node) · workload `{WORKLOAD}` (fp16) ·
strategies from `enumerate_strategies` (every RC-kp1-kp2 and CR-kp1 using exactly N devices)
· systems: N nodes on a 2-D torus with the `deepflow-case-study-512` settings.

![intensity vs devices](fig1_left_intensity_vs_devices.png)

![strategies at the largest count](fig1_right_strategies.png)

{chr(10).join(lines)}

Points: `fig1_points.csv` (per strategy: shard shape, intensity, shard and distributed FLOP/s,
communication share).

## CrossFlow beside the paper

| paper (§2, Fig. 1) | CrossFlow |
|---|---|
| Intensity is much smaller at higher degrees of parallelism. | **Agrees.** Median intensity falls from {med0:,.0f} FLOP/B at {n0} devices to {med1:,.0f} FLOP/B at {n1} ({med0 / med1:.0f}× lower). |
| A large spread at every device count, "particularly for lower parallelism degrees". | **Agrees on a linear axis, not on a log axis.** The absolute spread (max − min) is {abs0:,.0f} FLOP/B at {n0} devices and {abs1:,.0f} at {n1}, so on a linear axis the low-parallelism boxes are the wide ones, as in the paper; the *relative* spread (max/min) grows instead, {sp0:.1f}× at {n0} to {sp1:.1f}× at {n1}, because at high N the strategies range from balanced shards to degenerate ones (a dimension of 1). |
| The spread comes from "different parallelization strategies as well as different tiling strategies". | **Differs by construction:** CrossFlow's kernel model returns only the *best* tiling of each shard (an exhaustive search), so the spread here is over strategies alone; the paper's boxes also hold sub-optimal tilings, which widen them (most at low device counts, where shards are large and many tilings fit). |
| At 64K devices the best design point differs by strategy (Fig. 1 right). | **Agrees:** at {n1} devices balanced RC shards keep the highest intensity ({hi1:,.0f} FLOP/B), while RC-1-N / RC-N-1 and CR-N (a shard dimension of 1) fall to ~1 FLOP/B. |

Why the numbers are what they are: intensity is FLOPs over the **DRAM bytes of the chosen
tiling**.  For large shards (low N) it is capped by the case-study chip's ~9 MiB L2, which
bounds the L2 tile (here ≈ {hi0:,.0f} FLOP/B however large the shard: tiling-limited, like the
paper's "different tiling strategies"); for small shards (high N) it is capped by the shard's
smallest dimension (shape-limited: an m × 64K × n shard with m, n ≪ 64K reaches at most
≈ mn/(m+n) FLOP/B).  The distributed FLOP/s per device falls faster than intensity with N
because the kernel-parallel communication over the torus does not shrink as fast as the
per-device compute: at {n1} devices it is {comm1:.0%} of the best strategy's time.
"""
    return {"markdown": md, "figures": figs, "files": ["fig1_points.csv"], "metrics": metrics}
