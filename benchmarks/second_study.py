"""A second study with plain CMA-ES, or the driver's own study twice as long: which ends
better (docs/search-history.md, "A second study with plain CMA-ES").

    for t in studies fresh fresh3 fresh4 fresh6 fresh7 ranges v100; do
        python benchmarks/bench_plan.py --study-table benchmarks/suite/$t.yaml --half all \\
            --kind budgets --budgets 1000,2000 --jobs 2 \\
            --references benchmarks/results/$( [ $t = studies ] && echo suite || echo $t ).csv \\
            --out DIR/$t.json
    done
    python benchmarks/second_study.py DIR/*.json [--budget 1000]

Each ``DIR/<table>.json`` is a ``bench_plan.py --out`` of the driver on one table's studies
at ``B`` and ``2B`` evaluations (``--budget`` B); its committed table
(``benchmarks/results/<table>.csv``, ``suite.csv`` for ``studies``) gives plain CMA-ES's gap
at B (the median of its runs there) and the reference.  Per study, every figure is taken
against the lowest of the table's reference, the driver's best at 2B and CMA-ES's at B, and
the pair — the driver's study of B trials and a second study of B with CMA-ES, the better
best kept — is set against the driver's one study of 2B: the median, mean and worst gap
over the studies, and the studies on which each is more than 0.5 points ahead.  ``crossflow
study run`` offers that second study where this says it pays
(:data:`crossflow.search.study.guidance.SECOND_OPINION_TRIALS`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import suite_tables  # noqa: E402  (benchmarks/suite_tables.py: a committed table read as --carry reads it)

RESULTS = Path(__file__).resolve().parent / "results"


def table_csv(run_file: Path, results: Path = RESULTS) -> Path:
    """The committed table a bench_plan file of that table's name belongs to."""
    return results / f"{'suite' if run_file.stem == 'studies' else run_file.stem}.csv"


def pairs(run_file: Path, budget: int, results: Path = RESULTS) -> list[dict]:
    """Per study of ``run_file``: the driver's gap at ``budget`` and twice it, CMA-ES's at
    ``budget``, and the pair's (the better of the first and CMA-ES's), in %."""
    table = table_csv(run_file, results)
    reference = suite_tables.reference_values(table)
    cells = suite_tables.earlier_table(table).cells  # None: CMA-ES found no feasible design
    best: dict[str, dict[int, list[float]]] = {}
    for r in json.loads(run_file.read_text())["rows"]:
        if r["best"] is not None:
            best.setdefault(r["study"], {}).setdefault(r["budget"], []).append(r["best"])
    out = []
    for study, by_budget in sorted(best.items()):
        if (study, "cmaes", budget) not in cells or not {budget, 2 * budget} <= set(by_budget):
            continue
        one, two = (statistics.median(by_budget[b]) for b in (budget, 2 * budget))
        other = cells[study, "cmaes", budget]
        other = math.inf if other is None else other
        ref = min(reference[study], two, other)

        def gap(value: float, ref: float = ref) -> float:
            return 100 * (value / ref - 1)

        out.append({"study": study, "driver": gap(one), "driver_twice": gap(two),
                    "cmaes": gap(other), "pair": gap(min(one, other))})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="bench_plan.py --out files, "
                    "each named after its table (studies.json, fresh6.json, ...)")
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows = [p for f in args.runs for p in pairs(f, args.budget, args.results)]
    if not rows:
        ap.error(f"no study has the driver at {args.budget} and {2 * args.budget} "
                 f"evaluations and CMA-ES at {args.budget} in its table")
    b = args.budget
    print(f"{len(rows)} studies; gap (%) against each study's best known")
    for key, label in (("driver", f"the driver, {b} trials"),
                       ("cmaes", f"plain CMA-ES, {b} trials"),
                       ("driver_twice", f"the driver, {2 * b} trials"),
                       ("pair", f"the better of the driver's {b} and CMA-ES's {b}")):
        g = [r[key] for r in rows]
        print(f"  {label:<50} median {statistics.median(g):6.2f}  mean "
              f"{statistics.mean(g):6.2f}  worst {max(g):6.2f}")
    ahead = [r for r in rows if r["pair"] < r["driver_twice"] - 0.5]
    behind = [r for r in rows if r["pair"] > r["driver_twice"] + 0.5]
    print(f"  the pair more than 0.5 points ahead of the driver's {2 * b} on {len(ahead)}, "
          f"behind on {len(behind)}")
    for r in sorted(ahead, key=lambda r: r["pair"] - r["driver_twice"]):
        print(f"    {r['study']:<34} {r['driver_twice']:6.2f} -> {r['pair']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
