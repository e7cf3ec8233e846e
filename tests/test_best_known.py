"""best_known's phase 6: the integer area designs around the refined optimum, enumerated."""

from __future__ import annotations

import math

import pytest

from crossflow.search import best_known as bk
from crossflow.search.study import load_study

SMALL = {"samples": 20, "top_k": 2, "refine": 1, "refine_evals": 40, "hops": 5,
         "enum_core_radius": 2, "enum_radius": 1, "enum_top": 2, "enum_power_evals": 20,
         "enum_rounds": 2, "searches": 1}


@pytest.fixture(scope="module")
def quickstart():
    return load_study("quickstart")


def test_enumeration_recorded_and_never_worse(quickstart, tmp_path):
    r = bk.best_known(quickstart, root=tmp_path, **SMALL)
    e = r["enumeration"]
    assert e is not None and e["rounds"]
    first = e["rounds"][0]
    assert first["absorber"] == "L2"                   # the finest SRAM level takes the rest
    assert first["box"]["core"][1] - first["box"]["core"][0] == 4  # ±2 bundles
    assert first["evaluated"] + first["over_budget"] == first["vectors"] > 0
    assert first["feasible"] > 0                      # the thresholds buy buildable designs
    assert e["value_after"] <= e["value_before"] and r["value"] <= e["value_after"]
    assert e["improved"] == (e["value_after"] < e["value_before"])
    names = [p["phase"] for p in r["phases"]]
    assert names[:7] == ["screen", "sample", "refine", "recheck", "contenders",
                         "perturbation", "enumeration"]  # contenders: the logic nodes
    assert names[7:] == (["cross-check", "polish"] if r["cross_check"]["beat_main"]
                         else ["cross-check"])
    assert r["phases"][-1]["evaluations"] == r["evaluations"]
    assert all(a["best"] >= b["best"] for a, b in zip(r["phases"], r["phases"][1:],
                                                       strict=False))


def test_the_best_of_independent_searches_is_kept_and_each_one_recorded(quickstart, tmp_path):
    """``searches`` runs the whole search with the seeds seed, seed + 1, ...: the reference
    is the best of them, each is the search that seed alone makes, and the record says how
    far apart they ended."""
    from crossflow.search.compare import how_known

    r = bk.best_known(quickstart, root=tmp_path, **{**SMALL, "searches": 2})
    runs = r["searches"]
    assert [x["seed"] for x in runs] == [0, 1]
    values = [x["value"] for x in runs]
    assert r["value"] == min(values)
    assert r["spread"] == pytest.approx(max(values) / min(values) - 1)
    assert r["evaluations"] == sum(x["evaluations"] for x in runs)
    assert "the best of 2 independent searches (seeds 0, 1;" in how_known(r)
    alone = bk.best_known(quickstart, root=tmp_path / "alone", **{**SMALL, "seed": 1})
    assert alone["value"] == values[1] and alone["evaluations"] == runs[1]["evaluations"]
    with pytest.raises(ValueError, match="searches >= 1"):
        bk.best_known(quickstart, root=tmp_path / "none", **{**SMALL, "searches": 0})


