"""Shared pieces of the case-study reports: the LSTM case (Figs. 9–11, the Pareto report),
its parallelism search (exhaustive) and its architecture (budget) study (an Optuna study
through :func:`crossflow.search.run_study`, by default with the ``structured`` sampler), and
how a report writes its figures and data."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

import crossflow
from crossflow.arch import age
from crossflow.config.loader import load_spec
from crossflow.parallel import enumerate_strategies
from crossflow.search import load_study, run_study

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


def budget_study(name: str, overrides: dict, system, strategy: str, n_trials: int,
                 storage_dir: Path | None, *, mapping_order: str = "best",
                 objectives: list[str] | None = None, sampler: str = SAMPLER,
                 seed: int = 0) -> dict[str, Any]:
    """The study file (a mapping) of a budgets-only search of the LSTM case: the area,
    power and perimeter simplexes at a fixed strategy and mapping order, on the template at
    the case's chip area with ``overrides``.  Its journal in ``storage_dir`` is removed (a
    report recomputes from scratch); ``storage_dir`` None: a study only loaded, not run."""
    study = {"kind": "study", "name": name, "workload": WORKLOAD, "hardware": TEMPLATE,
             "overrides": {"chip_area_mm2": CHIP_AREA_MM2, **overrides}, "system": system,
             "devices": DEVICES, "parallelism": strategy, "mapping_order": mapping_order,
             "search_space": BUDGETS_SPACE, "sampler": sampler, "seed": seed,
             "n_trials": n_trials}
    if objectives is not None:
        study["objectives"] = list(objectives)
    if storage_dir is not None:
        journal = storage_dir / f"{name}.journal"
        journal.unlink(missing_ok=True)
        study["storage"] = str(journal)
    return study


def run_budget_study(study: dict[str, Any]):
    """Run a :func:`budget_study` (untracked, quietly): its RunResult."""
    return run_study(load_study(study), track=False, progress=False)


def architecture_search(name: str, overrides: dict, system, strategy: str, n_trials: int,
                        storage_dir: Path, *, sampler: str = SAMPLER, seed: int = 0) -> dict:
    """Budgets-only study (area, power, perimeter simplexes) at a fixed strategy, every
    trial with the best of the 24 mapping orders; its first trial is the template's split.
    The sampler is the structure-aware driver by default (``structured``: with the strategy
    fixed it is its cliff-aware exchange search of the budget split, starting from the
    template's split).  Returns the best time and design."""
    r = run_budget_study(budget_study(name, overrides, system, strategy, n_trials,
                                      storage_dir, sampler=sampler, seed=seed))
    if r.best is None:
        return {"time_s": math.inf, "design": None, "trials": r.total}
    return {"time_s": r.best["objectives"]["iteration_time_s"], "design": r.best["design"],
            "trials": r.total}


def save_figure(fig, out: Path, name: str) -> str:
    """Lay out ``fig``, write it to ``out/name`` (PNG, 120 dpi), close it; returns ``name``
    (a report lists its figures by file name)."""
    fig.tight_layout()
    fig.savefig(out / name, dpi=120)
    plt.close(fig)
    return name


def write_json(out: Path, name: str, data: Any) -> str:
    """Write a report's data points to ``out/name`` (JSON); returns ``name``."""
    (out / name).write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    return name
