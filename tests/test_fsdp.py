"""Megatron-FSDP (``use_megatron_fsdp`` with Megatron's ``data_parallel_sharding_strategy``):
what each sharding strategy shards, what its collectives cost and when they hide, and the
published runs that used it."""

from __future__ import annotations

import pytest

import crossflow
from crossflow.config.loader import load_spec
from crossflow.errors import ConfigError

H100 = "dgx-h100-megatron-core"


def _llama(name: str = "llama3-8b", **update):
    return load_spec(name, "workloads").model_copy(update={
        "precision": "fp8", "seq_length": 8192, "global_batch_size": 128,
        "micro_batch_size": 1, "activation_recompute": "none", **update})


def _predict(spec, system=H100, **par):
    return crossflow.predict(workload=spec, system=system, parallelism=par)


def test_the_sharding_strategy_is_refused_without_megatron_fsdp():
    with pytest.raises(ConfigError) as err:
        _predict(_llama(), data_parallel=8, data_parallel_sharding_strategy="optim_grads")
    assert "data_parallel_sharding_strategy" in str(err.value)
    assert "use_megatron_fsdp" in str(err.value)
    with pytest.raises(ConfigError, match="data_parallel_sharding_strategy"):
        _predict(_llama(), data_parallel=8, use_megatron_fsdp=True,
                 data_parallel_sharding_strategy="zero3")


def test_optim_is_the_distributed_optimizer_and_no_shard_is_ddp():
    spec = _llama(global_batch_size=64, seq_length=4096)
    zero1 = _predict(spec, data_parallel=8, use_distributed_optimizer=True)
    optim = _predict(spec, data_parallel=8, use_megatron_fsdp=True,
                     data_parallel_sharding_strategy="optim")
    assert (optim.time_s, optim.memory_per_device_bytes) == (
        zero1.time_s, zero1.memory_per_device_bytes)
    ddp = _predict(spec, data_parallel=8)
    no_shard = _predict(spec, data_parallel=8, use_megatron_fsdp=True,
                        data_parallel_sharding_strategy="no_shard")
    assert no_shard.time_s == ddp.time_s
    assert no_shard.memory_per_device_bytes == ddp.memory_per_device_bytes


def test_each_strategy_shards_more_of_the_model_state():
    """ZeRO-2 shards the gradient buffer, ZeRO-3 the weights too, each keeping two layers
    whole (its double buffer); the optimizer state is sharded by all three."""
    spec, dp = _llama(), 8
    mem = {s: _predict(spec, data_parallel=dp, use_megatron_fsdp=True,
                       data_parallel_sharding_strategy=s).details["memory_breakdown"]
           for s in ("optim", "optim_grads", "optim_grads_params")}
    zero1, zero2, zero3 = mem["optim"], mem["optim_grads"], mem["optim_grads_params"]
    assert zero1["optimizer_state_bytes"] == zero2["optimizer_state_bytes"] \
        == zero3["optimizer_state_bytes"]
    assert zero2["weights_bytes"] == zero1["weights_bytes"]
    layers = spec.num_layers
    for full, sharded in ((zero1["gradients_bytes"], zero2["gradients_bytes"]),
                          (zero1["weights_bytes"], zero3["weights_bytes"])):
        assert sharded == pytest.approx(full / dp + 2 * full / layers)
    assert zero3["gradients_bytes"] == zero2["gradients_bytes"]


def test_zero3_collectives_hide_inside_a_node_and_show_across_nodes():
    """On one NVLink node each layer's all-gathers and reduce-scatter hide behind its GEMMs
    (no slower than the distributed optimizer: no end-of-iteration sync); over
    InfiniBand, with Llama-3 70B whole on every rank, they do not, and what shows is counted
    as fsdp_comm_s."""
    # 4K sequences: at 8K the distributed optimizer's 8B model needs 81 GB
    spec = _llama(seq_length=4096, global_batch_size=256)
    zero1 = _predict(spec, data_parallel=8, use_distributed_optimizer=True)
    zero3 = _predict(spec, data_parallel=8, use_megatron_fsdp=True)
    assert zero1.feasible and zero3.feasible
    assert zero3.breakdown["fsdp_comm_s"] == pytest.approx(0.0, abs=1e-9)
    assert zero3.breakdown["dp_allreduce_s"] == 0.0 < zero1.breakdown["dp_allreduce_s"]
    assert zero3.time_s <= zero1.time_s
    hidden = zero3.details["hidden_comm_s"]["fsdp_comm_s"]
    assert hidden > 0
    # 2048-token sequences: a layer's GEMMs are too short to hide its 1.75 GB all-gather
    big = _llama("llama3-70b", global_batch_size=64, seq_length=2048,
                 activation_recompute="full")
    across = _predict(big, data_parallel=64, use_megatron_fsdp=True)
    assert across.breakdown["fsdp_comm_s"] > 0.1 * across.time_s
    assert across.details["exposed_comm_s"]["fsdp_comm_s"] == across.breakdown["fsdp_comm_s"]
    longer = _predict(_llama("llama3-70b", global_batch_size=64, seq_length=4096,
                             activation_recompute="full"),
                      data_parallel=64, use_megatron_fsdp=True)
    assert longer.breakdown["fsdp_comm_s"] == pytest.approx(0.0, abs=1e-9)
    # the 70B model whole on each of 64 H100s fits only with its weights sharded too
    zero2 = _predict(big, data_parallel=64, use_megatron_fsdp=True,
                     data_parallel_sharding_strategy="optim_grads")
    assert not zero2.feasible and across.feasible
    assert across.memory_per_device_bytes < 0.25 * zero2.memory_per_device_bytes


def test_the_published_fsdp_runs_are_a_held_out_data_set():
    from crossflow.validation import collect
    from crossflow.validation.megatron_bridge import MAX_MAPE, case, fsdp_dataset, fsdp_rows

    rows = fsdp_rows()
    assert {(r["release"], r["model_key"], r["fsdp"]) for r in rows} == {
        ("25.09", "llama3_8b", "8"), ("25.11", "llama3_8b", "8")}
    for r in rows:
        _, par = case(r)
        assert par["use_megatron_fsdp"] and \
            par["data_parallel_sharding_strategy"] == "optim_grads_params"
    ds = fsdp_dataset()
    assert ds.mape <= MAX_MAPE and ds.passed, ds.render()
    assert ds.name in [d.name for d in collect("training")]


def test_a_search_space_can_search_megatron_fsdp():
    from crossflow.search.space import SearchSpaceSpec

    spec = SearchSpaceSpec.model_validate({
        "kind": "search_space", "name": "fsdp",
        "strategy": {"kernel_types": ["TP"], "max_tp": 8},
        "params": {"use_megatron_fsdp": [False, True]}})
    assert "use_megatron_fsdp" in spec.params
    with pytest.raises(ConfigError, match="use_megatron_fsdp"):
        SearchSpaceSpec.model_validate({
            "kind": "search_space", "name": "fsdp",
            "strategy": {"kernel_types": ["TP"], "max_tp": 8},
            "params": {"use_megatron_fsdp": ["yes"]}})
