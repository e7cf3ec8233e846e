"""Start-up of ``crossflow predict`` as a whole process, beside its references measured in
the same run (docs/speed.md).  Prints one JSON object.

    python benchmarks/bench_startup.py [--runs N] [--reference DIR]

Each round runs, one after another, fresh interpreters of ``python -c pass``, ``python -c
"import crossflow"`` and ``python -m crossflow predict --hardware a100-sxm4-80gb --workload
gemm-8192`` (wall time of the whole process, from a parent that waits for it); with
``--reference DIR`` (another source tree, e.g. ``git archive COMMIT | tar -x -C DIR``) the
same two crossflow commands run from it in the same round, so load on a shared machine hits
both alike.  Reported: medians over N rounds and the ratios within each round (medians).

Each tree is byte-compiled first (``compileall``), as ``pip install`` does: where
``PYTHONDONTWRITEBYTECODE`` is set (some sandboxes and containers set it) every process
would otherwise compile each CrossFlow module again (~17 ms for those of ``import
crossflow``, under cProfile), which a user's installed copy never pays.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _timing import machine

REPO = Path(__file__).resolve().parents[1]
PREDICT = ["-m", "crossflow", "predict", "--hardware", "a100-sxm4-80gb",
           "--workload", "gemm-8192"]


def _wall(args: list[str], tree: Path | None) -> float:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, cwd=tree or REPO, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--reference", type=Path, help="another source tree to compare")
    args = parser.parse_args()
    trees = {"here": REPO}
    if args.reference is not None:
        trees["reference"] = args.reference.resolve()
    for tree in trees.values():
        compileall.compile_dir(tree / "crossflow", quiet=1)
    rows: list[dict[str, float]] = []
    for _ in range(args.runs):
        row = {"pass": _wall(["-c", "pass"], None)}
        for name, tree in trees.items():
            row[f"import_{name}"] = _wall(["-c", "import crossflow"], tree)
            row[f"predict_{name}"] = _wall(PREDICT, tree)
        rows.append(row)

    def median_ms(key: str) -> float:
        return round(statistics.median(r[key] for r in rows) * 1e3, 1)

    def ratio(a: str, b: str) -> float:
        return round(statistics.median(r[a] / r[b] for r in rows), 2)

    out: dict[str, object] = {"machine": machine(), "runs": args.runs,
                              "load_average": os.getloadavg(),
                              "python_c_pass_ms": median_ms("pass")}
    for name in trees:
        out[name] = {"import_crossflow_ms": median_ms(f"import_{name}"),
                     "predict_gemm_ms": median_ms(f"predict_{name}"),
                     "predict_over_import": ratio(f"predict_{name}", f"import_{name}"),
                     "predict_over_pass": ratio(f"predict_{name}", "pass")}
    if "reference" in trees:
        out["predict_here_over_reference"] = ratio("predict_here", "predict_reference")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
