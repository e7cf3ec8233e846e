"""The search benchmark suite: every study of ``benchmarks/suite/studies.yaml`` × sampler ×
seed at equal evaluation budgets, gaps to each study's reference (docs/search-benchmarks.md).

    python benchmarks/suite.py --budgets 300,1000 --samplers structured,cmaes,tpe,random \\
        --seeds 1 --half all --jobs 2 [--studies a,b] [--out benchmarks/results] [--quick]

* One run = one study × sampler × seed × budget, through :func:`crossflow.search.compare.run_one`
  (a fresh Optuna study of exactly ``budget`` trials, tracking off): every model evaluation
  is a trial (the enqueued baseline and a driver's screening included), so a run's trial
  count is its evaluation count.  Runs go to worker processes (``--jobs``).
* Each finished run is one JSON file ``<out>/runs/<study>/<sampler>.s<seed>.b<budget>.json``
  (written atomically); a re-run reads it instead of running again, so a killed suite
  continues where it stopped.  ``--fresh`` ignores them.
* No sampler sees the budget (:data:`PREFIX_SAFE`: Optuna's samplers are never told
  ``n_trials``, and the ``structured`` driver is an anytime search), so each runs once at the
  largest budget; its run at a smaller budget is the first ``budget`` trials of it (the same
  trials a separate run of that budget makes: same seed, one worker) and its file says
  ``prefix_of``.
* Reference per study = min(best-known value (:func:`crossflow.search.best_known.best_known`,
  cached under ``<out>/best_known/``), every run's best at every budget, and with
  ``--references CSV`` the study's reference in an earlier table).  Gap = best / reference
  − 1, in %; a run with no feasible design has no gap ("no feasible design").  A committed
  table keeps the best-known search among every study's candidates (``--no-best-known`` is
  for a scratch comparison: runs' bests alone read gaps too low); ``--samplers ''`` runs the
  best-known searches alone.
* The table (``<out>/suite.md`` and ``<out>/suite.csv``, long form): gap per study × sampler
  at each budget, then per half and sampler the median and worst gap over studies.
* A run file's ``wall_s`` for a prefix is the full run's wall time pro-rated by trials
  (an estimate; the runs' wall time is not what the table compares).
* ``--quick``: three small studies, budget 60, samplers tpe and random, a reduced best-known
  search (a smoke test in about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import shlex
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from suite_tables import (  # the tables' format: written and read back there
    Earlier,
    bk_record,
    carried_references,
    earlier_table,
    write_tables,
)

HERE = Path(__file__).resolve().parent
TABLE = HERE / "suite" / "studies.yaml"
RESULTS = HERE / "results"
#: Samplers whose first N trials do not depend on the run's budget (Optuna's own samplers
#: are never told ``n_trials``): a smaller budget is a prefix of the largest one's run.
PREFIX_SAFE = ("tpe", "cmaes", "random", "structured", "gd")
HALVES = ("tuning", "checking")
#: ``--quick``: three small, fast studies (one per half at least), a small budget.
QUICK = {"studies": ["gemm-mem-64k-1chip-n5", "gemm-mem-128k-1chip-n7-hbm3",
                     "gemm-16k-1chip-n3-600mm"],
         "budgets": [60], "samplers": ["tpe", "random"],
         "best_known": {"samples": 40, "top_k": 2, "refine": 2, "refine_evals": 150,
                        "hops": 10, "enum_rounds": 1, "enum_power_evals": 60,
                        "contender_evals": 60, "cma_starts": 2, "cma_evals": 150,
                        "searches": 1}}


# --- the table -> study mappings --------------------------------------------------------------


def half_of(row_number: int) -> str:
    """The split rule: row 1, 3, 5, … (odd) is tuning, 2, 4, 6, … (even) is checking."""
    return "tuning" if row_number % 2 == 1 else "checking"


def _system(name: str, block: Mapping[str, Any]) -> dict[str, Any]:
    dims = [int(d) for d in block["dims"]]
    return {"kind": "system", "name": f"case-study-{name}",
            "description": f"{math.prod(dims)} case-study nodes on a {'x'.join(map(str, dims))} "
                           "torus (as deepflow-case-study-512)",
            "device": block.get("device", "deepflow-case-study"), "devices_per_node": 1,
            "num_nodes": math.prod(dims),
            "inter": {"topology": "torus", "dims": dims,
                      "collective": {"efficiency": 1.0, "step_latency_us": 0}},
            "collective_launch_us": 0}


def load_table(path: str | Path = TABLE) -> list[dict[str, Any]]:
    """The suite's studies, in row order: ``name``, ``row``, ``half``, ``kind`` and ``spec``
    (a ``kind: study`` mapping for :func:`crossflow.search.study.load_study`).  A table
    with ``blocks_from: FILE`` (relative to it) uses that table's systems, workloads and
    spaces too, its own added or replacing them by name."""
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    blocks: dict[str, dict[str, Any]] = {"systems": {}, "workloads": {}, "spaces": {}}
    if doc.get("blocks_from"):
        base = yaml.safe_load((Path(path).parent / doc["blocks_from"]).read_text(
            encoding="utf-8"))
        for key in blocks:
            blocks[key].update(base.get(key) or {})
    for key in blocks:
        blocks[key].update(doc.get(key) or {})
    systems = {k: _system(k, v) for k, v in blocks["systems"].items()}
    workloads = {k: {"name": k, **v} for k, v in blocks["workloads"].items()}
    spaces = {k: {"kind": "search_space", "name": k, **v} for k, v in blocks["spaces"].items()}
    out, seen = [], set()
    for i, row in enumerate(doc["studies"], start=1):
        name = row["name"]
        if name in seen:
            raise ValueError(f"{path}: study {name!r} twice")
        seen.add(name)
        spec: dict[str, Any] = {
            "kind": "study", "name": name,
            "description": f"benchmark suite row {i} ({half_of(i)} half): {row.get('kind', '')}",
            "workload": workloads.get(row["workload"], row["workload"]),
            "hardware": row.get("hardware", "deepflow-case-study"),
            "search_space": spaces.get(row["space"], row["space"]),
            "objectives": ["iteration_time_s"], "sampler": "tpe", "seed": 0,
            "n_trials": 1000}
        if "system" in row:
            spec["system"] = systems.get(row["system"], row["system"])
        for key, field in (("devices", "devices"), ("over", "overrides"),
                           ("strategy", "parallelism"), ("order", "mapping_order")):
            if key in row:
                spec[field] = row[key]
        out.append({"name": name, "row": i, "half": half_of(i), "kind": row.get("kind", ""),
                    "spec": spec})
    return out


#: The kinds of study a table's rows are (its ``kind`` column): a budget split alone (one
#: chip, or a fixed strategy), a split co-designed with the strategy and mapping order, and
#: a strategy alone.
KINDS = ("budgets", "budgets+strategy+order", "strategy")


def select(studies: Sequence[dict[str, Any]], half: str = "all",
           names: Sequence[str] | None = None,
           kinds: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The studies of ``half`` (every half: ``all``), only those named in ``names`` and of
    the ``kinds`` given (None: every one)."""
    if kinds:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise SystemExit(f"unknown kinds of study: {', '.join(unknown)} (the kinds are "
                             f"{', '.join(KINDS)})")
    if names:
        known = {s["name"] for s in studies}
        missing = [n for n in names if n not in known]
        if missing:
            raise SystemExit(f"unknown studies: {', '.join(missing)}")
        studies = [s for s in studies if s["name"] in names]
        other = [s["name"] for s in studies if half not in ("all", s["half"])]
        if other:
            raise SystemExit(f"not in the {half} half: {', '.join(other)} (--half all "
                             "runs studies of both halves)")
        if kinds and (other := [s["name"] for s in studies if s["kind"] not in kinds]):
            raise SystemExit(f"not of the kinds {', '.join(kinds)}: {', '.join(other)}")
    return [s for s in studies if (half == "all" or s["half"] == half)
            and (not kinds or s["kind"] in kinds)]


