"""Accuracy against real-hardware measurements, asserted (issue #2 "Must show")."""

from __future__ import annotations

from pathlib import Path

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


def test_a_blocks_linear_layers_are_priced_by_their_kernel_time_whatever_the_layout():
    """Forward (x·Wᵀ), input gradient (dy·W), weight gradient (dyᵀ·x) and the bare
    row-major matmul of ten linear layers on an H200: within the GPU tolerance on the
    kernels' device time, and no layout priced more than 5 points off the others on
    average (cuBLAS runs them at much the same rate)."""
    import statistics

    from crossflow.validation.gemm import linear_sets

    (ds,) = linear_sets()
    assert len(ds.rows) == 40 and ds.passed, ds.render()
    by_pass: dict[str, list[float]] = {}
    for r in ds.rows:
        by_pass.setdefault(r.label.split()[1], []).append(r.error)
    assert sorted(by_pass) == ["dgrad", "fwd", "matmul", "wgrad"]
    means = [statistics.mean(v) for v in by_pass.values()]
    assert max(means) - min(means) <= 0.05, means


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


# --- issue #19: the weight gradients' accumulation into main_grad; sequence-parallel stage
# transfers ------------------------------------------------------------------------------------


def _table4_backward(accum: int, micro_batch: int):
    from crossflow.predict import load_hardware
    from crossflow.sim.training import _passes
    from crossflow.validation.training import TABLE4_MODEL, _spec, _tp_network

    arch = load_hardware("a100-sxm4-80gb")
    spec = _spec(**{**TABLE4_MODEL, "micro_batch_size": micro_batch,
                    "global_batch_size": micro_batch}, activation_recompute="selective")
    blocks, _ = _passes(arch, spec, 8, True, _tp_network(arch), accum=accum)
    return blocks["*-"]


def test_fused_weight_gradient_accumulation_reads_and_writes_the_fp32_buffer():
    """Each weight-gradient GEMM reads and writes the fp32 main_grad (8 B per weight, at the
    device's DRAM bandwidth and efficiency), the backward pass only; its share of the
    backward grows as the micro-batch's tokens shrink (micro-batch 1 against 4)."""
    from crossflow.config.loader import load_spec
    from crossflow.predict import load_hardware
    from crossflow.sim.training import accum_bytes
    from crossflow.validation.training import TABLE4_MODEL, _spec
    from crossflow.workloads.transformer import block_params

    assert accum_bytes(load_spec("dgx-a100", "systems").software) == 8
    # Megatron-Core's bf16 main_grad (grad_reduce_in_fp32 off): 2 B read, 2 B written
    assert accum_bytes(load_spec("dgx-h100-megatron-core", "systems").software) == 4
    dram = load_hardware("a100-sxm4-80gb").main_memory
    f0, b0 = _table4_backward(0, 4)
    f8, b8 = _table4_backward(8, 4)
    assert f8.total == f0.total and f8.grad_accum == 0.0
    weights = block_params(_spec(**TABLE4_MODEL)) / 8  # one tensor-parallel rank's block
    expected = weights * 8 / (dram.bandwidth_Bps * dram.efficiency)
    assert b8.grad_accum == pytest.approx(expected, rel=0.01)
    assert b8.total - b0.total == pytest.approx(b8.grad_accum, rel=1e-9)
    _, b1 = _table4_backward(8, 1)
    share1, share4 = b1.grad_accum / b1.total, b8.grad_accum / b8.total
    assert 3.0 < share1 / share4 < 4.5


def test_table5_meets_the_issue_19_target():
    """Korthikanti Table 5: each setting ≤ 3.5 % MAPE, the mean signed error within ±2 %
    (before the accumulation was priced: 3.3 % / 4.5 %, every pipelined row too fast)."""
    from crossflow.validation.training import korthikanti_table5

    sets = korthikanti_table5()
    errors = [r.error for ds in sets for r in ds.rows]
    for ds in sets:
        assert ds.mape <= 0.035, ds.render()
    assert abs(sum(errors) / len(errors)) <= 0.02


def test_sequence_parallel_stage_transfer_is_not_gathered_again():
    """Megatron-LM sends a sequence-parallel rank's own shard to the next stage and skips
    the scatter-gather: the stage transfer is the send/recv alone; without sequence
    parallelism the 1-D chunk is all-gathered on the receiver."""
    import crossflow
    from crossflow.validation.training import _spec

    model = dict(num_layers=96, hidden_size=12288, num_attention_heads=96, seq_length=2048,
                 vocab_size=51200, global_batch_size=64, micro_batch_size=1)
    p2p = {}
    for sp in (False, True):
        pred = crossflow.predict(
            workload=_spec(**model, activation_recompute="full"),
            hardware="a100-sxm4-80gb", system="dgx-a100",
            parallelism={"tensor_parallel": 8, "pipeline_parallel": 8, "data_parallel": 1,
                         "virtual_pipeline_stages": 3, "sequence_parallel": sp})
        p2p[sp] = pred.details["p2p_s"]
    act = 2048 * 12288 * 2
    # 6.3 MB across nodes at ~24 GB/s: ~0.27 ms; the 50 MB all-gather on NVSwitch ~0.2 ms more
    assert 0.2e-3 < p2p[True] < 0.35e-3
    assert p2p[False] - p2p[True] > 0.1e-3
    assert p2p[False] - p2p[True] < act / 100e9


