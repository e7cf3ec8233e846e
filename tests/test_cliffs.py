"""Cliffs of the AGE (crossflow.arch.cliffs): integer quantities and their step thresholds."""

from __future__ import annotations

import bisect
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossflow.arch.age import generate
from crossflow.arch.cliffs import (
    CONVENTIONS,
    FEASIBLE,
    SIMPLEXES,
    Step,
    coordinate_overrides,
    coordinate_range,
    edges,
    quantities,
    quantities_at,
    steps,
    thresholds,
    transfer_amount,
)
from crossflow.arch.paper_check import paper_check
from crossflow.config import load_spec
from crossflow.config.template import PERIMETER_KEYS
from crossflow.errors import ConfigError

NODES = ("N12", "N7", "N5", "N3", "N2", "N1")
SPECS = {name: load_spec(name, "templates") for name in ("deepflow-case-study", "v100-like-n12")}
HAIR = 1e-10

# The paper-lstm-512 best-known design (crossflow.search.best_known, 0.4352 s, cached
# 2026-11; rounded to 6 digits): 175 bundles, 3 register banks (48 KiB) per MCU.
LSTM512_BEST = {
    "area_fractions": {"core": 0.654956, "registers": 0.073726, "L1": 0.064849, "L2": 0.150102,
                       "dram_ctrl": 0.02709, "intra_links": 0.014674, "inter_links": 0.014383},
    "power_fractions": {"core": 0.523216, "registers": 0.155993, "L1": 0.020866, "L2": 0.008232,
                        "dram_ctrl": 0.059441, "intra_links": 0.000289, "inter_links": 0.231674},
    "perimeter_fractions": {"dram": 0.296894, "intra": 0.500442, "inter": 0.201908},
}


def _with(overrides: dict, simplex: str, component: str, f: float) -> dict:
    key = SIMPLEXES[simplex]
    return {**overrides, key: {**overrides.get(key, {}), component: float(f)}}


# --- quantities ------------------------------------------------------------------------------


def test_quantities_of_the_case_study():
    arch = generate(SPECS["deepflow-case-study"])
    q = quantities(arch)
    assert q == {
        "core.bundles": 93, "core.mcus": 744,
        "registers.banks_per_instance": 15, "registers.capacity_per_instance_B": 15 * 16384,
        "registers.instances": 744,
        "L1.banks_per_instance": 33, "L1.capacity_per_instance_B": 33 * 32768,
        "L1.instances": 93,
        "L2.banks_per_instance": 290, "L2.capacity_per_instance_B": 290 * 32768,
        "L2.instances": 1,
        "DRAM.devices": 4, "DRAM.pins": 4096,
        "intra_links.ports": 9135, "intra_links.lanes": 9135,
        "inter_links.ports": 6, "inter_links.lanes": 48,
    }
    assert all(isinstance(v, int) for v in q.values())


def test_quantities_at_marks_infeasible_designs():
    spec = SPECS["deepflow-case-study"]
    assert quantities_at(spec)[FEASIBLE] == 1
    assert quantities_at(spec, {"area_fractions": {"core": 0.001}}) == {FEASIBLE: 0}


def test_v100_has_no_intra_link_quantities():
    q = quantities(generate(SPECS["v100-like-n12"]))
    assert "intra_links.ports" not in q and q["inter_links.ports"] > 0
    assert q["core.bundles"] == 80 and q["registers.capacity_per_instance_B"] == 32768


# --- known steps -------------------------------------------------------------------------------


def test_core_area_bundle_steps_are_closed_form():
    spec = SPECS["deepflow-case-study"]
    found = [s for s in steps(spec, None, "area", "core") if s.quantity == "core.bundles"]
    # 8 MCUs of 0.38 mm2 per bundle on 815 mm2: bundle b needs b * 3.04 / 815 of the area
    assert [s.above for s in found] == list(range(2, 94))
    for s in found:
        assert s.below == s.above - 1
        assert s.fraction == pytest.approx(s.above * 8 * 0.38 / 815, abs=1e-9)
    assert steps(spec, None, "area", "core")[0] == Step(
        pytest.approx(3.04 / 815, abs=1e-9), FEASIBLE, 0, 1)


def _register_cliff(found: list[Step]) -> tuple[float, int]:
    """(fraction, bundles above it) of the core-area step where registers per MCU drop."""
    regs = [s for s in found if s.quantity == "registers.capacity_per_instance_B"]
    assert [(s.below, s.above) for s in regs] == [(48 * 1024, 32 * 1024)]
    (bundles,) = [s for s in found if s.quantity == "core.bundles" and s.fraction == regs[0].fraction]
    return regs[0].fraction, bundles.above


