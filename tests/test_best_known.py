"""best_known's phase 6: the integer area designs around the refined optimum, enumerated."""

from __future__ import annotations

import math

import pytest

from crossflow.search import best_known as bk
from crossflow.search.study import load_study

SMALL = {"samples": 20, "top_k": 2, "refine": 1, "refine_evals": 40, "hops": 5,
         "enum_core_radius": 2, "enum_radius": 1, "enum_top": 2, "enum_power_evals": 20,
         "enum_rounds": 2}


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
    assert e["value_after"] <= e["value_before"] and r["value"] == e["value_after"]
    assert e["improved"] == (e["value_after"] < e["value_before"])
    assert [p["phase"] for p in r["phases"]] == ["screen", "sample", "refine", "recheck",
                                                 "perturbation", "enumeration"]
    assert r["phases"][-1]["evaluations"] == r["evaluations"]
    assert all(a["best"] >= b["best"] for a, b in zip(r["phases"], r["phases"][1:],
                                                       strict=False))


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
