"""Search spaces, study files, the simplex encoding and the sampler factory (no study runs)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossflow.config.loader import load_spec, preset_names
from crossflow.errors import ConfigError
from crossflow.search import encoding
from crossflow.search.space import Simplex
from crossflow.search.study import load_study

STUDIES = preset_names("studies")
SPACES = preset_names("search_spaces")


def test_shipped_studies_and_spaces_are_there():
    assert {"quickstart", "paper-lstm-512", "gemm-64k", "gpt3-175b-a100"} <= set(STUDIES)
    assert SPACES


@pytest.mark.parametrize("name", SPACES)
def test_every_search_space_loads(name):
    spec = load_spec(name, "search_spaces")
    assert spec.kind == "search_space" and spec.name == name


@pytest.mark.parametrize("name", STUDIES)
def test_every_study_loads_and_resolves(name):
    setup = load_study(name)
    assert setup.name == name
    dists = setup.space.distributions()
    assert dists, "a study searches something"
    for simplex in setup.space.simplexes:
        for p in simplex.param_names:
            assert dists[p].low == -encoding.SPAN and dists[p].high == encoding.SPAN


def test_paper_studies_search_what_the_paper_searches():
    lstm = load_study("paper-lstm-512")
    assert lstm.devices == 512
    assert set(lstm.space.simplex_components()) == {"area", "power", "perimeter"}
    assert len(lstm.space.simplex_components()["area"]) == 7
    strategies = lstm.space.dimension("strategy").choices
    assert "RC-4-2-d32-p2" in strategies and all(s.startswith(("RC", "CR")) for s in strategies)
    assert len(lstm.space.dimension("mapping_order").choices) == 24
    gpt = load_study("gpt3-175b-a100")
    assert gpt.template is None and not gpt.space.simplexes       # no hardware dimensions
    assert gpt.space.dimension("micro_batch_size").choices == (1, 2, 4, 8)
    assert "t8-d24-p8" in gpt.space.dimension("strategy").choices
    assert gpt.objectives == ("iteration_time_s",)
    assert gpt.spec.sampler == "structured"
    assert {"recompute_granularity", "use_distributed_optimizer"} <= {
        d.name for d in gpt.space.dimensions}
    vps = {int(s.split("-v")[1].split("-")[0]) for s in gpt.space.dimension("strategy").choices
           if "-v" in s}
    assert max(vps) == 48                    # 96 layers, 2 stages: up to 48 virtual stages
    assert load_study("gpt3-175b-a100-pareto").objectives == ("iteration_time_s", "energy_J")


def test_quickstart_fixes_the_links_and_rescales_the_rest():
    setup = load_study("quickstart")
    area = next(s for s in setup.space.simplexes if s.name == "area")
    assert area.fixed == {"intra_links": 0.06, "inter_links": 0.1}
    assert area.share == pytest.approx(0.84)
    params = {p: 0.0 for p in area.param_names}          # equal logits: 6 equal shares
    fr = area.fractions(params)
    assert fr["intra_links"] == 0.06 and fr["core"] == pytest.approx(0.84 / 6)
    assert sum(fr.values()) == pytest.approx(1 - 0.84 / 6)  # the slack is unused budget
    assert list(fr) == ["core", "registers", "L1", "L2", "dram_ctrl", "intra_links",
                        "inter_links"]                    # the template's order


def test_design_decodes_to_overrides_and_parallelism():
    setup = load_study("gpt3-175b-a100")
    params = {"strategy": "t8-d24-p8", "mapping_order": "dp-kp1-kp2-lp",
              "micro_batch_size": 2, "recompute_granularity": "selective",
              "use_distributed_optimizer": True}
    d = setup.design(params)
    assert (d.strategy, d.mapping_order) == ("t8-d24-p8", "dp-kp1-kp2-lp")
    assert setup.parallelism(d) == {"kind": "parallelism", "strategy": "t8-d24-p8",
                                    "micro_batch_size": 2,
                                    "recompute_granularity": "selective",
                                    "use_distributed_optimizer": True}
    q = load_study("quickstart")
    params = {p: 0.0 for s in q.space.simplexes for p in s.param_names} | {"logic_node": "N7"}
    over = q.design(params).overrides()
    assert over["logic_node"] == "N7" and set(over) == {"logic_node", "area_fractions",
                                                        "power_fractions"}
    assert q.parallelism(q.design(params)) is None        # one device


def test_baseline_is_the_template_design():
    setup = load_study("gemm-64k")
    params = setup.baseline_params()
    d = setup.design(params | {"strategy": "RC-16-32-d1-p1", "mapping_order": "kp1-kp2-dp-lp"})
    tmpl = setup.template
    for key in ("area_fractions", "power_fractions", "perimeter_fractions"):
        for c, v in getattr(tmpl, key).items():
            assert d.fractions[key.split("_")[0]][c] == pytest.approx(v, abs=1e-3)


# --- the encoding: every sampled point is a valid budget split --------------------------------

SIMPLEX_7 = Simplex("area", ("core", "registers", "L1", "L2", "dram_ctrl"),
                    {"intra_links": 0.06, "inter_links": 0.1})
span = st.floats(-encoding.SPAN, encoding.SPAN, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(span, min_size=6, max_size=6))
def test_any_parameters_decode_to_valid_fractions(values):
    params = dict(zip(SIMPLEX_7.param_names, values, strict=True))
    fr = SIMPLEX_7.fractions(params)
    assert all(0.0 <= f <= 1.0 for f in fr.values())
    assert math.fsum(fr.values()) <= 1.0 + 1e-12
    # and the template checker accepts them (what the AGE runs)
    from crossflow.config.template import check_fractions

    check_fractions("area_fractions", fr, fr.keys())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.02, 1.0), min_size=2, max_size=9))
def test_encode_decode_round_trip(weights):
    fractions = [w / sum(weights) for w in weights]          # components + slack, sum 1
    values = encoding.encode(fractions)
    assert all(-encoding.SPAN <= v <= encoding.SPAN for v in values)
    assert encoding.decode(values) == pytest.approx(fractions, rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.05, 1.0), min_size=6, max_size=6))
def test_simplex_params_for_round_trip(weights):
    total = sum(weights)
    share = SIMPLEX_7.share
    wanted = {c: share * w / total for c, w in zip(SIMPLEX_7.components, weights, strict=False)}
    fr = SIMPLEX_7.fractions(SIMPLEX_7.params_for(wanted))
    for c, v in wanted.items():
        assert fr[c] == pytest.approx(v, rel=1e-9)
    assert fr["inter_links"] == 0.1


# --- bad files: rejected with the key named ---------------------------------------------------

BAD_SPACES = [
    ("simplexes: {volume: all}", "simplexes.volume"),
    ("simplexes: {perimeter: [dram, hbm]}", "simplexes.perimeter[1]"),
    ("simplexes: {area: core}", "simplexes.area"),
    ("params: {frequency_GHz: [1, 2]}", "params.frequency_GHz"),
    ("params: {tdp_W: {low: 400, high: 200}}", "params.tdp_W.high"),
    ("params: {logic_node: []}", "params.logic_node"),
    ("params: {zero1: [yes-please]}", "params.zero1[0]"),
    ("params: {micro_batch_size: {low: 1, high: 8, type: float}}", "params.micro_batch_size.type"),
    ("mapping_order: [kp1-kp2-dp]", "mapping_order[0]"),
    ("strategy: {choices: [RC-4-2], max_tp: 8}", "strategy.max_tp"),
    ("strategy: {kernel_types: [XY]}", "strategy.kernel_types[0]"),
    ("colour: blue", "colour"),
]


@pytest.mark.parametrize(("body", "key"), BAD_SPACES)
def test_bad_search_space_names_the_key(tmp_path, body, key):
    path = tmp_path / "space.yaml"
    path.write_text(f"kind: search_space\nname: bad\n{body}\n")
    with pytest.raises(ConfigError) as info:
        load_spec(path, "search_spaces")
    assert f"key '{key}'" in str(info.value)
    assert str(path) in str(info.value)


GOOD_STUDY = """\
kind: study
name: s
workload: gemm-8192
hardware: deepflow-case-study
search_space:
  simplexes: {area: [core, L2]}