def test_lstm512_register_cliff():
    """The issue's cliff: 177 bundles drop registers per MCU from 48 to 32 KiB."""
    spec = SPECS["deepflow-case-study"]
    q = quantities(generate(spec, overrides=LSTM512_BEST))
    assert q["core.bundles"] == 175 and q["registers.capacity_per_instance_B"] == 48 * 1024
    # moving the core share as the softmax encoding does (the others, registers included,
    # scale by (1 - f) / (1 - f0)): registers fall to 0.07261 of the area at 177 bundles,
    # 2.99 banks per MCU -> the cliff at exactly 177 bundles
    found = steps(spec, LSTM512_BEST, "area", "core", 0.6, 0.7, convention="proportional")
    t, bundles = _register_cliff(found)
    assert bundles == 177 and t == pytest.approx(177 * 8 * 0.38 / 815, abs=1e-9)   # 0.660221
    e = edges(spec, LSTM512_BEST, "area", "core", 0.657, k=1, both_sides=True,
              convention="proportional", only=("core.bundles",))
    assert len(e) == 4

    def at(x: float) -> dict:
        return quantities_at(spec, coordinate_overrides(spec, LSTM512_BEST, "area", "core", x,
                                                        convention="proportional"))

    assert (at(max(x for x in e if x < t))["registers.capacity_per_instance_B"],
            at(min(x for x in e if x > t))["registers.capacity_per_instance_B"]) == (49152, 32768)
    assert [at(x)["core.bundles"] for x in e] == [175, 176, 176, 177]
    # with the registers share held at 0.073726 (60.09 mm2; L2 lowered to 0.12 to give the
    # core room), 3 banks per MCU last while 8 b x 0.013981 mm2 x 3 <= 60.09 mm2: the step
    # is at 180 bundles
    room = {**LSTM512_BEST, "area_fractions": {**LSTM512_BEST["area_fractions"], "L2": 0.12}}
    t, bundles = _register_cliff(steps(spec, room, "area", "core", 0.6, 0.7))
    assert bundles == 180 and t == pytest.approx(180 * 8 * 0.38 / 815, abs=1e-9)


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize(("simplex", "component", "only"), [
    ("area", "core", (FEASIBLE, "core.", "registers.banks_per_instance")),
    ("power", "registers", (FEASIBLE, "registers.")),
    ("perimeter", "inter", ("inter_links.ports",)),
])
def test_thresholds_are_the_fractions_of_the_steps_of_the_named_quantities(
        convention, simplex, component, only):
    """The driver's fast path: the same fractions as every step filtered by name, each once
    and sorted, without the feasibility steps unless named."""
    spec = SPECS["deepflow-case-study"]
    every = steps(spec, LSTM512_BEST, simplex, component, convention=convention)
    want = sorted({s.fraction for s in every if s.quantity.startswith(only)})
    got = thresholds(spec, LSTM512_BEST, simplex, component, only, convention=convention)
    assert got == want and got
    if convention == "proportional":     # every component's units step: most are dropped
        assert {s.quantity for s in every if not s.quantity.startswith(only)}


def test_range_is_clipped_to_the_slack():
    spec = SPECS["deepflow-case-study"]            # area fractions sum to 1: no slack
    assert coordinate_range(spec, None, "area", "core") == (0.0, pytest.approx(0.35))
    assert max(s.fraction for s in steps(spec, None, "area", "core", 0, 1)) <= 0.35 + 1e-12
    assert steps(spec, None, "area", "core", 0.5, 0.9) == []


def test_sram_power_feasibility_step():
    spec = SPECS["deepflow-case-study"]
    (s,) = steps(spec, None, "power", "registers")
    static = 744 * 15 * 16384 * 8 * 9e-12                     # banks x bits x W/bit (eq. 2)
    assert s.quantity == FEASIBLE and (s.below, s.above) == (0, 1)
    assert s.fraction == pytest.approx(static / 300, rel=1e-9)


def test_bad_coordinate_is_a_config_error():
    spec = SPECS["deepflow-case-study"]
    with pytest.raises(ConfigError):
        steps(spec, None, "volume", "core")
    with pytest.raises(ConfigError):
        steps(spec, None, "perimeter", "core")


