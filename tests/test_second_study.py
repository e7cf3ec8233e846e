"""benchmarks/second_study.py: the driver's study twice as long against it and a second
study with plain CMA-ES, from bench_plan runs and a committed table."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

second_study = pytest.importorskip("second_study")


def _table(path: Path, rows: list[tuple[str, str, int, float, float]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["study", "sampler", "budget", "gap_pct", "reference"])
        w.writerows(rows)


def test_the_pair_is_the_better_of_the_two_studies_against_one_reference(tmp_path, capsys):
    """Gaps against the lowest of the table's reference, the driver's best at 2B and
    CMA-ES's at B; the pair is the better of the driver at B and CMA-ES at B; a study without
    CMA-ES in the table, or without both of the driver's budgets, is left out."""
    results = tmp_path / "results"
    results.mkdir()
    # 'a': CMA-ES (1.5) beats the driver at 1000 (2.0) and at 2000 (1.8): the pair wins;
    # 'b': the driver's 2000 trials (0.8) are below the table's reference (1.0), which they
    # replace, and beat the pair
    _table(results / "fresh9.csv", [("a", "cmaes", 1000, 50.0, 1.0),
                                    ("a", "structured", 1000, 100.0, 1.0),
                                    ("b", "cmaes", 1000, 10.0, 1.0),
                                    ("c", "structured", 1000, 0.0, 1.0)])
    rows = [{"study": "a", "budget": 1000, "best": 2.0}, {"study": "a", "budget": 2000,
                                                           "best": 1.8},
            {"study": "b", "budget": 1000, "best": 1.2}, {"study": "b", "budget": 2000,
                                                           "best": 0.8},
            {"study": "c", "budget": 1000, "best": 1.0}, {"study": "c", "budget": 2000,
                                                           "best": 1.0}]
    runs = tmp_path / "fresh9.json"
    runs.write_text(json.dumps({"rows": rows}))
    got = {r["study"]: r for r in second_study.pairs(runs, 1000, results)}
    assert set(got) == {"a", "b"}  # 'c' has no CMA-ES run in its table
    assert got["a"]["pair"] == got["a"]["cmaes"] == pytest.approx(50.0)
    assert got["a"]["driver_twice"] == pytest.approx(80.0)
    assert got["a"]["driver"] == pytest.approx(100.0)
    assert got["b"]["driver_twice"] == pytest.approx(0.0)
    assert got["b"]["cmaes"] == pytest.approx(100 * (1.1 / 0.8 - 1))
    assert got["b"]["pair"] == got["b"]["cmaes"]
    assert second_study.main([str(runs), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "2 studies" in out and "ahead of the driver's 2000 on 1, behind on 1" in out
    with pytest.raises(SystemExit):
        second_study.main([str(runs), "--results", str(results), "--budget", "300"])
