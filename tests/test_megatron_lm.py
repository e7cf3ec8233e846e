"""Megatron-LM's own H100 weak-scaling table and the ``dgx-h100-megatron-lm`` profile
(crossflow/validation/megatron_lm.py): Megatron-LM's loop, not NeMo's."""

from __future__ import annotations

import pytest

from crossflow.config.loader import load_spec
from crossflow.validation import megatron_lm as mlm

#: the profile's constants that are Megatron-LM's own; everything else is the NeMo profile's
OWN = {"name", "iteration_s", "grad_reduce_bytes", "main_grad_bytes"}


def test_the_file_is_nine_gpt_models_and_its_derived_columns_follow_from_the_printed_ones():
    rows = mlm.rows()
    assert [r["model_size"] for r in rows] == ["1.7B", "7.1B", "16B", "32B", "70B", "119B",
                                               "177B", "314B", "462B"]
    for r in rows:
        L, h, B = int(r["num_layers"]), int(r["hidden_size"]), int(r["global_batch_size"])
        s, v = mlm.SEQ_LENGTH, mlm.VOCAB
        # Megatron-LM's count (core_r0.8.0) for GPT blocks: MHA, a 4h MLP
        flops = 12 * B * s * L * h * h * ((2 + s / h) + 4 + v / (2 * L * h))
        assert float(r["derived_flops_per_iter"]) == pytest.approx(flops, rel=1e-5)
        gpus, tflops = int(r["num_gpus"]), float(r["tflops_per_gpu"])
        assert float(r["derived_iter_time_s"]) == pytest.approx(flops / (gpus * tflops * 1e12),
                                                                abs=1e-4)
        assert gpus == int(r["tensor_parallel"]) * int(r["pipeline_parallel"]) * int(
            r["data_parallel"])
        assert float(r["aggregate_pflops"]) == pytest.approx(gpus * tflops / 1e3, rel=2e-3)


def test_the_megatron_lm_profile_is_the_nemo_one_but_for_its_gradients_and_tail():
    lm = load_spec(mlm.SYSTEM, "systems")
    nemo = load_spec(mlm.NEMO_SYSTEM, "systems")
    ours, theirs = lm.software.model_dump(), nemo.software.model_dump()
    assert {k for k in ours if ours[k] != theirs[k]} == OWN
    assert (lm.software.grad_reduce_bytes, lm.software.main_grad_bytes) == (4, 4)
    assert lm.software.iteration_s < nemo.software.iteration_s
    assert lm.model_dump(exclude={"name", "description", "software"}) == nemo.model_dump(
        exclude={"name", "description", "software"})


def test_the_tail_is_fitted_on_the_unpipelined_rows_and_the_pipelined_ones_hold():
    assert {int(r["pipeline_parallel"]) for r in mlm.fit_rows()} == {1}
    assert len(mlm.fit_rows()) == 4 and len(mlm.held_out_rows()) == 5
    fitted = mlm.fit_tail()
    assert fitted == pytest.approx(load_spec(mlm.SYSTEM, "systems").software.iteration_s,
                                   abs=0.002)
    fit, held = mlm.datasets()
    assert "fit data" in fit.name and "held out" in held.name
    assert fit.passed and held.passed
    assert held.mape < 0.05  # 2.0 % when written


def test_nemos_profile_makes_the_short_iterations_too_slow():
    # its 280 ms tail, fitted to NeMo's multi-second iterations, is a third of these
    errors = [mlm.predict_row(r, mlm.NEMO_SYSTEM) / float(r["tflops_per_gpu"]) - 1
              for r in mlm.fit_rows()]
    assert all(e < -0.05 for e in errors), errors