def test_edges_buy_the_next_unit():
    spec = SPECS["v100-like-n12"]
    for simplex, component, f in (("area", "core", 0.25), ("power", "core", 0.03),
                                  ("power", "inter_links", 0.005), ("perimeter", "dram", 0.05)):
        e = edges(spec, None, simplex, component, f, k=2)
        assert len(e) == 4 and sum(x <= f for x in e) == 2
        for x in e:
            at = quantities_at(spec, _with({}, simplex, component, x))
            before = quantities_at(spec, _with({}, simplex, component, x - 2 * HAIR))
            assert at != before, (simplex, component, x)


# --- property test: steps() against a brute-force scan of generate() -------------------------


@st.composite
def coordinates(draw):
    name = draw(st.sampled_from(sorted(SPECS)))
    spec = SPECS[name]
    overrides: dict = {"logic_node": draw(st.sampled_from(NODES))}
    for simplex, key in SIMPLEXES.items():
        base = getattr(spec, key)
        keys = PERIMETER_KEYS if simplex == "perimeter" else spec.budget_keys
        weights = {k: base.get(k, 0.0) * math.exp(draw(st.floats(-1.0, 1.0))) for k in keys}
        total = sum(weights.values()) or 1.0
        keep = 1.0 - draw(st.sampled_from([0.0, 0.0, 0.05, 0.3]))
        overrides[key] = {k: w / total * keep for k, w in weights.items()}
    simplex = draw(st.sampled_from(sorted(SIMPLEXES)))
    keys = PERIMETER_KEYS if simplex == "perimeter" else spec.budget_keys
    component = draw(st.sampled_from(keys))
    convention = draw(st.sampled_from(CONVENTIONS))
    _, f_max = coordinate_range(spec, overrides, simplex, component, convention=convention)
    if draw(st.booleans()):
        lo, hi = 0.0, 1.0
    else:
        width = f_max * 10 ** draw(st.floats(-3.0, 0.0))
        lo = draw(st.floats(0.0, 1.0)) * max(0.0, f_max - width)
        hi = lo + width
    return spec, overrides, simplex, component, convention, lo, hi


def _changed(a: dict, b: dict) -> list[str]:
    if a[FEASIBLE] != b[FEASIBLE]:
        return [FEASIBLE]
    if not a[FEASIBLE]:
        return []
    return [q for q in a if a[q] != b[q]]


