"""The structured driver's plan run directly (no Optuna, no MLflow): how close it gets, in
how many evaluations.  For tuning the driver: the same points and values as a study with
the ``structured`` sampler (the plan is deterministic), in a fraction of the time.

    python benchmarks/bench_plan.py [--study paper-lstm-512] [--budget 300]
        [--settings '{"top_k": 3}'] [--seeds 1] [--reference VALUE]

Prints one JSON object: per seed the best value, and the evaluations (the study's baseline
trials counted, as in ``crossflow compare``) after which the best came within 5 %, 2 % and
1 % of the reference (default: the cached best-known value of the study, else the best
found); and the wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from crossflow.search.objective import evaluate_many
from crossflow.search.samplers.structured._plan import Settings, plan
from crossflow.search.samplers.structured._problem import Problem
from crossflow.search.study import load_study


def run(setup, budget: int, seed: int, settings: Settings) -> list[float]:
    """Every evaluation's value (inf when infeasible), the baseline trials first (a study
    samples their missing dimensions at random: counted here as inf)."""
    from crossflow.search.objective import evaluate

    names = {d.name for d in setup.space.dimensions}
    values = [evaluate(setup, setup.design(p)).values(setup.objectives)[0]
              if names <= set(p) else math.inf for p in setup.baseline_trials()]
    gen = plan(Problem(setup), seed=seed, settings=settings, records=[])
    _, batch = next(gen)
    while len(values) < budget:
        batch = batch[:budget - len(values)]
        got = [e.values(setup.objectives)[0] if e.feasible else math.inf
               for e in evaluate_many(setup, [setup.design(p) for p in batch])]
        values += got
        if len(values) >= budget:
            break
        _, batch = gen.send(got)
    return values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="paper-lstm-512")
    ap.add_argument("--budget", type=int, default=300)
    ap.add_argument("--settings", default="{}", help="the driver's settings (JSON)")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--reference", type=float)
    args = ap.parse_args()
    setup = load_study(args.study)
    reference = args.reference
    if reference is None:
        from crossflow.search.best_known import cache_path

        try:
            reference = json.loads(cache_path(setup.name).read_text())["value"]
        except (OSError, ValueError, KeyError):
            reference = None
    settings = Settings(**json.loads(args.settings))
    out = {"study": args.study, "budget": args.budget, "settings": json.loads(args.settings),
           "runs": []}
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        values = run(setup, args.budget, seed, settings)
        best = np.minimum.accumulate(values)
        ref = reference if reference is not None else float(best[-1])
        hits = {f"{int(tol * 100)}%": next((i + 1 for i, b in enumerate(best)
                                            if b <= ref * (1 + tol)), None)
                for tol in (0.05, 0.02, 0.01)}
        out["runs"].append({"seed": seed, "best": float(best[-1]),
                            "gap_pct": round(100 * (best[-1] / ref - 1), 3),
                            "evals_to": hits, "wall_s": round(time.perf_counter() - t0, 1)})
    out["reference"] = reference
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
