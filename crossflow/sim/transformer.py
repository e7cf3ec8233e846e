"""Pricing a transformer block on one device from the workload graph.

The ops of a block — forward, backward and recomputation — are the nodes of
:func:`crossflow.workloads.transformer_graph` (Megatron-LM's layout, unfused attention),
sharded for one tensor-parallel rank by :func:`crossflow.parallel.shard_node`.  Each node is
priced by the kernel model.  The tensor-parallel collectives are Megatron's conjugate f / g
operators (Shoeybi et al. 2019, Fig. 3; Korthikanti et al. 2022 §4.2.2), which the graph does
not carry as nodes: per block, two all-reduces of the b·s·h activation in the forward pass and
two in the backward pass; under sequence parallelism each all-reduce becomes an all-gather
and a reduce-scatter, and the backward pass gathers the sequence-split input once more for
the weight gradient; a fully recomputed forward repeats its collectives.  A layer of a
hybrid stack (one sublayer) has half a block's.  Expert and expert tensor parallelism
re-shard an MoE layer's expert GEMMs (:func:`expert_shard`, :func:`expert_gathered`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from crossflow.arch.microarch import BYTES_PER_ELEMENT, MicroArch
from crossflow.sim.execution import graph_replayed
from crossflow.sim.pricing import node_cost
from crossflow.workloads.graph import node_flops

CollectiveTime = Callable[[str, float], float]


@dataclass(frozen=True)
class PassTimes:
    """Seconds per category of one pass (forward or backward) over a group of nodes, and
    the dynamic energy of its kernels."""

    compute: float = 0.0  # GEMMs and fused (flash) attention
    memory: float = 0.0  # memory-bound ops
    tp_comm: float = 0.0
    energy_J: float = 0.0
    #: an MoE layer's token dispatch and combine: the expert-parallel all-to-alls and the
    #: expert-tensor-parallel all-gathers and reduce-scatters beside them
    ep_comm: float = 0.0
    #: of ``compute``: the attention core (flash kernel, or the batched score GEMMs)
    attention: float = 0.0
    #: kernels issued by forward code (forward and recomputed ops), by the autograd engine
    #: (backward ops), and collectives: what the host dispatches (software-stack layer)
    forward_ops: int = 0
    backward_ops: int = 0
    collectives: int = 0
    #: the kernels in issue order: (0 forward / recomputed op, 1 backward op, 2 collective;
    #: device seconds)
    trace: tuple[tuple[int, float], ...] = ()
    #: of ``memory``: the weight-gradient GEMMs' accumulation into the gradient buffer
    #: (:func:`grad_accumulation_s`; 0 without gradient-accumulation fusion)
    grad_accum: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.memory + self.tp_comm + self.ep_comm


#: the MoE nodes an expert-parallel all-to-all follows: the dispatch after the permutation,
#: the combine after the second expert GEMM; backward, the gradients' dispatch after the
#: un-permutation's backward and their combine after the first expert GEMM's input gradient.
#: Each has the expert-tensor-parallel all-gather (after a dispatch) or reduce-scatter
#: (before a combine) beside it
A2A_AFTER: frozenset[str] = frozenset({"permute", "expert_fc2", "unpermute.bwd",
                                       "expert_fc1.dX"})


def grad_accumulation_s(arch: MicroArch, elements: float, accum_bytes: float) -> float:
    """Seconds a weight-gradient GEMM spends accumulating ``elements`` gradients into the
    gradient buffer (``accum_bytes`` read and written per element) beyond its roofline.

    Megatron-LM's fused weight-gradient GEMM (``fused_dense_cuda.wgrad_gemm_accum_fp32``,
    ``LinearWithGradAccumulationAndAsyncCommunication``, the code of Korthikanti et al.
    2022) computes C += AᵀB into the fp32 ``main_grad``: each output tile's epilogue
    reads and writes it after a main loop whose length is the micro-batch's tokens, so the
    traffic does not hide behind the tile's FLOPs; its weight relative to the GEMM grows as
    1/tokens.  Priced at main memory's bandwidth and the device's own DRAM efficiency (the
    GEMM kernels', not the software profile's memory-bound kernels')."""
    dram = arch.main_memory
    return elements * accum_bytes / (dram.bandwidth_Bps * dram.efficiency)


#: the kind of a trace entry (forward 0, backward 1, collective 2) for a kernel of a CUDA
#: graph after its first: the host issues nothing for it
IN_GRAPH = 3


def price_nodes(arch: MicroArch, nodes: list[Mapping], tp_comm: float = 0.0,
                collectives: int = 0, a2a: float = 0.0, moe_efficiency: float = 1.0,
                accum_bytes: float = 0.0, *, gather: float = 0.0) -> PassTimes:
    """The pass over ``nodes``: ``tp_comm`` seconds of ``collectives`` tensor-parallel
    collectives spread through it, and an all-to-all of ``a2a`` seconds after each node
    named in :data:`A2A_AFTER` (none when ``a2a`` is 0: one expert-parallel rank), with an
    expert-tensor-parallel all-gather or reduce-scatter of ``gather`` seconds beside it
    (none when 0: one expert-tensor-parallel rank).  An MoE
    layer's own kernels (nodes marked ``moe_op``) take 1 / ``moe_efficiency`` of their
    price.  ``accum_bytes`` > 0: each weight-gradient GEMM accumulates into the gradient
    buffer (:func:`grad_accumulation_s`, counted as memory time).  A node marked
    ``graphed`` (a per-layer CUDA graph's, :func:`crossflow.sim.execution.graphed_ops`) runs
    without the device's launch cost, and the host issues a run of them as one."""
    compute = memory = energy = attention = ep_comm = grad_accum = 0.0
    backward = 0
    trace = []
    a2a_count = 0
    expert_comm = ((a2a,) if a2a else ()) + ((gather,) if gather else ())
    replayed = in_graph = False
    for attrs in nodes:
        graphed = attrs.get("graphed", False)
        if graphed:  # a per-layer CUDA graph's kernel: no launch of its own
            replayed = replayed or graph_replayed(arch)
            t, e = node_cost(replayed, attrs)
        else:
            t, e = node_cost(arch, attrs)
        if moe_efficiency != 1.0 and attrs.get("moe_op"):
            t /= moe_efficiency
        energy += e
        if attrs["op"] in ("gemm", "attention"):  # tensor-core work: GEMMs, flash attention
            compute += t
            if attrs["op"] == "attention" or attrs["batch_key"] == "count":
                attention += t
        else:
            memory += t
        if accum_bytes and attrs["op"] == "gemm" and attrs.get("wgrad_elements"):
            extra = grad_accumulation_s(arch, attrs["wgrad_elements"], accum_bytes)
            memory += extra
            grad_accum += extra
            t += extra
        is_bwd = attrs["phase"] == "bwd"
        backward += is_bwd
        # the host issues a captured run of kernels as one replay, an op's dispatch
        trace.append((IN_GRAPH if graphed and in_graph else int(is_bwd), t))
        in_graph = graphed
        if expert_comm and attrs["name"] in A2A_AFTER:
            for seconds in expert_comm:
                trace.append((2, seconds))
                ep_comm += seconds
                a2a_count += 1
    if collectives:  # spread evenly through the pass (Megatron's f / g operators)
        every = len(trace) / collectives
        for i in range(collectives, 0, -1):
            trace.insert(round(i * every), (2, tp_comm / collectives))
    return PassTimes(compute, memory, tp_comm, energy, ep_comm, attention,
                     len(nodes) - backward, backward, collectives + a2a_count, tuple(trace),
                     grad_accum)


def collective_count(*, sp: bool, sublayers: int = 2, rerun: int = 0) -> tuple[int, int]:
    """(forward, backward) tensor-parallel collectives of one block (as
    :func:`block_collectives` prices them) of ``sublayers`` sublayers (attention and
    MLP: 2; a layer of a hybrid stack: 1), ``rerun`` of them recomputed whole."""
    forward = (2 if sp else 1) * sublayers
    backward = (3 if sp else 1) * sublayers
    return forward, backward + forward * rerun // sublayers


def block_collectives(*, tokens: int, hidden: int, precision: str, sp: bool,
                      collective: CollectiveTime, sublayers: int = 2,
                      rerun: int = 0) -> tuple[float, float]:
    """(forward, backward) seconds of one block's tensor-parallel collectives: per
    sublayer (attention, MLP, or a hybrid stack's Mamba, attention, MLP or MoE layer) an
    all-gather before it and a reduce-scatter after it with sequence parallelism (backward
    the same, and the input gathered again for the weight gradient), else one all-reduce
    each way (Megatron's f and g operators).  Each of the ``rerun`` sublayers recomputed
    whole (all of them under full recomputation; the MLP or MoE one under selective
    recomputation's ``mlp`` or ``moe``) repeats its forward collectives in the backward."""
    act = tokens * hidden * BYTES_PER_ELEMENT[precision]
    if sp:
        pair = collective("all_gather", act) + collective("reduce_scatter", act)
        forward = sublayers * pair
        backward = sublayers * pair + sublayers * collective("all_gather", act)  # for dW
    else:
        forward = backward = sublayers * collective("all_reduce", act)
    return forward, backward + forward * rerun / sublayers


def dispatched_copies(spec, tokens: int, ranks: int, local: int) -> tuple[float, float]:
    """Copies of a rank's ``tokens`` the flex dispatcher (``moe_token_dispatcher_type:
    flex``: DeepEP, HybridEP) sends per token, in expectation over uniform top-k routing,
    among ``ranks`` expert-parallel ranks ``local`` to a node: (over NVLink, over the
    network).  A token reaches each rank holding one of its experts once — across nodes
    once per node (DeepEP's RDMA leg), then forwarded inside it — so of the p ranks in n
    nodes the NVLink carries (p − n)·h_r copies and the network (n − 1)·h_n, h_r and h_n
    the chances that one rank or one node holds at least one of the k experts:
    1 − C(E − E/p, k) / C(E, k) and likewise with E/n (without replacement: k distinct
    experts).  Copies a capacity drops (``routed_rows`` below k per token) are not sent:
    both scale by the copies kept."""
    E, k = spec.num_moe_experts, spec.moe_router_topk
    nodes = max(1, ranks // local)

    def hit(experts_there: float) -> float:
        away = E - round(experts_there)
        return 1 - math.comb(away, k) / math.comb(E, k)

    kept = spec.routed_rows(tokens) / (tokens * k)
    return ((ranks - nodes) * hit(E / ranks) * kept,
            (nodes - 1) * hit(E / nodes) * kept)


def expert_shard(attrs: dict, ep: int, etp: int = 1) -> dict:
    """An expert GEMM on one rank of the expert grid: 1/ep of the experts, each with the
    tokens routed to it from all ep expert-parallel ranks (balanced routing); with ``etp``
    expert-tensor-parallel ranks, 1/etp of each expert's width (``expert_width``: fc1's
    columns, fc2's rows) for the tokens of the whole expert-tensor group, etp times a
    rank's own.  FLOPs per rank stay those of ep = etp = 1: the GEMMs change shape."""
    out = dict(attrs)
    key = attrs["expert_tokens"]
    out["count"] = -(-attrs["count"] // ep)
    out[key] = attrs[key] * ep * etp
    if etp > 1:
        width = attrs["expert_width"]
        out[width] = -(-attrs[width] // etp)
    if attrs.get("wgrad_elements"):  # the weight gradients of this rank's experts only
        out["wgrad_elements"] = attrs["wgrad_elements"] * out["count"] // attrs["count"]
        if etp > 1:  # and of their slice (the width is a dimension of the m × n gradient)
            out["wgrad_elements"] = out["wgrad_elements"] * out[width] // attrs[width]
    out["flops"] = node_flops(out)
    return out


def expert_gathered(attrs: dict, etp: int) -> dict:
    """An FP8 cast of the full-width rows an expert-tensor group gathered (``expert_
    gathered``): etp times a rank's own rows."""
    out = dict(attrs)
    key = attrs["expert_gathered"]
    out[key] = attrs[key] * etp
    out["flops"] = node_flops(out)
    return out
