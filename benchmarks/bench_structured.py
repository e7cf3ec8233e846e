"""Throughput of a ``structured`` study with every trial logged to MLflow (issue 11).

    python benchmarks/bench_structured.py [--study paper-lstm-512] [--trials 300]
                                          [--samplers structured,tpe] [--repeat 1]

Prints one JSON object.  For each sampler: one fresh study of N trials (Optuna journal file,
MLflow SQLite store, both in a temporary directory, as ``crossflow study run`` keeps them
in ``mlruns/``) through :func:`crossflow.search.study.run_study` with tracking on, then the
same without tracking.  ``trials_per_s`` = N / wall (the tracker's start and ``finish``
included); ``eval_s`` = the model's own time (the trials' ``eval_time_s``: for the
structured driver's screening batches, each trial's share of the batch); ``ratio`` is
each sampler's tracked rate over the first sampler's, measured in the same run (machines
differ by 2x; ratios carry over).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from _timing import machine

from crossflow.search.study import load_study, run_study


def one(study: str, sampler: str, trials: int, track: bool) -> dict[str, float]:
    setup = load_study(study)
    with tempfile.TemporaryDirectory() as tmp:
        name = f"{study}.bench.{sampler}"
        sub = dataclasses.replace(setup, spec=setup.spec.model_copy(update={"name": name}))
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = run_study(sub, n_trials=trials, sampler=sampler, seed=0,
                               storage=str(Path(tmp) / "s.journal"), track=track,
                               tracking_uri=f"sqlite:///{Path(tmp) / 'mlflow.db'}",
                               progress=False)
        wall = time.perf_counter() - t0
        done = result.study.get_trials(deepcopy=False)
        evals = sum(float(t.user_attrs.get("eval_time_s", 0.0)) for t in done)
        best = min((t.value for t in done if t.user_attrs.get("feasible")), default=None)
    return {"wall_s": round(wall, 2), "trials_per_s": round(trials / wall, 1),
            "eval_s": round(evals, 2), "best": best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="paper-lstm-512")
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--samplers", default="structured,tpe")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    out: dict[str, object] = {"machine": machine(), "study": args.study, "trials": args.trials}
    first = None
    for sampler in args.samplers.split(","):
        tracked = [one(args.study, sampler, args.trials, True) for _ in range(args.repeat)]
        plain = [one(args.study, sampler, args.trials, False) for _ in range(args.repeat)]
        med = statistics.median(r["trials_per_s"] for r in tracked)
        first = first or med
        out[sampler] = {"tracked": tracked, "no_tracking": plain,
                        "tracked_trials_per_s_median": med, "ratio_to_first": round(
                            med / first, 2)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
