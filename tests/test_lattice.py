"""The whole-unit lattice of the area simplex (:class:`crossflow.search.lattice.AreaLattice`):
every count vector it builds is built exactly, at a split that fits the budget."""

from __future__ import annotations

import numpy as np
import pytest

from crossflow.arch.cliffs import quantities_at
from crossflow.search.lattice import AreaLattice
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


def test_the_lattice_scan_moves_one_count_at_a_time_and_keeps_the_best(quickstart):
    import math

    from crossflow.search.objective import evaluate_many
    from crossflow.search.samplers.structured._inner import lattice
    from crossflow.search.samplers.structured._problem import Problem

    setup, params, _ = quickstart
    P = Problem(setup)
    x, discrete = P.split(params)

    def values(batch):
        evs = evaluate_many(setup, [setup.design(P.params(c, discrete)) for c in batch])
        return [e.values(setup.objectives)[0] if e.feasible else math.inf for e in evs]

    (f0,) = values([x])
    gen = lattice(P, discrete, x, f0, 60, np.random.default_rng(0), then=None)
    incumbent, fbest, seen, used = x, f0, set(), 0
    try:
        batch = next(gen)
        while True:
            lat = AreaLattice(setup, P.params(incumbent, discrete))
            got = values(batch)
            used += len(batch)
            for c in batch:
                assert c.key() not in seen
                seen.add(c.key())
                units = _built(setup, lat, P.params(c, discrete))
                assert sum(units[k] != n for k, n in lat.counts.items()) <= 1  # one moved
            v, i = min((v, i) for i, v in enumerate(got))
            if v < fbest:
                incumbent, fbest = batch[i], v
            batch = gen.send(got)
    except StopIteration as end:
        best, fx = end.value
    assert used <= 60 and fx == fbest < f0                 # the template's split improves
