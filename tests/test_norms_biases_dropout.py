"""Megatron's ``normalization``, ``add_bias_linear``, ``hidden_dropout`` and
``attention_dropout``, and its other ``attention_backend`` names: what each changes in the
graph, the parameters and the memory, and that Megatron's defaults change nothing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import crossflow
from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.sim.training_memory import transformer_memory
from crossflow.workloads.transformer import block_ops, transformer_graph

SYSTEM = "dgx-h100-megatron-core"


def _spec(**update) -> TransformerSpec:
    return TransformerSpec(**{
        "kind": "transformer", "name": "nbd", "num_layers": 2, "hidden_size": 1024,
        "num_attention_heads": 16, "seq_length": 2048, "vocab_size": 32768,
        "global_batch_size": 8, "micro_batch_size": 1, "precision": "bf16",
        "gated_linear_unit": True, "position_embedding_type": "rope", **update})


def _params(spec: TransformerSpec) -> int:
    return sum(a.get("params", 0) for _, a in transformer_graph(spec).nodes(data=True))


def _activations(spec: TransformerSpec) -> float:
    return transformer_memory(spec, tp=1, pp=1, dp=1)["activations_bytes"]


def test_megatrons_defaults_are_what_a_workload_without_the_keys_gets():
    plain = _spec(attention_backend="flash")
    explicit = _spec(attention_backend="flash", normalization="LayerNorm", add_bias_linear=True,
                     hidden_dropout=0.1, attention_dropout=0.1)
    a = crossflow.predict(workload=plain, system=SYSTEM, parallelism="t2-d4")
    b = crossflow.predict(workload=explicit, system=SYSTEM, parallelism="t2-d4")
    assert (a.time_s, a.memory_per_device_bytes) == (b.time_s, b.memory_per_device_bytes)


def test_llama3_70b_holds_metas_published_parameter_count():
    # RMSNorm (one weight per norm) and no biases: Meta's 70,553,706,496
    spec = load_spec("llama3-70b", "workloads")
    assert (spec.normalization, spec.add_bias_linear) == ("RMSNorm", False)
    assert _params(spec) == 70_553_706_496
    # with Megatron's defaults every norm's bias and every linear layer's bias come back
    h, layers = spec.hidden_size, spec.num_layers
    biases = layers * (spec.qkv_width + h + spec.mlp_in_width + h) + (2 * layers + 1) * h
    assert _params(spec.model_copy(update={"normalization": "LayerNorm",
                                           "add_bias_linear": True})) == 70_553_706_496 + biases


def test_without_hidden_dropout_no_mask_is_kept_and_no_dropout_backward_runs():
    with_dropout, without = _spec(attention_backend="flash"), _spec(
        attention_backend="flash", hidden_dropout=0.0)
    nodes = set(transformer_graph(with_dropout).nodes)
    assert {"L0.proj_residual.bwd", "L0.mlp_residual.bwd"} <= nodes
    assert not {n for n in transformer_graph(without).nodes if n.endswith("residual.bwd")}
    # two masks of one byte per token and hidden unit per layer
    kept = 2 * 2048 * 1024 * 2
    assert _activations(with_dropout) - _activations(without) == pytest.approx(kept)
    slow = crossflow.predict(workload=with_dropout, system=SYSTEM, parallelism="t1-d8").time_s
    fast = crossflow.predict(workload=without, system=SYSTEM, parallelism="t1-d8").time_s
    assert 0.9 < fast / slow < 1.0


def test_without_attention_dropout_the_unfused_core_keeps_only_its_probabilities():
    unfused, clean = _spec(attention_backend="unfused"), _spec(
        attention_backend="unfused", attention_dropout=0.0)
    assert "attn_dropout" in block_ops(unfused) and "attn_dropout" not in block_ops(clean)
    g = transformer_graph(clean)
    assert g.has_edge("L0.softmax", "L0.av") and "L0.attn_dropout.bwd" not in g
    # 5 bytes per score (probabilities, mask, dropped copy) against 2, 16 heads × s² per layer
    scores = 2 * 16 * 2048 * 2048
    assert _activations(unfused) - _activations(clean) == pytest.approx(3 * scores)
    # a flash kernel keeps no s × s tensor, with or without dropout
    assert _activations(_spec(attention_backend="flash")) == _activations(
        _spec(attention_backend="flash", attention_dropout=0.0))


@pytest.mark.parametrize("name, kernel", [("fused", "flash"), ("flash", "flash"),
                                          ("local", "unfused"), ("unfused", "unfused"),
                                          ("auto", None)])
def test_megatron_core_attention_backend_names(name, kernel):
    assert _spec(attention_backend=name).attention_backend == kernel


def test_an_unknown_attention_backend_or_dropout_over_one_is_refused():
    with pytest.raises(ValidationError, match="'fused', 'local' or 'auto'"):
        _spec(attention_backend="cudnn")
    with pytest.raises(ValidationError, match="hidden_dropout"):
        _spec(hidden_dropout=1.5)


def test_a_workload_file_with_megatron_names_predicts(cli, tmp_path):
    path = tmp_path / "llama.yaml"
    path.write_text(
        "kind: transformer\nname: llama-like\nnum_layers: 4\nhidden_size: 2048\n"
        "num_attention_heads: 16\nnum_query_groups: 4\nffn_hidden_size: 5632\n"
        "gated_linear_unit: true\nposition_embedding_type: rope\nnormalization: RMSNorm\n"
        "add_bias_linear: false\nhidden_dropout: 0.0\nattention_dropout: 0.0\n"
        "attention_backend: fused\nseq_length: 4096\nvocab_size: 32000\n"
        "global_batch_size: 16\nmicro_batch_size: 1\nprecision: bf16\n")
    code, out, err = cli("predict", "--workload", str(path), "--system", SYSTEM,
                         "--parallelism", "t1-d8")
    assert code == 0, err
    assert "time" in out
    path.write_text(path.read_text().replace("RMSNorm", "BatchNorm"))
    code, _, err = cli("predict", "--workload", str(path), "--system", SYSTEM,
                       "--parallelism", "t1-d8")
    assert code == 2 and "normalization" in err and "RMSNorm" in err
