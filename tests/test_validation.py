"""Accuracy against real-hardware measurements, asserted (issue #2 "Must show")."""

from __future__ import annotations

import pytest

from crossflow.validation import Row, spearman
from crossflow.validation.gemm import a100_msweep, cpu_sets


def test_a100_fp16_msweep_within_tolerance():
    ds = a100_msweep()
    assert len(ds.rows) == 10
    assert ds.mape <= 0.10, ds.render()
    assert ds.spearman >= 0.9, ds.render()


def test_a100_achieved_tflops_rank_matches_measurement():
    # Time ranks are easy (bigger M, longer); the achieved-throughput curve is the real test:
    # it rises from DRAM-bound small M to compute-bound large M.
    ds = a100_msweep()
    flops = [2 * int(r.label.split("x")[0]) * 12288 * 12288 for r in ds.rows]
    predicted = [f / r.predicted for f, r in zip(flops, ds.rows, strict=True)]
    measured = [f / r.measured for f, r in zip(flops, ds.rows, strict=True)]
    assert spearman(predicted, measured) >= 0.8


def test_cpu_numpy_gemms_within_tolerance():
    sets = cpu_sets()
    assert sets, "a recorded CPU GEMM CSV ships with the package"
    for ds in sets:
        assert len(ds.rows) >= 40
        assert ds.mape <= 0.25, ds.render()


def test_spearman_handles_ties_and_order():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 1, 2]) == pytest.approx(1.0)


def test_row_error_sign():
    assert Row("x", predicted=1.1, measured=1.0).error == pytest.approx(0.1)


def test_validate_gemm_cli_prints_rows_and_summary(cli, tmp_path):
    out_csv = tmp_path / "rows.csv"
    code, out, _ = cli("validate", "gemm", "--csv", out_csv)
    assert code == 0, out
    assert "MAPE" in out and "Spearman" in out and "64x12288x12288" in out
    assert out_csv.read_text().count("\n") > 10


def test_training_data_sets_meet_the_issue_tolerances():
    from crossflow.validation.training import (
        korthikanti_table4,
        korthikanti_table5,
        megatron_table1,
    )

    full, seqsel = korthikanti_table5()
    for ds in (full, seqsel):
        assert ds.mape <= 0.10, ds.render()
        assert ds.spearman >= 0.9
    table1 = megatron_table1()
    assert len(table1.rows) == 10
    assert table1.mape <= 0.10, table1.render()
    assert korthikanti_table4().mape <= 0.10


def test_sc21_micro_batch_rule_is_one_rule_not_a_fit():
    from crossflow.validation.training import sc21_micro_batch, sc21_virtual_stages

    assert sc21_micro_batch(pp=8, per_replica_batch=96) == 1
    assert sc21_micro_batch(pp=1, per_replica_batch=16) == 8
    assert sc21_micro_batch(pp=1, per_replica_batch=12) == 4
    assert sc21_virtual_stages(layers_per_stage=12, pp=8, microbatches=96) == 4
    assert sc21_virtual_stages(layers_per_stage=2, pp=64, microbatches=512) == 2
    assert sc21_virtual_stages(layers_per_stage=5, pp=8, microbatches=96) == 1


def test_shipped_software_efficiencies_match_a_fresh_fit():
    from crossflow.config.loader import load_spec
    from crossflow.validation.training import fit_software_efficiency

    gemm_eff, mem_eff = fit_software_efficiency()
    sw = load_spec("dgx-a100", "systems").software
    assert sw.gemm_efficiency == pytest.approx(gemm_eff, abs=0.002)
    assert sw.memory_bound_efficiency == pytest.approx(mem_eff, abs=0.002)


def test_sc21_software_factor_matches_a_fresh_fit():
    from crossflow.config.loader import load_spec
    from crossflow.validation.training import SC21_SYSTEM, fit_sc21_software

    gemm_eff, mem_eff = fit_sc21_software()
    sw = load_spec(SC21_SYSTEM, "systems").software
    assert sw.gemm_efficiency == pytest.approx(gemm_eff, abs=0.002)
    assert sw.memory_bound_efficiency == pytest.approx(mem_eff, abs=0.002)
