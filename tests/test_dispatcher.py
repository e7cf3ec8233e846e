"""Megatron-Core's token dispatchers (``moe_token_dispatcher_type``): the all-to-all one
sends every routed copy; the flex one (DeepEP, HybridEP) sends a token once per rank that
holds one of its experts, and across nodes once per node."""

from __future__ import annotations

import math

import pytest
import yaml

import crossflow
from crossflow.config.workload import TransformerSpec
from crossflow.sim.transformer import dispatched_copies


def _moe(**update) -> dict:
    return {"kind": "transformer", "name": "small-moe", "num_layers": 2, "hidden_size": 1024,
            "num_attention_heads": 16, "seq_length": 4096, "vocab_size": 32768,
            "global_batch_size": 64, "micro_batch_size": 1, "precision": "bf16",
            "num_moe_experts": 64, "moe_router_topk": 8, "moe_ffn_hidden_size": 512,
            "gated_linear_unit": True, **update}


def test_copies_follow_uniform_routing_without_replacement():
    spec = TransformerSpec.model_validate(_moe(moe_token_dispatcher_type="flex"))
    E, k = 64, 8

    def hit(there: int) -> float:  # the chance a group of experts holds one of the k
        return 1 - math.comb(E - there, k) / math.comb(E, k)

    # one node of 8 ranks: each token to the other ranks holding one of its experts
    assert dispatched_copies(spec, 4096, 8, 8) == pytest.approx((7 * hit(8), 0.0))
    # 4 nodes of 8: once to each other node hit, and forwarded there over NVLink
    nvlink, network = dispatched_copies(spec, 4096, 32, 8)
    assert network == pytest.approx(3 * hit(16))
    assert nvlink == pytest.approx((32 - 4) * hit(2))
    # fewer than the k copies the all-to-all dispatcher sends across: (p − local)/p · k
    assert network < (32 - 8) / 32 * k


def _ep_comm(dispatcher: str, ep: int, nodes_of: int) -> float:
    par = {"tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": ep,
           "expert_parallel": ep}
    system = {"kind": "system", "name": "nodes", "device": "h100-sxm5-80gb",
              "devices_per_node": nodes_of, "num_nodes": ep // nodes_of,
              "intra": {"topology": "switch", "bandwidth_GBps": 450, "latency_us": 1.0},
              "inter": {"topology": "fat_tree", "bandwidth_Gbps": 400, "latency_us": 5.0}}
    p = crossflow.predict(workload=_moe(moe_token_dispatcher_type=dispatcher),
                          system=system, parallelism=par)
    return p.details["block_forward_s"]["ep_comm"]


def test_across_nodes_the_flex_dispatcher_sends_fewer_bytes():
    """Network-bound, an all-to-all's time follows the copies that leave the node: k ·
    (p − local)/p per token for the all-to-all dispatcher, (n − 1) · h_n for the flex one."""
    spec = TransformerSpec.model_validate(_moe(moe_token_dispatcher_type="flex"))
    alltoall, flex = _ep_comm("alltoall", 32, 8), _ep_comm("flex", 32, 8)
    ratio = dispatched_copies(spec, 4096, 32, 8)[1] / ((32 - 8) / 32 * 8)
    assert flex / alltoall == pytest.approx(ratio, rel=0.05)
    # inside one node both are NVLink-bound: fewer distinct ranks than copies
    assert _ep_comm("flex", 8, 8) < _ep_comm("alltoall", 8, 8)


@pytest.mark.parametrize("update, pattern", [
    ({"num_moe_experts": None, "moe_router_topk": 2, "moe_ffn_hidden_size": None},
     "the model has none"),
    ({"moe_expert_capacity_factor": 1.0, "moe_pad_expert_input_to_capacity": True},
     "does not pad"),
])
def test_a_flex_dispatcher_it_cannot_run_exits_2(cli, tmp_path, update, pattern):
    path = tmp_path / "w.yaml"
    data = {k: v for k, v in {**_moe(moe_token_dispatcher_type="flex"), **update}.items()
            if v is not None}
    path.write_text(yaml.safe_dump(data))
    code, out, err = cli("predict", "--workload", path, "--hardware", "h100-sxm5-80gb")
    assert code == 2 and not out
    assert "key 'moe_token_dispatcher_type'" in err and pattern in err


def test_deepseek_v3_runs_with_the_dispatcher_its_recipe_chose():
    from crossflow.validation import megatron_bridge as mb

    h100 = next(r for r in mb.moe_rows() if r["model_key"] == "deepseek_v3")
    assert mb.case(h100)[0].moe_token_dispatcher_type == "flex"  # DeepEP, 25.09
    b200 = mb._published("moe", mb.BLACKWELL["B200"][0])
    kinds = {(r["release"], mb.case(r)[0].moe_token_dispatcher_type) for r in b200
             if r["model_key"] == "deepseek_v3"}
    assert ("25.11", "alltoall") in kinds and ("26.04.01", "flex") in kinds


def test_the_flex_dispatcher_under_expert_tensor_parallelism_is_refused():
    from crossflow.errors import ConfigError

    par = {"tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 8,
           "expert_parallel": 4, "expert_tensor_parallel": 2}
    with pytest.raises(ConfigError, match="under expert tensor parallelism is not modelled"):
        crossflow.predict(workload=_moe(moe_token_dispatcher_type="flex"),
                          system="dgx-h100-megatron-core", parallelism=par)
    assert crossflow.predict(workload=_moe(), system="dgx-h100-megatron-core",
                             parallelism=par).time_s > 0


def test_nemotron_3_runs_take_their_recipes_flex_dispatcher():
    """Every Megatron-Bridge performance recipe of Nemotron 3 sets HybridEP.  Nemotron 3
    Super on 64 B200s spreads EP 64 over 8 nodes: with the all-to-all dispatcher its MXFP8
    run of 26.04.01 read −34.5 %, with the recipe's flex one +2.7 % (GB200, inside one NVLink
    domain, moves by less than a point either way)."""
    from crossflow.validation import megatron_bridge as mb

    row = next(r for r in mb._blackwell_rows("B200", moe=True) if r["release"] == "26.04.01"
               and r["model_key"] == "nemotron_3_super" and r["precision"] == "MXFP8")
    spec, _ = mb.case(row)
    assert spec.moe_token_dispatcher_type == "flex"
    tokens, _ = mb.predict_row(row, "dgx-b200-megatron-core")
    assert tokens == pytest.approx(float(row["tokens_per_s_per_gpu"]), rel=0.08)
