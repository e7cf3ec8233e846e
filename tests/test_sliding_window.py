"""Sliding-window attention in Megatron-LM's names (``window_size``,
``window_attn_skip_freq``; crossflow/config/attention_window.py): which layers have a
window, what the flash kernel skips, the checks Transformer Engine makes, and GPT-OSS's
alternating layers."""

from __future__ import annotations

import json

import pytest

import crossflow
from crossflow.config.attention_window import window_layers
from crossflow.config.loader import load_spec
from crossflow.kernels import ops
from crossflow.predict import load_hardware


def _model(**update) -> dict:
    return {"kind": "transformer", "name": "swa", "num_layers": 4, "hidden_size": 2048,
            "num_attention_heads": 16, "num_query_groups": 4, "seq_length": 16384,
            "vocab_size": 32768, "global_batch_size": 16, "micro_batch_size": 1,
            "precision": "bf16", "gated_linear_unit": True,
            "position_embedding_type": "rope", "attention_backend": "flash", **update}


def _predict(workload: dict, parallelism="t1-d8", system="dgx-h100-megatron-core"):
    return crossflow.predict(workload=workload, system=system, parallelism=parallelism)


def test_a_window_keeps_the_band_of_keys_before_each_query():
    s = 4096
    assert ops.score_share(s, 1) == 0.5 and ops.score_share(s, 0) == 1.0
    # GPT-OSS's window: each query and the 127 keys before it
    assert ops.score_share(s, 1, (127, 0)) == pytest.approx((128 * s - 128 ** 2 / 2) / s ** 2)
    assert ops.score_share(s, 1, (127, 0)) < 0.032
    # a window as long as the sequence limits nothing; an unmasked one has both sides
    assert ops.score_share(s, 1, (s - 1, 0)) == 0.5
    assert ops.score_share(s, 0, (s - 1, s)) == 1.0
    assert ops.score_share(s, 0, (100, 50)) == pytest.approx(
        (101 * s - 101 ** 2 / 2 + 50 * s - 50 ** 2 / 2) / s ** 2)


def test_the_flash_kernel_skips_the_products_outside_the_window():
    h100 = load_hardware("h100-sxm5-80gb")
    full = ops.fused_attention(h100, 32, 32768, 128, 5, 1)
    band = ops.fused_attention(h100, 32, 32768, 128, 5, 1, window=(4095, 0))
    share = ops.score_share(32768, 1, (4095, 0)) / 0.5
    assert band.flops == pytest.approx(full.flops * share)
    # compute-bound at this length: the products' time follows them, the measured kernels'
    # fixed time per query row does not
    rows = 32 * 32768 * h100.attention_kernel.backward_row_s
    assert band.compute_time_s - rows == pytest.approx(share * (full.compute_time_s - rows))


@pytest.mark.parametrize("freq, windowed", [
    (None, (True, True, True, True)),
    (2, (True, False, True, False)),          # GPT-OSS: every other layer full
    (4, (True, True, True, False)),
    ([0, 1, 1, 0], (False, True, True, False)),
])
def test_window_attn_skip_freq_picks_the_layers_as_megatron_core_does(freq, windowed):
    spec = load_spec(_model(window_size=[127, 0], window_attn_skip_freq=freq), "workloads")
    assert window_layers(spec) == windowed


def test_only_a_hybrid_stacks_attention_layers_have_the_window():
    spec = load_spec(_model(num_layers=4, hybrid_override_pattern="M*-*",
                            position_embedding_type="none", window_size=[255, 0]),
                     "workloads")
    assert window_layers(spec) == (False, True, False, True)


