"""``crossflow compare`` and the best-known optimum (issue #5, items 1-2)."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from crossflow.search import best_known as bk
from crossflow.search.compare import (
    best_so_far,
    compare,
    evaluations_to,
    run_one,
    summarize,
)

SMALL = {"samples": 20, "top_k": 2, "refine": 1, "refine_evals": 40, "hops": 5, "searches": 1}


@pytest.fixture(scope="module")
def quickstart():
    from crossflow.search import load_study

    return load_study("quickstart")


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_equal_budgets_monotone_curves_and_seeds_differ(quickstart, tmp_path, sampler):
    runs = [run_one(quickstart, sampler, seed, 12, root=tmp_path) for seed in (0, 1)]
    n_baseline = len(quickstart.baseline_trials())
    for r in runs:
        assert len(r["values"]) == len(r["feasible"]) == len(r["params"]) == 12
        curve = best_so_far(r["values"])
        assert np.all(np.diff(curve[np.isfinite(curve)]) <= 0)
        assert curve[-1] == min(r["values"])
    # the enqueued baseline trials are shared, the sampled ones differ between seeds
    assert runs[0]["params"][:n_baseline] == runs[1]["params"][:n_baseline]
    assert runs[0]["params"][n_baseline:] != runs[1]["params"][n_baseline:]
    # a re-run starts afresh (same budget, not resumed past it)
    again = run_one(quickstart, sampler, 0, 12, root=tmp_path)
    assert again["params"] == runs[0]["params"]


def test_summary_bookkeeping():
    inf = math.inf
    runs = [{"sampler": "a", "seed": 0, "values": [inf, 5, 4, 4, 2, 2, 2, 2, 2, 1.0],
             "feasible": [False] + [True] * 9, "wall_s": 1.0},
            {"sampler": "a", "seed": 1, "values": [3, 3, 3, 3, 3, 3, 3, 3, 3, 3.0],
             "feasible": [True] * 10, "wall_s": 3.0}]
    assert evaluations_to(best_so_far(runs[0]["values"]), 2.0) == 5
    assert evaluations_to(best_so_far(runs[1]["values"]), 2.0) is None
    (row,) = summarize(runs, 10, reference=1.0)
    # seed 0 has nothing feasible after 1 evaluation: no median, no max
    assert row["best_at_10pct_min"] == 3.0 and row["best_at_10pct_max"] is None
    assert row["best_at_10pct_median"] is None
    assert row["best_at_100pct_median"] == 2.0
    assert row["best_at_100pct_min"] == 1.0 and row["best_at_100pct_max"] == 3.0
    assert row["evals_to_1pct_median"] is None and row["evals_to_1pct_reached"] == 1
    assert row["wall_s_median"] == 2.0 and row["infeasible_share"] == pytest.approx(0.05)


def test_best_known_cache_reuse(quickstart, tmp_path, monkeypatch):
    calls = []
    real, real_many = bk.evaluate, bk.evaluate_many

    def counting(setup, design):
        calls.append(1)
        return real(setup, design)

    def counting_many(setup, designs):
        calls.extend([1] * len(designs))
        return real_many(setup, designs)

    monkeypatch.setattr(bk, "evaluate", counting)
    monkeypatch.setattr(bk, "evaluate_many", counting_many)
    first = bk.best_known(quickstart, root=tmp_path, **SMALL)
    assert not first["cached"] and first["evaluations"] == len(calls) > 0
    assert (tmp_path / "best_known" / "quickstart.json").is_file()
    assert first["value"] <= first["sampled_value"]
    n = len(calls)
    second = bk.best_known(quickstart, root=tmp_path, **SMALL)
    assert second["cached"] and len(calls) == n
    assert second["value"] == first["value"] and second["key"] == first["key"]
    # other settings are another key: searched again
    bk.best_known(quickstart, root=tmp_path, **{**SMALL, "samples": 21})
    assert len(calls) > n


def test_compare_end_to_end(quickstart, tmp_path):
    result = compare(quickstart, samplers=["tpe", "random"], seeds=2, budget=10,
                     root=tmp_path, progress=False, best_known_options=SMALL)
    assert [(r["sampler"], r["seed"]) for r in result["runs"]] == [
        ("tpe", 0), ("tpe", 1), ("random", 0), ("random", 1)]
    assert all(len(r["values"]) == 10 for r in result["runs"])
    files = result["files"]
    out = files["table"].parent
    assert out.parent == tmp_path / "compare" / "quickstart" and out.name != "latest"
    for path in files.values():
        assert path.parent == out and path.stat().st_size > 0
    latest = out.parent / "latest"
    assert (latest / "FROM").read_text().strip() == out.name
    assert (latest / "summary.csv").read_bytes() == files["summary"].read_bytes()
    assert files["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with files["summary"].open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["sampler"] for r in rows] == ["tpe", "random"]
    assert "best_at_50pct_median" in rows[0] and "evals_to_5pct_median" in rows[0]
    table = result["table"]
    assert "tpe" in table and "random" in table and "best@100% (10)" in table

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}")
    exp = client.get_experiment_by_name("quickstart.compare")
    parent = client.get_run(result["mlflow_run_id"])
    assert parent.data.params["budget"] == "10" and parent.info.status == "FINISHED"
    names = {a.path for a in client.list_artifacts(parent.info.run_id, "compare")}
    assert {"compare/convergence.png", "compare/summary.csv",
            "compare/table.txt"} <= names
    children = client.search_runs(
        [exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 4
    history = client.get_metric_history(children[0].info.run_id, "best_so_far")
    steps = [m.step for m in sorted(history, key=lambda m: m.step)]
    values = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert steps[-1] == 10 and all(b <= a for a, b in zip(values, values[1:], strict=False))


def test_cli_compare_with_workers(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bk, "SETTINGS", {**bk.SETTINGS, **SMALL})
    code, out, err = cli("compare", "quickstart", "--samplers", "random,cmaes", "--seeds",
                         "2", "--budget", "8", "--workers", "2", "--no-tracking", "--quiet")
    assert code == 0, err
    assert "random" in out and "cmaes" in out and "evals≤1%" in out
    with (tmp_path / "mlruns" / "compare" / "quickstart" / "latest" / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and {r["evaluations"] for r in rows} == {"8"}
    code, _, err = cli("compare", "quickstart", "--samplers", "nsga2", "--budget", "5")
    assert code == 2 and "optimises several objectives" in err
    # the help, the check and the refusal name one list: the samplers compare runs
    from crossflow.search.samplers import COMPARED

    assert f"allowed: {', '.join(COMPARED)}" in err
    code, out, _ = cli("help", "compare")
    assert "of " + ", ".join(COMPARED) in " ".join(out.split())


def _drawn(monkeypatch, tmp_path, runs, reference, budget_name="p.png"):
    """Draw the convergence plot; return its axes (plot() closes the figure: keep it)."""
    import matplotlib.pyplot as plt

    from crossflow.search.compare import plot

    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    known = {"objective": "iteration_time_s", "value": reference}
    plot(tmp_path / budget_name, "toy", runs, reference, known)
    assert (tmp_path / budget_name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return kept[0].axes[0]


def _toy_runs(budget):
    same = [3.0, 2.0] + [1.5] * (budget - 2)  # two samplers on the very same curve
    return ([{"sampler": s, "seed": k, "values": same} for s in ("tpe", "random")
             for k in range(2)]
            + [{"sampler": "structured", "seed": k, "values": [3.0] + [1.1] * (budget - 1)}
               for k in range(2)])


def test_convergence_plot_tells_samplers_apart(monkeypatch, tmp_path):
    """Samplers on the same curve stay visible: each median has its own line style and
    marker, the one drawn first is the thickest and lowest; the legend names each."""
    ax = _drawn(monkeypatch, tmp_path, _toy_runs(30), 1.0)
    lines = [ln for ln in ax.get_lines() if "median" in ln.get_label()]
    assert [ln.get_label().split()[0] for ln in lines] == ["tpe", "random", "structured"]
    assert len({ln.get_linestyle() for ln in lines}) == 3
    assert len({ln.get_marker() for ln in lines}) == 3
    widths = [ln.get_linewidth() for ln in lines]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[1]
    assert [ln.get_zorder() for ln in lines] == sorted(ln.get_zorder() for ln in lines)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(any(t.startswith(s) for t in legend) for s in ("tpe", "random", "structured"))


def test_convergence_plot_axes_read_in_units(monkeypatch, tmp_path):
    """A small budget gets a linear evaluation axis, a large one a log axis; the y label
    names the objective in words with its unit (gap in %, or seconds without reference)."""
    ax = _drawn(monkeypatch, tmp_path, _toy_runs(30), 1.0)
    assert ax.get_xscale() == "linear" and ax.get_yscale() == "log"
    assert "iteration time" in ax.get_ylabel() and "%" in ax.get_ylabel()
    assert "iteration_time_s" not in ax.get_ylabel() and "1 s" in ax.get_ylabel()
    ax = _drawn(monkeypatch, tmp_path, _toy_runs(1000), 1.0)
    assert ax.get_xscale() == "log"
    ax = _drawn(monkeypatch, tmp_path, _toy_runs(30), None)
    assert ax.get_ylabel() == "best feasible iteration time so far (s)"
    assert ax.get_yscale() == "linear"


def test_cli_compare_defaults_to_the_compared_samplers():
    from crossflow.cli import _parser
    from crossflow.search.samplers import COMPARED

    args = _parser().parse_args(["compare", "quickstart"])
    assert args.samplers.split(",") == list(COMPARED)
    assert args.root == "mlruns"


def test_report_folders_keep_earlier_comparisons(tmp_path):
    """Each comparison writes its own folder; ``latest`` is a copy of the newest."""
    from crossflow.search.compare import keep_latest, report_dir

    made = []
    for text in ("first", "second"):
        out = report_dir(tmp_path, "toy")
        out.mkdir(parents=True)
        (out / "table.txt").write_text(text)
        keep_latest({"table": out / "table.txt"})
        made.append(out)
    assert made[0] != made[1] and (made[0] / "table.txt").read_text() == "first"
    latest = tmp_path / "compare" / "toy" / "latest"
    assert (latest / "table.txt").read_text() == "second"
    assert (latest / "FROM").read_text().strip() == made[1].name


def test_a_sampler_without_a_feasible_design_is_reported_not_a_crash(monkeypatch, tmp_path):
    """The table says "no feasible design" for it, the plot names it in the legend and
    draws the others (it used to raise IndexError in matplotlib's markevery)."""
    from crossflow.search.compare import format_table

    inf = math.inf
    runs = [{"sampler": "tpe", "seed": k, "values": [3.0, 2.0, 1.5], "feasible": [True] * 3,
             "wall_s": 1.0} for k in range(2)]
    runs += [{"sampler": "random", "seed": k, "values": [inf] * 3, "feasible": [False] * 3,
              "wall_s": 1.0} for k in range(2)]
    summary = summarize(runs, 3, 1.5)
    known = {"objective": "iteration_time_s", "value": 1.5, "evaluations": 1}
    table = format_table("toy", summary, 3, 2, 1.5, known, False, 1.0)
    (line,) = [ln for ln in table.splitlines() if ln.startswith("random")]
    assert "no feasible design" in line and "100%" in line
    assert "no feasible design" not in next(ln for ln in table.splitlines()
                                            if ln.startswith("tpe"))
    for reference in (1.5, None):
        ax = _drawn(monkeypatch, tmp_path, runs, reference)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(t.startswith("random: no feasible design") for t in legend)
        assert any(t.startswith("tpe (median") for t in legend)
    nothing = [r for r in runs if r["sampler"] == "random"]
    ax = _drawn(monkeypatch, tmp_path, nothing, None)
    assert any("no sampler found a feasible design" in t.get_text() for t in ax.texts)


@pytest.mark.parametrize("args,key", [(["--samplers", "nope"], "--samplers"),
                                      (["--seeds", "0"], "--seeds"),
                                      (["--budget", "0"], "--budget"),
                                      (["--workers", "0"], "--workers")])
def test_cli_compare_names_the_option_it_refuses(cli, tmp_path, monkeypatch, args, key):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("compare", "quickstart", *args, "--no-tracking", "--quiet")
    assert code == 2 and f"crossflow: error: command line: key '{key}' = " in err, err
    assert "is no sampler" not in err and not (tmp_path / "mlruns").exists()


def test_the_table_reads_as_words_and_one_precision_per_column():
    from crossflow.search.compare import format_table, summarize

    budget = 10
    runs = [{"sampler": "tpe", "seed": 0, "values": [0.00637718] * 4 + [0.00377] * 6,
             "feasible": [True] * 10, "wall_s": 1.0},
            {"sampler": "random", "seed": 0, "values": [0.00637718] * 10,
             "feasible": [True] * 10, "wall_s": 1.0}]
    summary = summarize(runs, budget, 0.0037)
    table = format_table("toy", summary, budget, 1, 0.0037,
                         {"objective": "iteration_time_s", "value": 0.0037,
                          "evaluations": 5}, False, 1.0)
    assert table.startswith("toy: 2 samplers × 1 seed × 10 evaluations, ")
    assert all(line == line.rstrip() for line in table.splitlines())
    tpe = next(line for line in table.splitlines() if line.startswith("tpe "))
    assert "0.003770 [" in tpe and "0.006377 [" in tpe  # four digits, zeros kept