@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(coordinates())
def test_steps_match_a_brute_force_scan(case):
    spec, overrides, simplex, component, convention, lo, hi = case
    _, f_max = coordinate_range(spec, overrides, simplex, component, convention=convention)
    lo, hi = max(0.0, lo), min(hi, f_max)
    found = steps(spec, overrides, simplex, component, lo, hi, convention=convention)

    def at(x: float) -> dict:
        return quantities_at(spec, coordinate_overrides(spec, overrides, simplex, component, x,
                                                        convention=convention))

    assert all(lo < s.fraction <= hi for s in found)
    assert [s.fraction for s in found] == sorted(s.fraction for s in found)
    if not hi > lo:
        assert found == []
        return
    by_quantity: dict[str, list[float]] = {}
    for s in found:
        by_quantity.setdefault(s.quantity, []).append(s.fraction)

    def reported(q: str, a: float, b: float) -> bool:
        for name in (q, FEASIBLE):
            ts = by_quantity.get(name, [])
            i = bisect.bisect_left(ts, a - 1e-9)
            if i < len(ts) and ts[i] <= b + 1e-9:
                return True
        return False

    # completeness: every change the scan sees lies in its grid cell next to a reported step
    grid = np.linspace(lo, hi, 250)
    scan = [at(x) for x in grid]
    for i in range(len(grid) - 1):
        for q in _changed(scan[i], scan[i + 1]):
            assert reported(q, grid[i], grid[i + 1]), (q, grid[i], grid[i + 1], scan[i].get(q),
                                                        scan[i + 1].get(q))
    # soundness: every reported step (a sample of them) is a real change of that quantity
    for s in found[:: max(1, len(found) // 25)]:
        x_below, x_above = s.fraction - HAIR, min(hi, s.fraction + HAIR)
        if x_below < lo:
            continue
        below, above = at(x_below), at(x_above)
        if s.quantity == FEASIBLE:
            assert (below[FEASIBLE], above[FEASIBLE]) == (s.below, s.above), s
        else:
            assert below[FEASIBLE] and above[FEASIBLE], s
            assert (below[s.quantity], above[s.quantity]) == (s.below, s.above), s


# --- the paper's §9 numbers ----------------------------------------------------------------


def test_paper_check_rows():
    rows = {r["technology"]: r for r in paper_check()}
    assert set(rows) >= {"HBM2", "HBM2e", "HBM3", "HBM4", "NDR-x8", "XDR-x8", "GDR-x8"}
    for name in ("NDR-x8", "XDR-x8", "GDR-x8"):      # one x8 port at nominal = the paper
        assert rows[name]["unit_nominal_Bps"] == pytest.approx(rows[name]["paper_Bps"])
    for name in ("HBM2", "HBM2e", "HBM3", "HBM4"):    # 4 stacks at nominal = the paper
        assert rows[name]["nominal_Bps"] == pytest.approx(rows[name]["paper_Bps"])
    ndr = rows["NDR-x8"]                                 # the 317 GB/s
    assert ndr["age_Bps"] == pytest.approx(317.5e9, rel=1e-3)
    assert ndr["units"] == 6 and ndr["count_limit"] == "power"
    assert ndr["ratio"] == pytest.approx(ndr["age_Bps"] / 100e9)


def test_proportional_convention_scales_the_others_and_the_slack():
    spec = SPECS["v100-like-n12"]              # power fractions sum to 0.95815
    o = coordinate_overrides(spec, None, "power", "core", 0.5, convention="proportional")
    p = o["power_fractions"]
    scale = (1 - 0.5) / (1 - 0.3745)
    assert p["core"] == 0.5 and p["registers"] == pytest.approx(0.3022 * scale)
    slack = 1 - sum(spec.power_fractions.values())                     # 0.04185
    assert 1 - sum(p.values()) == pytest.approx(slack * scale)
    assert coordinate_range(spec, None, "power", "core", convention="proportional") == (0.0, 1.0)
    held = coordinate_overrides(spec, None, "power", "core", 0.4)["power_fractions"]
    assert held["registers"] == 0.3022 and held["core"] == 0.4
    with pytest.raises(ConfigError):
        steps(spec, None, "power", "core", convention="softmax")


# --- pairwise transfers (unit exchanges) ------------------------------------------------------


@pytest.mark.parametrize("simplex, to, donor, quantity, units", [
    ("area", "registers", "core", "registers.banks_per_instance", 1),   # fewer MCUs share
    ("area", "L1", "L2", "L1.banks_per_instance", 1),
    ("power", "core", "dram_ctrl", "DRAM.devices", -1),                # a device's power
    ("area", "L2", "core", "core.bundles", -1),
])
def test_transfer_amount_is_the_first_point_of_a_scan_that_buys_the_unit(
        simplex, to, donor, quantity, units):
    spec = SPECS["deepflow-case-study"]
    key = SIMPLEXES[simplex]

    def at(t: float) -> dict:
        fr = dict(LSTM512_BEST[key])
        fr[to] += t
        fr[donor] -= t
        return quantities_at(spec, {**LSTM512_BEST, key: fr})

    q0 = at(0.0)[quantity]
    want = q0 + units
    t = transfer_amount(spec, LSTM512_BEST, simplex, to, donor, quantity, units)
    assert t is not None and 0.0 < t < LSTM512_BEST[key][donor]
    grid = np.linspace(0.0, LSTM512_BEST[key][donor], 400)
    if units > 0:
        assert at(t)[FEASIBLE] and at(t)[quantity] == want
        assert at(t - 2e-6)[quantity] < want                      # no less buys it
        first = next(x for x in grid if at(x)[FEASIBLE] and at(x)[quantity] >= want)
        assert first - grid[1] <= t <= first
    else:
        assert at(t)[FEASIBLE] and at(t)[quantity] == want        # one unit fewer, kept
        after = at(t + 2e-6)
        assert not after[FEASIBLE] or after[quantity] < want      # no more can be given
        last = max(x for x in grid if at(x)[FEASIBLE] and at(x)[quantity] >= want)
        assert last <= t <= last + grid[1]


def test_transfer_amount_is_none_when_the_donor_cannot_pay():
    spec = SPECS["deepflow-case-study"]
    # the DRAM devices are bound by more than the controller area here (the perimeter or
    # the package): no area buys one more
    assert transfer_amount(spec, LSTM512_BEST, "area", "dram_ctrl", "L2", "DRAM.devices") is None
    with pytest.raises(ConfigError):
        transfer_amount(spec, LSTM512_BEST, "area", "core", "core", "core.bundles")