def test_windowed_layers_are_a_kind_of_their_own_and_cost_less():
    """Half the layers windowed save about half of what all of them save; the memory does
    not change (a flash kernel keeps no s × s tensor)."""
    base = _predict(_model())
    every = _predict(_model(window_size=[1023, 0]))
    half = _predict(_model(window_size=[1023, 0], window_attn_skip_freq=2))
    assert every.time_s < half.time_s < base.time_s
    # about half the saving (less attention time hides less of the gradient all-reduce)
    assert 0.4 < (base.time_s - half.time_s) / (base.time_s - every.time_s) < 0.6
    assert every.memory_per_device_bytes == base.memory_per_device_bytes
    # the breakdown's block is the representative layer: windowed where every one is
    assert every.details["block_forward_s"]["attention"] < \
        0.2 * base.details["block_forward_s"]["attention"]


def test_an_unfused_core_computes_every_score_and_masks_them():
    unfused = {"attention_backend": "unfused", "seq_length": 2048, "global_batch_size": 64}
    assert _predict(_model(**unfused, window_size=[127, 0])).time_s == \
        _predict(_model(**unfused)).time_s


def test_the_window_saves_more_the_longer_the_sequence():
    saving = {}
    for s in (4096, 32768):
        work = _model(seq_length=s, global_batch_size=8 * 65536 // s,
                      activation_recompute="full")
        base = _predict(work).time_s
        saving[s] = 1 - _predict({**work, "window_size": [127, 0]}).time_s / base
    assert 0 < saving[4096] < saving[32768]
    assert saving[32768] > 0.2


def test_the_gpt_oss_preset_alternates_128_token_windows_with_full_layers():
    spec = load_spec("gpt-oss-120b", "workloads")
    assert spec.window_size == (127, 0) and spec.window_attn_skip_freq == 2
    assert window_layers(spec)[:4] == (True, False, True, False)
    assert sum(window_layers(spec)) == 18


@pytest.mark.parametrize("update, key, pattern", [
    ({"window_size": [127, 5]}, "window_size", "does not fit the attention mask"),
    ({"window_size": [-2, 0]}, "window_size", "(left >= 0, 0) under the causal mask"),
    ({"window_size": [-1, 0], "causal": False}, "window_size", "without a causal mask"),
    ({"window_attn_skip_freq": 2}, "window_attn_skip_freq", "sets no window_size"),
    ({"window_size": [127, 0], "window_attn_skip_freq": [1, 0]}, "window_attn_skip_freq",
     "a list of 4 zeros and ones"),
    ({"window_size": [127, 0], "window_attn_skip_freq": [1, 0, 2, 0]},
     "window_attn_skip_freq", "zeros and ones"),
    ({"window_size": [127, 0], "window_attn_skip_freq": [0, 0, 0, 0]},
     "window_attn_skip_freq", "no layer with attention"),
])
def test_a_window_transformer_engine_refuses_exits_2_naming_the_key(refuses, update, key,
                                                                   pattern):
    refuses(_model(**update), key, pattern)


def test_context_parallelism_with_a_window_is_refused_before_anything_is_priced(refuses):
    refuses(_model(window_size=[127, 0]), "context_parallel", "sliding window",
            parallelism="t1-d8-c2", source="command line")
    # a window that limits nothing is no window: context parallelism runs
    assert _predict(_model(window_size=[-1, 0]), "t1-d8-c2").feasible


def test_predict_says_which_layers_have_a_window(cli):
    args = ("predict", "--workload", "gpt-oss-120b", "--system", "dgx-b200-megatron-core",
            "--parallelism", "{strategy: t1-d64-e8, use_distributed_optimizer: true}")
    code, out, _ = cli(*args)
    assert code == 0
    assert "  window        128 keys up to each query, on 18 of 36 layers" in out
    code, out, _ = cli(*args, "--json")
    doc = json.loads(out)
    assert (doc["window_size"], doc["windowed_layers"], doc["num_layers"]) == ([127, 0], 18, 36)
    # a model without a window says nothing of one
    code, out, _ = cli("predict", "--workload", "llama3-8b", "--system",
                       "dgx-h100-megatron-core", "--parallelism", "t4-d2-sp")
    assert code == 0 and "window" not in out
