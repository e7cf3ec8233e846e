"""The whole-unit lattice of the area simplex (:class:`crossflow.search.lattice.AreaLattice`):
every count vector it builds is built exactly, at a split that fits the budget."""

from __future__ import annotations

import math

import numpy as np
import pytest

from crossflow.arch.cliffs import quantities_at
from crossflow.search.lattice import AreaLattice, wave_edges
from crossflow.search.study import load_study


@pytest.fixture(scope="module")
def quickstart():
    setup = load_study("quickstart")
    params = setup.baseline_trials()[0]
    return setup, params, AreaLattice(setup, params)


def _built(setup, lat, params):
    got = quantities_at(setup.template, setup.overrides(setup.design(params)))
    return {c: got[lat.units[c]] for c in lat.coarse}


def test_the_lattice_names_the_point_by_its_units(quickstart):
    setup, params, lat = quickstart
    assert lat.ok and lat.coarse[0] == "core" and lat.absorber == "L2"
    assert set(lat.coarse) == {"core", "registers", "L1", "dram_ctrl"}
    assert _built(setup, lat, params) == lat.counts
    assert _built(setup, lat, lat.point({})) == lat.counts        # re-centred, same units


def test_every_count_vector_near_the_point_is_built_exactly(quickstart):
    setup, _, lat = quickstart
    rng = np.random.default_rng(7)
    built = 0
    for _ in range(25):
        want = {c: n + int(rng.integers(-8, 9) if c == "core" else rng.integers(-1, 2))
                for c, n in lat.counts.items()}
        p = lat.point(want)
        if p is None:
            continue
        built += 1
        assert _built(setup, lat, p) == want
        fractions = setup.design(p).fractions["area"]
        assert sum(fractions.values()) <= 1.0 + 1e-9
    assert built >= 10          # the others over budget (more of everything) or unbuildable


def test_a_count_over_budget_or_below_one_has_no_point(quickstart):
    _, _, lat = quickstart
    assert lat.point({"core": 10**6}) is None
    assert lat.point({"registers": 0}) is None


def test_a_study_without_a_template_has_no_lattice():
    from types import SimpleNamespace

    setup = load_study("quickstart")
    bare = SimpleNamespace(space=setup.space, template=None)
    lat = AreaLattice(bare, setup.baseline_trials()[0])
    assert not lat.ok and lat.point({}) is None and "template" in lat.why


def test_wave_edges_are_the_counts_where_a_power_of_two_tiles_take_one_wave_fewer():
    # 2^10 tiles on 342 bundles are 3 waves, on 341 four; 2^11 on 293 are 7, on 292 eight
    assert wave_edges(256, (1,)) == [293, 205, 342, 171]
    for n in wave_edges(1000, (1, 3), limit=100):
        assert 1000 / 1.6 <= n <= 1600 and n != 1000
        assert any(math.ceil(t / (n - 1)) == math.ceil(t / n) + 1 <= 9
                   for t in (b * 2 ** j for b in (1, 3) for j in range(16)))
    assert len(wave_edges(1000, (1, 3))) == 6


def test_a_wave_edge_is_built_with_its_bundle_count_and_the_other_units_near_the_points(
        quickstart):
    setup, _, lat = quickstart
    edges = wave_edges(lat.bundles, (1, 3), limit=100)
    built = {n: lat.with_bundles(n) for n in edges}
    assert sum(p is not None for p in built.values()) >= len(edges) // 2
    for n, p in built.items():
        if p is None:
            continue
        got = _built(setup, lat, p)
        assert got["core"] == n
        # kept, one unit fewer, or scaled by bundles / n (more bundles need room)
        for c, k in got.items():
            if c != "core":
                assert k in (lat.counts[c], lat.counts[c] - 1,
                             max(1, round(lat.counts[c] * lat.bundles / n)))
        assert sum(setup.design(p).fractions["area"].values()) <= 1.0 + 1e-9
