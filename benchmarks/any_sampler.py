"""Any Optuna sampler on a table of the benchmark suite's studies, beside the table's own
``structured`` and ``cmaes`` runs: how a standard optimiser CrossFlow does not ship would do.

    python benchmarks/any_sampler.py --sampler optuna.samplers.GPSampler \\
        --options '{"deterministic_objective": true}' \\
        --study-table benchmarks/suite/fresh7.yaml --kind budgets --budgets 100,300 \\
        --references benchmarks/results/fresh7.csv [--seeds 1] [--jobs 2] [--out F.json]

``--sampler`` is the import path of a class of :class:`optuna.samplers.BaseSampler`,
built as ``cls(seed=SEED, **OPTIONS)`` (Optuna's GPSampler needs torch, ``pip install
torch``, which CrossFlow does not depend on).  Each study × seed runs as a study does (the
template's baseline trial enqueued first, ``max(--budgets)`` trials of
:class:`crossflow.search.objective.Objective` in all) in an in-memory Optuna storage, no
MLflow; every trial is one model evaluation.  Gap = best / reference − 1 (%), the reference
the lowest of the table's (``--references``: a CSV with ``study`` and ``reference``
columns, such as ``benchmarks/results/fresh7.csv``) and every run's best.  Prints per study and
budget the sampler's gap (median over seeds), the table's ``structured`` and ``cmaes`` gaps
at that budget where the CSV has them (their best designs against the same reference), the trial its best came from, and the run's wall
milliseconds per trial (the model's few included: a sampler that thinks long per trial
shows here, beside ``optuna.samplers.RandomSampler``'s on the same machine); then each
column's median and worst.  Runs go to ``--jobs`` worker processes, each held to one
thread (a sampler built on torch, such as GPSampler, otherwise starts a thread per core in
every worker, and the workers crowd each other out).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # set before numpy or torch is imported (see above)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_plan  # noqa: E402  (benchmarks/bench_plan.py: --references read the same way)
import suite  # noqa: E402  (benchmarks/suite.py: the table of studies)
import suite_tables  # noqa: E402  (benchmarks/suite_tables.py: a committed table read back)

#: The table's own samplers shown beside the one measured.
TABLE_SAMPLERS = ("structured", "cmaes")


def sampler_class(path: str):
    """The sampler class at import path ``path`` (``module.Class``)."""
    import optuna

    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name, None) if module else None
    except ImportError as exc:
        raise SystemExit(f"--sampler {path}: cannot import {module} ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, optuna.samplers.BaseSampler)):
        raise SystemExit(f"--sampler {path}: not an Optuna sampler class (a subclass of "
                         "optuna.samplers.BaseSampler, e.g. optuna.samplers.GPSampler)")
    return cls


def run(spec, sampler: str, options: dict, seed: int, budget: int) -> dict:
    """One run: every trial's value in order (None where infeasible), and its wall time."""
    import optuna

    from crossflow.search.objective import Objective
    from crossflow.search.study import is_feasible, load_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    setup = load_study(spec)
    study = optuna.create_study(directions=["minimize"] * len(setup.objectives),
                                sampler=sampler_class(sampler)(seed=seed, **options))
    setup.enqueue_baselines(study, budget)
    t0 = time.perf_counter()
    study.optimize(Objective(setup), n_trials=budget)
    wall = time.perf_counter() - t0
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    values = [float(t.values[0]) if is_feasible(t) else None for t in trials]
    return {"values": values, "wall_s": wall}


def _task(task: tuple) -> dict:
    entry, sampler, options, seed, budget = task
    return {"study": entry["name"], "seed": seed, **run(entry["spec"], sampler, options,
                                                        seed, budget)}


def table_gap(cells, key: tuple[str, str, int], reference: float) -> float | None:
    """The gap (%) against ``reference`` of a committed table's cell (``cells``:
    :func:`suite_tables.earlier_table`'s, each the best value of the cell's median run): None where
    the table has no such run, inf where its runs found no feasible design."""
    if key not in cells:
        return None
    best = cells[key]
    return math.inf if best is None else 100 * (best / reference - 1)


