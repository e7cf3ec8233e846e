"""The ``structured`` driver's own time beside the model's, on studies of the benchmark suite
(docs/speed.md).  Prints one JSON object.

    python benchmarks/bench_driver.py [--studies a,b] [--evaluations 1000] [--rounds 1]
                                      [--reference DIR]

Each study's plan runs directly (no Optuna, no MLflow: the points and values of a study with
the ``structured`` sampler) for ``--evaluations`` model evaluations, in a fresh process.
Reported per study: ``model_s`` (the evaluations), ``driver_s`` (everything else: the plan,
its local search, the AGE step edges it snaps moves to), ``total_s`` and ``digest`` (a hash
of every point and value, so two trees that make the same search show the same digest).
With ``--reference DIR`` (another source tree, e.g. ``git worktree add DIR COMMIT``) each
study runs from it too, alternating, so load on a shared machine hits both alike, and the
ratios reference / this tree are given.
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
import hashlib, json, math, sys, time
sys.path.insert(0, sys.argv[3])
import suite
from crossflow.search.objective import evaluate_many
from crossflow.search.samplers.structured._plan import Settings, plan
from crossflow.search.samplers.structured._problem import Problem, point_key
from crossflow.search.study import load_study

name, budget = sys.argv[1], int(sys.argv[2])
setup = load_study(suite.select(suite.load_table(), "all", [name])[0]["spec"])
digest, model, t0 = hashlib.sha1(), 0.0, time.perf_counter()
gen = plan(Problem(setup), seed=0, settings=Settings(), records=[])
phase, batch = next(gen)
done = 0
while done < budget:
    t = time.perf_counter()
    got = [e.values(setup.objectives)[0] if e.feasible else math.inf
           for e in evaluate_many(setup, [setup.design(p) for p in batch])]
    model += time.perf_counter() - t
    for p, v in zip(batch, got):
        digest.update((point_key(p) + repr(v)).encode())
    done += len(batch)
    phase, batch = gen.send(got)
total = time.perf_counter() - t0
print(json.dumps({"model_s": model, "driver_s": total - model, "total_s": total,
                  "evaluations": done, "digest": digest.hexdigest()[:16]}))
"""


def _one(tree: Path, study: str, evaluations: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CHILD, study, str(evaluations),
                          str(REPO / "benchmarks")], env=env, cwd=tree, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", default=",".join(STUDIES))
    ap.add_argument("--evaluations", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--reference", type=Path, default=None,
                    help="another source tree, run alternately with this one")
    args = ap.parse_args()
    trees = {"this": REPO, **({"reference": args.reference.resolve()} if args.reference else {})}
    runs: dict[str, dict[str, list[dict]]] = {}
    for _ in range(args.rounds):
        for study in args.studies.split(","):
            for label, tree in trees.items():
                runs.setdefault(study, {}).setdefault(label, []).append(
                    _one(tree, study, args.evaluations))
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
            row["driver_speedup"] = round(ref["driver_s"] / this["driver_s"], 2)
            row["total_speedup"] = round(ref["total_s"] / this["total_s"], 2)
            row["same_search"] = ref["digest"] == this["digest"]
        report[study] = row
    print(json.dumps({"machine": machine(), "evaluations": args.evaluations,
                      "rounds": args.rounds, "studies": report}, indent=1))


if __name__ == "__main__":
    main()
