"""The search diagnostics of ``benchmarks/``: ``portfolio.py`` (what a share of the budget
given to plain CMA-ES would have reached, from suite runs) and ``strategy_ranks.py`` (where
a strategy ranks at one split and at others)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _runs(tmp_path: Path) -> tuple[Path, Path]:
    """Two studies' runs of 10 evaluations, two seeds, and their references: on ``a`` the
    driver is ahead early and CMA-ES only at the end; on ``b`` the driver throughout."""
    runs = tmp_path / "runs"
    values = {
        ("a", "structured"): [4.0, 3.0, 2.0] + [2.0] * 7,        # 2.0 from its 3rd
        ("a", "cmaes"): [9.0] * 8 + [1.5, 1.0],                  # 1.0 only at its 10th
        ("b", "structured"): [2.0] + [1.0] * 9,
        ("b", "cmaes"): [5.0] * 9 + [3.0],
    }
    for (study, sampler), vs in values.items():
        (runs / study).mkdir(parents=True, exist_ok=True)
        for seed in (0, 1):
            (runs / study / f"{sampler}.s{seed}.b10.json").write_text(
                json.dumps({"values": vs}))
    refs = tmp_path / "suite.csv"
    with refs.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["study", "reference"])
        w.writerows([["a", 1.0], ["b", 1.0]])
    return runs, refs


def test_a_portfolio_ends_at_the_better_of_both_prefixes(tmp_path):
    runs, refs = _runs(tmp_path)
    out = subprocess.run([sys.executable, str(BENCH / "portfolio.py"), str(runs), str(refs),
                          "--budget", "10", "--shares", "0.2,0.5"],
                         capture_output=True, text=True, check=True).stdout
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]]
            for line in out.splitlines() if line.split() and line.split()[0] in ("a", "b")}
    # columns: driver, cmaes, cma 0.2 (driver 8 + cma 2), cma 0.5 (driver 5 + cma 5)
    assert rows["a"] == [100.0, 0.0, 100.0, 100.0]  # CMA-ES's lead is in its last 2
    assert rows["b"] == [0.0, 200.0, 0.0, 0.0]
    assert "driver: more than 0.5 points behind plain CMA-ES on 1 of 2 (a)" in out


def test_strategy_ranks_prices_every_strategy_at_each_split():
    out = subprocess.run(
        [sys.executable, str(BENCH / "strategy_ranks.py"), "--study", "gemm-16k-64-n5-hbm3",
         "--strategy", "RC-8-8-d1-p1", "--driver-prefixes", "30", "--random", "2",
         "--top", "4", "--mixed", "12,24", "--pool", "4"],
        capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith("template split") and "rank 4 of 8" in out[0]
    assert out[1].startswith("driver after 30 (")
    # the random splits rank the template's 4 best only, each by its best split
    assert [line.split(" rank ")[1].split(";")[0] for line in out[2:4]] == ["4 of 4"] * 2
    # a mixed CMA-ES's best split after 12 and 24 evaluations (whole generations): every
    # strategy ranked there
    assert [line.split(" (")[0] for line in out[4:]] == [
        "mixed CMA-ES's best after 12", "mixed CMA-ES's best after 24"]
    assert all("of 8;" in line for line in out[4:])
