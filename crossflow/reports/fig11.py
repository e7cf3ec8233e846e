"""Fig. 11 (paper §9.2): multi-node packages.

512 case-study nodes (N12, HBM2, NDR-x8, 300 W, 850 mm² chip) grouped 1, 2, 4, 8, 16 per
package; the nodes of a package are joined by an intra-package mesh at 2 TB/s per node
(the paper's assumption), the packages by the 2-D torus of ``deepflow-case-study-512``
(squarest factorisation of the package count; each package pools its nodes' NDR-x8 links).
For each package size: the parallelism search (every strategy, each feasible one under all
24 mapping orders) and then the architecture (budget) search at that strategy, as in
Fig. 10.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from crossflow.reports import _common as C
from crossflow.search import load_study
from crossflow.search.objective import evaluate
from crossflow.search.space import SIMPLEXES, Design

SIZES = [1, 2, 4, 8, 16]
INTRA_GBPS = 2000.0
LOGIC = "N12"


def compute(out: Path, quick: bool) -> list[dict]:
    sizes = [1, 4] if quick else SIZES
    n_trials = 6 if quick else 150
    hw = C.arch({"logic_node": LOGIC})
    rows = []
    for k in sizes:
        system = C.package_system(k, INTRA_GBPS)
        par = C.parallelism_search(hw, system, top=2 if quick else None,
                                   limit=12 if quick else None)
        archs = C.architecture_search(f"case-fig11-pkg{k}", {"logic_node": LOGIC}, system,
                                      par["strategy"], n_trials, out / "optuna")
        rows.append({"nodes_per_package": k, "parallelism_s": par["time_s"],
                     "strategy": par["strategy"], "mapping_order": par["mapping_order"],
                     "search_s": archs["time_s"],
                     "arch_s": min(archs["time_s"], par["time_s"]),
                     "arch_from": k if archs["time_s"] < par["time_s"] else None,
                     "arch_trials": archs["trials"], "arch_design": archs["design"]})
    _cross_check(rows)
    return rows


def _cross_check(rows: list[dict]) -> None:
    """Run every package size's searched split at every other size (its strategy, best
    mapping order) and keep the fastest: a short search's residual would otherwise show
    as a difference between package sizes.  ``arch_from`` is the size whose search found
    the split kept (None: the template's split)."""
    searched = [(src["nodes_per_package"], src["arch_design"]) for src in rows]
    for r in rows:
        setup = load_study(C.budget_study(
            f"case-fig11-check{r['nodes_per_package']}", {"logic_node": LOGIC},
            C.package_system(r["nodes_per_package"], INTRA_GBPS), r["strategy"], 1, None))
        for k, d in searched:
            if k == r["nodes_per_package"] or d is None:
                continue
            design = Design({s: d[f"{s}_fractions"] for s in SIMPLEXES},
                            r["strategy"], "best", d.get("technology") or {})
            ev = evaluate(setup, design)
            if ev.feasible and ev.prediction.time_s < r["arch_s"]:
                r["arch_s"] = float(ev.prediction.time_s)
                r["arch_from"] = k
                r["arch_design"] = {**d, "mapping_order": ev.mapping_order}


def _plot(rows: list[dict], out: Path) -> str:
    ks = [r["nodes_per_package"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for key, label in (("parallelism_s", "parallelism search"),
                       ("arch_s", "parallelism + architecture search")):
        ref = rows[0][key]
        ax.plot(ks, [(ref / r[key] - 1) * 100 for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("nodes per package")
    ax.set_ylabel("improvement over 1 node per package (%)")
    ax.axhline(32, color="grey", ls="--", lw=1)
    ax.text(ks[0], 30, "paper: ≤ ~32 %", color="grey", fontsize=8, va="top")
    ax.set_ylim(top=max(ax.get_ylim()[1], 38))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize=9)
    ax.set_title("LSTM, 512 nodes, 2 TB/s intra-package links")
    return C.save_figure(fig, out, "fig11_packages.png")


def report(out: Path, quick: bool) -> dict:
    rows = compute(out, quick)
    fig = _plot(rows, out)
    C.write_json(out, "fig11_points.json", rows)
    ref = rows[0]["arch_s"]
    ref_p = rows[0]["parallelism_s"]
    table = ["| nodes / package | packages | parallelism search (s) | gain, parallelism only | "
             "+ architecture (s) | gain, + architecture | strategy, order |",
             "|---|---|---|---|---|---|---|"]
    gains, gains_p = [], []
    for r in rows:
        g = ref / r["arch_s"] - 1
        gp = ref_p / r["parallelism_s"] - 1
        gains.append(g)
        gains_p.append(gp)
        table.append(f"| {r['nodes_per_package']} | {C.DEVICES // r['nodes_per_package']} | "
                     f"{r['parallelism_s']:.3f} | {gp:+.0%} | {r['arch_s']:.3f} | {g:+.0%} | "
                     f"{r['strategy']}, {r['mapping_order']} |")
    best = max(gains)
    best_p = max(gains_p)

    def beyond_4(gs: list[float]) -> float | None:
        """Points of gain the best size above 4 adds over 4 per package."""
        g4 = next((g for r, g in zip(rows, gs, strict=True) if r["nodes_per_package"] == 4),
                  None)
        more = [g for r, g in zip(rows, gs, strict=True) if r["nodes_per_package"] > 4]
        return max(more) - g4 if g4 is not None and more else None

    def verdict(top: float) -> str:
        return ("**Agrees.**" if 0.15 <= top <= 0.45 else "**Disagrees: larger.**"
                if top > 0.45 else "**Disagrees: smaller.**")

    beyond, beyond_p = beyond_4(gains), beyond_4(gains_p)
    first = (f"Template chip (parallelism search only): {verdict(best_p)} best gain "
             f"{best_p:+.0%}.  Architecture searched per package size: {verdict(best)} "
             f"best gain {best:+.0%}.")
    if beyond is None:
        second = "n/a in this run."
    else:
        agree = "**Agrees.**" if max(beyond, beyond_p) <= 0.1 else "**Disagrees.**"
        second = (f"{agree} From 4 to {rows[-1]['nodes_per_package']} nodes per package the "
                  f"best larger package adds {beyond_p:+.0%} (template chip) and {beyond:+.0%} "
                  "(architecture searched) over 4 per package (points of gain over 1 / "
                  "package).")
    borrowed = [r for r in rows if r["arch_from"] not in (None, r["nodes_per_package"])]
    borrowed_txt = ("; ".join(f"{r['nodes_per_package']} per package: {r['arch_s']:.3f} s "
                              f"with the split searched for {r['arch_from']}, own search "
                              f"{r['search_s']:.3f} s" for r in borrowed) or "none")
    trials = rows[0]["arch_trials"]
    md = f"""# Fig. 11 — multi-node packages

**Command:** `crossflow report fig11-packages{' --quick' if quick else ''}` · workload
`{C.WORKLOAD}` · 512 `{C.TEMPLATE}` nodes ({LOGIC}, HBM2, NDR-x8, 300 W,
{C.CHIP_AREA_MM2} mm²), k per package on an intra-package mesh at {INTRA_GBPS / 1000:.0f} TB/s
per node, packages on the squarest 2-D torus.  Per k: parallelism search (all strategies,
all 24 mapping orders for every feasible one), then a {trials}-trial budget search at that
strategy (the `structured` sampler: cliff-aware exchange search from the template's split);
each size's searched split is then also run at every other size and the fastest kept (the
"+ architecture" column; splits found for another size: {borrowed_txt}).

![packages](fig11_packages.png)

{chr(10).join(table)}

## CrossFlow beside the paper

| paper (§9.2, Fig. 11) | CrossFlow |
|---|---|
| More nodes per package improve performance by ~32 % at best. | {first} |
| Little improvement beyond 4 nodes per package. | {second} |

**How CrossFlow gets there, and why it differs.**  Packaging puts some neighbours of
the kernel-parallel rings on 2 TB/s intra-package links instead of the NDR-x8 torus.  A ring
collective runs at the pace of its slowest edge, so as long as a ring still crosses
packages its inter-package edges set its speed and packaging helps little; what changes with
k is how many ring edges cross packages and how the (smaller) package torus routes and
shares them — hence the uneven curve rather than a smooth rise.  Modelling differences that
move the numbers: (1) the inter-package network is a torus whose per-package bandwidth is
the sum of its nodes' NDR-x8 links (each device's NIC traffic is pooled per package), so
bigger packages neither gain nor lose inter-package bandwidth per node; (2) the system's
2 TB/s intra-package bandwidth replaces whatever the chip's intra-link budget would give, so
the architecture search can take the intra-link area and power away at no cost; (3) the
architecture search is a short `structured` run ({trials} trials per point), whose residual (a few
percent) is of the order of the differences between package sizes, which is why every
searched split is also tried at every size.  The searched chips buy inter-node link
bandwidth (as in Fig. 10), which is what packaging otherwise supplies, so with the
architecture searched the packages have little left to add; the parallelism-only column, on
one fixed chip, is the comparison closest to the paper's.  The model was not tuned to the paper.
"""
    metrics = {f"gain_pkg{r['nodes_per_package']}": g
               for r, g in zip(rows, gains, strict=True)}
    metrics.update({f"gain_parallelism_only_pkg{r['nodes_per_package']}": g
                    for r, g in zip(rows, gains_p, strict=True)})
    return {"markdown": md, "figures": [fig], "files": ["fig11_points.json"],
            "metrics": metrics}
