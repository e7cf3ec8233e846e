"""Fast screening (issue 11 part 4): the batch screen of a study and uncached evaluations,
against the prediction path of a reference commit measured in the same run.  Prints one
JSON object.

    python benchmarks/bench_screen.py [--reference d419945] [--studies paper-lstm-512,gemm-64k]
                                      [--calls N] [--repeat R] [--no-reference]

Each side runs in a fresh Python process pinned to one core (``sched_setaffinity``), after
``import crossflow`` and ``load_study`` (timed apart as ``setup_s``):

* ``screen``: at the template's budget split (``baseline_params``), the memory verdict of
  every strategy of the study, then every memory-feasible strategy x one representative per
  class of equivalent mapping orders (:func:`crossflow.system.order_classes`).  Current
  tree: :func:`crossflow.distributed.memory_check` + one
  :func:`crossflow.distributed.predict_many`.  Reference: what a screen cost there, one
  ``crossflow.predict`` per strategy (its memory verdict needed a full prediction) and per
  (feasible strategy, representative), all on the same MicroArch object (so its kernel
  prices were shared too).  ``cold_s``: the first screen in the process (plans compiled);
  ``warm_s``: a second screen on another chip (a perturbed split).  The best
  (strategy, order, time) must agree.
* ``evaluate`` (a separate fresh process): one ``crossflow.search.objective.evaluate(setup, design)`` per call, a new
  chip every call (every budget fraction perturbed), as in a study: ``fixed_strategy``
  (RC-32-16-d1-p1 / kp2-kp1-dp-lp for the LSTM, the first strategy for the GEMM),
  ``feasible_strategies_first_sight`` (each memory-feasible strategy once, random orders:
  nothing compiled for it yet), ``feasible_strategies`` (then N more calls drawn from them),
  ``all_strategies`` (N calls drawn from every strategy: the memory-infeasible ones are
  rejected by the memory check).  Median and p90 in ms.

The reference side is a temporary ``git worktree`` of ``--reference`` (removed afterwards),
imported through ``PYTHONPATH``; ``ratio`` = reference / current.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LSTM_FIXED = ("RC-32-16-d1-p1", "kp2-kp1-dp-lp")


# --- the measurement (runs in a child process, against either tree) -------------------------


def _order_classes(grid) -> list[str]:
    """One representative per class (same rule as crossflow.system.order_classes; repeated
    here because the reference tree does not have it)."""
    from itertools import permutations

    dims = ("kp1", "kp2", "dp", "lp")
    reps: dict[tuple, str] = {}
    for order in permutations(dims):
        key = tuple(d for d in order if grid[dims.index(d)] > 1)
        reps.setdefault(key, "-".join(order))
    return list(reps.values())


def _perturbed(params: dict, rng: random.Random, spread: float) -> dict:
    return {k: v + rng.uniform(-spread, spread) if isinstance(v, float) else v
            for k, v in params.items()}


def _screen(setup, params: dict, current: bool) -> dict:
    import crossflow
    from crossflow.parallel import Strategy

    strategies = setup.space.dimension("strategy").choices
    first = {**params, "strategy": strategies[0], "mapping_order": "kp1-kp2-dp-lp"}
    t0 = time.perf_counter()
    arch = setup.arch(setup.design(first))
    kw = {"workload": setup.workload, "hardware": arch, "system": setup.system}
    if current:
        from crossflow.distributed import memory_check, predict_many

        feasible = [s for s in strategies
                    if memory_check(setup.workload, arch, s).feasible]
        candidates = [(s, o) for s in feasible for o in _order_classes(Strategy.parse(s).grid)]
        preds = predict_many(setup.workload, arch, setup.system, candidates)
    else:
        feasible = [s for s in strategies
                    if crossflow.predict(**kw, parallelism=s,
                                         mapping_order="kp1-kp2-dp-lp").feasible]
        candidates = [(s, o) for s in feasible for o in _order_classes(Strategy.parse(s).grid)]
        preds = [crossflow.predict(**kw, parallelism=s, mapping_order=o) for s, o in candidates]
    seconds = time.perf_counter() - t0
    best = min(range(len(preds)), key=lambda i: preds[i].time_s)
    return {"seconds": seconds, "strategies": len(strategies), "memory_feasible": len(feasible),
            "feasible": feasible,
            "candidates": len(candidates), "best": [*candidates[best], preds[best].time_s]}


def _evaluate_times(setup, params: dict, pool, rng: random.Random) -> dict:
    from crossflow.search.objective import evaluate

    samples = []
    for strategy, order in pool:
        design = setup.design({**_perturbed(params, rng, 0.05), "strategy": strategy,
                               "mapping_order": order})
        t0 = time.perf_counter()
        evaluate(setup, design)
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return {"median_ms": statistics.median(samples) * 1e3,
            "p90_ms": samples[int(0.9 * (len(samples) - 1))] * 1e3, "calls": len(samples)}


def measure(study: str, part: str, calls: int, current: bool) -> dict:
    """``part`` "screen" or "evaluate", each in its own fresh process (so neither warms the
    other's caches)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    t0 = time.perf_counter()
    import crossflow
    from crossflow.search.study import load_study

    setup = load_study(study)
    base = setup.baseline_params()
    out: dict = {"crossflow": str(Path(crossflow.__file__).parent.parent),
                 "setup_s": time.perf_counter() - t0}
    if part == "screen":
        cold = _screen(setup, base, current)
        warm = _screen(setup, _perturbed(base, random.Random(1), 0.2), current)
        out["screen"] = {"cold_s": cold["seconds"], "warm_s": warm["seconds"],
                         **{k: v for k, v in cold.items() if k != "seconds"},
                         "best_warm_chip": warm["best"]}
        return out

    rng = random.Random(0)
    strategies = setup.space.dimension("strategy").choices
    orders = setup.space.dimension("mapping_order").choices
    # Which strategies fit memory at the template split: known to a study after one
    # screen; here read from the study's own strategy list without warming any cache.
    feasible = json.loads(os.environ["CROSSFLOW_BENCH_FEASIBLE"])
    fixed = LSTM_FIXED if LSTM_FIXED[0] in strategies else (feasible[0], orders[0])
    out["evaluate"] = {
        "fixed": list(fixed),
        "feasible_strategies_first_sight": _evaluate_times(
            setup, base, [(s, rng.choice(orders)) for s in feasible], rng),
        "fixed_strategy": _evaluate_times(setup, base, [fixed] * calls, rng),
        "feasible_strategies": _evaluate_times(
            setup, base, [(rng.choice(feasible), rng.choice(orders)) for _ in range(calls)], rng),
        "all_strategies": _evaluate_times(
            setup, base, [(rng.choice(strategies), rng.choice(orders)) for _ in range(calls)],
            rng),
    }
    return out


# --- the driver -------------------------------------------------------------------------------


def _child(pythonpath: str, cwd: Path, study: str, calls: int, current: bool,
           feasible: list[str] | None = None) -> dict:
    """Screen, then (given the screen's memory-feasible strategies) evaluate, each in a
    fresh process importing crossflow from ``pythonpath``."""
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out: dict = {}
    for part in ("screen", "evaluate"):
        if part == "evaluate":
            env["CROSSFLOW_BENCH_FEASIBLE"] = json.dumps(feasible or out["feasible"])
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", study, "--part",
               part, "--calls", str(calls)] + ([] if current else ["--reference-api"])
        run = subprocess.run(cmd, env=env, cwd=cwd, check=True, capture_output=True,
                             text=True)
        row = json.loads(run.stdout.strip().splitlines()[-1])
        out.setdefault("crossflow", row["crossflow"])
        out[f"setup_s_{part}"] = row["setup_s"]
        out.update({k: v for k, v in row.items() if k in ("screen", "evaluate")})
        if part == "screen":
            out["feasible"] = out["screen"].pop("feasible")
    return out


