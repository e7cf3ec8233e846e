"""The search benchmark suite (benchmarks/suite.py, issue 18 item 1): its table of studies,
the split into halves, a small run end to end, the cached runs and the table's content."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import statistics
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # suite.py imports suite_tables beside it
import suite_tables  # noqa: E402  (benchmarks/suite_tables.py: the tables written and read back)

_spec = importlib.util.spec_from_file_location("suite_bench", REPO / "benchmarks" / "suite.py")
suite = importlib.util.module_from_spec(_spec)
sys.modules["suite_bench"] = suite  # worker processes (fork) find the module's functions
_spec.loader.exec_module(suite)

SUITE_TABLE = suite.TABLE
STUDIES = suite.load_table()
SMALL = dict(suite.QUICK["best_known"])


def test_the_table_makes_at_least_24_loadable_studies_split_by_the_written_rule():
    assert len(STUDIES) >= 24
    assert [s["row"] for s in STUDIES] == list(range(1, len(STUDIES) + 1))
    for s in STUDIES:
        assert s["half"] == ("tuning" if s["row"] % 2 else "checking")
    halves = {h: [s for s in STUDIES if s["half"] == h] for h in suite.HALVES}
    assert abs(len(halves["tuning"]) - len(halves["checking"])) <= 1
    # each half spans the kinds and the workload families
    for mine in halves.values():
        assert {s["kind"] for s in mine} == {"budgets", "budgets+strategy+order", "strategy"}
        assert {s["name"].split("-")[0] for s in mine} >= {"gemm", "lstm", "gpt"}
    header = SUITE_TABLE.read_text().split("studies:")[0]
    assert "ODD" in header and "TUNING" in header and "EVEN" in header
    # every study loads (the schema accepts it) and can run; single chips and 64-1536 devices
    suite.preflight(STUDIES, SUITE_TABLE)
    systems = [s["spec"].get("system") for s in STUDIES]
    assert None in systems
    sizes = {s.get("num_nodes") for s in systems if isinstance(s, dict)}
    assert {64, 1024} <= sizes
    assert suite.select(STUDIES, "checking") == halves["checking"]


def test_studies_are_selected_by_kind_and_a_wrong_kind_or_name_is_refused():
    """``--kind`` (bench_plan.py, suite.py): only studies of those kinds, in table order,
    within the half; an unknown kind, or a named study of another kind, is an error."""
    codesign = suite.select(STUDIES, "all", kinds=["budgets+strategy+order"])
    assert codesign and codesign == [s for s in STUDIES if s["kind"] == "budgets+strategy+order"]
    both = suite.select(STUDIES, "tuning", kinds=["budgets", "strategy"])
    assert both == [s for s in STUDIES if s["half"] == "tuning"
                    and s["kind"] in ("budgets", "strategy")]
    with pytest.raises(SystemExit, match="unknown kinds of study: codesign"):
        suite.select(STUDIES, "all", kinds=["codesign"])
    single = next(s for s in STUDIES if s["kind"] == "budgets")
    assert suite.select(STUDIES, "all", [single["name"]], ["budgets"]) == [single]
    with pytest.raises(SystemExit, match=f"not of the kinds strategy: {single['name']}"):
        suite.select(STUDIES, "all", [single["name"]], ["strategy"])


def test_a_table_row_that_cannot_run_is_refused_before_any_worker_starts(tmp_path, capsys):
    """``preflight`` (suite.py and bench_plan.py call it before their workers): every
    committed table passes (those no other test here checks so); a bf16 workload on the fp16
    template and an unknown system are each named with their row and reason, exit status 2."""
    for table in sorted((REPO / "benchmarks" / "suite").glob("*.yaml")):
        if table.name not in {SUITE_TABLE.name, *FRESH}:
            suite.preflight(suite.load_table(table), table)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        f"blocks_from: {REPO / 'benchmarks' / 'suite' / 'studies.yaml'}\n"
        "studies:\n"
        "  - {name: llama-bf16, workload: llama3-8b, system: torus-64,"
        " space: budgets-strategy-order-tp, kind: budgets+strategy+order}\n"
        "  - {name: nowhere, workload: gemm-16k, system: torus-999,"
        " space: budgets-parallelism, kind: budgets+strategy+order}\n")
    with pytest.raises(SystemExit) as exit_:
        suite.preflight(suite.load_table(bad), bad)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{bad}, study 'llama-bf16' (row 1): key 'workload'" in err
    assert "no bf16 arithmetic" in err
    assert f"{bad}, study 'nowhere' (row 2): key 'system' = 'torus-999'" in err


FRESH = ["fresh.yaml", "fresh2.yaml", "fresh3.yaml", "fresh4.yaml", "fresh5.yaml", "fresh6.yaml",
         "fresh7.yaml", "fresh8.yaml"]
#: the kinds of study of each set: the seventh (fresh5) checks a rule that touches only
#: strategy studies, so it has nothing else
KINDS = {"fresh5.yaml": {"budgets+strategy+order"}}
#: studies per set (the eighth and ninth, fresh6 and fresh7, check rules that touch both
#: kinds: sixteen; the tenth, fresh8, eight Llama-style transformers)
SIZES = {"fresh6.yaml": 16, "fresh7.yaml": 16, "fresh8.yaml": 8}


@pytest.mark.parametrize("table", FRESH)
def test_the_new_studies_load_and_are_none_of_the_suites(table):
    """benchmarks/suite/fresh*.yaml: twelve studies each (the eighth and ninth sixteen, the
    tenth eight), written after the rules were chosen, the generalisation checks of
    docs/search-benchmarks.md; each loads, and none is a suite study or another set's; each
    has the kinds it was written with."""
    fresh = suite.load_table(REPO / "benchmarks" / "suite" / table)
    others = {s["name"] for s in STUDIES}
    for name in set(FRESH) - {table}:
        others |= {s["name"] for s in suite.load_table(REPO / "benchmarks" / "suite" / name)}
    assert len(fresh) == SIZES.get(table, 12)
    assert not {s["name"] for s in fresh} & others
    assert {s["kind"] for s in fresh} == KINDS.get(table, {"budgets", "budgets+strategy+order"})
    suite.preflight(fresh, table)  # each loads, and its chip has the workload's arithmetic


@pytest.mark.parametrize("table", ["fresh-strategy.yaml", "fresh-strategy-2.yaml"])
def test_the_new_strategy_only_studies_load_and_search_nothing_continuous(table):
    """benchmarks/suite/fresh-strategy*.yaml: twelve strategy-only studies each, written
    after the descent's rules were chosen; each loads, none is another set's, and none has
    a continuous dimension (so its best-known reference is the exhaustive optimum)."""
    from crossflow.search.study import load_study

    others = {s["name"] for s in STUDIES}
    for name in ("fresh.yaml", "fresh-strategy.yaml", "fresh-strategy-2.yaml"):
        if name != table:
            others |= {s["name"] for s in suite.load_table(REPO / "benchmarks" / "suite" / name)}
    strategy = suite.load_table(REPO / "benchmarks" / "suite" / table)
    assert len(strategy) == 12 and {s["kind"] for s in strategy} == {"strategy"}
    assert not {s["name"] for s in strategy} & others
    for s in strategy:
        space = load_study(s["spec"]).space
        assert not space.simplexes and all(d.kind != "float" for d in space.dimensions)


def test_a_small_suite_end_to_end(tmp_path):
    """Three tiny studies (both halves), two samplers, budgets 12 and 24 in two worker
    processes: gaps >= 0 against reference = min(best-known, every run), medians and worst
    per half, files per run; a second call runs nothing (cached)."""
    names = suite.QUICK["studies"]
    chosen = suite.select(STUDIES, "all", names)
    assert {s["half"] for s in chosen} == {"tuning", "checking"}
    budgets, samplers, seeds = [12, 24], ["tpe", "random"], [0]
    suite.execute(chosen, samplers, seeds, budgets, tmp_path, jobs=2,
                  best_known_options=SMALL, progress=False)
    for s in chosen:
        for sampler in samplers:
            for b in budgets:
                run = suite.read_run(suite.run_path(tmp_path, s["name"], sampler, 0, b))
                assert run["evaluations"] == len(run["values"]) == b
    # tpe never sees the budget: its 12-run is the first 12 trials of the 24-run, and a
    # separate 12-evaluation run makes the same trials
    r12 = suite.read_run(suite.run_path(tmp_path, names[0], "tpe", 0, 12))
    r24 = suite.read_run(suite.run_path(tmp_path, names[0], "tpe", 0, 24))
    assert r12["prefix_of"] == 24 and r12["values"] == r24["values"][:12]
    from crossflow.search.compare import run_one
    from crossflow.search.study import load_study

    alone = run_one(load_study(chosen[0]["spec"]), "tpe", 0, 12, root=tmp_path / "alone")
    assert [None if math.isinf(v) else v for v in alone["values"]] == r12["values"]

    assert suite.plan(chosen, samplers, seeds, budgets, tmp_path) == []  # resumable
    result = suite.collect(chosen, samplers, seeds, budgets, tmp_path)
    assert result["missing"] == 0
    for row in result["rows"]:
        bests = [suite.read_run(suite.run_path(tmp_path, row["study"], s, 0, b))["best"]
                 for s in samplers for b in budgets]
        assert row["reference"] == min([row["best_known"], *bests])
        for (s, b), gap in row["gaps"].items():
            best = suite.read_run(suite.run_path(tmp_path, row["study"], s, 0, b))["best"]
            assert gap >= 0 and gap == pytest.approx(100 * (best / row["reference"] - 1))
        # a bigger budget is never worse (same seed, prefix)
        for s in samplers:
            assert row["gaps"][s, 24] <= row["gaps"][s, 12]
    for half in (*suite.HALVES, "all"):
        rows = [r for r in result["rows"] if half == "all" or r["half"] == half]
        for s in samplers:
            for b in budgets:
                (summ,) = [x for x in result["summary"] if (x["half"], x["sampler"],
                                                            x["budget"]) == (half, s, b)]
                gaps = [r["gaps"][s, b] for r in rows]
                assert summ["median_gap_pct"] == pytest.approx(statistics.median(gaps))
                assert summ["worst_gap_pct"] == pytest.approx(max(gaps))
                assert summ["studies"] == summ["of"] == len(rows)
    files = suite_tables.write_tables(result, tmp_path, samplers, seeds, budgets, "test")
    md = files["md"].read_text()
    assert "| tuning | tpe |" in md and "| checking | random |" in md
    with files["csv"].open() as fh:
        assert len(list(csv.DictReader(fh))) == len(chosen) * len(samplers) * len(budgets)


def test_a_sampler_with_no_feasible_design_reads_so_in_the_table(tmp_path):
    entry = STUDIES[0]
    for sampler, values in (("good", [2.0, 1.5]), ("bad", [None, None])):
        path = suite.run_path(tmp_path, entry["name"], sampler, 0, 2)
        path.parent.mkdir(parents=True, exist_ok=True)
        best = min((v for v in values if v is not None), default=None)
        path.write_text(json.dumps({"values": values, "best": best, "sampler": sampler,
                                    "seed": 0, "budget": 2}))
    result = suite.collect([entry], ["good", "bad"], [0], [2], tmp_path)
    (row,) = result["rows"]
    assert row["reference"] == 1.5 and row["gaps"]["bad", 2] is None
    bad = [s for s in result["summary"] if s["sampler"] == "bad" and s["half"] == "all"]
    assert bad[0]["no_feasible"] == 1 and math.isinf(bad[0]["worst_gap_pct"])
    md = suite_tables.markdown(result, ["good", "bad"], [0], [2], "test")
    assert suite_tables.NO_FEASIBLE in md and "0.00" in md


def test_an_earlier_tables_lower_reference_is_carried(tmp_path):
    """``--references``: a study's reference in an earlier table's CSV joins the candidates
    (the lowest row of the study wins), named as its source; a higher one changes nothing,
    and a study the CSV does not list keeps its own reference."""
    first, second = STUDIES[0], STUDIES[1]
    for entry in (first, second):
        path = suite.run_path(tmp_path, entry["name"], "good", 0, 2)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"values": [2.0, 1.5], "best": 1.5, "sampler": "good",
                                    "seed": 0, "budget": 2}))
    earlier = tmp_path / "earlier.csv"
    earlier.write_text("study,reference\n"
                       f"{first['name']},1.4\n{first['name']},1.2\n{second['name']},1.6\n"
                       f"{first['name']},\n")
    carried = suite_tables.carried_references(earlier)
    assert carried[first["name"]] == (1.2, "earlier table (earlier.csv)")
    result = suite.collect([first, second], ["good"], [0], [2], tmp_path, carried)
    one, two = result["rows"]
    assert one["reference"] == 1.2 and one["reference_source"] == "earlier table (earlier.csv)"
    assert one["gaps"]["good", 2] == pytest.approx(100 * (1.5 / 1.2 - 1))
    assert two["reference"] == 1.5 and two["reference_source"] == "good s0 @2"
    md = suite_tables.markdown(result, ["good"], [0], [2], "test")
    assert "an earlier table's" in md and "earlier table (earlier.csv)" in md
    assert "an earlier table's" not in suite_tables.markdown(
        suite.collect([second], ["good"], [0], [2], tmp_path), ["good"], [0], [2], "test")


def test_carry_keeps_an_earlier_tables_cells_where_no_run_is_here(tmp_path):
    """``--carry``: the runs of one sampler again, the other's cells from the earlier table
    (its median run's value, the gap taken against the new reference), the best-known row
    as that table printed it; a cell with runs here is never carried."""
    entry = STUDIES[0]
    path = suite.run_path(tmp_path, entry["name"], "good", 0, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"values": [2.0, 1.0], "best": 1.0, "sampler": "good",
                                "seed": 0, "budget": 2}))
    earlier = tmp_path / "old.csv"
    header = ("row,study,half,kind,sampler,budget,gap_pct,reference,reference_source,"
              "best_known,best_known_evaluations\n")
    earlier.write_text(header
                       + f"1,{entry['name']},tuning,budgets,good,2,50.0,1.2,x,1.3,77\n"
                       + f"1,{entry['name']},tuning,budgets,other,2,25.0,1.2,x,1.3,77\n"
                       + f"1,{entry['name']},tuning,budgets,none,2,{suite_tables.NO_FEASIBLE},1.2,x,"
                         "1.3,77\n")
    earlier.with_suffix(".md").write_text(
        "| study | evaluations | s | classes / combinations | within margin / refined "
        "| cross-check | searches | reference from |\n|---|---|---|---|---|---|---|---|\n"
        f"| {entry['name']} | 77 | 9.5 | 1 / 1 | — | did not beat phases 1-6 | 1 | x |\n")
    old = suite_tables.earlier_table(earlier)
    assert old.cells[entry["name"], "other", 2] == pytest.approx(1.5)
    assert old.cells[entry["name"], "none", 2] is None
    result = suite.collect([entry], ["good", "other", "none"], [0], [2], tmp_path,
                           suite_tables.carried_references(earlier), old)
    (row,) = result["rows"]
    assert row["reference"] == 1.0 and row["reference_source"] == "good s0 @2"
    assert row["gaps"]["good", 2] == 0.0  # its run here, not the earlier 50 %
    assert row["gaps"]["other", 2] == pytest.approx(50.0)  # 1.5 against the new 1.0
    assert row["gaps"]["none", 2] is None
    assert result["carried_cells"] == 2 and result["missing"] == 0
    assert row["best_known"] == 1.3 and row["best_known_evaluations"] == 77
    md = suite_tables.markdown(result, ["good", "other", "none"], [0], [2], "test")
    assert "Cells carried from old.csv" in md
    assert f"| {entry['name']} | 77 | 9.5 | 1 / 1 | — | did not beat phases 1-6 | 1 | good s0 @2 |" in md


def test_with_no_sampler_the_table_lists_the_references_alone(tmp_path):
    """``--samplers ''`` runs only the best-known searches: the table has each study's
    reference and no summary rows or empty sampler columns."""
    entry = STUDIES[0]
    cache = tmp_path / "best_known" / f"{entry['name']}.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"value": 0.25, "evaluations": 12}))
    result = suite.collect([entry], [], [0], [300, 1000], tmp_path)
    (row,) = result["rows"]
    assert (row["reference"], row["reference_source"]) == (0.25, "best-known")
    md = suite_tables.markdown(result, [], [0], [300, 1000], "test")
    assert "| half | sampler |" not in md
    assert "| # | study | half | kind | reference (s) | from |\n|---|---|---|---|---|---|\n" in md
    assert f"| {entry['name']} | {entry['half']} | {entry['kind']} | 0.25 | best-known |" in md


def test_a_carried_reference_keeps_the_run_that_found_it(tmp_path):
    """A reference carried through tables names the table and the run that found it, and
    one carried twice is not wrapped again."""
    earlier = tmp_path / "old.csv"
    earlier.write_text("study,reference,reference_source\n"
                       "a,1.0,structured s0 @1000\nb,2.0,earlier table (older.csv)\n"
                       "c,3.0,best-known\n")
    assert suite_tables.carried_references(earlier) == {
        "a": (1.0, "earlier table (old.csv: structured s0 @1000)"),
        "b": (2.0, "earlier table (older.csv)"),
        "c": (3.0, "earlier table (old.csv: best-known)")}
