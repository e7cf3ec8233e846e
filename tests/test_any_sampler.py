"""benchmarks/any_sampler.py: a standard Optuna sampler CrossFlow does not ship, run on the
suite's studies as a study runs them, beside the committed table's own samplers."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

any_sampler = pytest.importorskip("any_sampler")

STUDY = "gemm-mem-64k-1chip-n5"


def test_a_run_is_a_study_baseline_first_every_trial_one_evaluation():
    """The template's baseline trial comes first, then exactly the budget's trials; the same
    seed gives the same values, another seed others."""
    from crossflow.search.objective import evaluate
    from crossflow.search.study import load_study

    entry = next(e for e in any_sampler.suite.load_table() if e["name"] == STUDY)
    setup = load_study(entry["spec"])
    base = setup.baseline_trials()[0]
    first = evaluate(setup, setup.design(base)).values(setup.objectives)[0]
    a = any_sampler.run(entry["spec"], "optuna.samplers.RandomSampler", {}, 0, 25)
    assert len(a["values"]) == 25 and a["values"][0] == pytest.approx(first)
    assert a["wall_s"] > 0
    assert any_sampler.run(entry["spec"], "optuna.samplers.RandomSampler", {}, 0, 25)[
        "values"] == a["values"]
    assert any_sampler.run(entry["spec"], "optuna.samplers.RandomSampler", {}, 1, 25)[
        "values"] != a["values"]


def test_the_table_shows_the_committed_samplers_beside_it(tmp_path, capsys):
    """Gaps against the committed table's reference (or the run's best when lower), the
    table's structured and cmaes gaps at the same budget beside, and a JSON of the rows."""
    table = REPO / "benchmarks" / "results" / "suite.csv"
    out = tmp_path / "r.json"
    assert any_sampler.main(["--sampler", "optuna.samplers.RandomSampler", "--studies", STUDY,
                             "--budgets", "30,300", "--references", str(table),
                             "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "RandomSampler" in text and "structured" in text and "cmaes" in text
    doc = json.loads(out.read_text())
    rows = {r["budget"]: r for r in doc["rows"]}
    with table.open(newline="") as f:
        committed = {(r["study"], r["sampler"], int(r["budget"])): float(r["gap_pct"])
                     for r in csv.DictReader(f)}
    ref = any_sampler.bench_plan.references(table)[STUDY]
    best = min(v for v in doc["runs"][0]["values"][:300] if v is not None)
    assert rows[300]["reference"] == min(ref, best)
    # the table's own runs against the same reference: its printed gap where the run found
    # nothing better than its reference (a random search's 300 trials do not)
    assert rows[300]["reference"] == ref
    assert rows[300]["gaps"]["structured"] == pytest.approx(
        committed[(STUDY, "structured", 300)])
    assert rows[300]["gaps"]["cmaes"] == pytest.approx(committed[(STUDY, "cmaes", 300)])
    assert rows[30]["gaps"]["structured"] is None  # the table has no run of 30
    assert rows[300]["gaps"]["RandomSampler"] == pytest.approx(
        100 * (best / rows[300]["reference"] - 1))
    assert rows[30]["gaps"]["RandomSampler"] >= rows[300]["gaps"]["RandomSampler"]
    assert 0 <= rows[300]["best_at"] < 300 and rows[300]["wall_s_per_trial"] > 0


@pytest.mark.parametrize("path, says", [
    ("optuna.samplers.NoSuchSampler", "not an Optuna sampler class"),
    ("crossflow.nosuchmodule.Sampler", "cannot import crossflow.nosuchmodule"),
    ("crossflow.search.objective.Objective", "not an Optuna sampler class"),
])
def test_a_class_that_is_no_sampler_is_refused_before_anything_runs(path, says):
    with pytest.raises(SystemExit, match=says):
        any_sampler.main(["--sampler", path, "--studies", STUDY])


def test_options_the_sampler_rejects_are_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exc:
        any_sampler.main(["--sampler", "optuna.samplers.RandomSampler", "--options",
                          '{"no_such_option": 1}', "--studies", STUDY])
    assert exc.value.code == 2
    assert "RandomSampler rejects" in capsys.readouterr().err
