"""The ``structured`` driver's own time beside the model's, on studies of the benchmark suite
(docs/speed.md).  Prints one JSON object.

    python benchmarks/bench_driver.py [--studies a,b] [--evaluations 1000] [--rounds 1]
                                      [--table benchmarks/suite/TABLE.yaml] [--reference DIR]

Each study's plan runs as ``bench_plan.py`` runs it (no Optuna, no MLflow: the points and
values of a study with the ``structured`` sampler, seed 0) for ``--evaluations`` model
evaluations, in a fresh process.  Reported per study: ``model_s`` (the plan's batches
evaluated), ``driver_s`` (everything else: the plan, its local search, the AGE step edges it
snaps moves to; also loading the study and its baseline trial), ``total_s`` and ``digest``
(a hash of every point and value of the plan, so two trees that make the same search show
the same digest).
With ``--reference DIR`` (another source tree, e.g. ``git worktree add DIR COMMIT``) each
study runs from it too, alternating, so load on a shared machine hits both alike, and the
ratios reference / this tree are given (``model_speedup``: the model's own time, what a
change to the model's pricing moves).  ``--table``: the studies of another table than the
suite's (``benchmarks/suite/studies.yaml``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _timing import machine

REPO = Path(__file__).resolve().parents[1]
STUDIES = ("lstm-2k-1chip-n7", "gemm-mem-64k-1chip-n5", "gemm-32k-8k-512-n5",
           "lstm-paper-512-n7-600mm", "gpt-350m-1chip-n5")

_CHILD = r"""
import hashlib, json, sys, time
sys.path.insert(0, sys.argv[3])
import bench_plan, suite
from crossflow.search.samplers.structured._problem import point_key

digest, model = hashlib.sha1(), [0.0]

def seen(points, values, seconds):
    model[0] += seconds
    for p, v in zip(points, values):
        digest.update((point_key(p) + repr(v)).encode())

table = suite.load_table(sys.argv[4]) if sys.argv[4] else suite.load_table()
spec = suite.select(table, "all", [sys.argv[1]])[0]["spec"]
t0 = time.perf_counter()
done = len(bench_plan.run(spec, int(sys.argv[2]), 0, {}, on_batch=seen))
total = time.perf_counter() - t0
print(json.dumps({"model_s": model[0], "driver_s": total - model[0], "total_s": total,
                  "evaluations": done, "digest": digest.hexdigest()[:16]}))
"""


def _one(tree: Path, study: str, evaluations: int, table: Path | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CHILD, study, str(evaluations),
                          str(REPO / "benchmarks"), str(table or "")], env=env, cwd=tree, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", default=",".join(STUDIES))
    ap.add_argument("--evaluations", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--table", type=Path, default=None,
                    help="a table of studies (default: the suite's, benchmarks/suite/studies.yaml)")
    ap.add_argument("--reference", type=Path, default=None,
                    help="another source tree, run alternately with this one")
    args = ap.parse_args()
    trees = {"this": REPO, **({"reference": args.reference.resolve()} if args.reference else {})}
    runs: dict[str, dict[str, list[dict]]] = {}
    for _ in range(args.rounds):
        for study in args.studies.split(","):
            for label, tree in trees.items():
                runs.setdefault(study, {}).setdefault(label, []).append(
                    _one(tree, study, args.evaluations,
                         args.table.resolve() if args.table else None))
    report = {}
    for study, by in runs.items():
        row = {}
        for label, rs in by.items():
            row[label] = {k: round(statistics.median(r[k] for r in rs), 2)
                          for k in ("model_s", "driver_s", "total_s")}
            row[label]["digest"] = rs[0]["digest"]
            row[label]["driver_per_model"] = round(row[label]["driver_s"]
                                                   / row[label]["model_s"], 2)
        if "reference" in row:
            ref, this = row["reference"], row["this"]
            row["model_speedup"] = round(ref["model_s"] / this["model_s"], 2)
            row["driver_speedup"] = round(ref["driver_s"] / this["driver_s"], 2)
            row["total_speedup"] = round(ref["total_s"] / this["total_s"], 2)
            row["same_search"] = ref["digest"] == this["digest"]
        report[study] = row
    print(json.dumps({"machine": machine(), "evaluations": args.evaluations,
                      "rounds": args.rounds, "studies": report}, indent=1))


if __name__ == "__main__":
    main()
