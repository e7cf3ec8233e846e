"""benchmarks/bench_basin.py, the diagnosis of where the structured driver ends on a suite
study (docs/search-benchmarks.md): a smoke run on a small study with a quick reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
bench_basin = pytest.importorskip("bench_basin")


def test_the_diagnosis_compares_the_driver_with_the_best_known_design(tmp_path):
    d = bench_basin.diagnose("gemm-mem-64k-1chip-n5", budget=60, root=str(tmp_path),
                             quick=True, cma_evals=12, hops=2, hop_evals=10,
                             from_evals=10, shake_evals=10, pairs=True, axial_evals=12)
    bk, drv = d["best_known"], d["driver"]
    assert bk["gap_pct"] == 0.0
    assert drv["value"] >= bk["value"] * (1 - 1e-12) or drv["gap_pct"] < 0
    assert drv["gap_pct"] == pytest.approx(100 * (drv["value"] / bk["value"] - 1), abs=1e-3)
    # whole units of both designs, from the AGE
    assert bk["units"]["core.bundles"] >= 1 and drv["units"]["core.bundles"] >= 1
    assert set(bk["shares"]) == set(drv["shares"]) == {"area", "power"}
    # two simplexes: the driver's power on the best-known's area is the same design as the
    # best-known's area on the driver's power
    swaps = d["swapped_simplexes_gap_pct"]
    assert swaps["best-known area on the driver's"] == swaps["driver's power on the best-known"]
    # CMA-ES and the hops start from the driver's end point: never worse than it
    for runs in (*d["local_cma_from_driver_gap_pct"].values(),):
        assert len(runs) == 3 and all(g <= drv["gap_pct"] + 1e-9 for g in runs)
    assert all(len(v) == 2 for v in d["basin_hops_gap_pct"].values())
    assert set(d["local_search_from_best_known_simplex_gap_pct"]) == {
        "best-known area", "best-known power"}
    # every share halved and doubled, then searched: never worse than the shake itself
    shakes = d["shakes_gap_pct"]
    assert {k.rsplit(" ", 1)[1] for k in shakes} == {"x0.5", "x2"}
    assert {k.split(".")[0] for k in shakes} == {"area", "power"}
    assert all(v["searched"] <= v["shaken"] + 1e-9 for v in shakes.values()
               if v["shaken"] is not None)
    # two shares of one simplex moved together (five components: ten pairs, four factors
    # each, less those the encoding's floor or the whole budget refuses), every shake
    # ranked once by its shaken value
    two = d["pair_shakes_gap_pct"]
    assert two and all("+" in k.split(" ")[0] for k in two)
    assert {k.rsplit(" ", 1)[1] for k in two} <= {"x0.25", "x0.5", "x2", "x4"}
    assert all(v["searched"] <= v["shaken"] + 1e-9 for v in two.values()
               if v["shaken"] is not None)
    ranks = sorted(v["rank_by_shaken"] for v in (*shakes.values(), *two.values()))
    assert ranks == list(range(len(shakes) + len(two)))
    # the template's split and its axial probes (two shares each, where the template's
    # share is below them), each searched in the best-known design's discrete choices
    axial = d["axial_from_template_gap_pct"]
    assert "template" in axial and len(axial) > 1
    assert {k.split(" ")[1] for k in axial if k != "template"} <= {"0.5", "0.8"}
    assert {k.split(".")[0] for k in axial if k != "template"} == {"area", "power"}
    assert all(v["searched"] <= v["probed"] + 1e-9 for v in axial.values()
               if v["probed"] is not None)
    # ... and its best on the way (after 10 of its 12 evaluations), never better than at
    # its end
    assert all(set(v["after"]) <= {10} for v in axial.values())
    assert any(v["after"] for v in axial.values())
    assert all(g >= v["searched"] - 1e-9 for v in axial.values() for g in v["after"].values())
