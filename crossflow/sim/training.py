"""One training iteration of a GPT-style transformer (paper §6.5 with Megatron-LM's layout).

(Over 600 lines, one job on purpose: every term of the iteration — the layers' passes and
what each overlap hides, the pipeline, the data-parallel, FSDP and embedding
synchronisation, the optimizer, the breakdown — reads the same per-kind layer times; the
memory is :mod:`crossflow.sim.training_memory`'s.)

Per micro-batch, each pipeline chunk's forward and backward time is the sum of its layers'
ops on one tensor-parallel rank (:mod:`crossflow.sim.transformer`), plus the embedding on the
first chunk and the vocabulary projection and loss on the last.  The pipeline schedule runs
through the event simulator; after the flush come the gradients' reduction over the data
(and context) ranks — exposed whole, as in Megatron-LM of SC21 / Korthikanti et al., or
behind the last backward where the software profile overlaps it — the tied embedding's
gradient exchange between the first and last stage, and the optimizer step.

The bytes per device (weights, gradients, optimizer state, activations) are
:mod:`crossflow.sim.training_memory`'s, as are the stage parameters that the time and energy
here read too; the layers per pipeline chunk are the parallelism file's
(:meth:`~crossflow.parallel.spec.ParallelismSpec.chunk_split`; one definition each,
imported; the names are still importable from this module).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Protocol

from crossflow.arch.microarch import BYTES_PER_ELEMENT, MicroArch
from crossflow.config.attention_window import window_layers
from crossflow.config.system import OverlapSpec
from crossflow.errors import ConfigError
from crossflow.kernels import ops
from crossflow.parallel import Strategy, shard_node
from crossflow.parallel.spec import chunk_layers
from crossflow.sim.execution import as_executed, graphed_ops
from crossflow.sim.memory import check_capacity
from crossflow.sim.model_flops import model_flops as model_flops
from crossflow.sim.model_flops import moe_model_flops as moe_model_flops
from crossflow.sim.model_flops import spec_model_flops
from crossflow.sim.pipeline import (
    MAX_PASSES,
    Host,
    chain,
    passes,
    repeat,
    simulate_pipeline,
    span,
)
from crossflow.sim.ring_attention import kv_elements, ring_comm, ring_exposed, ring_nodes
from crossflow.sim.training_memory import (
    GRAD_BYTES,
    WEIGHT_BYTES,
    grad_bytes,
    stage_memory,
    stage_name,
    stage_parameter_split,
)
from crossflow.sim.training_memory import MAIN_GRAD_BYTES as MAIN_GRAD_BYTES
from crossflow.sim.training_memory import OPTIMIZER_BYTES as OPTIMIZER_BYTES
from crossflow.sim.training_memory import stage_parameters as stage_parameters
from crossflow.sim.training_memory import transformer_memory as transformer_memory
from crossflow.sim.transformer import (
    block_collectives,
    collective_count,
    dispatched_copies,
    expert_gathered,
    expert_shard,
    price_nodes,
)
from crossflow.workloads import transformer_graph

#: Megatron's optimizer step, per parameter, with the fp32 gradient buffer: the unscale and
#: inf check (read and write the gradient, 4 + 4 B), the gradient norm (read it, 4 B), fused
#: Adam (read the fp32 master weight, gradient and two moments, 16 B; write weight and
#: moments, 12 B), the copy of the master weight into the fp16/bf16 model weight (read 4,
#: write 2 B) and the zeroing of the gradient buffer (write 4 B): 28 B read, 22 B written
#: (megatron/optimizer/optimizer.py, MixedPrecisionOptimizer.step; ZeRO §3.1 counts only
#: Adam's 14 + 14).
ADAM_BYTES_READ, ADAM_BYTES_WRITTEN = 28, 22
ADAM_FLOPS_PER_PARAM = 12


class Network(Protocol):
    """Collective and point-to-point times along the parallel dimensions of a mapping."""

    def collective(self, kind: str, nbytes: float, dim: str) -> float:
        """``kind`` ∈ all_reduce | all_gather | reduce_scatter over the ``dim`` group."""

    def p2p(self, nbytes: float, dim: str) -> float:
        """One point-to-point transfer between neighbours of the ``dim`` group."""

    def all_to_all(self, nbytes: float, size: int, stride: int = 1,
                   copies: Callable[[int, int], tuple[float, float]] | None = None) -> float:
        """An all-to-all in each expert-parallel group of ``size`` ranks (every
        ``stride``-th rank of the expert grid: ``stride`` is expert tensor parallelism);
        ``copies``: a deduplicating dispatcher's copies per token over NVLink and the
        network, given the group's size and members per node."""

    def expert_tensor(self, kind: str, nbytes: float, size: int) -> float:
        """``kind`` ∈ all_gather | reduce_scatter in each expert-tensor-parallel group of
        ``size`` ranks."""


@dataclass(frozen=True)
class TrainingResult:
    time_s: float
    breakdown: dict[str, float]
    flops_per_iteration: float  # model FLOPs (no recompute), Megatron eq. 3 with 72
    hardware_flops_per_iteration: float  # including recomputation
    memory_per_device_bytes: float
    memory_breakdown: dict[str, float]
    microbatches: int
    energy_J: float = 0.0
    detail: dict[str, object] = field(default_factory=dict)