def test_enumerated_design_builds_its_units(quickstart):
    """Each candidate sits at the smallest fractions that buy its units: the AGE builds
    exactly the target counts of the enumerated components (the encoding's floor handled)."""
    from crossflow.arch.cliffs import quantities_at

    start = {**quickstart.baseline_params()}
    f = bk._Counter(quickstart)
    f(start)
    seen = []
    real = f.many

    def spy(points, chunk=512):
        seen.extend(points)
        return real(points, chunk)

    f.many = spy
    rec = bk._enumerate(f, quickstart, start, {**bk.SETTINGS, **SMALL, "enum_top": 0}, False)
    assert rec["evaluated"] == len(seen) > 0
    units = rec["units"]
    box = rec["box"]
    for p in seen[:: max(1, len(seen) // 6)]:
        got = quantities_at(quickstart.template, quickstart.overrides(quickstart.design(p)))
        assert got["feasible"]
        for c, (lo, hi) in box.items():
            assert lo <= got[units[c]] <= hi
    assert math.isfinite(f.best[0])


#: A small strategy study: a GEMM on 16 case-study nodes (4 x 4 torus), budgets + RC/CR
#: strategy + mapping order (12 strategies x 24 orders).
TINY = {"kind": "study", "name": "tiny-gemm-16", "workload": {
            "kind": "gemm", "name": "g4k", "m": 4096, "k": 4096, "n": 4096,
            "precision": "fp16"},
        "hardware": "deepflow-case-study",
        "system": {"kind": "system", "name": "torus-16", "device": "deepflow-case-study",
                   "devices_per_node": 1, "num_nodes": 16,
                   "inter": {"topology": "torus", "dims": [4, 4],
                             "collective": {"efficiency": 1.0, "step_latency_us": 0}},
                   "collective_launch_us": 0},
        "search_space": "budgets-parallelism", "objectives": ["iteration_time_s"],
        "n_trials": 10}
TINY_SETTINGS = {**SMALL, "top_k": 3, "refine": 2, "max_contenders": 3,
                 "contender_evals": 40, "cma_combos": 2, "cma_starts": 2, "cma_contenders": 1,
                 "cma_evals": 60}


@pytest.fixture(scope="module")
def tiny():
    return load_study(TINY)


def test_best_known_deduplicates_order_classes_and_is_no_worse_than_any_phase(
        tiny, tmp_path, monkeypatch):
    from crossflow.search.orders import class_key
    from crossflow.system import order_classes

    screened = []
    real = bk.evaluate_many

    def spy(setup, designs):
        if not screened:  # the first batch: the screen at the template's split
            screened.extend((d.strategy, d.mapping_order) for d in designs)
        return real(setup, designs)

    monkeypatch.setattr(bk, "evaluate_many", spy)
    r = bk.best_known(tiny, root=tmp_path, **TINY_SETTINGS)
    discrete = [d for d in tiny.space.dimensions if d.kind != "float"]
    strategies = next(d for d in discrete if d.name == "strategy").values()
    # one order per class: as many as the classes of every strategy, no two equivalent
    classes = sum(len(order_classes(s)) for s in strategies)
    oc = r["order_classes"]
    assert oc["combinations"] == len(strategies) * 24 and oc["classes"] == classes
    assert oc["equivalent_dropped"] == oc["combinations"] - classes > 0
    assert len(screened) == classes
    keys = {class_key(discrete, {"strategy": s, "mapping_order": o}) for s, o in screened}
    assert len(keys) == len(screened)
    # the best-known value is no worse than anything any phase found
    value = r["value"]
    assert value is not None
    assert all(p["best"] is None or value <= p["best"] for p in r["phases"])
    assert r["phases"][-1]["best"] == value
    assert all(value <= v for v in r["refined_values"])
    c = r["contenders"]
    assert c["splits"] == ["template", "refined", "equal"]
    assert c["within_margin"] == c["already_refined"] + c["refined"] + c["left_out"]
    assert all(value <= x["value"] <= x["start_value"] for x in c["contenders"]
               if x["value"] is not None)
    x = r["cross_check"]
    # 2 strategies x 2 starts, then one more strategy from its best point only
    assert 2 <= len(x["runs"]) <= 5 and all(value <= run["value"] for run in x["runs"]
                                            if run["value"] is not None)
    assert [r["start"] for r in x["runs"]][4:] in ([], ["strategy 3: its best point"])
    assert x["beat_main"] == (x["value"] is not None and x["value"] < x["main_value"])
    assert [p["phase"] for p in r["phases"]][:5] == ["screen", "sample", "refine",
                                                     "recheck", "contenders"]


def test_order_classes_match_the_structured_driver(tiny):
    """The shared module gives the driver's own answers (its methods can delegate)."""
    from crossflow.search import orders
    from crossflow.search.samplers.structured._problem import Problem

    problem = Problem(tiny)
    for combo in problem.combos():
        assert orders.order_classes(problem.discrete, combo) == problem.order_classes(combo)
        assert orders.canonical_order(problem.discrete, combo) == \
            problem.canonical_order(combo)


def test_a_cached_optimum_is_stale_once_the_model_changes(monkeypatch):
    """The cache key covers the model's code and presets, not only the package version:
    a value found with another model is searched again."""
    setup = load_study("quickstart")
    key = bk.cache_key(setup, bk.SETTINGS)
    assert bk.cache_key(setup, bk.SETTINGS) == key                 # deterministic
    monkeypatch.setattr(bk, "model_fingerprint", lambda: "another-model")
    assert bk.cache_key(setup, bk.SETTINGS) != key


def test_the_fingerprint_follows_the_models_code_and_data_not_the_measurement_scripts(
        tmp_path):
    """Editing a module of the model or a measured data file changes the fingerprint (the
    cached optima are searched again); editing a script that records measurements, or a
    module of the search itself, does not."""
    files = {"kernels/gemm.py": "a = 1\n", "presets/hardware/x.yaml": "a: 1\n",
             "presets/measurements/gpu/measure_x.py": "print(1)\n",
             "presets/measurements/gpu/x.csv": "a\n1\n", "search/driver.py": "b = 1\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    first = bk.fingerprint(tmp_path)
    for rel, moves in (("presets/measurements/gpu/measure_x.py", False),
                       ("search/driver.py", False), ("kernels/gemm.py", True),
                       ("presets/hardware/x.yaml", True),
                       ("presets/measurements/gpu/x.csv", True)):
        before = bk.fingerprint(tmp_path)
        with (tmp_path / rel).open("a") as f:
            f.write("# edited\n")
        assert (bk.fingerprint(tmp_path) != before) is moves, rel
    assert bk.fingerprint(tmp_path) != first


def test_same_class_carries_an_order_to_another_strategy(tiny):
    """A mapping order carried to another strategy: the same dimensions of size > 1 in the
    same sequence, as the order the space prices for that class."""
    from crossflow.search import orders
    from crossflow.search.samplers.structured._problem import Problem
    from crossflow.search.space import MAPPING_ORDER, STRATEGY
    from crossflow.system import order_representative

    problem = Problem(tiny)
    discrete = problem.discrete
    allowed = next(d for d in discrete if d.name == MAPPING_ORDER).values()
    for combo in problem.combos():
        classes = orders.order_classes(discrete, combo)
        for order in allowed:
            got = orders.same_class(discrete, combo, order)
            assert got in classes
            strategy = combo[STRATEGY]
            assert order_representative(strategy, got) == order_representative(strategy, order)
    # a size-1 dimension does not count: kp2 then kp1 is the class of kp2-kp1-dp-lp
    combo = {STRATEGY: "RC-32-2-d1-p1"}
    assert orders.same_class(discrete, combo, "kp2-dp-lp-kp1") == \
        order_representative("RC-32-2-d1-p1", "kp2-kp1-dp-lp")


#: A strategy-only study (nothing continuous): GPT-3 20B on 32 A100s of 40 GB, where most
#: strategies do not fit in memory.
STRATEGY_ONLY = {
    "kind": "study", "name": "gpt3-20b-a100-40gb-32", "workload": "gpt3-20b",
    "hardware": "a100-sxm4-40gb", "system": "dgx-a100", "devices": 32,
    "search_space": {"kind": "search_space", "name": "small-megatron", "mapping_order": True,
                     "strategy": {"kernel_types": ["TP"], "max_tp": 8,
                                  "virtual_stages": "all", "sequence_parallel": [False, True]},
                     "params": {"micro_batch_size": [1, 2],
                                "recompute_granularity": ["none", "full"]}},
    "objectives": ["iteration_time_s"], "n_trials": 10}


def test_a_strategy_only_space_is_searched_whole_past_its_memory_verdicts(tmp_path):
    """With nothing continuous the chip is fixed, so the best-known search drops what does
    not fit and prices every other class — the exhaustive optimum, even where the classes
    outnumber ``max_discrete`` (which would otherwise draw a random subset of them)."""
    from crossflow.search.compare import how_known
    from crossflow.search.objective import evaluate_many
    from crossflow.search.samplers.structured._problem import Problem

    setup = load_study(STRATEGY_ONLY)
    P = Problem(setup)  # every combination in one order of each of its classes
    every = [{**c, "mapping_order": o} for c in P.combos() for o in P.order_classes(c)]
    evs = evaluate_many(setup, [setup.design(p) for p in every])
    fits = [ev for ev in evs if ev.feasible]
    optimum = min(ev.values(setup.objectives)[0] for ev in fits)

    r = bk.best_known(setup, root=tmp_path, max_discrete=len(every) // 4)
    oc = r["order_classes"]
    assert oc["classes"] == len(every)
    assert oc["memory_dropped"] == len(every) - len(fits) > len(every) // 2
    assert r["discrete_screened"] == len(fits) > len(every) // 4
    assert r["value"] == pytest.approx(optimum, rel=1e-12)
    assert r["enumeration"] is None  # no budget split: no whole units to enumerate
    assert [x["seed"] for x in r["searches"]] == [0]  # exhaustive: one search, not three
    assert (f"every one of the {len(fits)} order classes that fit in memory screened "
            f"({len(every) - len(fits)} do not fit") in how_known(r)


def test_a_numeric_range_is_searched_with_the_split_not_enumerated(tmp_path):
    """``tdp_W: {low: 150, high: 450}`` (an integer range) is a continuous parameter of the
    reference's search, as of the driver's, rounded to whole watts when evaluated: one
    combination is screened (not one per watt), and the best point is on the grid."""
    setup = load_study({
        "kind": "study", "name": "bk-range", "workload": "gemm-8192",
        "hardware": "deepflow-case-study", "objectives": ["iteration_time_s"],
        "sampler": "structured", "seed": 0, "n_trials": 50,
        "search_space": {"simplexes": {"area": ["core", "L1", "L2"]},
                         "params": {"tdp_W": {"low": 150, "high": 450}}}})
    assert "tdp_W" in bk._continuous(setup.space)
    r = bk.best_known(setup, root=tmp_path, **SMALL)
    assert r["discrete_total"] == 1
    tdp = r["params"]["tdp_W"]
    assert isinstance(tdp, int) and 150 <= tdp <= 450
