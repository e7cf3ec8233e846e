"""benchmarks/paired.py, how a rule's change in the suite's median is told from noise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import paired  # noqa: E402


def _doc(gaps: dict[str, dict[str, list[float | None]]], budget: int = 1000) -> dict:
    """A bench_plan.py --out document: variant -> study -> gap per seed."""
    rows = [{"study": s, "half": "tuning" if i % 2 else "checking", "variant": v,
             "seed": k, "budget": budget, "best": 1.0, "gap_pct": g, "wall_s": 0.0}
            for v, studies in gaps.items() for i, (s, seeds) in enumerate(studies.items())
            for k, g in enumerate(seeds)]
    return {"variants": {v: {} for v in gaps}, "rows": rows}


def test_a_variant_better_on_every_study_is_told_from_one_that_is_the_same():
    """A variant one point better on every run of 30 studies: the change is -1 and its
    interval excludes 0, every study counts as better; the base against itself: 0, [0, 0]."""
    rng = np.random.default_rng(1)
    base = {f"s{i}": list(rng.uniform(0, 5, 3)) for i in range(30)}
    better = {s: [g - 1.0 for g in v] for s, v in base.items()}
    table, halves = paired.gaps([_doc({"base": base, "better": better})])
    studies = sorted(table[(1000, "base")])
    c = paired.compare(table[(1000, "base")], table[(1000, "better")], studies)
    assert abs(c["change"] + 1.0) < 1e-9
    assert c["high"] < 0 and c["better"] == 30 and c["worse"] == 0
    same = paired.compare(table[(1000, "base")], table[(1000, "base")], studies)
    assert same["change"] == same["low"] == same["high"] == 0.0
    assert set(halves.values()) == {"tuning", "checking"}


def test_noise_alone_gives_an_interval_around_zero():
    """Two variants whose runs are drawn from one distribution: the interval holds 0."""
    rng = np.random.default_rng(2)
    a = {f"s{i}": list(rng.lognormal(0, 1, 3)) for i in range(40)}
    b = {s: list(rng.lognormal(0, 1, 3)) for s in a}
    table, _ = paired.gaps([_doc({"a": a, "b": b})])
    c = paired.compare(table[(1000, "a")], table[(1000, "b")], sorted(a))
    assert c["low"] < 0 < c["high"]


def test_an_infeasible_run_counts_as_infinitely_far_off_and_the_cli_prints_both_halves(
        tmp_path):
    """A run with no gap (nothing feasible) is an infinite gap, not a crash; the command
    prints each half and the pooled studies, the change and the counts."""
    base = {f"s{i}": [1.0, 2.0, 3.0] for i in range(6)}
    worse = dict(base, s0=[None, None, None])
    out = tmp_path / "run.json"
    out.write_text(json.dumps(_doc({"base": base, "worse": worse})))
    got = subprocess.run([sys.executable, str(REPO / "benchmarks" / "paired.py"), str(out),
                          "--resamples", "200"], capture_output=True, text=True, check=True)
    assert "checking" in got.stdout and "tuning" in got.stdout and "all" in got.stdout
    assert "worse  1" in got.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    refused = subprocess.run([sys.executable, str(REPO / "benchmarks" / "paired.py"), str(bad)],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "not a bench_plan.py --out file" in refused.stderr


def test_bench_plan_prints_the_paired_comparison_when_it_compares_variants(capsys,
                                                                           monkeypatch):
    """`bench_plan.py` with two variants ends with paired.py's report (here two variants
    that are the same plan: no change, an interval of nothing)."""
    import bench_plan

    monkeypatch.setattr(sys, "argv", [
        "bench_plan.py", "--shipped", "quickstart", "--budgets", "30,60", "--variants",
        '{"a": {}, "b": {"plan": {"GAIN": 1e-6}}}'])
    bench_plan.main()
    out = capsys.readouterr().out
    assert "change against 'a'" in out
    assert "change  +0.00 [ +0.00 ..  +0.00]  better  0  worse  0" in out


def test_the_same_runs_in_two_files_are_refused(tmp_path):
    """Two files with the same study's runs (two bench_plan.py invocations of one table,
    whose gaps are against different references) cannot be pooled: exit status 2, and the
    message names the study."""
    out = tmp_path / "run.json"
    out.write_text(json.dumps(_doc({"base": {"s0": [1.0, 2.0, 3.0]}})))
    got = subprocess.run([sys.executable, str(REPO / "benchmarks" / "paired.py"), str(out),
                          str(out)], capture_output=True, text=True)
    assert got.returncode == 2 and "'s0'" in got.stderr and "more than one file" in got.stderr