n_trials: 5
"""

BAD_STUDIES = [
    ("workload: gemm-8192", "workload: no-such-workload", "workload"),
    ("simplexes: {area: [core, L2]}", "simplexes: {area: [core, L3]}",
     "search_space.simplexes.area[1]"),
    ("n_trials: 5", "n_trials: 5\nsampler: bayes", "sampler"),
    ("n_trials: 5", "n_trials: 0", "n_trials"),
    ("n_trials: 5\n", "", "n_trials"),
    ("n_trials: 5", "n_trials: 5\nobjectives: [iteration_time_s, iteration_time_s]",
     "objectives[1]"),
    ("n_trials: 5", "n_trials: 5\nsampler_options: {n_startup: 3}",
     "sampler_options.n_startup"),
    ("n_trials: 5", "n_trials: 5\nsampler: cmaes\nobjectives: [iteration_time_s, energy_J]",
     "sampler"),
    ("hardware: deepflow-case-study", "hardware: a100-sxm4-80gb",
     "search_space.simplexes.area"),
    ("n_trials: 5", "n_trials: 5\noverrides: {logic_node: N99}", "overrides.logic_node"),
    ("simplexes: {area: [core, L2]}", "simplexes: {area: [core]}\n  params: "
     "{logic_node: [N7, N99]}", "search_space.params.logic_node[1]"),
    ("simplexes: {area: [core, L2]}", "strategy: true", "search_space.strategy"),
    ("search_space:\n  simplexes: {area: [core, L2]}", "search_space: no-such-space",
     "search_space"),
    ("n_trials: 5", "n_trials: 5\nsystem: dgx-a100\ndevices: 100000", "devices"),
]


def test_good_study_resolves(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(GOOD_STUDY)
    setup = load_study(path)
    assert setup.space.simplex_components() == {"area": ["core", "L2"]}


@pytest.mark.parametrize(("old", "new", "key"), BAD_STUDIES)
def test_bad_study_names_the_key(tmp_path, old, new, key):
    assert old in GOOD_STUDY
    path = tmp_path / "s.yaml"
    path.write_text(GOOD_STUDY.replace(old, new))
    with pytest.raises(ConfigError) as info:
        load_study(path)
    assert f"key '{key}'" in str(info.value) or f"'{key}' is missing" in str(info.value)
    assert str(path) in str(info.value)


def test_local_studies_folder_is_found_first(tmp_path, monkeypatch):
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "mine.yaml").write_text(GOOD_STUDY.replace("name: s", "name: mine"))
    monkeypatch.chdir(tmp_path)
    assert load_study("mine").name == "mine"
    assert load_study("quickstart").name == "quickstart"   # the shipped ones still work
    with pytest.raises(ConfigError, match="mine"):           # listed among the names
        load_study("nope")


# --- samplers -------------------------------------------------------------------------------


def test_sampler_factory():
    import optuna

    from crossflow.search.samplers import make_sampler

    space = load_study("quickstart").space
    tpe = make_sampler("tpe", seed=1, space=space)
    assert isinstance(tpe, optuna.samplers.TPESampler)
    cma = make_sampler("cmaes", seed=1, space=space)
    assert isinstance(cma, optuna.samplers.CmaEsSampler)
    # categoricals go to an explicit TPE sampler, not a silent random fallback
    assert isinstance(cma._independent_sampler, optuna.samplers.TPESampler)
    assert cma._warn_independent_sampling is False
    assert isinstance(make_sampler("random", seed=1), optuna.samplers.RandomSampler)
    assert isinstance(make_sampler("nsga2", seed=1, n_objectives=2,
                                   options={"population_size": 10}),
                      optuna.samplers.NSGAIISampler)
    with pytest.raises(ConfigError, match="sampler_options.popsize_typo"):
        make_sampler("cmaes", seed=1, options={"popsize_typo": 3})
    with pytest.raises(ConfigError, match="cmaes sampler optimises one objective"):
        make_sampler("cmaes", seed=1, n_objectives=2)


def test_every_sampler_from_the_factory():
    from crossflow.search.samplers import NAMES, make_sampler
    from crossflow.search.samplers.gd import GDSampler
    from crossflow.search.samplers.structured import StructuredSampler

    setup = load_study("quickstart")
    samplers = {name: make_sampler(name, seed=0, space=setup.space, setup=setup)
                for name in NAMES if name != "nsga2"}
    assert isinstance(samplers["structured"], StructuredSampler)
    assert isinstance(samplers["gd"], GDSampler)
    assert isinstance(make_sampler("gd-paper", seed=0, space=setup.space), GDSampler)
    with pytest.raises(ConfigError, match="needs the study's setup"):
        make_sampler("structured", seed=0, space=setup.space)


def test_importing_crossflow_does_not_import_optuna_or_mlflow():
    code = textwrap.dedent("""
        import sys
        import crossflow, crossflow.search, crossflow.search.space, crossflow.search.study
        from crossflow.config.loader import load_spec
        load_spec("quickstart", "studies"); load_spec("budgets-parallelism", "search_spaces")
        crossflow.predict(workload="gemm-8192", hardware="a100-sxm4-80gb")
        bad = [m for m in ("optuna", "mlflow") if m in sys.modules]
        print(",".join(bad))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""
