"""Shared pieces of the LSTM case-study reports (Fig. 10, Fig. 11): the parallelism search
(exhaustive) and the architecture (budget) search (an Optuna study through
:func:`crossflow.search.run_study`, with the ``structured`` sampler)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

TEMPLATE = "deepflow-case-study"
WORKLOAD = "lstm-paper-case-study"
SYSTEM = "deepflow-case-study-512"
CHIP_AREA_MM2 = 850
DEVICES = 512
#: Fig. 9's strategy: the least model-parallel strategy that fits the 16 GiB HBM2 node
#: (fig9.choose_strategy derives it; pure data parallelism needs ~139 GiB per device).
DATA_PARALLEL_BASELINE = "RC-1-16-d32-p1"
#: The sampler of the reports' budget searches (crossflow.search.samplers.structured).
SAMPLER = "structured"
BUDGETS_SPACE = {"kind": "search_space", "name": "case-budgets",
                 "description": "area, power and perimeter budgets of the chip",
                 "simplexes": {"area": "all", "power": "all", "perimeter": "all"}}


def arch(overrides: dict[str, Any]):
    from crossflow.arch import age
    return age.generate(TEMPLATE, overrides={"chip_area_mm2": CHIP_AREA_MM2, **overrides})


def dims2(n: int) -> list[int]:
    a = 2 ** (int(math.log2(n)) // 2)
    return [a, n // a]


def package_system(nodes_per_package: int, intra_GBps: float = 2000.0) -> dict:
    """512 case-study nodes, ``nodes_per_package`` per package on an intra-package mesh at
    ``intra_GBps`` per node, the packages on the squarest 2-D torus (deepflow-case-study-512's
    collective settings)."""
    k = nodes_per_package
    sysd: dict[str, Any] = {
        "kind": "system", "name": f"deepflow-case-study-512-pkg{k}", "device": TEMPLATE,
        "devices_per_node": k, "num_nodes": DEVICES // k,
        "inter": {"topology": "torus", "dims": dims2(DEVICES // k),
                  "collective": {"efficiency": 1.0, "step_latency_us": 0}},
        "collective_launch_us": 0}
    if k > 1:
        sysd["intra"] = {"topology": "mesh", "dims": dims2(k) if k > 2 else [2],
                         "bandwidth_GBps": intra_GBps,
                         "collective": {"efficiency": 1.0, "step_latency_us": 0}}
    return sysd


def parallelism_search(hw, system, *, top: int | None = None,
                       limit: int | None = None) -> dict:
    """Every strategy for 512 devices (default mapping order), then all 24 mapping orders
    for the ``top`` fastest feasible ones (None: every feasible one).  ``limit`` keeps every ``len/limit``-th strategy
    (quick mode)."""
    import crossflow
    from crossflow.config.loader import load_spec
    from crossflow.parallel import enumerate_strategies

    w = load_spec(WORKLOAD, "workloads")
    strategies = list(enumerate_strategies(w, DEVICES))
    if DATA_PARALLEL_BASELINE not in [str(s) for s in strategies]:
        raise AssertionError(DATA_PARALLEL_BASELINE)
    if limit:
        strategies = strategies[:: max(1, len(strategies) // limit)]
    scored = []
    for s in strategies:
        p = crossflow.predict(workload=w, hardware=hw, system=system, parallelism=str(s))
        if p.feasible:
            scored.append((p.time_s, str(s)))
    scored.sort()
    best = None
    for _, s in scored[:top] if top else scored:
        p = crossflow.predict(workload=w, hardware=hw, system=system, parallelism=s,
                              mapping_order="best")
        if best is None or p.time_s < best["time_s"]:
            best = {"strategy": s, "mapping_order": p.to_dict().get("mapping_order"),
                    "time_s": p.time_s}
    best["evaluated"] = len(strategies)
    best["feasible"] = len(scored)
    return best


def architecture_search(name: str, overrides: dict, system, strategy: str, n_trials: int,
                        storage_dir: Path, *, sampler: str = SAMPLER, seed: int = 0) -> dict:
    """Budgets-only study (area, power, perimeter simplexes) at a fixed strategy, every
    trial with the best of the 24 mapping orders; its first trial is the template's split.
    The sampler is the structure-aware driver by default (``structured``: with the strategy
    fixed it is its cliff-aware exchange search of the budget split, starting from the
    template's split).  Returns the best time and design."""
    from crossflow.search import load_study, run_study

    journal = storage_dir / f"{name}.journal"
    if journal.exists():
        journal.unlink()  # a report recomputes from scratch
    study = {"kind": "study", "name": name, "workload": WORKLOAD, "hardware": TEMPLATE,
             "overrides": {"chip_area_mm2": CHIP_AREA_MM2, **overrides}, "system": system,
             "devices": DEVICES, "parallelism": strategy, "mapping_order": "best",
             "search_space": BUDGETS_SPACE, "sampler": sampler, "seed": seed,
             "n_trials": n_trials, "storage": str(journal)}
    r = run_study(load_study(study), track=False, progress=False)
    if r.best is None:
        return {"time_s": math.inf, "design": None, "trials": r.total}
    return {"time_s": r.best["objectives"]["iteration_time_s"], "design": r.best["design"],
            "trials": r.total}