def preflight(studies: Sequence[dict[str, Any]], table: str | Path) -> None:
    """Every study of ``studies`` loaded as a run would load it, and its chip checked for the
    workload's arithmetic (as ``crossflow check`` does), before any worker starts: a row a
    table cannot run (an unknown system, a bf16 workload on the fp16 template) is refused
    with its name and the reason, exit status 2, instead of a traceback from a worker or
    every one of its trials infeasible."""
    from crossflow.errors import ConfigError
    from crossflow.search.study import load_study
    from crossflow.search.study.setup import check_precision_of

    problems: list[str] = []
    for s in studies:
        try:
            check_precision_of(load_study(s["spec"]))
        except ConfigError as exc:  # each error found, attributed to the table's row
            row = f"{table}, study {s['name']!r} (row {s.get('row', '?')})"
            problems += [str(e) for e in exc.with_file(row).every()]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(2)


# --- runs (each cached as one JSON file) -------------------------------------------------------


def run_path(out: Path, study: str, sampler: str, seed: int, budget: int) -> Path:
    return Path(out) / "runs" / study / f"{sampler}.s{seed}.b{budget}.json"


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    tmp.replace(path)  # atomic: a killed run leaves no half-written file


def read_run(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "values" in doc else None


def _quiet() -> None:
    import logging
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _run_task(task: tuple) -> dict[str, Any]:
    """One sampler × seed on one study at the largest budget it needs; writes a file per
    budget it covers (``budgets``).  Returns a short record for the progress line."""
    entry, sampler, seed, budgets, out = task
    _quiet()
    from crossflow import __version__
    from crossflow.search.compare import run_one
    from crossflow.search.study import load_study

    setup = load_study(entry["spec"])
    top = max(budgets)
    work = Path(out) / "work"
    r = run_one(setup, sampler, seed, top, root=work)
    if r.get("interrupted"):
        raise KeyboardInterrupt
    Path(r["storage"]).unlink(missing_ok=True)  # the values are in the JSON
    if len(r["values"]) != top:  # a run's trial count must be its evaluation count
        raise RuntimeError(f"{r['study']}: {len(r['values'])} evaluations, not {top}")
    for budget in budgets:
        values = r["values"][:budget]
        best = min(values, default=math.inf)
        i = values.index(best) if math.isfinite(best) else None
        _write_json(run_path(out, entry["name"], sampler, seed, budget), {
            "study": entry["name"], "half": entry["half"], "sampler": sampler, "seed": seed,
            "budget": budget, "evaluations": len(values),
            "best": best if math.isfinite(best) else None,
            "best_params": r["params"][i] if i is not None else None,
            "values": [v if math.isfinite(v) else None for v in values],
            "feasible": r["feasible"][:budget],
            "wall_s": r["wall_s"] * len(values) / max(1, len(r["values"])),
            "prefix_of": top if budget != top else None,
            "crossflow_version": __version__})
    return {"study": entry["name"], "sampler": sampler, "seed": seed, "budget": top,
            "best": min(r["values"], default=math.inf), "wall_s": r["wall_s"]}


def _best_known_task(task: tuple) -> dict[str, Any]:
    entry, out, options = task
    _quiet()
    from crossflow.search.best_known import best_known
    from crossflow.search.study import load_study

    t0 = time.perf_counter()
    doc = best_known(load_study(entry["spec"]), root=out, **(options or {}))
    return {"study": entry["name"], "best_known": doc.get("value"),
            "evaluations": doc.get("evaluations"), "cached": doc.get("cached"),
            "wall_s": time.perf_counter() - t0}


def plan(studies, samplers, seeds, budgets, out: Path, fresh: bool = False) -> list[tuple]:
    """The runs still to do: one task per study × sampler × seed (all budgets at once for a
    :data:`PREFIX_SAFE` sampler), skipping those whose files exist."""
    tasks = []
    for entry in studies:
        for sampler in samplers:
            for seed in seeds:
                groups = [list(budgets)] if sampler in PREFIX_SAFE else [[b] for b in budgets]
                for group in groups:
                    missing = [b for b in group if fresh or read_run(
                        run_path(out, entry["name"], sampler, seed, b)) is None]
                    if missing:
                        # a prefix-safe sampler reruns at the largest budget of its group
                        tasks.append((entry, sampler, seed, group if sampler in PREFIX_SAFE
                                      else missing, str(out)))
    return tasks


def execute(studies, samplers, seeds, budgets, out: Path, *, jobs: int = 1,
            fresh: bool = False, best_known_options: Mapping[str, Any] | None = None,
            progress: bool = True, with_best_known: bool = True) -> None:
    """Run what is missing (best-known searches first: they are the longest tasks)."""
    tasks = plan(studies, samplers, seeds, budgets, out, fresh)
    known = [(entry, str(out), dict(best_known_options or {}))
             for entry in (studies if with_best_known else [])]
    jobs_all = [(_best_known_task, t) for t in known] + [(_run_task, t) for t in tasks]
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (
        lambda text: None)
    say(f"suite: {len(studies)} studies, {len(tasks)} runs to do "
        f"({len(studies) * len(samplers) * len(seeds)} study x sampler x seed in all), "
        f"{jobs} worker(s); files under {out}")
    t0 = time.perf_counter()
    if jobs > 1:
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        with mp.get_context(method).Pool(jobs, maxtasksperchild=8) as pool:
            for k, rec in enumerate(pool.imap_unordered(_call, jobs_all), start=1):
                say(_line(k, len(jobs_all), rec, t0))
    else:
        for k, job in enumerate(jobs_all, start=1):
            say(_line(k, len(jobs_all), _call(job), t0))


def _call(job: tuple) -> dict[str, Any]:
    """One task; a failure is reported (and no file written: a re-run retries it) rather
    than stopping the suite."""
    fn, task = job
    try:
        return fn(task)
    except Exception as exc:  # noqa: BLE001 - one study's failure must not stop the others
        import traceback

        return {"error": f"{type(exc).__name__}: {exc}", "task": repr(task[1:] if len(task) > 1
                                                                       else task)[:200],
                "study": task[0]["name"], "traceback": traceback.format_exc()[-2000:]}


def _line(k: int, n: int, rec: Mapping[str, Any], t0: float) -> str:
    if "error" in rec:
        return (f"suite: [{k}/{n}] {rec['study']} FAILED ({rec['task']}): {rec['error']}\n"
                f"{rec['traceback']}")
    if "sampler" in rec:
        what = (f"{rec['study']} {rec['sampler']} s{rec['seed']} @{rec['budget']}: "
                f"best {rec['best']:.6g}")
    else:
        what = (f"{rec['study']} best-known {rec['best_known']} "
                f"({rec['evaluations']} evaluations{', cached' if rec['cached'] else ''})")
    return f"suite: [{k}/{n}] {what}, {rec['wall_s']:.1f} s (elapsed {time.perf_counter() - t0:.0f} s)"


# --- the table -----------------------------------------------------------------------------------


def collect(studies, samplers, seeds, budgets, out: Path,
            carried: Mapping[str, tuple[float, str]] | None = None,
            earlier: Earlier | None = None) -> dict[str, Any]:
    """Read every run file and best-known cache: per study the reference and per sampler ×
    budget the gap (median over seeds, in %), then per half × sampler × budget the median
    and worst gap over the studies.  ``None`` gap = no feasible design; a missing run is
    left out (``missing`` counts them).  ``carried`` (study -> (value, where from), see
    :func:`carried_references`) joins each study's candidates for the reference.  With
    ``earlier`` (:func:`earlier_table`), a study × sampler × budget none of whose runs is
    in ``out`` takes its cell from that table instead (``carried_cells`` counts them): the
    median run's best value, whose gap is then taken against this table's reference."""
    from crossflow.search.best_known import cache_path

    rows, missing, carried_cells = [], 0, 0
    for entry in studies:
        bk = None
        with contextlib.suppress(OSError, ValueError):
            bk = json.loads(cache_path(entry["name"], out).read_text(encoding="utf-8"))
        known = bk.get("value") if bk else None
        runs, kept = {}, {}
        for sampler in samplers:
            for budget in budgets:
                got = [read_run(run_path(out, entry["name"], sampler, s, budget)) for s in seeds]
                cell = (entry["name"], sampler, budget)
                if earlier is not None and all(r is None for r in got) and cell in earlier.cells:
                    kept[sampler, budget] = earlier.cells[cell]
                    carried_cells += 1
                    continue
                missing += sum(r is None for r in got)
                runs[sampler, budget] = [r for r in got if r is not None]
        if bk is None and earlier is not None and entry["name"] in earlier.best_known:
            bk = earlier.best_known[entry["name"]]
            known = bk.get("value")
        found = [(r["best"], f"{r['sampler']} s{r['seed']} @{r['budget']}")
                 for rs in runs.values() for r in rs if r["best"] is not None]
        candidates = ([(known, "best-known")] if known is not None else []) + found
        if carried and entry["name"] in carried:
            candidates.append(carried[entry["name"]])
        reference, source = min(candidates, key=lambda t: t[0]) if candidates else (None, None)
        row: dict[str, Any] = {"study": entry["name"], "row": entry["row"],
                               "half": entry["half"], "kind": entry["kind"],
                               "reference": reference, "reference_source": source,
                               "best_known": known,
                               "best_known_evaluations": bk.get("evaluations") if bk else None,
                               "best_known_record": bk_record(bk), "gaps": {}}
        for (sampler, budget), best in kept.items():
            row["gaps"][sampler, budget] = (None if reference is None or best is None
                                            else 100.0 * (best / reference - 1.0))
        for (sampler, budget), rs in runs.items():
            if not rs:
                continue
            bests = [r["best"] for r in rs]
            if reference is None or all(b is None for b in bests):
                row["gaps"][sampler, budget] = None
                continue
            gaps = [math.inf if b is None else 100.0 * (b / reference - 1.0) for b in bests]
            med = statistics.median(gaps)
            row["gaps"][sampler, budget] = None if math.isinf(med) else med
        rows.append(row)
    summary = []
    for half in (*HALVES, "all"):
        mine = [r for r in rows if half == "all" or r["half"] == half]
        for sampler in samplers:
            for budget in budgets:
                have = [r["gaps"][sampler, budget] for r in mine
                        if (sampler, budget) in r["gaps"]]
                if not have:
                    continue
                gaps = [math.inf if g is None else g for g in have]
                summary.append({"half": half, "sampler": sampler, "budget": budget,
                                "studies": len(have), "of": len(mine),
                                "no_feasible": sum(g is None for g in have),
                                "median_gap_pct": statistics.median(gaps),
                                "worst_gap_pct": max(gaps),
                                "worst_study": max(zip(gaps, (r["study"] for r in mine
                                                              if (sampler, budget) in r["gaps"]),
                                                       strict=True))[1]})
    return {"rows": rows, "summary": summary, "missing": missing, "carried": bool(carried),
            "carried_cells": carried_cells,
            "earlier": earlier.name if earlier is not None else None}


# --- command line --------------------------------------------------------------------------------


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="300,1000", help="evaluations per run, e.g. 300,1000")
    ap.add_argument("--samplers", default="structured,cmaes,tpe,random",
                    help="comma-separated; '' runs only the best-known searches (the references)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per study x sampler")
    ap.add_argument("--half", choices=(*HALVES, "all"), default="all")
    ap.add_argument("--studies", default="", help="only these studies (comma-separated)")
    ap.add_argument("--kind", default="", help="only studies of these kinds (comma-separated: "
                    f"{', '.join(KINDS)})")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--out", default=str(RESULTS), help="folder for runs, caches and tables")
    ap.add_argument("--table", default=str(TABLE), help="the suite's study table (YAML)")
    ap.add_argument("--quick", action="store_true",
                    help="three small studies, budget 60, tpe and random, a reduced best-known")
    ap.add_argument("--fresh", action="store_true", help="ignore cached run files")
    ap.add_argument("--no-best-known", action="store_true",
                    help="run the samplers only (the reference is then the runs' best, or a "
                    "best-known value already cached there)")
    ap.add_argument("--references", type=Path, default=None, metavar="CSV",
                    help="an earlier table's CSV (e.g. benchmarks/results/suite.csv): a study's "
                    "reference there joins the candidates (only while the model is unchanged)")
    ap.add_argument("--carry", action="store_true",
                    help="with --references: a study x sampler x budget with no runs in --out "
                    "takes its cell (and a study its best-known record) from that earlier "
                    "table, its gap against the new reference; for running again only the "
                    "runs a change touches (with --report-only after them, every study)")
    ap.add_argument("--report-only", action="store_true",
                    help="write the tables from the files there are; run nothing")
    ap.add_argument("--list", action="store_true", help="print the studies and halves, run nothing")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per worker
    studies = load_table(args.table)
    if args.list:
        for s in select(studies, args.half, _list(args.studies), _list(args.kind)):
            print(f"{s['row']:3d}  {s['half']:8s}  {s['kind']:24s}  {s['name']}")
        return 0
    budgets = sorted({int(b) for b in _list(args.budgets)})
    samplers = _list(args.samplers)
    names = _list(args.studies)
    bk_options: dict[str, Any] = {}
    if args.quick:
        names = names or QUICK["studies"]
        budgets = QUICK["budgets"] if args.budgets == "300,1000" else budgets
        samplers = QUICK["samplers"] if args.samplers == "structured,cmaes,tpe,random" \
            else samplers
        bk_options = dict(QUICK["best_known"])
        out = Path(args.out) if args.out != str(RESULTS) else RESULTS / "quick"
    else:
        out = Path(args.out)
    chosen = select(studies, args.half, names, _list(args.kind))
    seeds = list(range(args.seeds))
    if not args.report_only:
        preflight(chosen, args.table)
        execute(chosen, samplers, seeds, budgets, out, jobs=max(1, args.jobs),
                fresh=args.fresh, best_known_options=bk_options,
                with_best_known=not args.no_best_known)
    command = "python benchmarks/suite.py " + shlex.join(argv if argv is not None
                                                         else sys.argv[1:])
    if args.carry and not args.references:
        ap.error("--carry needs --references (the earlier table to carry cells from)")
    carried = carried_references(args.references) if args.references else None
    earlier = earlier_table(args.references) if args.carry else None
    result = collect(chosen, samplers, seeds, budgets, out, carried, earlier)
    files = write_tables(result, out, samplers, seeds, budgets, command)
    print(files["md"].read_text(encoding="utf-8"))
    print(f"files: {', '.join(str(p) for p in files.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