def transformer_iteration(
    spec,
    arch: MicroArch,
    network: Network,
    *,
    tp: int,
    pp: int,
    dp: int,
    vp: int = 1,
    sp: bool = False,
    schedule: str = "1f1b",
    zero1: bool = False,
    fsdp: str = "",
    overlap_grad_reduce: bool = False,
    software=None,
    cp: int = 1,
    split: tuple[int, ...] | None = None,
    ep: int = 1,
    etp: int = 1,
) -> TrainingResult:
    """Predict one iteration of ``spec`` (a TransformerSpec) on ``tp·cp·pp·dp`` devices
    (``dp`` model replicas; ``cp`` context-parallel ranks share each sequence; ``ep``
    expert-parallel ranks share the experts of each MoE layer, ``etp`` expert-tensor-parallel
    ranks the width of each expert).

    ``software`` (a system's SoftwareSpec) adds the host: each pass's dispatch time runs on
    a host resource beside the device in the pipeline simulation, and the iteration's host
    tail (optimizer step and synchronising checks) bounds the tail with the device's.

    ``fsdp`` is Megatron-FSDP's sharding strategy (``ParallelismSpec.fsdp``; "" for DDP or
    the distributed optimizer, which ``zero1`` says): with ``optim_grads`` each layer's
    gradients are reduce-scattered during every micro-batch's backward pass, with
    ``optim_grads_params`` its parameters are also all-gathered before its forward and its
    backward, each collective behind the layer's GEMMs as far as they last.

    ``split`` gives the decoder layers of each pipeline chunk in layer order (None: the
    layers split evenly), as :meth:`~crossflow.parallel.spec.ParallelismSpec.chunk_split`
    derives it from Megatron's uneven-split options.
    """
    arch, software = as_executed(arch, software, spec)
    L, h, s, V = spec.num_layers, spec.hidden_size, spec.seq_length, spec.vocab_size
    prec, b = spec.activation_precision, spec.micro_batch_size
    m = spec.global_batch_size // (dp * b)
    chunks = pp * vp
    if passes(pp, vp, m) > MAX_PASSES:  # counted before any pass is priced or simulated
        raise ConfigError(
            f"{m:,} micro-batches per pipeline (global_batch_size / (data_parallel × "
            f"micro_batch_size)) over {chunks} model chunks are {passes(pp, vp, m):,} forward "
            f"and backward passes to simulate, more than one prediction runs ({MAX_PASSES:,})",
            key="global_batch_size", value=spec.global_batch_size,
            allowed=f"at most {MAX_PASSES // (2 * chunks) * dp * b:,} with data_parallel "
            f"{dp} × micro_batch_size {b} over {chunks} chunks (or a larger micro-batch)")
    layers = list(split) if split else chunk_layers(L, chunks)
    per_chunk = max(layers)
    nbytes = BYTES_PER_ELEMENT[prec]
    if vp > 1 and schedule == "1f1b":
        schedule = "interleaved"
    overlap = software.overlap if software is not None else OverlapSpec()
    grad_reduce_bytes = software.grad_reduce_bytes if software is not None else GRAD_BYTES

    def coll(kind: str, size: float) -> float:
        return network.collective(kind, size, "kp1") if tp > 1 else 0.0

    # An MoE layer's token dispatch and combine: each rank sends its tokens' k copies (its
    # sequence-parallel share of the micro-batch) to the experts' ranks, those past an
    # expert's capacity dropped, or every expert's capacity when padded (Megatron-Core's
    # capacity is per rank, from its own tokens)
    a2a = gather = 0.0
    if spec.moe and (ep > 1 or etp > 1):
        tokens = b * s // cp // tp
        routed = spec.routed_rows(tokens) * spec.moe_width * nbytes
        if ep > 1 and spec.moe_token_dispatcher_type == "flex":
            # each token once per destination rank and node (DeepEP, HybridEP)
            a2a = network.all_to_all(tokens * spec.moe_width * nbytes, ep, etp,
                                     partial(dispatched_copies, spec, tokens))
        elif ep > 1:
            a2a = network.all_to_all(routed, ep, etp)
        if etp > 1:
            # Megatron-Core's all-to-all dispatcher then gathers the rows its expert-tensor
            # group received (gather_from_sequence_parallel_region over expt_tp) and, before
            # the combine, reduce-scatters the experts' partial outputs
            # (reduce_scatter_to_sequence_parallel_region): etp × a rank's rows each, the
            # same ring cost; backward the other way round
            gather = network.expert_tensor("all_gather", etp * routed, etp)
    moe_efficiency = software.moe_efficiency if software is not None else 1.0
    per_chunk_kinds = _chunk_kinds(spec, layers)
    blocks, ends = _passes(arch, spec, tp, sp, coll, cp, ep, a2a, moe_efficiency,
                           accum_bytes(software), etp, gather,
                           kinds=set().union(*per_chunk_kinds))
    emb_f, emb_b, head_f, head_b = (p.total for p in ends)
    # Context parallelism (Transformer Engine's ring attention, crossflow.sim.ring_attention):
    # each rank holds 1/cp of every sequence and passes its keys and values around the ring
    # (the context-parallel ranks are neighbours on the grid's data dimension)
    kv_s = kv_dkv_s = 0.0
    if cp > 1:
        kv = kv_elements(spec, tp, cp) * BYTES_PER_ELEMENT[prec]
        kv_s = network.p2p(kv, "dp")
        kv_dkv_s = network.p2p(2 * kv, "dp") if cp > 2 else 0.0
    cp_f, cp_b = ring_comm(cp, kv_s, kv_dkv_s)
    dense_params, expert_params = stage_parameter_split(
        spec, tp=tp, pp=pp, split=tuple(layers), vp=vp, ep=ep, etp=etp)
    edp = tp * dp * cp // (ep * etp)  # the experts' data-parallel ranks
    fsdp_f, fsdp_b = _fsdp_layer_comm(network, fsdp, dense_params, expert_params,
                                      grad_reduce_bytes, sum(layers[::pp]) or 1, tp=tp,
                                      dp=dp, cp=cp, edp=edp)
    # per kind of layer (:func:`layer_kinds`): (forward, backward) seconds and the
    # communication hidden behind them
    kinds = {kind: _layer_times(bf, bb, overlap, cp_f, cp_b,
                                ring_exposed(cp, kv_s, kv_dkv_s, bf.attention, bb.attention),
                                (fsdp_f, fsdp_b))
             for kind, (bf, bb) in blocks.items()}
    # the block the host, the breakdown's detail and the per-layer figures describe: the
    # MoE one where there are MoE layers (a model mixing both is priced layer by layer on
    # the device, its host issue as if all its layers were of that kind); of a hybrid
    # stack, its most frequent kind, and a layer's time the mean over its layers
    # the layers of each kind, the MTP depths' included, and the decoder's
    every = {k: sum(c.get(k, 0) for c in per_chunk_kinds) for k in blocks}
    decoder = dict(every)
    for k in _mtp_layer_kinds(spec):
        decoder[k] -= spec.mtp_num_layers
    if spec.hybrid_override_pattern is None:
        rep = "*E" if spec.moe else "*-"
        # the layers of that kind with the fewest marks: where every one is marked (kept in
        # BF16, windowed, or its activations kept under block recomputation), a marked one
        rep_kind = min((k for k in sorted(kinds) if k.rstrip(MARKS) == rep), key=len)
        layer_f, layer_b, *_ = kinds[rep_kind]
    else:
        rep_kind = max(sorted(blocks), key=decoder.get)
        layer_f, layer_b = (sum(n * kinds[k][i] for k, n in decoder.items()) / L
                            for i in (0, 1))
    block_f, block_b = blocks[rep_kind]
    T = b * s // cp

    p2p = _stage_transfer(network, T * h * nbytes, tp=tp, pp=pp, sp=sp)
    p2p_on_device = 0.0 if overlap.p2p else p2p
    fwd_s, bwd_s = _chunk_times(per_chunk_kinds, kinds, ends, p2p_on_device)
    host = _host(software, block_f, block_b, ends, per_chunk, chunks, pp, p2p_on_device)
    pipe = simulate_pipeline(stages=pp, microbatches=m, fwd_s=fwd_s, bwd_s=bwd_s,
                             schedule=schedule, virtual_stages=vp, host=host)

    stage_params = dense_params + expert_params
    reduce_s, gather_s = _gradient_sync(network, dense_params, expert_params,
                                        grad_reduce_bytes, tp=tp, dp=dp, cp=cp, edp=edp,
                                        zero1=zero1)
    if fsdp in ("optim_grads", "optim_grads_params"):
        reduce_s = 0.0  # reduce-scattered layer by layer in every backward pass (above)
    if fsdp == "optim_grads_params":
        gather_s = 0.0  # the updated shards stay sharded: the next forward gathers them
    dp_time = _sync_exposed(reduce_s, gather_s, vp * per_chunk, layer_f, layer_b,
                            overlap_reduce=overlap_grad_reduce or overlap.grad_reduce,
                            overlap_gather=overlap.param_gather)
    # The tied word embedding's gradient is summed between the first and last stage: one
    # exchange of the (vocab-parallel) table's gradient each way.
    tied = not spec.untie_embeddings_and_output_weights
    emb_time = network.p2p(V * h / tp * grad_reduce_bytes, "lp") if pp > 1 and tied else 0.0
    # parameters this device updates (× shard: the expert ones in the dense ones' units)
    shard = dp * cp if zero1 else 1
    updated = stage_params if not expert_params else (
        dense_params + expert_params * shard / (edp if zero1 else 1))
    optimized = updated / shard
    adam = ops.memory_bound(arch, "adam", bytes_read=ADAM_BYTES_READ * updated / shard,
                            bytes_written=ADAM_BYTES_WRITTEN * updated / shard,
                            flops=ADAM_FLOPS_PER_PARAM * updated / shard)
    opt = adam.time_s

    device_tail = dp_time + emb_time + opt
    host_tail = software.iteration_s if host is not None else 0.0
    total = pipe.makespan_s + max(device_tail, host_tail)
    recompute = sum(map(spec.recomputed_layers, layers)) / L  # the layers rerun whole
    blocks_J = sum(every[kind] * (bf.energy_J + bb.energy_J)
                   for kind, (bf, bb) in blocks.items())
    energy = _energy(arch, spec, tp=tp, pp=pp, dp=dp, m=m, blocks_J=blocks_J,
                     ends=ends, stage_params=optimized, adam_J=adam.energy_J,
                     rerun=recompute)
    # layer passes per device per iteration, for the breakdown (the first device's: the MTP
    # layers' too when it holds the last chunk)
    micro = m * (vp * per_chunk + (len(mtp_kinds(spec)) * spec.mtp_num_layers if pp == 1 else 0))
    # the first device's chunks: what share of its layers is of each kind (the first: the rest)
    here = max(1, sum(sum(c.values()) for c in per_chunk_kinds[::pp]))
    first, *others = blocks
    share = {k: sum(c.get(k, 0) for c in per_chunk_kinds[::pp]) / here for k in others}
    share[first] = 1.0 - sum(share.values())

    def per_layer(f) -> float:
        return micro * sum(share[k] * f(k, bf, bb) for k, (bf, bb) in blocks.items())

    layers_share = {
        "compute_s": per_layer(lambda _, f, b: f.compute + b.compute),
        "memory_bound_s": per_layer(lambda _, f, b: f.memory + b.memory),
        "tp_comm_s": per_layer(lambda k, f, b: f.tp_comm + b.tp_comm - kinds[k][2]
                               - kinds[k][3]),
        "cp_comm_s": per_layer(lambda k, f, b: cp_f + cp_b - kinds[k][4] - kinds[k][5]),
    }
    if spec.moe:
        layers_share["ep_comm_s"] = per_layer(lambda k, f, b: f.ep_comm + b.ep_comm
                                              - kinds[k][6] - kinds[k][7])
    if fsdp_f or fsdp_b:
        layers_share["fsdp_comm_s"] = per_layer(lambda k, f, b: (fsdp_f - kinds[k][8])
                                                + (fsdp_b - kinds[k][9]))
    breakdown = {
        **layers_share,
        "embedding_and_head_s": m * (emb_f + emb_b + head_f + head_b) / max(pp, 1),
        "pipeline_bubble_s": pipe.bubble_s,
        # a middle stage's sends and receives per micro-batch and chunk: two each
        "pp_p2p_s": 4 * p2p_on_device * m * vp if pp > 1 else 0.0,
        "dp_allreduce_s": dp_time,
        "embedding_allreduce_s": emb_time,
        "optimizer_s": opt,
    }
    # communication behind computation (not in the iteration time; the breakdown's
    # communication entries are the exposed parts)
    hidden = {
        "tp_comm_s": per_layer(lambda k, f, b: kinds[k][2] + kinds[k][3]),
        "cp_comm_s": per_layer(lambda k, f, b: kinds[k][4] + kinds[k][5]),
        **({"ep_comm_s": per_layer(lambda k, f, b: kinds[k][6] + kinds[k][7])}
           if spec.moe else {}),
        **({"fsdp_comm_s": per_layer(lambda k, f, b: kinds[k][8] + kinds[k][9])}
           if fsdp_f or fsdp_b else {}),
        "pp_p2p_s": 4 * (p2p - p2p_on_device) * m * vp if pp > 1 else 0.0,
        "dp_allreduce_s": reduce_s + gather_s - dp_time,
    }
    if host is not None:
        # The busiest host's issue time (it overlaps with the device where the device is the
        # critical path; compare with the device's share above).
        breakdown["host_dispatch_s"] = m * max(
            sum(host.fwd_s[c * pp + s] + host.bwd_s[c * pp + s] for c in range(vp))
            for s in range(pp)) + host_tail
    stage, memory = stage_memory(spec, tp=tp, pp=pp, dp=dp, vp=vp, sp=sp, schedule=schedule,
                                 zero1=zero1, fsdp=fsdp, grad_bytes=grad_bytes(software),
                                 cp=cp, split=tuple(layers), ep=ep, etp=etp)
    where = stage_name(stage, pp)
    used = check_capacity(arch, memory, where)
    return TrainingResult(
        time_s=total,
        breakdown=breakdown,
        flops_per_iteration=spec_model_flops(spec, False),
        hardware_flops_per_iteration=spec_model_flops(spec, recompute),
        memory_per_device_bytes=used,
        memory_breakdown=memory,
        microbatches=m,
        energy_J=energy,
        detail={"block_forward_s": block_f.__dict__, "block_backward_s": block_b.__dict__,
                "p2p_s": p2p, "hidden_comm_s": hidden,
                "exposed_comm_s": {"tp_comm_s": breakdown["tp_comm_s"],
                                   "cp_comm_s": breakdown["cp_comm_s"],
                                   "pp_p2p_s": breakdown["pp_p2p_s"],
                                   "dp_allreduce_s": dp_time,
                                   **({"fsdp_comm_s": breakdown["fsdp_comm_s"]}
                                      if "fsdp_comm_s" in breakdown else {})},
                "attention": spec.attention_backend or "unfused",
                "schedule": schedule, "pipeline_makespan_s": pipe.makespan_s,
                **({"memory_stage": where} if where else {})},
    )


