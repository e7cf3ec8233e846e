"""Is a variant's gain bigger than the noise?  A paired comparison of ``bench_plan.py`` runs.

    python benchmarks/paired.py OUT.json [OUT.json ...] [--base default] [--budgets 300,1000]

Each OUT.json is a ``bench_plan.py --out`` file (one per table of studies; their studies
are pooled).  A rule is decided by the median over studies of each study's median gap over
its runs; this prints that figure per half (tuning, checking, all) for every variant and,
for each variant against the base, the change in it with a 90 % bootstrap interval, and how
many studies moved by more than ``--threshold`` points either way.

The interval resamples what a median over a few dozen studies and three runs each depends
on, both at once (a two-level bootstrap, Davison and Hinkley, *Bootstrap Methods and their
Application*, CUP 1997, section 3.8): the studies, with replacement, and within each study
its runs, with replacement.  The comparison is paired: run ``k`` of a study starts from the
same jittered split under every variant, so each resample takes the same studies and the
same runs for the base and the variant.  An interval that holds 0 says the two differ by
less than the suite can tell; a rule that moves the median by 0.1 points with an interval
of ±0.3 has not been shown to do anything.

Variants are compared only within one file: each file's gaps are against its own references
(the best of the table's reference and of every run of that invocation).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

HALVES = ("tuning", "checking", "all")


def gaps(docs: list[dict]) -> tuple[dict, dict[str, str]]:
    """(budget, variant) -> {study: [gap per seed]}, seeds in order, and study -> half.
    An infeasible run (no gap) counts as infinitely far off.  A run in two documents is an
    error: their gaps are against different references, so they cannot be pooled."""
    out: dict = {}
    halves: dict[str, str] = {}
    for doc in docs:
        for r in doc["rows"]:
            g = math.inf if r["gap_pct"] is None else float(r["gap_pct"])
            runs = out.setdefault((r["budget"], r["variant"]), {}).setdefault(r["study"], {})
            if r["seed"] in runs:
                raise ValueError(f"study {r['study']!r} (variant {r['variant']!r}, seed "
                                 f"{r['seed']}) is in more than one file: compare the "
                                 f"variants of one bench_plan.py run at a time")
            runs[r["seed"]] = g
            halves[r["study"]] = r["half"]
    return ({k: {s: [by_seed[i] for i in sorted(by_seed)] for s, by_seed in v.items()}
             for k, v in out.items()}, halves)


def _median_of_medians(a: np.ndarray) -> float:
    """The median over studies (rows) of each study's median over its runs (columns)."""
    return float(np.median(np.median(a, axis=1)))


def compare(base: dict[str, list[float]], other: dict[str, list[float]],
            studies: list[str], *, threshold: float = 0.5, resamples: int = 4000,
            seed: int = 0) -> dict:
    """The variant ``other`` against ``base`` over ``studies`` (each: gaps per seed): both
    medians of per-study medians, their difference with a 90 % two-level paired bootstrap
    interval, and the studies more than ``threshold`` points better / worse."""
    k = min(min(len(base[s]), len(other[s])) for s in studies)
    a = np.array([base[s][:k] for s in studies])
    b = np.array([other[s][:k] for s in studies])
    per_a, per_b = np.median(a, axis=1), np.median(b, axis=1)
    moved = per_b - per_a
    moved[np.isnan(moved)] = 0.0  # both infinitely far off: no change
    rng = np.random.default_rng(seed)
    n = len(studies)
    diffs = np.empty(resamples)
    for i in range(resamples):
        rows = rng.integers(n, size=n)[:, None]
        runs = rng.integers(k, size=(n, k))
        diffs[i] = _median_of_medians(b[rows, runs]) - _median_of_medians(a[rows, runs])
    diffs = diffs[np.isfinite(diffs)]
    low, high = (np.quantile(diffs, [0.05, 0.95]) if len(diffs) else (math.nan, math.nan))
    return {"studies": n, "runs": k, "base": float(np.median(per_a)),
            "variant": float(np.median(per_b)),
            "change": float(np.median(per_b) - np.median(per_a)),
            "low": float(low), "high": float(high),
            "better": int(np.sum(moved < -threshold)), "worse": int(np.sum(moved > threshold))}


def report(docs: list[dict], base: str | None = None, budgets: list[int] | None = None, *,
           threshold: float = 0.5, resamples: int = 4000) -> str:
    """Per budget and half, the base's median of per-study medians and every other
    variant's, with :func:`compare`'s change, interval and counts; ``base`` defaults to the
    first variant, ``budgets`` to every one of the runs."""
    table, halves = gaps(docs)
    variants = list(dict.fromkeys(v for doc in docs for v in doc["variants"]))
    base = base or variants[0]
    lines = []
    for budget in budgets or sorted({b for b, _ in table}):
        lines.append(f"@{budget}: the median over studies of each study's median gap (%); "
                     f"its change against {base!r}\n  [90 % bootstrap interval]; studies "
                     f"more than {threshold:g} points better / worse")
        ref = table.get((budget, base), {})
        for half in HALVES:
            studies = sorted(s for s in ref if half == "all" or halves[s] == half)
            if not studies:
                continue
            level = float(np.median([np.median(ref[s]) for s in studies]))
            lines.append(f"  {half:8s} {len(studies):3d} studies {base:>20s} {level:6.2f}")
            for v in variants:
                mine = table.get((budget, v), {})
                if v == base or not all(s in mine for s in studies):
                    continue
                c = compare(ref, mine, studies, threshold=threshold, resamples=resamples)
                lines.append(f"                       {v:>20s} {c['variant']:6.2f}  change "
                             f"{c['change']:+6.2f} [{c['low']:+6.2f} .. {c['high']:+6.2f}]  "
                             f"better {c['better']:2d}  worse {c['worse']:2d}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path, help="bench_plan.py --out files")
    ap.add_argument("--base", help="the variant the others are compared with (default: "
                                   "the first of the first file)")
    ap.add_argument("--budgets", default="", help="comma-separated (default: every one)")
    ap.add_argument("--threshold", type=float, default=0.5,
                    help="points a study must move by to count as better or worse")
    ap.add_argument("--resamples", type=int, default=4000)
    args = ap.parse_args()
    docs = []
    for f in args.files:
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as exc:
            ap.error(f"{f}: cannot be read as JSON ({exc})")
        if not (isinstance(doc, dict) and {"variants", "rows"} <= set(doc)):
            ap.error(f"{f}: not a bench_plan.py --out file (it has no 'variants' and 'rows')")
        docs.append(doc)
    variants = list(dict.fromkeys(v for doc in docs for v in doc["variants"]))
    if args.base is not None and args.base not in variants:
        ap.error(f"--base {args.base!r}: the files' variants are {', '.join(variants)}")
    budgets = [int(b) for b in args.budgets.split(",")] if args.budgets else None
    try:
        print(report(docs, args.base, budgets, threshold=args.threshold,
                     resamples=args.resamples))
    except ValueError as exc:
        ap.error(str(exc))


if __name__ == "__main__":
    main()
