"""Context parallelism as Transformer Engine's ring attention (issue #22): the ring's
kernels, its memory-bound merges and accumulations, the step-wise overlap of its transfers,
and the held-out context-parallel rows."""

from __future__ import annotations

import pytest

from crossflow.kernels.ops import NO_WINDOW, attention_flops
from crossflow.sim.ring_attention import ring_comm, ring_exposed, ring_nodes

HEADS, SEQ, DIM = 32, 8192, 128


def _attn(gemms: int = 2, causal: int = 1) -> dict:
    """A flash-attention node's tensor-parallel shard over the whole sequence."""
    return {"op": "attention", "name": "attn", "phase": "fwd" if gemms == 2 else "bwd",
            "layer": 0, "precision": "bf16", "heads": HEADS, "seq": SEQ, "head_dim": DIM,
            "gemms": gemms, "causal": causal, "window": NO_WINDOW, "batch_key": "heads",
            "tp_key": "heads",
            "flops": attention_flops(HEADS, SEQ, DIM, gemms, causal)}


def _kernels(nodes):
    return [n for n in nodes if n["op"] == "attention"]


@pytest.mark.parametrize("cp", [2, 4, 8])
@pytest.mark.parametrize("gemms", [2, 5])
def test_context_parallel_ring_balances_the_causal_work_over_cp_steps(cp, gemms):
    steps = _kernels(ring_nodes(_attn(gemms), cp, kv_elements=1024))
    assert len(steps) == cp  # one kernel per ring step
    whole = attention_flops(HEADS, SEQ, DIM, gemms, causal=1)
    # together a rank's share of the causal work, each step the same (the load balancing)
    assert sum(n["flops"] for n in steps) == pytest.approx(whole / cp)
    assert {n["flops"] for n in steps} == {whole / cp ** 2}
    # the diagonal step under the mask, the others two unmasked chunk blocks: half the
    # work of the rank's queries against a whole other rank's keys
    assert steps[0]["causal"] == 1 and not any(n["causal"] for n in steps[1:])
    full_block = attention_flops(HEADS, SEQ // cp, DIM, gemms, causal=0)
    assert all(n["flops"] == pytest.approx(full_block / 2) for n in steps[1:])


def test_context_parallel_ring_without_a_mask_has_full_blocks():
    steps = _kernels(ring_nodes(_attn(causal=0), 4, kv_elements=1024))
    block = attention_flops(HEADS, SEQ // 4, DIM, 2, causal=0)
    assert [n["flops"] for n in steps] == [block] * 4


def test_context_parallel_ring_merges_and_accumulates_once_per_step():
    q = HEADS * SEQ // 4 * DIM
    forward = ring_nodes(_attn(2), 4, kv_elements=q // 4)
    merges = [n for n in forward if n["name"] == "attn.cp_out"]
    assert len(merges) == 4 and all(n["elements"] == q for n in merges)
    assert [n["inputs"] for n in merges] == [1, 2, 2, 2]  # rescale, then rescale and add
    # the softmax log-sum-exps, fp32, one per query row and head: copied, then folded in
    lse = [n for n in forward if n["name"] == "attn.cp_lse"]
    assert [n["inputs"] for n in lse] == [1, 2, 2, 2]
    assert all(n["elements"] == HEADS * SEQ // 4 and n["precision"] == "fp32" for n in lse)
    backward = ring_nodes(_attn(5), 4, kv_elements=q // 4)
    assert sum(n["name"] == "attn.cp_dq" for n in backward) == 4
    assert sum(n["name"] == "attn.cp_dkv" for n in backward) == 4
    assert not any(n["name"] in ("attn.cp_out", "attn.cp_lse") for n in backward)


def test_context_parallel_ring_transfers_hide_only_behind_their_own_step():
    # forward cp−1 transfers, backward 2 of keys and values (or their gradients) and cp−2
    # of both together
    assert ring_comm(1, 1.0, 2.0) == (0.0, 0.0)
    assert ring_comm(4, 1.0, 2.0) == (3.0, 2.0 + 2 * 2.0)
    # a transfer shorter than one step's kernel is hidden; a longer one shows the excess,
    # so with the same attention time more, smaller steps hide less
    assert ring_exposed(2, 1.0, 2.0, attention_f=4.0, attention_b=10.0) == (0.0, 0.0)
    two = ring_exposed(2, 1.0, 2.0, attention_f=1.0, attention_b=1.0)
    four = ring_exposed(4, 1.0, 2.0, attention_f=1.0, attention_b=1.0)
    assert two == pytest.approx((0.5, 1.0))
    assert four[0] > two[0] and four[1] > two[1]


def test_context_parallel_ring_costs_more_than_one_kernel_over_the_same_work():
    from crossflow.config.loader import load_spec
    from crossflow.predict import load_hardware
    from crossflow.sim.pricing import node_cost
    from crossflow.sim.transformer import price_nodes
    from crossflow.workloads.graph import node_flops

    arch = load_hardware(load_spec("dgx-h100-megatron-core", "systems").device)
    for gemms in (2, 5):
        attn = _attn(gemms)
        # what the model priced before the ring: the rank's share as one kernel
        share = {**attn, "heads": HEADS // 2}
        share["flops"] = node_flops(share)
        one, _ = node_cost(arch, share)
        ring = price_nodes(arch, ring_nodes(attn, 2, kv_elements=2 * SEQ // 2 * 8 * DIM))
        assert ring.attention >= one  # the same FLOPs in two kernels
        assert ring.memory > 0  # the buffer copies, merges and accumulations
        assert ring.total > one


def test_context_parallel_rows_meet_the_issue_target():
    from crossflow.validation.megatron_bridge import MAX_MAPE_CP, cp_dataset

    held_out = cp_dataset()
    assert MAX_MAPE_CP <= 0.10
    # measured 8.0 % (docs/validation.md); 11.6 % with the ring as one kernel, 9.6 % with
    # the ring and without the weight-gradient accumulation into main_grad
    assert held_out.mape <= 0.082, held_out.render()
    assert held_out.passed


def test_context_parallel_rows_are_less_one_sided():
    """Issue #22: every held-out row was predicted too fast, mean +9.6 %.  With the
    log-sum-exp merges and the profile's weight-gradient accumulation into main_grad (a cost
    per micro-batch and weight, so per token twice as heavy on a rank that holds half of each
    sequence) the mean is +8.0 %, and no precision group is above +12.5 %."""
    from crossflow.validation.megatron_bridge import cp_dataset

    held_out = cp_dataset()
    mean = sum(r.error for r in held_out.rows) / len(held_out.rows)
    assert mean <= 0.085, held_out.render()
    assert max(held_out.group_bias.values()) <= 0.125, held_out.render()


def test_exposing_the_rings_and_the_gradient_reductions_does_not_explain_the_cp_rows():
    """Issue #22's candidates, bounded: with every transfer of the ring and the whole
    gradient reduction over the data × context ranks put back on the critical path (an upper
    bound: Transformer Engine overlaps the first, Megatron-Core the second), six of the seven
    held-out rows are still too fast and the mean signed error stays above +3 % (+8 % as
    modelled; docs/software-stack.md, "What the context-parallel rows leave unexplained")."""
    import crossflow
    from crossflow.validation.megatron_bridge import _roomy, case, cp_rows

    errors = []
    for r in cp_rows():
        spec, par = case(r)
        p = crossflow.predict(workload=spec, hardware=_roomy("h100-sxm5-80gb"),
                              system="dgx-h100-megatron-core", parallelism=par)
        hidden = p.details["hidden_comm_s"]
        assert hidden["cp_comm_s"] > 0 and p.breakdown["cp_comm_s"] < 0.01 * p.time_s
        worst = p.time_s + hidden["cp_comm_s"] + hidden["dp_allreduce_s"]
        measured = (spec.global_batch_size * spec.seq_length
                    / (float(r["tokens_per_s_per_gpu"]) * int(r["num_gpus"])))
        errors.append(measured / worst - 1)  # predicted tokens/s over measured, minus 1
    assert sum(e > 0 for e in errors) >= 6 and min(errors) > -0.01
    assert sum(errors) / len(errors) > 0.03


# --- context parallelism as a search dimension -------------------------------------------


def test_context_parallel_is_a_searchable_dimension_that_takes_the_data_ranks():
    """With a strategy name, ``context_parallel`` takes the ranks of the strategy's data
    dimension: d / cp replicas, each sequence split over cp ranks — the same prediction as
    the Megatron degrees written out."""
    import crossflow
    from crossflow.search.objective import evaluate
    from crossflow.search.study import load_study

    setup = load_study("llama3-70b-h100-cp")
    assert setup.space.dimension("context_parallel").choices == (1, 2, 4)

    def design(strategy, cp):
        return setup.space.decode({"strategy": strategy, "mapping_order": "kp1-kp2-dp-lp",
                                   "context_parallel": cp, "micro_batch_size": 1,
                                   "recompute_granularity": "selective",
                                   "use_distributed_optimizer": True})

    par = setup.parallelism(design("t4-d4-p4-v5-sp", 2))
    assert par["strategy"] == "t4-d4-p4-v5-sp" and par["context_parallel"] == 2
    with_cp = crossflow.predict(workload=setup.workload, system=setup.system, parallelism=par)
    assert with_cp.feasible and with_cp.details["context_parallel"] == 2
    degrees = {k: v for k, v in par.items() if k != "strategy"} | {
        "tensor_parallel": 4, "pipeline_parallel": 4, "data_parallel": 2,
        "virtual_pipeline_stages": 5, "sequence_parallel": True}
    assert crossflow.predict(workload=setup.workload, system=setup.system,
                             parallelism=degrees).time_s == with_cp.time_s
    # the same grid without context parallelism: four replicas, the whole sequence each
    plain = setup.parallelism(design("t4-d4-p4-v5-sp", 1))
    assert plain["strategy"] == "t4-d4-p4-v5-sp"
    times = [evaluate(setup, design("t4-d4-p4-v5-sp", cp)).values(setup.objectives)[0]
             for cp in (1, 2)]
    assert times[0] != times[1]

    # a degree that does not divide the strategy's d is an infeasible trial that says why,
    # not an exception out of the objective
    bad = evaluate(setup, design("t8-d1-p8-v10-sp", 2))
    assert not bad.feasible and "divide the strategy's d" in bad.reason


def test_context_parallel_in_a_space_for_a_non_transformer_workload_is_refused(tmp_path):
    from crossflow.errors import ConfigError
    from crossflow.search.study import load_study

    space = tmp_path / "space.yaml"
    space.write_text("kind: search_space\nname: s\nstrategy: {kernel_types: [RC]}\n"
                     "params: {context_parallel: [1, 2]}\n")
    study = tmp_path / "study.yaml"
    study.write_text(f"kind: study\nname: lstm-cp\nworkload: lstm-paper-case-study\n"
                     f"system: deepflow-case-study-512\nsearch_space: {space}\n"
                     f"objectives: [iteration_time_s]\nn_trials: 10\n")
    with pytest.raises(ConfigError, match="context_parallel applies to transformer"):
        load_study(str(study))
