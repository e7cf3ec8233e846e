"""Where the default driver stands on every committed table of studies, in one table.

    python benchmarks/standing.py [--by table|kind] [--results benchmarks/results] [--margin 0.5]

Reads each table's long-form CSV that ``suite.py`` wrote (``benchmarks/results/<table>.csv``:
study × sampler × budget × seed gaps against the table's reference) and prints, per table
and budget, the median and the worst over its studies of each study's median gap over its
runs, for the driver (``structured``) and plain CMA-ES (``cmaes``), and on how many studies
the driver is more than ``--margin`` points behind CMA-ES — the figures issue 18's targets
are stated in.  ``--by kind`` pools the studies of every table by their kind of search space
(``budgets``, ``budgets+strategy+order``, ``strategy``) instead.  It runs nothing: a table's
runs are made by ``suite.py`` (its command is in the table's ``.md`` beside the CSV).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite_tables import NO_FEASIBLE  # noqa: E402  (how a table writes a run with no feasible design)

DRIVER, BASELINE = "structured", "cmaes"


def per_study(paths: list[Path], by: str = "table"
              ) -> dict[tuple[str, int], dict[tuple[str, str], dict[str, float]]]:
    """(group, budget) -> (table, study) -> sampler -> the median of its runs' gaps (inf: no
    feasible design); the group is the table's name, or the study's kind."""
    runs: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in paths:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                gap = math.inf if row["gap_pct"] == NO_FEASIBLE else float(row["gap_pct"])
                group = path.stem if by == "table" else row["kind"]
                study = runs[group, int(row["budget"])][path.stem, row["study"]]
                study[row["sampler"]].append(gap)
    return {key: {s: {k: statistics.median(v) for k, v in samplers.items()}
                  for s, samplers in studies.items()} for key, studies in runs.items()}


def summary(studies: dict[tuple[str, str], dict[str, float]], margin: float) -> dict[str, object]:
    """Median and worst per sampler over ``studies``, and how many the driver trails by
    more than ``margin`` points."""
    out: dict[str, object] = {"studies": len(studies)}
    for sampler in (DRIVER, BASELINE):
        gaps = [g[sampler] for g in studies.values() if sampler in g]
        out[sampler] = (statistics.median(gaps), max(gaps)) if gaps else None
    both = [g for g in studies.values() if DRIVER in g and BASELINE in g]
    out["behind"] = sum(g[DRIVER] > g[BASELINE] + margin for g in both)
    out["compared"] = len(both)
    return out


def tables(results: Path) -> list[Path]:
    """The tables' CSVs (every ``<table>.csv`` with a ``.md`` of the same name)."""
    return sorted(p for p in results.glob("*.csv") if p.with_suffix(".md").exists())


def _cell(pair) -> str:
    if pair is None:
        return "—"
    median, worst = (f"{g:.2f} %" if math.isfinite(g) else "no feasible design" for g in pair)
    return f"{median} / {worst}"


def markdown(results: Path, margin: float, by: str = "table") -> str:
    lines = [f"| {by} | studies | budget | driver median / worst | CMA-ES median / worst "
             f"| driver > {margin} behind CMA-ES |", "|---|---|---|---|---|---|"]
    for (group, budget), studies in sorted(per_study(tables(results), by).items()):
        s = summary(studies, margin)
        behind = f"{s['behind']} of {s['compared']}" if s["compared"] else "—"
        lines.append(f"| `{group}` | {s['studies']} | {budget} | {_cell(s[DRIVER])} "
                     f"| {_cell(s[BASELINE])} | {behind} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--by", choices=("table", "kind"), default="table",
                    help="one row per table (default), or per kind of study over every table")
    ap.add_argument("--results", type=Path,
                    default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--margin", type=float, default=0.5,
                    help="points behind CMA-ES that count as behind (default 0.5)")
    args = ap.parse_args(argv)
    if not tables(args.results):
        print(f"standing.py: no table in {args.results} (a table is a <name>.csv that "
              "suite.py wrote, with its <name>.md beside it)", file=sys.stderr)
        return 2
    print(markdown(args.results, args.margin, args.by))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
