"""``crossflow compare``: which sampler finds the best design, in how many evaluations.

Each sampler × seed runs in its own fresh Optuna study ``<study>.compare.<sampler>.s<seed>``
(by default a journal file per run under ``mlruns/optuna/compare/``; a re-run starts it
again) for exactly ``budget`` model evaluations — the study's enqueued baseline trials
count — with one worker, so budgets are equal.  Seeds are 0 … N−1.  A sampler takes the
study's ``sampler_options`` when it is the study's own sampler, else its defaults.

Per sampler, over seeds: the best feasible value at 10 / 25 / 50 / 100 % of the budget
(median, min–max), the evaluations needed to come within 1 % and 5 % of the best-known
value (:mod:`crossflow.search.best_known`; median over seeds, a seed that never gets
there counts as never, "—" when the median never does; ``k/N`` seeds that did), wall
time (median per run) and the infeasible share.  When a run beats the best-known value,
the better value is the reference (and the table says so).

Written to a new folder ``mlruns/compare/<study>/<UTC time>/`` per comparison (earlier
ones are kept; ``mlruns/compare/<study>/latest/`` is a copy of the newest, with ``FROM``
naming it): ``table.txt`` (what the terminal shows), ``summary.csv`` (per sampler),
``runs.csv`` (per run), ``curves.csv`` (every evaluation), ``convergence.png``
(:mod:`crossflow.search.compare_plot`: the gap of the best-so-far to the reference, in % on
a log scale, vs evaluations — a linear axis up to 200, log above: median line and min–max
band per sampler, each with its own colour, line style and marker; 1 % and 5 % marked) and
``best_known.json``; the table's header says how the best-known value was obtained.  A
sampler whose every seed found no feasible design reads "no feasible design" in the table
and in the plot's legend (it has no curve).  The same files are the artifacts of one MLflow
parent run in the experiment ``<study>.compare``, with a child run per sampler × seed
carrying its best-so-far curve as the metric ``best_so_far`` (step = evaluation number) and
its summary metrics.

(About 480 lines, one job: a comparison from its runs to its report — the table, files,
plot and MLflow runs all read the same per-run curves and summary.)
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import logging
import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from crossflow import __version__
from crossflow.errors import ConfigError
from crossflow.search.best_known import best_known
from crossflow.search.compare_plot import best_so_far, plot  # noqa: F401 - compare.plot
from crossflow.search.locations import MLRUNS, git_label, is_url
from crossflow.search.samplers import (
    COMPARED,
    NAMES,
    canonical,
    check_objectives,
    check_options,
)
from crossflow.search.storage import make_storage
from crossflow.search.study import is_feasible, load_study, run_study
from crossflow.search.tracking import _db_lock, _key, resolve_locations

FRACTIONS = (0.10, 0.25, 0.50, 1.00)
TOLERANCES = (0.01, 0.05)


def run_name(study: str, sampler: str, seed: int) -> str:
    return f"{study}.compare.{sampler}.s{seed}"


def run_one(setup, sampler: str, seed: int, budget: int, *, storage: str | None = None,
            root: str | Path | None = None) -> dict[str, Any]:
    """One sampler × seed: a fresh study of exactly ``budget`` evaluations.  Returns
    ``sampler``, ``seed``, ``study``, ``storage``, ``values`` (per evaluation, in trial
    order; ``inf`` for an infeasible design), ``feasible``, ``params`` and ``wall_s``."""
    name = run_name(setup.name, sampler, seed)
    url = storage or str(Path(root or MLRUNS) / "optuna" / "compare" / f"{name}.journal")
    _fresh(url, name)
    sub = dataclasses.replace(setup, spec=setup.spec.model_copy(update={"name": name}))
    t0 = time.perf_counter()
    result = run_study(sub, n_trials=budget, sampler=sampler, seed=seed, storage=url,
                       track=False, progress=False)
    wall = time.perf_counter() - t0
    trials = sorted(result.study.get_trials(deepcopy=False), key=lambda t: t.number)
    values, feasible, params = [], [], []
    for t in trials:
        ok = is_feasible(t)
        feasible.append(ok)
        values.append(float(t.values[0]) if ok and t.values else math.inf)
        params.append(dict(t.params))
    return {"sampler": sampler, "seed": seed, "study": name, "storage": url,
            "values": values, "feasible": feasible, "params": params, "wall_s": wall,
            "interrupted": result.interrupted}


def _fresh(url: str, name: str) -> None:
    """Remove an earlier run of ``name`` so every comparison run starts empty."""
    if not is_url(url):
        path = Path(url)
        if path.exists():
            path.unlink()
        for lock in path.parent.glob(f"{path.name}.lock*"):
            lock.unlink(missing_ok=True)
        return
    # optuna (and mlflow, matplotlib below) are imported where they are used, not at the
    # top: the CLI and `crossflow.search` stay light until a comparison actually runs.
    import optuna

    with contextlib.suppress(KeyError):
        optuna.delete_study(study_name=name, storage=make_storage(url))


def _worker(task: tuple) -> dict[str, Any]:
    source, sampler, seed, budget, storage, root = task
    return run_one(load_study(source), sampler, seed, budget, storage=storage, root=root)


def evaluations_to(curve: np.ndarray, target: float) -> int | None:
    """The first evaluation (1-based) whose best-so-far is within ``target``, or None."""
    hit = np.nonzero(curve <= target)[0]
    return int(hit[0]) + 1 if hit.size else None


def summarize(runs: Sequence[dict[str, Any]], budget: int,
              reference: float | None) -> list[dict[str, Any]]:
    """Per sampler (in the order first seen) the comparison's statistics."""
    out = []
    for sampler in dict.fromkeys(r["sampler"] for r in runs):
        mine = [r for r in runs if r["sampler"] == sampler]
        curves = np.array([best_so_far(r["values"]) for r in mine])
        row: dict[str, Any] = {"sampler": sampler, "seeds": len(mine), "budget": budget}
        for f in FRACTIONS:
            at = curves[:, max(1, round(budget * f)) - 1]
            key = f"best_at_{int(f * 100)}pct"
            row[f"{key}_median"] = _finite(np.median(at))
            row[f"{key}_min"] = _finite(at.min())
            row[f"{key}_max"] = _finite(at.max())
        for tol in TOLERANCES:
            key = f"evals_to_{int(tol * 100)}pct"
            if reference is None:
                row[f"{key}_median"], row[f"{key}_reached"] = None, 0
                continue
            hits = [evaluations_to(c, reference * (1 + tol) * (1 + 1e-12)) for c in curves]
            n = np.array([math.inf if h is None else h for h in hits])
            med = float(np.median(n))
            row[f"{key}_median"] = None if math.isinf(med) else med
            row[f"{key}_reached"] = sum(h is not None for h in hits)
        row["wall_s_median"] = float(np.median([r["wall_s"] for r in mine]))
        row["infeasible_share"] = float(np.mean([1 - np.mean(r["feasible"]) for r in mine]))
        out.append(row)
    return out


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