def _median_run(runs: list[dict]) -> dict:
    """The first run with every timing replaced by its median over the runs."""
    out = json.loads(json.dumps(runs[0]))
    for key in ("cold_s", "warm_s"):
        out["screen"][key] = statistics.median(r["screen"][key] for r in runs)
    for case, value in out["evaluate"].items():
        if isinstance(value, dict):
            for key in ("median_ms", "p90_ms"):
                value[key] = statistics.median(r["evaluate"][case][key] for r in runs)
    out["runs"] = len(runs)
    return out


def _ratios(ref: dict, cur: dict) -> dict:
    return {
        "screen_cold": ref["screen"]["cold_s"] / cur["screen"]["cold_s"],
        "screen_warm": ref["screen"]["warm_s"] / cur["screen"]["warm_s"],
        **{f"evaluate_{k}": ref["evaluate"][k]["median_ms"] / cur["evaluate"][k]["median_ms"]
           for k in cur["evaluate"] if k != "fixed"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", default="paper-lstm-512,gemm-64k")
    parser.add_argument("--calls", type=int, default=300, help="evaluations per case")
    parser.add_argument("--reference", default="d419945",
                        help="commit of the reference path (before the fast paths)")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each side, alternating; medians are shown")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--part", default="screen", help=argparse.SUPPRESS)
    parser.add_argument("--reference-api", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.part, args.calls, not args.reference_api)))
        return

    sys.path.insert(0, str(HERE))
    from _timing import machine

    results: dict = {"machine": machine(), "reference": None if args.no_reference
                     else args.reference, "targets": {"screen_s": 5.0, "evaluate_ms": 5.0}}
    worktree = None
    try:
        if not args.no_reference:
            worktree = Path(tempfile.mkdtemp(prefix="crossflow-ref-")) / "tree"
            subprocess.run(["git", "worktree", "add", "--detach", str(worktree),
                            args.reference], cwd=REPO, check=True, capture_output=True)
        for study in args.studies.split(","):
            curs, refs = [], []
            for _ in range(args.repeat):  # alternate, so both sides see the same load
                curs.append(_child(str(REPO), REPO, study, args.calls, True))
                if worktree is not None:
                    refs.append(_child(str(worktree), worktree, study, args.calls, False,
                                       curs[0]["feasible"]))
            cur = _median_run(curs)
            row = {"current": cur}
            if worktree is not None:
                ref = _median_run(refs)
                row["reference"] = ref
                row["ratio_reference_over_current"] = _ratios(ref, cur)
                row["same_best"] = (ref["screen"]["best"] == cur["screen"]["best"]
                                    and ref["screen"]["best_warm_chip"]
                                    == cur["screen"]["best_warm_chip"])
            row["meets_targets"] = {
                "screen": cur["screen"]["cold_s"] <= 5.0,
                "evaluate_fixed_strategy": cur["evaluate"]["fixed_strategy"]["median_ms"] <= 5.0,
                "evaluate_feasible_strategies":
                    cur["evaluate"]["feasible_strategies"]["median_ms"] <= 5.0,
            }
            results[study] = row
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO,
                           check=False, capture_output=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
