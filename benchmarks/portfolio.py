"""What a portfolio of the driver and plain CMA-ES would have reached, from runs already made
by ``benchmarks/suite.py`` (docs/search-history.md, "A portfolio with plain CMA-ES").

    python benchmarks/portfolio.py RUNS_FOLDER REFERENCES_CSV [--budget 1000]
        [--shares 0.25,0.5]

``RUNS_FOLDER`` is a suite's ``<out>/runs`` (one folder per study, files
``<sampler>.s<seed>.b<budget>.json`` with every evaluation's value); ``REFERENCES_CSV`` the
suite's table (``<out>/suite.csv``), whose ``reference`` column is each study's reference.

A portfolio that gives CMA-ES a share ``s`` of a budget ``B`` ends at the better of the
driver's first ``(1 - s) B`` evaluations and CMA-ES's first ``s B`` (both samplers are
anytime searches: a shorter run is a prefix of the longer one, the same seed).  Prints, per
study, the median over seeds of each sampler's gap at B and at the prefixes, and of each
portfolio's; then the median over studies, and the studies on which each is more than 0.5
points behind plain CMA-ES at B.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path


def _best(values: list, n: int) -> float:
    finite = [v for v in values[:n] if v is not None and math.isfinite(v)]
    return min(finite) if finite else math.inf


def _gap(best: float, reference: float) -> float:
    return 100.0 * (best / reference - 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("references", type=Path)
    ap.add_argument("--budget", type=int, default=1000)
    ap.add_argument("--shares", default="0.25,0.5", help="CMA-ES's shares of the budget")
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    reference = {r["study"]: float(r["reference"])
                 for r in csv.DictReader(args.references.open())}
    B = args.budget
    columns = ["driver", "cmaes", *(f"cma {s:g}" for s in shares)]
    rows = {}
    for folder in sorted(p for p in args.runs.iterdir() if p.is_dir()):
        study, ref = folder.name, reference.get(folder.name)
        if ref is None:
            continue
        per_seed = []
        for driver_file in sorted(folder.glob(f"structured.s*.b{B}.json")):
            cma_file = folder / driver_file.name.replace("structured", "cmaes")
            if not cma_file.is_file():
                continue
            dv = json.loads(driver_file.read_text())["values"]
            cv = json.loads(cma_file.read_text())["values"]
            gaps = [_gap(_best(dv, B), ref), _gap(_best(cv, B), ref)]
            for s in shares:
                k = round(s * B)
                gaps.append(_gap(min(_best(dv, B - k), _best(cv, k)), ref))
            per_seed.append(gaps)
        if per_seed:
            rows[study] = [statistics.median(g[i] for g in per_seed)
                           for i in range(len(columns))]
    if not rows:
        raise SystemExit(f"portfolio: no structured/cmaes pairs of runs at {B} under "
                         f"{args.runs}")
    print(f"gap (%) at {B} evaluations, median over seeds; 'cma s': CMA-ES has the share s "
          f"of the budget, the driver the rest")
    print(f"{'study':34s}" + "".join(f"{c:>10s}" for c in columns))
    for study, gaps in rows.items():
        print(f"{study:34s}" + "".join(f"{g:10.2f}" for g in gaps))
    print(f"{'median':34s}" + "".join(
        f"{statistics.median(r[i] for r in rows.values()):10.2f}" for i in range(len(columns))))
    for i, c in enumerate(columns):
        if c == "cmaes":
            continue
        behind = [s for s, r in rows.items() if r[i] > r[1] + 0.5]
        print(f"{c}: more than 0.5 points behind plain CMA-ES on {len(behind)} of {len(rows)}"
              + (f" ({', '.join(behind)})" if behind else ""))


if __name__ == "__main__":
    main()
