"""benchmarks/standing.py: the driver against plain CMA-ES on every committed table, per table
or per kind of study, from the tables' long-form CSVs."""

from __future__ import annotations

import csv
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import standing  # noqa: E402

FIELDS = ("row", "study", "half", "kind", "sampler", "budget", "gap_pct")


def _table(path, rows) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for study, kind, sampler, budget, gap in rows:
            w.writerow({"row": 1, "study": study, "half": "tuning", "kind": kind,
                        "sampler": sampler, "budget": budget, "gap_pct": gap})
    path.with_suffix(".md").write_text("table\n")


def test_medians_of_runs_then_of_studies_and_the_studies_the_driver_trails(tmp_path):
    _table(tmp_path / "a.csv", [
        # three runs each: the study's figure is the median of its runs
        *[("s1", "budgets", "structured", 1000, g) for g in (1.0, 5.0, 2.0)],
        *[("s1", "budgets", "cmaes", 1000, g) for g in (0.1, 0.2, 9.0)],
        ("s2", "strategy", "structured", 1000, 0.0), ("s2", "strategy", "cmaes", 1000, 0.4),
        ("s3", "budgets", "structured", 1000, 4.0),
        ("s3", "budgets", "cmaes", 1000, standing.NO_FEASIBLE),
    ])
    _table(tmp_path / "b.csv", [("s1", "budgets", "structured", 1000, 3.0),
                                ("s1", "budgets", "cmaes", 1000, 2.6)])
    (tmp_path / "notes.csv").write_text("not,a,table\n")  # no .md beside it: not a table
    by_table = standing.per_study(standing.tables(tmp_path))
    s = standing.summary(by_table["a", 1000], 0.5)
    assert s["structured"] == (2.0, 4.0)  # studies at 2.0, 0.0 and 4.0
    assert s["cmaes"] == (0.4, float("inf"))  # s3's CMA-ES found no feasible design
    assert (s["behind"], s["compared"]) == (1, 3)  # s1: 2.0 against 0.2
    by_kind = standing.per_study(standing.tables(tmp_path), by="kind")
    s = standing.summary(by_kind["budgets", 1000], 0.5)
    assert s["studies"] == 3 and s["behind"] == 1  # b's s1 is 0.4 behind: within the margin
    text = standing.markdown(tmp_path, 0.3, by="kind")
    assert ("| `budgets` | 3 | 1000 | 3.00 % / 4.00 % | 2.60 % / no feasible design | 2 of 3 |"
            in text)
    assert "notes" not in text


def test_the_committed_tables_are_read_whole():
    text = standing.markdown(REPO / "benchmarks" / "results", 0.5)
    for table in ("suite", "fresh7"):
        assert f"| `{table}` | " in text
    assert standing.main(["--by", "kind"]) == 0


def test_a_folder_without_tables_is_refused(tmp_path, capsys):
    (tmp_path / "notes.csv").write_text("a,b\n")
    assert standing.main(["--results", str(tmp_path)]) == 2
    assert f"no table in {tmp_path}" in capsys.readouterr().err


def test_every_committed_study_has_a_best_known_search_under_its_reference():
    """A reference made of runs alone is the best design some sampler happened to find: the
    `v100` table's were, and the best-known search later found designs up to 9.3 % faster
    (docs/search-history.md, "A fifty-seventh round").  Every study of every committed table
    has the best-known search's value among its reference's candidates."""
    for path in standing.tables(REPO / "benchmarks" / "results"):
        with path.open(encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
        assert rows, path
        for row in rows:
            assert row["best_known"], (path.name, row["study"], "no best-known search")
            assert float(row["reference"]) <= float(row["best_known"]), (path.name, row["study"])