def _best(values, upto: int) -> float:
    return min((v for v in values[:upto] if v is not None), default=math.inf)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sampler", required=True,
                    help="import path of an Optuna sampler class, e.g. "
                         "optuna.samplers.GPSampler")
    ap.add_argument("--options", default="{}",
                    help="keyword arguments of the class, a JSON object")
    ap.add_argument("--study-table", type=Path, default=suite.TABLE)
    ap.add_argument("--half", default="all", choices=("tuning", "checking", "all"))
    ap.add_argument("--studies", default="")
    ap.add_argument("--kind", default="")
    ap.add_argument("--budgets", default="300")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--references", type=Path,
                    help="a results CSV (study, sampler, budget, gap_pct, reference): the "
                         "references, and the table's own samplers' runs shown beside")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.out:  # made now: a missing folder would lose the runs at the end
        args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        options = json.loads(args.options)
    except ValueError as exc:
        ap.error(f"--options is not JSON: {exc}")
    if not isinstance(options, dict):
        ap.error("--options must be a JSON object of keyword arguments")
    try:  # an unknown class, or options it rejects, end here, before any worker starts
        sampler_class(args.sampler)(seed=0, **options)
    except (TypeError, ValueError) as exc:
        ap.error(f"--options: {args.sampler} rejects {options}: {exc}")
    budgets = sorted(int(b) for b in args.budgets.split(","))
    names = [s for s in args.studies.split(",") if s] or None
    kinds = [k for k in args.kind.split(",") if k] or None
    studies = suite.select(suite.load_table(args.study_table), args.half, names, kinds)
    if not studies:
        ap.error("no study of the table matches --half / --studies / --kind")
    tasks = [(e, args.sampler, options, seed, budgets[-1]) for e in studies
             for seed in range(args.seeds)]
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(args.jobs) as pool:
        runs = list(pool.imap_unordered(_task, tasks))
    runs.sort(key=lambda r: ([e["name"] for e in studies].index(r["study"]), r["seed"]))
    refs = bench_plan.references(args.references) if args.references else {}
    table = suite_tables.earlier_table(args.references).cells if args.references else {}
    reference = {e["name"]: min([refs.get(e["name"], math.inf)]
                                + [_best(r["values"], budgets[-1]) for r in runs
                                   if r["study"] == e["name"]]) for e in studies}
    print(f"{len(studies)} studies x {args.seeds} seeds of {args.sampler} in "
          f"{time.perf_counter() - t0:.0f} s")
    short = args.sampler.rpartition(".")[2]
    head = [short, *(s for s in TABLE_SAMPLERS if table)]
    columns: dict[tuple[int, str], list[float]] = {}
    rows = []
    for b in budgets:
        print(f"\n@{b:<5} {'study':<32}" + "".join(f"{h:>12}" for h in head)
              + f"{'best at':>9}{'ms/trial':>10}")
        for e in studies:
            name, mine = e["name"], [r for r in runs if r["study"] == e["name"]]
            ref = reference[name]
            bests = [_best(r["values"], b) for r in mine]
            gap = statistics.median(100 * (x / ref - 1) for x in bests)
            cells = {short: gap, **{s: table_gap(table, (name, s, b), ref) for s in head[1:]}}
            first = min(r["values"].index(x) if math.isfinite(x) else b
                        for r, x in zip(mine, bests, strict=True))
            per_trial = statistics.median(r["wall_s"] / len(r["values"]) for r in mine)
            for h, v in cells.items():
                if v is not None:
                    columns.setdefault((b, h), []).append(v)
            print(f"{'':7}{name:<32}" + "".join(f"{'—' if v is None else f'{v:.2f} %':>12}"
                                                for v in cells.values())
                  + f"{first:>9}{1e3 * per_trial:>10.1f}")
            rows.append({"study": name, "budget": b, "reference": ref, "gaps": cells,
                         "best_at": first, "wall_s_per_trial": per_trial})
        for label, fn in (("median", statistics.median), ("worst", max)):
            print(f"{'':7}{label:<32}" + "".join(
                f"{fn(columns[(b, h)]):>10.2f} %" if columns.get((b, h)) else f"{'—':>12}"
                for h in head))
    if args.out:
        args.out.write_text(json.dumps({"sampler": args.sampler, "options": options,
                                        "rows": rows, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