# --- the whole comparison -------------------------------------------------------------------


def compare(setup, *, samplers: Sequence[str] = COMPARED, seeds: int = 3,
            budget: int = 100, workers: int = 1, storage: str | None = None,
            tracking_uri: str | None = None, track: bool = True,
            root: str | Path | None = None, progress: bool = True,
            best_known_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the comparison of ``setup`` (a StudySetup) and write / log its report.

    ``root`` is the ``mlruns`` folder (default ``./mlruns``).  Returns ``runs`` (see
    :func:`run_one`), ``summary`` (:func:`summarize`), ``reference`` / ``best_known``,
    ``table`` (text), ``files`` (name -> path) and ``mlflow_run_id`` (the parent run)."""
    samplers = list(dict.fromkeys(canonical(s) for s in samplers))
    for s in samplers:
        if s not in COMPARED:
            why = ("optimises several objectives; a comparison measures one" if s in NAMES
                   else "is not a sampler")
            raise ConfigError(f"sampler {s!r} {why}", key="samplers", value=s,
                              allowed=", ".join(COMPARED))
        if s == setup.spec.sampler:
            check_options(s, setup.spec.sampler_options)
    for s in samplers:
        check_objectives(s, len(setup.objectives), key="samplers")
    if seeds < 1 or budget < 1 or workers < 1:
        raise ConfigError("seeds, budget and workers must be >= 1", key="compare",
                          value={"seeds": seeds, "budget": budget, "workers": workers})
    baselines = len(setup.baseline_trials()) if setup.spec.baseline else 0
    if budget < baselines:  # every run evaluates them first: no equal budget below that
        raise ConfigError(f"the budget is smaller than the study's {baselines} baseline "
                          f"trials, which every run evaluates first", key="budget",
                          value=budget, allowed=f"an integer >= {baselines}")
    if storage is not None:  # a bad URL fails here, not after the best-known search
        from crossflow.search.storage import check_storage

        check_storage(storage)
    root = Path(root or MLRUNS)
    check_places(setup, root, storage=storage, tracking_uri=tracking_uri, track=track)
    t0 = time.perf_counter()
    known = best_known(setup, root=root, progress=progress, **(best_known_options or {}))
    tasks = [(setup.file or setup.name, s, seed, budget, storage, str(root))
             for s in samplers for seed in range(seeds)]
    runs: list[dict[str, Any]] = []
    if workers > 1 and len(tasks) > 1:
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        with mp.get_context(method).Pool(min(workers, len(tasks))) as pool:
            for r in pool.imap_unordered(_worker, tasks):
                runs.append(r)
                _say(progress, r, len(runs), len(tasks))
    else:
        for task in tasks:
            r = run_one(setup, task[1], task[2], budget, storage=storage, root=root)
            runs.append(r)
            _say(progress, r, len(runs), len(tasks))
    order = {(s, seed): i for i, (_, s, seed, *_rest) in enumerate(tasks)}
    runs.sort(key=lambda r: order[(r["sampler"], r["seed"])])
    for r in runs:
        if r["interrupted"]:
            raise KeyboardInterrupt
        if len(r["values"]) != budget:
            raise RuntimeError(f"{r['study']}: {len(r['values'])} evaluations, not {budget}")

    found = min((min(r["values"]) for r in runs), default=math.inf)
    reference = known.get("value")
    beaten = reference is not None and found < reference
    if reference is None or beaten:
        reference = found if math.isfinite(found) else None
    summary = summarize(runs, budget, reference)
    elapsed = time.perf_counter() - t0
    table = format_table(setup.name, summary, budget, seeds, reference, known, beaten,
                         elapsed)
    files = write_report(report_dir(root, setup.name), setup, runs, summary, table,
                         reference, known)
    keep_latest(files)
    run_id = None
    if track:
        run_id = log_mlflow(setup, runs, summary, files, reference, known, budget, seeds,
                            _tracking_uri(setup, tracking_uri, root))
    return {"study": setup.name, "runs": runs, "summary": summary, "reference": reference, "best_known": known,
            "beaten": beaten, "table": table, "files": files, "mlflow_run_id": run_id,
            "elapsed_s": elapsed}


def _tracking_uri(setup, tracking_uri: str | None, root: Path) -> str | None:
    """Where a comparison logs: ``--tracking-uri``, the study's, else ``root``'s store
    (None: the default ``mlruns/mlflow.db``)."""
    return tracking_uri or setup.spec.tracking_uri or (
        f"sqlite:///{(root / 'mlflow.db').resolve()}" if root != Path(MLRUNS) else None)


def check_places(setup, root: Path, *, storage: str | None = None,
                 tracking_uri: str | None = None, track: bool = True) -> None:
    """A ConfigError unless the comparison can write where it will: ``root`` (the report,
    the best-known cache and, without ``storage``, the journals) and the tracking store.
    Checked before the best-known search, which alone takes minutes, so that an unwritable
    place is not found only when its result is to be saved."""
    from crossflow.outputs import check_output_folder
    from crossflow.search.tracking.check import check_tracking

    check_output_folder(Path(root).absolute(), "--root", "the comparison's folder: its "
                        "report, the best-known cache" + ("" if storage else
                                                          " and the runs' journals"))
    if not track:
        return
    from_file = not tracking_uri and setup.spec.tracking_uri is not None
    try:
        check_tracking(_tracking_uri(setup, tracking_uri, root), storage,
                       key="tracking_uri" if from_file else "--tracking-uri")
    except ConfigError as exc:
        if from_file and setup.file:  # the study file's URI: its message names that file
            raise ConfigError(exc.problem, file=setup.file, key=exc.key, value=exc.value,
                              allowed=exc.allowed) from None
        raise


def _say(enabled: bool, r: dict[str, Any], done: int, total: int) -> None:
    if enabled:
        best = min(r["values"]) if r["values"] else math.inf
        print(f"compare: [{done}/{total}] {r['sampler']} seed {r['seed']}: best "
              f"{best:.6g} in {len(r['values'])} evaluations, {r['wall_s']:.1f} s",
              file=sys.stderr, flush=True)


def _fmt(x: float | None, digits: int = 4) -> str:
    """``digits`` significant digits, trailing zeros kept (0.003770, not 0.00377, beside
    0.006377: a column reads as one precision)."""
    return "—" if x is None else f"{x:#.{digits}g}".rstrip(".")


def format_table(name: str, summary: Sequence[dict[str, Any]], budget: int, seeds: int,
                 reference: float | None, known: dict[str, Any], beaten: bool,
                 elapsed: float) -> str:
    head = ["sampler"] + [f"best@{int(f * 100)}% ({max(1, round(budget * f))})"
                          for f in FRACTIONS] + ["evals≤1%", "evals≤5%", "wall s", "infeas."]
    rows = []
    for r in summary:
        row = [r["sampler"]]
        if r["best_at_100pct_min"] is None:  # no seed found a feasible design
            row += ["no feasible design"] + ["—"] * (len(FRACTIONS) + len(TOLERANCES) - 1)
            row += [f"{r['wall_s_median']:.1f}", f"{100 * r['infeasible_share']:.0f}%"]
            rows.append(row)
            continue
        for f in FRACTIONS:
            k = f"best_at_{int(f * 100)}pct"
            row.append(f"{_fmt(r[k + '_median'])} [{_fmt(r[k + '_min'], 3)}–"
                       f"{_fmt(r[k + '_max'], 3)}]")
        for tol in TOLERANCES:
            k = f"evals_to_{int(tol * 100)}pct"
            med = r[k + "_median"]
            row.append(f"{'—' if med is None else f'{med:g}'} ({r[k + '_reached']}/"
                       f"{r['seeds']})")
        row += [f"{r['wall_s_median']:.1f}", f"{100 * r['infeasible_share']:.0f}%"]
        rows.append(row)
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines = [f"{name}: {_count(len(summary), 'sampler')} × {_count(seeds, 'seed')} × "
             f"{_count(budget, 'evaluation')}, "
             f"objective {known.get('objective')}; median [min–max] over seeds; "
             f"evals to within 1 % / 5 % of the reference (median; seeds that got there)"]
    src = ("a comparison run (it beat the best-known value "
           f"{_fmt(known.get('value'), 6)})" if beaten else
           f"best-known search, {known.get('evaluations')} evaluations")
    lines.append(f"reference {_fmt(reference, 6)} ({src}); {elapsed:.0f} s in all")
    lines.append(f"best-known: {how_known(known)}")
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return "\n".join(lines)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def report_dir(root: Path, name: str) -> Path:
    """A new folder for one comparison: ``<root>/compare/<study>/<UTC time>`` (a suffix
    when two start in the same second), so earlier comparisons are kept."""
    base = Path(root) / "compare" / name
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out, k = base / stamp, 1
    while out.exists():
        k += 1
        out = base / f"{stamp}-{k}"
    return out


def keep_latest(files: Mapping[str, Path]) -> Path:
    """Copy one comparison's files to ``<root>/compare/<study>/latest/`` (a copy, not a
    link: it reads the same on every file system); returns that folder."""
    import shutil

    src = Path(next(iter(files.values()))).parent
    latest = src.parent / "latest"
    tmp = src.parent / f".latest.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    (tmp / "FROM").write_text(src.name + "\n", encoding="utf-8")
    shutil.rmtree(latest, ignore_errors=True)
    tmp.rename(latest)
    return latest


def write_report(out_dir: Path, setup, runs, summary, table: str, reference,
                 known: dict[str, Any]) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"table": out_dir / "table.txt", "summary": out_dir / "summary.csv",
             "runs": out_dir / "runs.csv", "curves": out_dir / "curves.csv",
             "plot": out_dir / "convergence.png", "best_known": out_dir / "best_known.json"}
    files["table"].write_text(table + "\n", encoding="utf-8")
    _write_csv(files["summary"], summary)
    _write_csv(files["runs"], [
        {"sampler": r["sampler"], "seed": r["seed"], "study": r["study"],
         "storage": r["storage"], "evaluations": len(r["values"]),
         "best": _finite(min(r["values"], default=math.inf)),
         "infeasible": sum(1 for f in r["feasible"] if not f), "wall_s": r["wall_s"]}
        for r in runs])
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["sampler", "seed", "evaluation", "value", "feasible", "best_so_far"])
    for r in runs:
        curve = best_so_far(r["values"])
        for i, (v, ok, b) in enumerate(zip(r["values"], r["feasible"], curve, strict=True)):
            w.writerow([r["sampler"], r["seed"], i + 1, "" if math.isinf(v) else repr(v),
                        ok, "" if math.isinf(b) else repr(float(b))])
    files["curves"].write_text(buf.getvalue(), encoding="utf-8")
    files["best_known"].write_text(json.dumps(known, indent=2, default=str),
                                   encoding="utf-8")
    plot(files["plot"], setup.name, runs, reference, known)
    return files


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else [])
        w.writeheader()
        for row in rows:
            w.writerow({k: "" if v is None else v for k, v in row.items()})


def how_known(known: Mapping[str, Any]) -> str:
    """One line: how the best-known value was obtained (:mod:`crossflow.search.best_known`)."""
    seconds = known.get("seconds")
    parts = [f"{_fmt(known.get('value'), 6)} after {known.get('evaluations')} evaluations"
             + (f" ({seconds:.1f} s)" if isinstance(seconds, int | float) else "")]
    searches = [r for r in known.get("searches") or [] if r.get("value") is not None]
    if len(searches) > 1:
        parts.append(f"the best of {len(searches)} independent searches (seeds "
                     f"{', '.join(str(r['seed']) for r in searches)}; the worst ended "
                     f"{100 * known.get('spread', 0.0):.2f} % above it)")
    enum = known.get("enumeration") or {}
    if enum:
        rounds = enum.get("rounds") or []
        vectors = sum(r.get("vectors", 0) for r in rounds)
        gain = enum.get("gain")
        parts.append(f"whole-unit neighbourhood enumerated ({len(rounds)} round(s), "
                     f"{vectors} unit vectors): "
                     + (f"improved the refined split by {100 * gain:.2f} %"
                        if enum.get("improved") and gain is not None
                        else "nothing better than the refined split"))
    oc = known.get("order_classes") or {}
    if oc.get("memory_dropped"):
        parts.append(f"every one of the {oc['classes'] - oc['memory_dropped']} order classes "
                     f"that fit in memory screened ({oc['memory_dropped']} do not fit; "
                     f"{oc['combinations']} combinations)")
    elif oc.get("equivalent_dropped"):
        parts.append(f"{oc['classes']} order classes screened of {oc['combinations']} "
                     "combinations")
    con = known.get("contenders") or {}
    if con:
        parts.append(f"refined {con.get('refined', 0)} more of the "
                     f"{con.get('within_margin', 0)} strategies within {con.get('margin')}x "
                     "of the best at some split"
                     + (f" ({con['left_out']} left out)" if con.get("left_out") else ""))
    cross = known.get("cross_check") or {}
    if cross and "skipped" not in cross:
        parts.append("CMA-ES cross-check " + (
            f"BEAT the main search by {100 * cross.get('gain', 0):.2f} %"
            if cross.get("beat_main") else "did not beat the main search"))
    return "; ".join(parts)


# --- MLflow ---------------------------------------------------------------------------------


def log_mlflow(setup, runs, summary, files: dict[str, Path], reference, known, budget: int,
               seeds: int, tracking_uri: str | None) -> str:
    """One parent run in the experiment ``<study>.compare`` (summary metrics, the report
    files as artifacts), a child run per sampler × seed (its curve and summary)."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    uri, artifact_root = resolve_locations(tracking_uri)
    name = f"{setup.name}.compare"
    with _db_lock(uri):
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(name)
    if exp is None:
        location = f"{artifact_root}/{_key(name)}" if artifact_root else None
        eid = client.create_experiment(name, artifact_location=location,
                                       tags={"crossflow.study": setup.name})
    else:
        eid = exp.experiment_id
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(eid)
    samplers = [r["sampler"] for r in summary]
    now = int(time.time() * 1000)
    parent = client.create_run(eid, run_name=f"compare {','.join(samplers)} x{seeds} "
                                             f"@{budget}",
                               tags={"crossflow.study": setup.name,
                                     "crossflow.kind": "compare"})
    pid = parent.info.run_id
    params = {"study": setup.name, "samplers": ",".join(samplers), "seeds": seeds,
              "budget": budget, "objective": setup.objectives[0],
              "reference": reference, "best_known": known.get("value"),
              "best_known_evaluations": known.get("evaluations"),
              "crossflow_version": __version__, "git_revision": git_label()}
    metrics = []
    for row in summary:
        for k, v in row.items():
            if k not in ("sampler", "seeds", "budget") and isinstance(v, int | float) \
                    and v is not None and math.isfinite(v):
                metrics.append(Metric(_key(f"{row['sampler']}.{k}"), float(v), now, 0))
    if reference is not None:
        metrics.append(Metric("reference", float(reference), now, 0))
    client.log_batch(pid, metrics=metrics[:1000],
                     params=[Param(k, str(v)) for k, v in params.items()])
    for r in runs:
        child = client.create_run(eid, run_name=f"{r['sampler']} s{r['seed']}", tags={
            "mlflow.parentRunId": pid, "crossflow.study": setup.name,
            "crossflow.kind": "compare-run"})
        cid = child.info.run_id
        curve = best_so_far(r["values"])
        ms = [Metric("best_so_far", float(b), now, i + 1) for i, b in enumerate(curve)
              if math.isfinite(b)]
        best = float(curve[-1]) if len(curve) else math.inf
        summ = {"wall_s": r["wall_s"], "evaluations": len(r["values"]),
                "infeasible_share": 1 - float(np.mean(r["feasible"])) if r["feasible"]
                else 0.0}
        if math.isfinite(best):
            summ["best"] = best
        if reference is not None:
            for tol in TOLERANCES:
                hit = evaluations_to(curve, reference * (1 + tol) * (1 + 1e-12))
                if hit is not None:
                    summ[f"evals_to_{int(tol * 100)}pct"] = hit
        ms += [Metric(k, float(v), now, 0) for k, v in summ.items()]
        ps = [Param("sampler", r["sampler"]), Param("seed", str(r["seed"])),
              Param("budget", str(budget)), Param("optuna_study", r["study"]),
              Param("storage", r["storage"])]
        for i in range(0, len(ms), 1000):
            client.log_batch(cid, metrics=ms[i:i + 1000], params=ps if i == 0 else [],
                             tags=[RunTag("crossflow.sampler", r["sampler"])] if i == 0
                             else [])
        client.set_terminated(cid)
    for path in files.values():
        client.log_artifact(pid, str(path), artifact_path="compare")
    client.set_terminated(pid)
    return pid


def main_table(result: dict[str, Any]) -> str:
    """What ``crossflow compare`` prints: the table and where the files are."""
    files = result["files"]
    lines = [result["table"], "", f"files: {Path(files['table']).parent}{os.sep} "
             "(table.txt, summary.csv, runs.csv, curves.csv, convergence.png, "
             "best_known.json)"]
    if result.get("mlflow_run_id"):
        lines.append(f"MLflow: experiment {result['study']}.compare, parent run "
                     f"{result['mlflow_run_id']}")
    return "\n".join(lines)
