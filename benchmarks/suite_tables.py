"""The tables a suite run writes, and what the next run reads back from them.

:func:`write_tables` writes ``suite.md`` (the summary per half and sampler, the gap per
study, the best-known search per study) and the CSVs beside it; :func:`carried_references`
and :func:`earlier_table` read a committed table's CSV (and ``.md``) again, so a later
table keeps an earlier one's references and cells (``suite.py --references``, ``--carry``)
and the other benchmarks (``bench_plan.py``, ``second_study.py``, ``any_sampler.py``,
``standing.py``) measure against the same references.  ``suite.py`` makes the runs and
the figures; this module only formats and parses them.
"""

from __future__ import annotations

import contextlib
import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: how a cell with no feasible design is written (a run whose every trial was infeasible)
NO_FEASIBLE = "no feasible design"


def carried_references(path: Path) -> dict[str, tuple[float, str]]:
    """study -> (reference, source) from an earlier table's CSV (``suite.csv``'s columns
    ``study`` and ``reference``; the lowest where a study has several rows).  A reference is
    a design's predicted time, so it stays valid while the model does not change: a best-known
    search is partly luck (its seeds end apart), and a lower value an earlier table found is
    still the best design known."""
    found: dict[str, tuple[float, str]] = {}
    name = Path(path).name
    with Path(path).open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                value = float(row["reference"])
                if math.isfinite(value) and value < found.get(row["study"], (math.inf,))[0]:
                    found[row["study"]] = (value, _carried_source(name, row.get("reference_source")))
    return found


def reference_values(path: Path) -> dict[str, float]:
    """study -> reference of an earlier table's CSV, as :func:`carried_references` reads it,
    without where each came from."""
    return {study: value for study, (value, _) in carried_references(path).items()}


def _carried_source(table: str, source: str | None) -> str:
    """Where a carried reference came from, the run that found it kept across tables
    (``earlier table (fresh3.csv: structured s0 @1000)``)."""
    if not source:
        return f"earlier table ({table})"
    return source if source.startswith("earlier table") else f"earlier table ({table}: {source})"


@dataclass(frozen=True)
class Earlier:
    """What ``--carry`` takes from an earlier table (:func:`earlier_table`)."""

    name: str
    #: (study, sampler, budget) -> the best value of the cell's median run (None: no
    #: feasible design), undone from the table's gap and reference
    cells: Mapping[tuple[str, str, int], float | None]
    #: study -> its best-known value, evaluations and the row of the table's best-known
    #: search (``printed``: its cells as the earlier table printed them; None: no row)
    best_known: Mapping[str, dict[str, Any]]


def earlier_table(path: Path) -> Earlier:
    """An earlier table's cells (its CSV) and best-known rows (the ``.md`` beside it), for
    re-running some of its runs (one sampler, say, after a rule of it changed) while the
    others' results stand: the model being unchanged, a cell's best value is still that
    design's time, and only its gap moves with the reference.  The median of the seeds'
    gaps is the gap of the median run, so the median run's value is exact."""
    path = Path(path)
    cells: dict[tuple[str, str, int], float | None] = {}
    best_known: dict[str, dict[str, Any]] = {}
    with path.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            ref, gap = float(row["reference"]), row["gap_pct"]
            cells[row["study"], row["sampler"], int(row["budget"])] = (
                None if gap == NO_FEASIBLE else ref * (1.0 + float(gap) / 100.0))
            if row.get("best_known"):
                best_known[row["study"]] = {"value": float(row["best_known"]),
                                            "evaluations": int(row["best_known_evaluations"]),
                                            "printed": None}
    md = path.with_suffix(".md")
    lines = md.read_text(encoding="utf-8").splitlines() if md.exists() else []
    head = next((k for k, line in enumerate(lines) if line.startswith("| study | evaluations")),
                None)
    for line in lines[head + 2:] if head is not None else []:
        if not line.startswith("| "):
            break
        cells_md = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells_md[0] in best_known:
            best_known[cells_md[0]]["printed"] = cells_md[1:-1]
    return Earlier(path.name, cells, best_known)