def test_a_data_sets_table_keeps_its_columns_whatever_the_labels_and_values():
    """``crossflow validate`` tables: each column ends where its header does, for short
    and long case labels, tiny and large values, errors of one to three digits."""
    from crossflow.validation import DataSet

    rows = (Row("8x8x8 fp32 1t", 8.2684e-07, 8.4811e-07),
            Row("16384x12288x12288 fp16", 0.017096, 0.017031),
            Row("2048x1x2048 fp32 1t", 6.9784e-05, 0.0043183),
            Row("big", 12345.678, 1234.5))
    ds = DataSet(name="toy", source="toy.csv", quantity="time_s", rows=rows, max_mape=0.1,
                 min_spearman=0.5)
    table = ds.render().splitlines()[2:-1]
    head = table[0]
    ends = [head.index(name) + len(name) for name in ("predicted", "measured", "error")]
    for line in table[1:]:
        assert len(line) == len(head), (line, head)
        for end in ends:
            assert line[end - 1] != " " and (end == len(line) or line[end] == " "), line


# --- the documented ``python -m crossflow.validation.<script>`` commands (issue 20) ------------

REPO = Path(__file__).resolve().parents[1]
VALIDATION = REPO / "crossflow" / "validation"
#: The validation modules that are also scripts (an ``if __name__ == "__main__":`` block).
SCRIPTS = sorted(p.stem for p in VALIDATION.glob("*.py")
                 if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8"))


def _python(*args: str, timeout: float = 120):
    import subprocess
    import sys

    from crossflow.search.workers import child_env

    return subprocess.run([sys.executable, *args], cwd=REPO, env=child_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_a_documented_validation_command_prints_no_runpy_warning():
    """``python -m crossflow.validation.vtrain dgx-a100`` (docs/validation.md): its result,
    and nothing on stderr (once Python's "found in sys.modules after import of package ...
    RuntimeWarning", the package having imported the script's module before it ran)."""
    done = _python("-m", "crossflow.validation.vtrain", "dgx-a100")
    assert done.returncode == 0, done.stderr
    assert "vTrain" in done.stdout and "720 rows" in done.stdout
    assert "Warning" not in done.stderr and done.stderr == "", done.stderr


def test_importing_the_validation_package_imports_none_of_its_scripts():
    """Python warns at ``python -m crossflow.validation.X`` exactly when importing the
    package put X in sys.modules: none of the scripts is (the fits take minutes to run, so
    the other documented commands are checked by this condition, not run)."""
    assert {"collectives", "megatron_bridge", "ops", "training", "vtrain"} <= set(SCRIPTS)
    done = _python("-c", "import sys, crossflow.validation as v; "
                         "v.SUITES, v.DataSet, v.run_validation; "
                         "print(' '.join(m for m in sys.modules "
                         "if m.startswith('crossflow.validation.')))")
    assert done.returncode == 0, done.stderr
    loaded = {m.rsplit(".", 1)[1] for m in done.stdout.split()}
    assert not loaded & set(SCRIPTS), loaded


def test_the_validation_package_still_exports_its_data_set_functions():
    """The package's names once imported eagerly resolve on first use."""
    import crossflow.validation as v
    from crossflow.validation import megatron_bridge, vtrain

    assert v.vtrain_dataset is vtrain.vtrain_dataset
    assert v.megatron_bridge_moe_all is megatron_bridge.moe_all_dataset
    assert set(v.SUITES) == {"gemm", "collectives", "ops", "training"}
    assert [ds.name for ds in v.SUITES["gemm"]()] == [ds.name for ds in v.collect("gemm")]
    with pytest.raises(AttributeError):
        v.nothing_here  # noqa: B018


def test_calibrate_software_calls_every_fit_as_it_is_declared(monkeypatch):
    """``crossflow calibrate software`` runs minutes of fits, so each fit is replaced here by
    a recorder that binds the arguments ``refit_all`` passes to the fit's own signature (a
    call that no longer matches, as ``vtrain._main()`` without its argv did, fails here)."""
    import inspect

    from crossflow.validation import (
        collectives,
        megatron_bridge,
        megatron_lm,
        ops,
        refit,
        training,
        vtrain,
    )

    calls = []
    for module, name in ((collectives, "_print_vidur_fit"), (ops, "_print_fit"),
                         (vtrain, "_main"), (training, "print_fits"),
                         (megatron_bridge, "print_fit"), (megatron_lm, "print_fit")):
        signature = inspect.signature(getattr(module, name))
        qualified = f"{module.__name__.rsplit('.', 1)[1]}.{name}"

        def record(*args, _name=qualified, _signature=signature, **kwargs):
            _signature.bind(*args, **kwargs)
            calls.append((_name, args))

        monkeypatch.setattr(module, name, record)
    refit.refit_all()
    names = [n for n, _ in calls]
    assert {"collectives._print_vidur_fit", "ops._print_fit", "vtrain._main",
            "training.print_fits", "megatron_lm.print_fit"} <= set(names)
    assert [a for n, a in calls if n == "megatron_bridge.print_fit"] == [
        ("",), ("moe",), ("blackwell",)]