def _stage_transfer(network: Network, act: float, *, tp: int, pp: int, sp: bool) -> float:
    """Seconds of one micro-batch's activations (``act`` bytes) sent to the next pipeline
    stage (its gradients come back the same way).  Each tensor-parallel rank sends 1/tp of
    the activation: without sequence parallelism its 1-D chunk, gathered again on the
    receiver (SC21 §4.1's scatter-gather); with it the rank's own sequence shard, which the
    next stage takes as it is (Megatron-LM's ``p2p_communication._communicate`` skips the
    split and the gather under ``sequence_parallel``)."""
    if pp == 1:
        return 0.0
    p2p = network.p2p(act / tp if tp > 1 else act, "lp")
    if tp > 1 and not sp:
        p2p += network.collective("all_gather", act, "kp1")
    return p2p


def _chunk_times(per_chunk_kinds: list[dict[str, int]], kinds: dict, ends,
                 p2p_on_device: float) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of one micro-batch on each pipeline chunk: its layers of
    each kind (``per_chunk_kinds``; ``kinds``, :func:`_layer_times` per kind), the
    embedding on the first chunk, the head and loss on the last, and the stage transfers.
    Megatron's send/recv between stages blocks both devices (``batch_isend_irecv`` and a
    wait, SC21 §4.1): every chunk
    but the last sends activations, every chunk but the first gradients, each to a device
    that waits for them — unless ``overlap.p2p`` (Megatron-Core's ``overlap_p2p_comm``)
    runs them on their own stream and ``p2p_on_device`` is 0."""
    def per_chunk(i: int) -> list[float]:  # i: 0 forward, 1 backward
        return [sum(n * kinds[k][i] for k, n in counts.items()) for counts in per_chunk_kinds]

    fwd_s, bwd_s = per_chunk(0), per_chunk(1)
    emb_f, emb_b, head_f, head_b = (p.total for p in ends)
    fwd_s[0] += emb_f
    bwd_s[0] += emb_b
    fwd_s[-1] += head_f
    bwd_s[-1] += head_b
    for g in range(len(per_chunk_kinds) - 1):
        fwd_s[g] += p2p_on_device
        bwd_s[g + 1] += p2p_on_device
        fwd_s[g + 1] += p2p_on_device
        bwd_s[g] += p2p_on_device
    return fwd_s, bwd_s


def _gradient_sync(network: Network, dense_params: float, expert_params: float,
                   grad_bytes: float, *, tp: int, dp: int, cp: int, edp: int,
                   zero1: bool) -> tuple[float, float]:
    """Seconds of the gradients' reduction and of the updated parameters' all-gather (0
    without the distributed optimizer, ZeRO-1) over the data × context ranks: with it a
    reduce-scatter and an all-gather, else one all-reduce.  The experts' go over their own
    data-parallel ranks (``edp`` = tp·dp·cp / (ep·etp)), a group that is not a dimension of the
    mapped grid: priced on the data-parallel rings, scaled to its ring volume."""
    reduce_s = gather_s = 0.0
    if dp * cp > 1:
        reduce_s = network.collective("reduce_scatter" if zero1 else "all_reduce",
                                      dense_params * grad_bytes, "dp")
        if zero1:
            gather_s = network.collective("all_gather", dense_params * WEIGHT_BYTES, "dp")
    if expert_params and edp > 1:
        dim = "dp" if dp * cp > 1 else "kp1"
        n = dp * cp if dp * cp > 1 else tp
        scale = (edp - 1) / edp / ((n - 1) / n)
        reduce_s += scale * network.collective(
            "reduce_scatter" if zero1 else "all_reduce", expert_params * grad_bytes, dim)
        if zero1:
            gather_s += scale * network.collective(
                "all_gather", expert_params * WEIGHT_BYTES, dim)
    return reduce_s, gather_s


def _fsdp_layer_comm(network: Network, fsdp: str, dense_params: float,
                     expert_params: float, grad_bytes: float, layers_here: int, *, tp: int,
                     dp: int, cp: int, edp: int) -> tuple[float, float]:
    """Seconds of one layer's Megatron-FSDP collectives in one micro-batch's (forward,
    backward) pass: under ``optim_grads`` the reduce-scatter of its gradients after its
    backward, under ``optim_grads_params`` also the all-gather of its parameters before
    its forward and again before its backward (they are freed after each).  A layer is an
    FSDP unit of the device's parameters shared evenly over its layers (the embedding and
    output layer's spread with them), over the groups :func:`_gradient_sync` uses."""
    if fsdp not in ("optim_grads", "optim_grads_params"):
        return 0.0, 0.0
    reduce_s, gather_s = _gradient_sync(network, dense_params / layers_here,
                                        expert_params / layers_here, grad_bytes, tp=tp,
                                        dp=dp, cp=cp, edp=edp, zero1=True)
    if fsdp == "optim_grads":
        return 0.0, reduce_s
    return gather_s, gather_s + reduce_s


def _sync_exposed(reduce_s: float, gather_s: float, layers_here: int, layer_f: float,
                  layer_b: float, *, overlap_reduce: bool, overlap_gather: bool) -> float:
    """What of the gradient synchronisation (:func:`_gradient_sync`) the iteration waits
    for.  Overlapped (``overlap_reduce``), each bucket's gradients are final after the last
    micro-batch's backward through its layers and are reduced behind the rest of that
    backward pass: exposed is the part longer than that last backward, and at least the
    last bucket's reduction (one layer's share).  With ``overlap_gather`` the next
    iteration's first forward waits for each layer's parameters only."""
    reduce_exposed, gather_exposed = reduce_s, gather_s
    if overlap_reduce and reduce_s:
        reduce_exposed = max(reduce_s - layers_here * layer_b, reduce_s / layers_here)
    if overlap_gather and gather_s:
        gather_exposed = max(gather_s - layers_here * layer_f, gather_s / layers_here)
    return reduce_exposed + gather_exposed


def _layer_times(block_f, block_b, overlap, cp_f: float, cp_b: float,
                 cp_exposed: tuple[float, float] = (0.0, 0.0),
                 fsdp: tuple[float, float] = (0.0, 0.0)) -> tuple[float, ...]:
    """(forward, backward, tp hidden forward, tp hidden backward, cp hidden forward, cp
    hidden backward, ep hidden forward, ep hidden backward, fsdp hidden forward, fsdp
    hidden backward) seconds of one layer of a kind; ``fsdp`` its Megatron-FSDP
    collectives (:func:`_fsdp_layer_comm`)."""
    # Megatron-Core's tp-comm-overlap splits each GEMM and its all-gather / reduce-scatter
    # into chunks on separate streams: up to ``overlap.tp_comm`` of the collectives hide
    # behind the pass's GEMMs, never more than the GEMMs' time
    tp_hidden_f = min(overlap.tp_comm * block_f.tp_comm, block_f.compute)
    tp_hidden_b = min(overlap.tp_comm * block_b.tp_comm, block_b.compute)
    # the ring's transfers behind its attention kernels, step by step
    cp_hidden_f = cp_f - cp_exposed[0]
    cp_hidden_b = cp_b - cp_exposed[1]
    # an MoE layer's all-to-alls: ``overlap.ep_comm`` of them off the critical path, never
    # more than the GEMM time left after the tensor-parallel overlap
    ep_hidden_f = min(overlap.ep_comm * block_f.ep_comm, block_f.compute - tp_hidden_f)
    ep_hidden_b = min(overlap.ep_comm * block_b.ep_comm, block_b.compute - tp_hidden_b)
    # Megatron-FSDP prefetches the next unit's parameters and reduce-scatters the last
    # one's gradients on streams of their own (its overlap is always on for ZeRO-2 and -3):
    # hidden behind the GEMM time the other overlaps leave
    fsdp_hidden_f = min(fsdp[0], block_f.compute - tp_hidden_f - ep_hidden_f)
    fsdp_hidden_b = min(fsdp[1], block_b.compute - tp_hidden_b - ep_hidden_b)
    return (block_f.total - tp_hidden_f - ep_hidden_f + cp_f - cp_hidden_f
            + fsdp[0] - fsdp_hidden_f,
            block_b.total - tp_hidden_b - ep_hidden_b + cp_b - cp_hidden_b
            + fsdp[1] - fsdp_hidden_b,
            tp_hidden_f, tp_hidden_b, cp_hidden_f, cp_hidden_b, ep_hidden_f, ep_hidden_b,
            fsdp_hidden_f, fsdp_hidden_b)


def _chunk_kinds(spec, layers: list[int]) -> list[dict[str, int]]:
    """Layers of each kind in each pipeline chunk (chunks hold consecutive layers, first to
    last), the kinds in sorted order, a kind a chunk does not hold left out.  Under full
    recomputation's block method a chunk's layers past its first ``recompute_num_layers``
    keep their activations: a kind of their own (:data:`KEPT_MARK`), priced without
    recomputation."""
    pattern, out, start = layer_kinds(spec), [], 0
    for n in layers:
        here = pattern[start:start + n]
        if spec.recompute_method == "block":
            rerun = spec.recomputed_layers(n)
            here = here[:rerun] + tuple(k + KEPT_MARK for k in here[rerun:])
        out.append({k: here.count(k) for k in sorted(set(here))})
        start += n
    if spec.mtp_num_layers:  # the MTP depths' layers run on the last chunk, after the head
        last = dict(out[-1])
        for kind in _mtp_layer_kinds(spec):
            last[kind] = last.get(kind, 0) + spec.mtp_num_layers
        out[-1] = dict(sorted(last.items()))
    return out


def _mtp_layer_kinds(spec) -> tuple[str, ...]:
    """:func:`mtp_kinds`, kept (:data:`KEPT_MARK`) under the block method: Megatron-Core
    recomputes no MTP layer there (multi_token_prediction.py warns and skips)."""
    mark = KEPT_MARK if spec.recompute_method == "block" else ""
    return tuple(kind + mark for kind in mtp_kinds(spec))


def _energy(arch: MicroArch, spec, *, tp, pp, dp, m, blocks_J, ends, stage_params,
            adam_J, rerun: float) -> float:
    """Dynamic energy of one iteration on all devices (joules).

    Kernels: the kernel model's energy (FLOPs at the technology's energy per FLOP, bytes at
    each memory level's energy per byte).  Links: the bytes each device sends — ring
    all-reduces move 2(n−1)/n of the tensor, gathers and scatters (n−1)/n, a pipeline
    boundary the activation and its gradient — at the link's energy per byte (NVLink inside
    a node, the NIC between nodes); ``rerun`` is the share of the layers recomputed whole
    (their forward all-reduces run again).  Static power is not included.
    """
    act = spec.micro_batch_size * spec.seq_length * spec.hidden_size * BYTES_PER_ELEMENT[
        spec.activation_precision]
    kernels = tp * dp * m * (blocks_J + sum(p.energy_J for p in ends))
    intra = arch.links.get("intra")
    inter = arch.links.get("inter") or intra
    per_pass = 4 + 2 * rerun  # all-reduces per block: 2 more in a block recomputed whole
    blocks = sum(map(len, spec.layer_kinds)) / 2  # a hybrid stack's layer is half a block
    tp_bytes = per_pass * 2 * (tp - 1) / tp * act * blocks * m * dp * tp
    dp_bytes = 2 * (dp - 1) / dp * stage_params * GRAD_BYTES * tp * pp * dp
    pp_bytes = 2 * act * (pp - 1) * m * dp
    links = (tp_bytes * (intra.energy_J_per_B if intra else 0.0)
             + (dp_bytes + pp_bytes) * (inter.energy_J_per_B if inter else 0.0))
    return kernels + adam_J * tp * pp * dp + links


def accum_bytes(software) -> int:
    """Bytes each weight-gradient element costs a GEMM beyond its roofline: the gradient
    buffer read and written where the profile fuses the accumulation into the GEMM
    (``gradient_accumulation_fusion``), else 0."""
    if software is None or not software.gradient_accumulation_fusion:
        return 0
    return 2 * software.main_grad_bytes


def _passes(arch: MicroArch, spec, tp: int, sp: bool, coll, cp: int = 1, ep: int = 1,
            a2a: float = 0.0, moe_efficiency: float = 1.0, accum: float = 0.0,
            etp: int = 1, gather: float = 0.0, kinds: set[str] | None = None):
    """Forward / backward times of one block of each kind the model has, or of ``kinds`` (a
    dict: :func:`_chunk_kinds`' symbols -> (forward, backward)), and of the embedding
    and of the head (per micro-batch, one tensor-parallel and context-parallel rank),
    priced from the workload graph's nodes.  Context parallelism divides every node's
    tokens (its batch key) by ``cp``; a flash attention core becomes Transformer
    Engine's ring (:mod:`crossflow.sim.ring_attention`), an unfused one keeps 1/cp of
    its heads; expert parallelism gives each rank 1/ep of the experts, each with ep
    times the tokens and expert tensor parallelism 1/etp of each expert's width for etp
    times the tokens (:func:`~crossflow.sim.transformer.expert_shard`); ``a2a`` is the
    seconds of one of its all-to-alls, ``gather`` of the expert-tensor-parallel
    all-gather or reduce-scatter beside each; ``accum`` the bytes per weight gradient of
    the accumulation into the gradient buffer (:func:`accum_bytes`)."""
    blocks = {}
    for kind in sorted(kinds or set(layer_kinds(spec)) | set(mtp_kinds(spec))):
        moe = "E" in kind
        *block, ends = _block_passes(arch, _one_block(spec, kind), tp, sp, coll, cp, ep,
                                     a2a if moe else 0.0, moe_efficiency, accum, etp,
                                     gather if moe else 0.0)
        blocks[kind] = tuple(block)
    return blocks, ends


def _block_passes(arch: MicroArch, spec, tp: int, sp: bool, coll, cp: int, ep: int,
                  a2a: float, moe_efficiency: float = 1.0, accum: float = 0.0,
                  etp: int = 1, gather: float = 0.0):
    graph = transformer_graph(spec)
    strategy = Strategy.megatron(tp=tp, sp=sp, dp=cp)
    experts = ep > 1 or etp > 1
    # the block's ops a per-layer CUDA graph captures (by the op its node's id names)
    graphed = graphed_ops(spec, spec.layer_kinds[0])
    groups: dict[tuple[int, bool], list[dict]] = {}
    for node, attrs in graph.nodes(data=True):
        if attrs["phase"] == "optimizer":
            continue  # priced below as mixed-precision Adam
        backward = attrs["phase"] != "fwd"
        if cp > 1 and attrs["op"] == "attention":
            # a flash kernel under context parallelism: Transformer Engine's ring
            # (crossflow.sim.ring_attention) on this rank's heads over the whole sequence
            whole = shard_node(attrs, Strategy.megatron(tp=tp, sp=sp))
            groups.setdefault((attrs["layer"], backward), []).extend(
                ring_nodes(whole, cp, kv_elements(spec, tp, cp)))
            continue
        shard = shard_node(attrs, strategy)
        if experts and attrs.get("expert_tokens"):
            shard = expert_shard(shard, ep, etp)
        elif etp > 1 and attrs.get("expert_gathered"):
            shard = expert_gathered(shard, etp)
        if graphed and attrs["layer"] == 0 and graphed(node.split(".")[1]):
            shard["graphed"] = True
        groups.setdefault((attrs["layer"], backward), []).append(shard)
    tokens = spec.micro_batch_size * spec.seq_length // cp
    # the collectives of its sublayers: two (attention and MLP) in a block, one in a layer
    # of a hybrid stack
    kind = spec.layer_kinds[0]
    sublayers = len(kind)
    # the sublayers whose forward (and its collectives) the backward runs again
    modules = spec.recomputed_modules
    rerun = (sublayers if spec.activation_recompute == "full"
             else ("mlp" in modules and "-" in kind) + ("moe" in modules and "E" in kind))
    comm_f, comm_b = block_collectives(tokens=tokens, hidden=spec.hidden_size,
                                       precision=spec.activation_precision, sp=sp,
                                       collective=coll, sublayers=sublayers, rerun=rerun)
    act = tokens * spec.hidden_size * BYTES_PER_ELEMENT[spec.activation_precision]
    vocab_comm = coll("all_reduce", act)  # vocab-parallel embedding / loss (Megatron)
    on = tp > 1
    count_f, count_b = collective_count(sp=sp, sublayers=sublayers, rerun=rerun)
    block_f = price_nodes(arch, groups[(0, False)], comm_f, on * count_f, a2a, moe_efficiency,
                          gather=gather)
    block_b = price_nodes(arch, groups[(0, True)], comm_b, on * count_b, a2a, moe_efficiency,
                          accum, gather=gather)
    emb_f = price_nodes(arch, groups[(-1, False)], vocab_comm, on)
    emb_b = price_nodes(arch, groups[(-1, True)])
    head_f, head_b = groups[(1, False)], groups[(1, True)]
    # Multi-token prediction: each depth after the decoder's head (the last chunk) embeds
    # the shifted inputs, projects, and runs the shared head and loss again (its layers are
    # layers of their kinds, :func:`_chunk_kinds`).  Its column-parallel projection
    # gathers its 2h-wide input under sequence parallelism and gathers its output across
    # the tensor-parallel group (gather_from_tensor_model_parallel_region); backward, the
    # scatter's gather and the input gradient's reduce-scatter (an all-reduce without
    # sequence parallelism)
    D = spec.mtp_num_layers
    comm_f = comm_b = 0.0
    if D:
        proj_f = coll("all_gather", 3 * act) if sp else coll("all_gather", act)
        proj_b = (coll("all_gather", act) + coll("reduce_scatter", 2 * act) if sp
                  else coll("all_reduce", 2 * act))
        head_f = head_f + D * (groups[(-1, False)] + groups[(2, False)] + head_f)
        head_b = head_b + D * (groups[(-1, True)] + groups[(2, True)] + head_b)
        comm_f, comm_b = D * (vocab_comm + proj_f), D * (vocab_comm + proj_b)
    head_f = price_nodes(arch, head_f, comm_f, on * D * (3 if sp else 2))
    head_b = price_nodes(arch, head_b, vocab_comm + comm_b, on * (1 + D * (3 if sp else 2)),
                         accum_bytes=accum)
    return block_f, block_b, (emb_f, emb_b, head_f, head_b)


def _host(software, block_f, block_b, ends, per_chunk: int, chunks: int, pp: int,
          p2p: float) -> Host | None:
    """The host side of every chunk's passes (None when the software profile has none):
    each pass's host time and its span through host and device (crossflow.sim.pipeline)."""
    if software is None or not software.has_host:
        return None
    # forward, backward, collective, and a CUDA graph's kernel after its first (IN_GRAPH)
    cost = (software.dispatch_s, software.backward_dispatch_s, software.collective_dispatch_s,
            0.0)

    def segment(p) -> tuple[float, float, float]:
        kernels = [(cost[kind], t) for kind, t in p.trace]
        return sum(h for h, _ in kernels), sum(d for _, d in kernels), span(kernels)

    emb_f, emb_b, head_f, head_b = (segment(p) for p in ends)
    launch = software.kernel_launch_s

    def synced(seg):  # the host waits for each layer before issuing the next
        h, d, sp = seg
        n = per_chunk
        return (n - 1) * (sp + launch) + h, n * d, n * sp + (n - 1) * launch

    ahead = partial(repeat, times=per_chunk)
    layers_f = (synced if software.sync == "layer" else ahead)(segment(block_f))
    layers_b = (synced if software.sync in ("layer", "backward-layer") else ahead)(
        segment(block_b))
    # a pipeline send/recv: issued after the chunk's kernels, occupying the device (SC21 §4.1)
    send = (software.collective_dispatch_s, p2p, software.collective_dispatch_s + p2p)
    fwd, bwd = [], []
    for g in range(chunks):
        f = ([emb_f] if g == 0 else []) + [layers_f] + ([head_f] if g == chunks - 1 else [])
        b = ([head_b] if g == chunks - 1 else []) + [layers_b] + ([emb_b] if g == 0 else [])
        fwd.append(chain(f + ([send] if g < chunks - 1 else [])))
        bwd.append(chain(b + ([send] if g > 0 else [])))
    return Host([f[0] for f in fwd], [b[0] for b in bwd], [f[2] for f in fwd],
                [b[2] for b in bwd], software.kernel_launch_s,
                software.sync != "none" and pp > 1)


#: what :func:`layer_kinds` appends to the kind of a layer whose attention has a sliding
#: window (``window_size``)
WINDOW_MARK = "/"
#: what :func:`layer_kinds` appends (after :data:`WINDOW_MARK`) to the kind of a layer a
#: quantized run keeps in BF16
BF16_MARK = "#"
#: what :func:`_chunk_kinds` appends to the kind of a layer that full recomputation's block
#: method does not recompute
KEPT_MARK = "~"
#: every mark a kind may carry, in the order they are appended
MARKS = WINDOW_MARK + BF16_MARK + KEPT_MARK


def layer_kinds(spec) -> tuple[str, ...]:
    """``spec.layer_kinds``, each layer with a sliding window marked with
    :data:`WINDOW_MARK` and each a quantized run keeps in BF16 (``first_last_layers_bf16``)
    with :data:`BF16_MARK`: kinds of their own, priced so, so the pipeline stages that hold
    such layers take their time."""
    if not spec.first_last_layers_bf16 and spec.window_size is None:  # the common case
        return spec.layer_kinds
    return tuple(k + WINDOW_MARK * w + BF16_MARK * bf16 for k, w, bf16 in zip(
        spec.layer_kinds, window_layers(spec), spec.bf16_layers, strict=True))


def mtp_kinds(spec) -> tuple[str, ...]:
    """The layers of one multi-token-prediction depth as :func:`layer_kinds` names them
    (``spec.mtp_layer_kinds``), in BF16 in an NVFP4 run: Megatron-Core's MTP layer takes
    the FP8 context only (multi_token_prediction.py: "currently ignoring FP4 in MTP
    layers")."""
    mark = BF16_MARK if spec.precision == "fp4" else ""
    return tuple(kind + mark for kind in spec.mtp_layer_kinds)


@lru_cache(maxsize=256)
def _one_block(spec, kind: str = "*-"):
    """The same model with one block of a kind (:func:`layer_kinds`' symbols): all blocks of
    a kind are alike, so one prices them all."""
    one = {"num_layers": 1, "first_last_layers_bf16": False}
    if kind.endswith(KEPT_MARK):
        kind = kind[:-1]
        one.update(activation_recompute="none", recompute_method=None,
                   recompute_num_layers=None)
    if kind.endswith(BF16_MARK):
        kind = kind[:-1]
        one["precision"] = spec.activation_precision
    # a windowed kind keeps the window in its one (first) layer, another has none
    one["window_attn_skip_freq"] = None
    if kind.endswith(WINDOW_MARK):
        kind = kind[:-1]
    else:
        one["window_size"] = None
    if spec.hybrid_override_pattern is not None:
        return spec.model_copy(update={**one, "hybrid_override_pattern": kind})
    if kind == "*-":
        return spec.model_copy(update={**one, "num_moe_experts": None, "moe_layer_freq": 1})
    return spec.model_copy(update={**one, "moe_layer_freq": 1})