def bk_record(bk: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the best-known search did (its cached record, :mod:`crossflow.search.best_known`):
    evaluations, seconds, order classes, contenders, the cross-check, the best per phase; a
    record carried from an earlier table (:func:`earlier_table`) is its printed row."""
    if not bk:
        return None
    if "printed" in bk:  # carried: the row as the earlier table printed it (None: no row)
        return {"evaluations": bk.get("evaluations"), "printed": bk["printed"]}
    oc, con, cross = (bk.get(k) or {} for k in ("order_classes", "contenders", "cross_check"))
    return {"evaluations": bk.get("evaluations"), "seconds": bk.get("seconds"),
            "combinations": oc.get("combinations"), "classes": oc.get("classes"),
            "within_margin": con.get("within_margin"), "contenders_refined": con.get("refined"),
            "contenders_left_out": con.get("left_out"),
            "cross_check": None if not cross or "skipped" in cross else
            {"beat_main": cross.get("beat_main"), "gain": cross.get("gain"),
             "main_value": cross.get("main_value"), "value": cross.get("value")},
            "phases": {ph["phase"]: ph["best"] for ph in bk.get("phases") or []},
            "searches": [(r.get("seed"), r.get("value")) for r in bk.get("searches") or []],
            "spread": bk.get("spread")}


def _searches(b: Mapping[str, Any]) -> str:
    """The best-known's independent searches: how many, the best one's seed, the spread."""
    runs = [(seed, v) for seed, v in b.get("searches") or [] if v is not None]
    if not runs:
        return "—"
    if len(runs) == 1:
        return "1"
    seed = min(runs, key=lambda sv: sv[1])[0]
    return f"{len(runs)}: seed {seed} best, worst +{100 * (b.get('spread') or 0.0):.2f} %"


def _gap(g: float | None) -> str:
    return NO_FEASIBLE if g is None or math.isinf(g) else f"{g:.2f}"


def markdown(result: Mapping[str, Any], samplers, seeds, budgets, command: str) -> str:
    rows, summary = result["rows"], result["summary"]
    lines = [f"Command: `{command}`", "",
             f"Gap = best / reference − 1, in % ({'median over ' + str(len(seeds)) + ' seeds' if len(seeds) > 1 else 'seed ' + str(seeds[0])}); "
             "reference = min(best-known, every run's best"
             + (", an earlier table's" if result.get("carried") else "")
             + "). "
             f"Runs missing: {result['missing']}."
             + (f" Cells carried from {result['earlier']} (study × sampler × budget with no "
                f"runs here: that table's median run, its gap taken against this reference): "
                f"{result['carried_cells']}." if result.get("earlier") else ""), ""]
    if samplers:  # with none (``--samplers ''``: the best-known searches only) no summary
        lines += ["| half | sampler | " + " | ".join(f"median @{b} | worst @{b}"
                                                    for b in budgets) + " | studies |",
                  "|---|---|" + "---|---|" * len(budgets) + "---|"]
    for half in dict.fromkeys(x["half"] for x in summary):  # tuning, checking, all
        for sampler in samplers:
            cells, n = [], None
            for b in budgets:
                s = next((x for x in summary if x["half"] == half and x["sampler"] == sampler
                          and x["budget"] == b), None)
                if s is None:
                    cells += ["—", "—"]
                    continue
                n = f"{s['studies']}/{s['of']}" + (f" ({s['no_feasible']} without a feasible "
                                                   "design)" if s["no_feasible"] else "")
                cells += [_gap(s["median_gap_pct"]),
                          f"{_gap(s['worst_gap_pct'])} ({s['worst_study']})"]
            if n is not None:  # a half with no runs of this sampler has no row
                lines.append(f"| {half} | {sampler} | " + " | ".join(cells) + f" | {n} |")
    head = ["#", "study", "half", "kind", "reference (s)", "from",
            *(f"{s} @{b}" for b in budgets for s in samplers)]
    if samplers:  # a blank line after the summary rows
        lines.append("")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ref = "—" if r["reference"] is None else f"{r['reference']:.6g}"
        cells = [("—" if (s, b) not in r["gaps"] else _gap(r["gaps"][s, b]))
                 for b in budgets for s in samplers]
        lines.append("| " + " | ".join([str(r["row"]), r["study"], r["half"], r["kind"], ref,
                                        r["reference_source"] or "—", *cells]) + " |")
    lines += ["", "Best-known search per study (`crossflow/search/best_known.py`, cached under "
              "`best_known/`): evaluations, seconds, order classes screened / combinations, "
              "strategies within the margin / more of them refined (left out), the CMA-ES "
              "cross-check against phases 1-6 (of the best search), the independent searches "
              "(the seed of the best; how far above it the worst ended), and where the "
              "reference came from.", "",
              "| study | evaluations | s | classes / combinations | within margin / refined "
              "| cross-check | searches | reference from |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r.get("best_known_record")
        if b is not None and "printed" in b:
            cells = b["printed"] or [str(b["evaluations"])] + ["—"] * 6
            lines.append(f"| {r['study']} | " + " | ".join(cells)
                         + f" | {r['reference_source'] or '—'} |")
            continue
        if b is None:
            lines.append(f"| {r['study']} | — | — | — | — | — | — | "
                         f"{r['reference_source'] or '—'} |")
            continue
        cross = b["cross_check"]
        cx = ("—" if cross is None else
              f"beat phases 1-6 by {100 * cross['gain']:.2f} %" if cross["beat_main"]
              else "did not beat phases 1-6")
        within = ("—" if b["within_margin"] is None else
                  f"{b['within_margin']} / {b['contenders_refined']}"
                  + (f" ({b['contenders_left_out']} left out)" if b["contenders_left_out"]
                     else ""))
        classes = ("—" if b["classes"] is None else f"{b['classes']} / {b['combinations']}")
        lines.append(f"| {r['study']} | {b['evaluations']} | {b['seconds']} | {classes} | "
                     f"{within} | {cx} | {_searches(b)} | {r['reference_source'] or '—'} |")
    return "\n".join(lines) + "\n"


def write_tables(result: Mapping[str, Any], out: Path, samplers, seeds, budgets,
                 command: str) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = {"md": out / "suite.md", "csv": out / "suite.csv",
             "summary": out / "suite_summary.csv"}
    files["md"].write_text(markdown(result, samplers, seeds, budgets, command), encoding="utf-8")
    with files["csv"].open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["row", "study", "half", "kind", "sampler", "budget", "gap_pct",
                    "reference", "reference_source", "best_known", "best_known_evaluations"])
        for r in result["rows"]:
            for b in budgets:
                for s in samplers:
                    if (s, b) in r["gaps"]:
                        g = r["gaps"][s, b]
                        w.writerow([r["row"], r["study"], r["half"], r["kind"], s, b,
                                    NO_FEASIBLE if g is None else repr(g), r["reference"],
                                    r["reference_source"], r["best_known"],
                                    r["best_known_evaluations"]])
    with files["summary"].open("w", newline="", encoding="utf-8") as fh:
        keys = ["half", "sampler", "budget", "studies", "of", "no_feasible",
                "median_gap_pct", "worst_gap_pct", "worst_study"]
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for s in result["summary"]:
            w.writerow({k: (NO_FEASIBLE if k.endswith("gap_pct") and math.isinf(s[k])
                            else s[k]) for k in keys})
    return files
