"""Technology library + micro-architecture generator (AGE, paper §4.4)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossflow.arch.age import OVERRIDE_KEYS, generate
from crossflow.config import load_spec
from crossflow.config.loader import preset_dir, preset_names
from crossflow.config.template import ArchitectureTemplateSpec
from crossflow.errors import ConfigError, InfeasibleDesignError
from crossflow.tech import VoltageFrequency, library, solve_voltage

TEMPLATES = preset_names("templates")
NODES = ("N12", "N7", "N5", "N3", "N2", "N1")
PROPERTY = settings(derandomize=True, max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def case_study() -> ArchitectureTemplateSpec:
    return load_spec("deepflow-case-study", "templates")


@pytest.fixture(scope="module")
def v100_like() -> ArchitectureTemplateSpec:
    return load_spec("v100-like-n12", "templates")


def _template_dict(name: str) -> dict:
    from crossflow.config import read_yaml

    return read_yaml(preset_dir("templates") / f"{name}.yaml")


# --- shipped files -------------------------------------------------------------------------------


def test_shipped_presets_exist():
    assert {"v100-like-n12", "deepflow-case-study"} <= set(TEMPLATES)
    assert {"logic", "sram", "dram", "links"} <= set(preset_names("tech"))


@pytest.mark.parametrize("name", preset_names("tech"))
def test_every_tech_file_loads(name):
    spec = load_spec(preset_dir("tech") / f"{name}.yaml", "tech")
    assert spec.kind == "technology"


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_template_loads_and_generates(name):
    arch = generate(load_spec(name, "templates"))
    assert arch.peak_flops["fp16"] > 0
    assert all(m.bandwidth_Bps > 0 and m.capacity_B > 0 for m in arch.memory)
    assert all(link.bandwidth_Bps > 0 and link.count >= 1 for link in arch.links.values())
    json.dumps(arch.to_dict())  # the report is JSON-ready
    for part in arch.report["components"].values():
        if "area_used_mm2" in part:
            assert part["area_used_mm2"] <= part["area_budget_mm2"] * (1 + 1e-9)
            assert part["power_used_W"] <= part["power_budget_W"] * (1 + 1e-9)


@pytest.mark.parametrize("path", sorted(
    [*preset_dir("tech").glob("*.yaml"), *preset_dir("templates").glob("*.yaml")]),
    ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_number_has_a_source_comment(path):
    """The preset style: a source comment beside every number (docs/architecture.md,
    "Units and conventions")."""
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        code = line.split("#", 1)[0]
        if re.search(r":\s*\[?[0-9]", code) and "#" not in line:
            pytest.fail(f"{path.name}:{lineno} has a number without a source comment: {line!r}")


def test_library_names_and_node_rule():
    lib = library()
    assert lib.names("logic") == NODES
    assert {"HBM2", "HBM2e", "HBM3", "HBM4"} <= set(lib.names("dram"))
    assert {"NVLink2", "NVLink3", "NVLink4", "NDR-x8", "XDR-x8", "GDR-x8"} <= set(lib.names("links"))
    n12 = lib.logic("N12")
    for k, name in enumerate(NODES):  # paper §9: area ÷1.8, power ÷1.3 per node, iso-performance
        node = lib.logic(name)
        assert node.mcu_area_mm2 == pytest.approx(n12.mcu_area_mm2 / 1.8**k, rel=1e-12)
        assert node.mcu_power_W == pytest.approx(n12.mcu_power_W / 1.3**k, rel=1e-12)
        assert node.frequency_Hz == n12.frequency_Hz
    l2_12, l2_5 = lib.sram("sram-l2", "N12"), lib.sram("sram-l2", "N5")
    assert l2_5.bank_area_mm2 == pytest.approx(l2_12.bank_area_mm2 / 1.8**2)
    assert l2_5.dynamic_energy_J_per_bit == pytest.approx(l2_12.dynamic_energy_J_per_bit / 1.3**2)
    assert lib.area_factor("N12", "N3") == pytest.approx(1.8**-3)


def test_paper_case_study_dram_bandwidths():
    # per-accelerator nominal bandwidth of the paper's 4-stack node (§9): 1 / 2 / 2.6 / 3.3 TB/s
    lib = library()
    for name, tbps in {"HBM2": 1.0, "HBM2e": 2.0, "HBM3": 2.6, "HBM4": 3.3}.items():
        assert 4 * lib.dram(name).device_bandwidth_Bps == pytest.approx(tbps * 1e12)
    for name, gbps in {"NDR-x8": 100, "XDR-x8": 200, "GDR-x8": 3300, "NVLink4": 25}.items():
        assert lib.link(name).port_bandwidth_Bps == pytest.approx(gbps * 1e9)


@pytest.mark.parametrize("category, lookup", [
    ("logic", lambda lib: lib.logic("N4")),
    ("dram", lambda lib: lib.dram("HBM9")),
    ("links", lambda lib: lib.link("NVLink9")),
    ("sram", lambda lib: lib.sram("sram-l9", "N7")),
])
def test_unknown_technology_lists_what_exists(category, lookup):
    with pytest.raises(ConfigError) as err:
        lookup(library())
    assert err.value.allowed and all(n in err.value.allowed for n in library().names(category))


def test_unknown_technology_in_template_is_a_config_error(case_study):
    with pytest.raises(ConfigError, match="HBM9") as err:
        generate(case_study, overrides={"dram": "HBM9"})
    assert "HBM3" in str(err.value)
    with pytest.raises(ConfigError, match="overrides"):
        generate(case_study, overrides={"logic_nodes": "N7"})
    assert "logic_node" in OVERRIDE_KEYS


# --- V100-like template reproduces the V100 ------------------------------------------------------


def test_v100_like_matches_the_v100(v100_like):
    arch = generate(v100_like)
    assert (arch.num_bundles, arch.mcus_per_bundle) == (80, 8)
    assert arch.peak_flops["fp16"] == pytest.approx(125e12, rel=0.03)   # datasheet 125 TFLOP/s
    assert arch.peak_flops["fp32"] == pytest.approx(15.7e12, rel=0.03)
    regs, l1, l2, dram = arch.memory
    assert regs.total_capacity_B == 20 * 2**20                          # 256 KiB x 80 SMs
    assert l1.capacity_B == 128 * 2**10                                 # per SM
    assert l2.capacity_B == 6 * 2**20
    assert dram.capacity_B == 16 * 2**30
    assert arch.report["components"]["DRAM"]["count_limit"] == "package_area"


# --- the V/f root ---------------------------------------------------------------------------------


@PROPERTY
@given(ratio=st.floats(1e-9, 1e3), vnom=st.floats(0.3, 2.0), vt_share=st.floats(0.0, 0.9))
def test_vf_root_is_physical_and_exact(ratio, vnom, vt_share):
    vt = vnom * vt_share
    v = solve_voltage(ratio, vnom, vt)
    assert v > vt
    vf = VoltageFrequency(vnom, vt, vt + (vnom - vt) / 2, 2 * vnom)
    assert vf.power_ratio(v) == pytest.approx(ratio, rel=1e-9)


def test_vf_root_is_not_numpys_first_real_root():
    # Small power ratio: V(V-Vt)^2 = c has three real roots (reference BUGS.md solve_poly).
    vn, vt, ratio = 0.8, 0.2, 1e-3
    c = ratio * vn * (vn - vt) ** 2
    roots = np.roots([1.0, -2 * vt, vt * vt, -c])
    real = roots[np.abs(roots.imag) < 1e-12].real
    assert len(real) == 3 and (real <= vt).sum() == 2   # two non-physical roots below Vt
    v = solve_voltage(ratio, vn, vt)
    assert v == pytest.approx(real.max(), rel=1e-9) and v > vt


# --- core -----------------------------------------------------------------------------------------


def _core_area(t, frac):
    return generate(t, overrides={"area_fractions": {"core": frac}})


def test_more_core_area_never_lowers_peak(case_study):
    fracs = np.linspace(0.02, 0.35, 60)
    for node in ("N12", "N1"):   # N12 area-bound, N1 power-bound at the top
        peaks = [generate(case_study, overrides={"logic_node": node,
                                                 "area_fractions": {"core": f}}).peak_flops["fp16"]
                 for f in fracs]
        assert all(b >= a for a, b in zip(peaks, peaks[1:], strict=False))


def test_more_core_power_raises_frequency_until_vmax(case_study):
    node = library().logic("N12")
    fmax = node.frequency_Hz * node.vf.frequency_ratio(node.vf.max_V)
    freqs, peaks = [], []
    others = {"registers": 0.02, "L1": 0.02, "L2": 0.02, "dram_ctrl": 0.05, "intra_links": 0.01,
              "inter_links": 0.01}
    for p in np.linspace(0.01, 0.87, 120):
        over = {"power_fractions": {**others, "core": p}}
        arch = generate(case_study, overrides=over)
        core = arch.report["components"]["core"]
        peaks.append(arch.peak_flops["fp16"])
        if core["count_limit"] == "area":        # the same MCUs: only V/f changes
            freqs.append(arch.frequency_Hz)
            assert core["voltage_V"] <= node.vf.max_V + 1e-12
    assert all(b >= a for a, b in zip(peaks, peaks[1:], strict=False))
    assert all(b >= a for a, b in zip(freqs, freqs[1:], strict=False))
    assert freqs[-1] == pytest.approx(fmax, rel=1e-12)            # stops at Vmax
    assert freqs[-1] == freqs[-2]


def test_power_bound_core_sheds_bundles_at_vmin(case_study):
    arch = generate(case_study, overrides={"logic_node": "N1"})
    core = arch.report["components"]["core"]
    assert core["count_limit"] == "power" and core["mcus"] < core["mcus_by_area"]
    assert core["voltage_V"] >= library().logic("N1").vf.min_V
    assert core["power_used_W"] == pytest.approx(core["power_budget_W"], rel=1e-9)


def test_vf_operating_point_reproduces_the_budget(case_study):
    arch = generate(case_study)
    for name in ("core", "DRAM", "intra_links", "inter_links"):
        part = arch.report["components"][name]
        if part["voltage_limit"] == "power":
            assert part["power_used_W"] == pytest.approx(part["power_budget_W"], rel=1e-9)


def test_newer_logic_node_never_lowers_peak():
    for name in TEMPLATES:
        t = load_spec(name, "templates")
        peaks = [generate(t, overrides={"logic_node": n}).peak_flops["fp16"] for n in NODES]
        assert all(b >= a for a, b in zip(peaks, peaks[1:], strict=False)), (name, peaks)


# --- memory and links ---------------------------------------------------------------------------


def test_newer_hbm_gives_more_bandwidth_at_equal_budgets():
    for name in TEMPLATES:
        t = load_spec(name, "templates")
        bw = [generate(t, overrides={"dram": d}).main_memory.bandwidth_Bps
              for d in ("HBM2", "HBM2e", "HBM3", "HBM4")]
        assert bw[2] > bw[0], name                                  # HBM3 > HBM2
        assert all(b > a for a, b in zip(bw, bw[1:], strict=False)), (name, bw)


def test_dram_power_beyond_vmax_clamps(v100_like):
    # reference BUGS.md: DRAM power 480 W on V100 -> AttributeError in the reference
    arch = generate(v100_like, overrides={"power_fractions": {"dram_ctrl": 0.88, "core": 0.05,
                                                              "registers": 0.02, "L1": 0.02}})
    dram = arch.report["components"]["DRAM"]
    tech = library().dram("HBM2")
    assert dram["voltage_limit"] == "max_voltage" and dram["voltage_V"] == tech.vf.max_V
    assert arch.main_memory.bandwidth_Bps == pytest.approx(
        4 * tech.device_bandwidth_Bps * tech.vf.frequency_ratio(tech.vf.max_V))
    assert dram["power_used_W"] < dram["power_budget_W"]


def test_sram_bandwidth_is_capped_by_bank_ports(v100_like):
    arch = generate(v100_like, overrides={"power_fractions": {"L2": 0.3, "registers": 0.0122}})
    l2 = arch.report["components"]["L2"]
    assert l2["bandwidth_limit"] == "bank_ports"
    assert arch.memory[2].bandwidth_Bps == pytest.approx(l2["bandwidth_by_bank_ports_Bps"])
    assert l2["power_used_W"] < l2["power_budget_W"]


def test_crossbar_grows_with_clients(case_study):
    few = generate(case_study, overrides={"area_fractions": {"core": 0.1}})
    many = generate(case_study)
    assert many.num_bundles > few.num_bundles
    assert many.memory[2].capacity_B < few.memory[2].capacity_B   # L2 loses banks to crossbar


def test_links_bandwidth_is_ports_times_rate(case_study):
    arch = generate(case_study, overrides={"inter_link": "XDR-x8",
                                           "power_fractions": {"inter_links": 0.2, "core": 0.2}})
    inter, tech = arch.links["inter"], library().link("XDR-x8")
    rep = arch.report["components"]["inter_links"]
    assert inter.bandwidth_Bps == pytest.approx(inter.count * tech.lanes_per_port
                                                * rep["lane_rate_Bps"])
    assert rep["lane_rate_Bps"] <= tech.lane_rate_Bps * (1 + 1e-12)   # max voltage = nominal
    assert "intra" not in generate(case_study, overrides={"intra_link": None}).links


# --- infeasible budgets and bad fractions -------------------------------------------------------


@pytest.mark.parametrize("budget", ["area_fractions", "power_fractions"])
@pytest.mark.parametrize("component", ["core", "registers", "L1", "L2", "dram_ctrl",
                                       "intra_links", "inter_links"])
def test_zero_budget_is_infeasible_with_numbers(case_study, budget, component):
    with pytest.raises(InfeasibleDesignError) as err:
        generate(case_study, overrides={budget: {component: 0.0}})
    assert any(ch.isdigit() for ch in str(err.value))


@pytest.mark.parametrize("kind", ["dram", "intra", "inter"])
def test_zero_perimeter_is_infeasible(case_study, kind):
    with pytest.raises(InfeasibleDesignError, match="perimeter"):
        generate(case_study, overrides={"perimeter_fractions": {kind: 0.0}})


def test_tiny_power_for_one_unit_is_infeasible(case_study):
    with pytest.raises(InfeasibleDesignError, match="cannot run one"):
        generate(case_study, overrides={"power_fractions": {"core": 1e-4}})


@pytest.mark.parametrize("key, values", [
    ("area_fractions", {"core": 0.9, "L2": 0.2}),
    ("power_fractions", {"core": 0.7, "registers": 0.5}),
    ("perimeter_fractions", {"dram": 0.8, "inter": 0.3}),
])
def test_fractions_over_one_name_the_key(key, values):
    data = _template_dict("deepflow-case-study")
    data[key] = {**data[key], **values}
    with pytest.raises(ConfigError) as err:
        load_spec(data, "templates")
    assert err.value.key == key and key in str(err.value)
    with pytest.raises(ConfigError) as err:
        generate(load_spec("deepflow-case-study", "templates"), overrides={key: values})
    assert err.value.key == key


@pytest.mark.parametrize("key, value, where", [
    ("area_fractions", {"core": 1.5}, "area_fractions.core"),
    ("power_fractions", {"core": -0.1}, "power_fractions.core"),
    ("area_fractions", {"L3": 0.1}, "area_fractions.L3"),
])
def test_bad_single_fraction_names_the_key(key, value, where):
    data = _template_dict("v100-like-n12")
    data[key] = {**data[key], **value}
    with pytest.raises(ConfigError) as err:
        load_spec(data, "templates")
    assert where in str(err.value)


def test_chip_larger_than_node_is_a_config_error():
    data = _template_dict("v100-like-n12")
    data["chip_area_mm2"] = 2000
    with pytest.raises(ConfigError, match="chip_area_mm2"):
        load_spec(data, "templates")


# --- monotonicity properties ----------------------------------------------------------------------


def _area_output(arch, key):
    if key == "core":
        return arch.peak_flops["fp16"]
    if key == "dram_ctrl":
        return arch.main_memory.capacity_B
    if key.endswith("_links"):
        return arch.links[key.removesuffix("_links")].bandwidth_Bps
    return next(m.total_capacity_B for m in arch.memory if m.name == key)


def _power_output(arch, key):
    if key == "core":
        return arch.peak_flops["fp16"]
    if key == "dram_ctrl":
        return arch.main_memory.bandwidth_Bps
    if key.endswith("_links"):
        return arch.links[key.removesuffix("_links")].bandwidth_Bps
    return next(m.bandwidth_Bps for m in arch.memory if m.name == key)


def _perimeter_output(arch, key):
    return arch.main_memory.capacity_B if key == "dram" else arch.links[key].bandwidth_Bps


_SETS = {
    "area_fractions": ("core", "registers", "L1", "L2", "dram_ctrl", "intra_links", "inter_links"),
    "power_fractions": ("core", "registers", "L1", "L2", "dram_ctrl", "intra_links",
                        "inter_links"),
    "perimeter_fractions": ("dram", "intra", "inter"),
}
_OUTPUT = {"area_fractions": _area_output, "power_fractions": _power_output,
           "perimeter_fractions": _perimeter_output}


@st.composite
def _budget_change(draw):
    """Template fractions jittered ×[0.3, 3] (renormalised if over 1), one of them raised."""
    template = draw(st.sampled_from(TEMPLATES))
    node = draw(st.sampled_from(NODES))
    dram = draw(st.sampled_from(("HBM2", "HBM2e", "HBM3", "HBM4")))
    kind = draw(st.sampled_from(sorted(_SETS)))
    spec = load_spec(template, "templates")
    base = dict(getattr(spec, kind))
    jitter = {k: base.get(k, 0.0) * draw(st.floats(0.3, 3.0)) for k in _SETS[kind]}
    total = sum(jitter.values())
    if total > 0.98:
        jitter = {k: v * 0.98 / total for k, v in jitter.items()}
    key = draw(st.sampled_from(_SETS[kind]))
    room = 1.0 - sum(jitter.values())
    raised = {**jitter, key: jitter[key] + room * draw(st.floats(0.0, 1.0))}
    return spec, {"logic_node": node, "dram": dram}, kind, key, jitter, raised


@PROPERTY
@given(change=_budget_change())
def test_raising_one_fraction_never_lowers_its_output(change):
    spec, tech, kind, key, before, after = change
    try:
        low = generate(spec, overrides={**tech, kind: before})
    except InfeasibleDesignError:
        return  # the jittered starting point itself cannot be built
    try:
        high = generate(spec, overrides={**tech, kind: after})
    except InfeasibleDesignError as exc:
        # more core area means more bundles, so an L2 crossbar to more clients: a cross-effect
        # on another component, never on the one whose share grew
        assert not str(exc).startswith(key.replace("_links", " links")), str(exc)
        return
    if key in ("intra", "inter", "intra_links", "inter_links") and \
            key.split("_")[0] not in low.links:
        return
    out = _OUTPUT[kind]
    assert out(high, key) >= out(low, key) * (1 - 1e-12), (kind, key, before, after)


@PROPERTY
@given(ratio=st.floats(1e-4, 50.0), more=st.floats(1.0, 10.0))
def test_more_power_never_lowers_frequency_for_fixed_hardware(ratio, more):
    vf = library().logic("N7").vf
    v1, _ = vf.voltage_for(ratio)
    v2, _ = vf.voltage_for(ratio * more)
    assert vf.min_V <= v1 <= v2 <= vf.max_V
    assert vf.frequency_ratio(v2) >= vf.frequency_ratio(v1)


def test_generate_is_deterministic_and_pure(case_study):
    a = generate(case_study, overrides={"logic_node": "N5", "dram": "HBM3"})
    b = generate(case_study, overrides={"logic_node": "N5", "dram": "HBM3"})
    assert a.to_dict() == b.to_dict()
    c = generate(case_study)
    assert c.report["technology"]["logic_node"] == "N12"
    assert math.isclose(c.peak_flops["fp16"], generate("deepflow-case-study").peak_flops["fp16"])
