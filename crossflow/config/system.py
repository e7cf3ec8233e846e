"""System files: devices, nodes and the two network levels joining them
(docs/architecture.md, "Layers").

File shape (``presets/systems/*.yaml``, ``kind: system``)::

    kind: system
    name: dgx-a100
    device: a100-sxm4-80gb           # a hardware preset or an architecture template
    devices_per_node: 8              # accelerators in one node (package, server)
    num_nodes: 384
    intra:                           # the network inside a node (paper §4.2.3 "intra-package")
      topology: switch               # switch | crossbar | fat_tree | mesh | torus | ring | graph
      dims: [2, 4]                   # mesh / torus / ring only: sizes, product = devices_per_node
      edges: [[0, 1, 2], …]          # graph only: [device, device, links] (links defaults to 1)
      bandwidth_GBps: 300            # per device, per direction, all its links of this level
      latency_us: 1.0                # per hop (direct networks) or per switch traversal
      efficiency: 1.0                # sustained fraction of the link bandwidth
      collective: {efficiency: 0.76, step_latency_us: 3.7}   # ring-collective constants
    inter: {topology: fat_tree, bandwidth_Gbps: 200, …}      # between nodes; endpoints = nodes
    collective_launch_us: 5          # fixed cost of one collective
    p2p_launch_us: 8                 # fixed cost of one send/recv (default: collective_launch)
    software: {name: …, gemm_efficiency: …, dispatch_us: …}  # the software-stack layer

``bandwidth``, ``latency`` and ``efficiency`` default to the device's own links (the
``intra`` / ``inter`` links of its MicroArch); a system file overrides them where the machine
differs from the chip (e.g. a node with fewer NICs than GPUs).  Bandwidth is always *per device*;
the inter level's endpoints are nodes, each with ``devices_per_node`` times that bandwidth.

The system layer builds the model from this spec (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from crossflow.config.base import Spec
from crossflow.errors import ConfigError

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Count = Annotated[int, Field(ge=1)]
Index = Annotated[int, Field(ge=0)]

#: Topologies in which every endpoint has its own port(s) into a non-blocking fabric.
SWITCHED = ("switch", "crossbar", "fat_tree")
#: Direct networks laid out on a grid and routed dimension by dimension (XY routing).
GRID = ("mesh", "torus", "ring")
Topology = Literal["switch", "crossbar", "fat_tree", "mesh", "torus", "ring", "graph"]


class LowLatencySpec(Spec):
    """NCCL's LL protocol on one level: 8-byte stores with an inline flag, so a step costs
    little latency but only part of the bandwidth reaches the data (NCCL docs, "Protocols")."""

    #: software latency per ring step (on top of the links' own latency)
    step_latency_s: NonNegative
    #: bandwidth of the protocol as a fraction of the level's collective bandwidth
    efficiency: Fraction


class TreeSpec(Spec):
    """The constants of NCCL's tree all-reduce across nodes (the system layer's collectives
    use them), and the bandwidths NCCL's tuner believes when it rates the tree against the
    ring."""

    #: the tree's bandwidth across nodes as a fraction of the level's (like ``efficiency``)
    efficiency: Fraction
    #: software latency per tree hop across nodes, on top of the links' own latency
    step_latency_s: NonNegative = 0.0
    #: the bus bandwidths NCCL's tuner assigns the ring and the tree (its topology search's
    #: channels × per-channel speed; not what they achieve)
    tuner_ring_busbw_Bps: Positive
    tuner_tree_busbw_Bps: Positive


class CollectiveSpec(Spec):
    """Constants of the α–β ring-collective model on one level (the system layer's collectives)."""

    #: achievable fraction of the (shared) link bandwidth for collective traffic (NCCL's
    #: "busbw / link bandwidth"); multiplies the level's link efficiency
    efficiency: Fraction = 1.0
    #: software latency per ring step on top of the links' own latency
    step_latency_s: NonNegative = 0.0
    #: NCCL's low-latency protocol (LL), which NCCL's tuner picks for small messages: its
    #: own step latency and its bandwidth as a fraction of the one above; absent: the level
    #: has one protocol (the one above, NCCL's Simple)
    low_latency: LowLatencySpec | None = None
    #: send/recv's fraction of the (shared) link bandwidth: NCCL's point-to-point path copies
    #: without reducing (absent: ``efficiency``)
    p2p_efficiency: Fraction | None = None
    #: NCCL's tree all-reduce (inter level only; absent: rings only)
    tree: TreeSpec | None = None


class LevelSpec(Spec):
    """One network level: the topology and the links of one endpoint (paper §4.2.3)."""

    topology: Topology
    dims: tuple[Count, ...] = ()
    edges: tuple[tuple[Index, ...], ...] = ()
    bandwidth_Bps: Positive | None = None
    latency_s: NonNegative | None = None
    efficiency: Fraction | None = None
    collective: CollectiveSpec = Field(default_factory=CollectiveSpec)
    #: inter level: the node's NICs (rails), each serving ``devices_per_node / nics`` devices
    #: (NCCL uses the NIC nearest each GPU), and the node's network throughput limit in NICs'
    #: worth (a host-side limit below their sum); absent: the node's bandwidth is all usable
    nics: Count | None = None
    nic_limit: Positive | None = None

    def grid_dims(self, endpoints: int) -> tuple[int, ...]:
        """Grid sizes: the given dims, ``(endpoints,)`` for a ring without dims or a switch."""
        return self.dims or (endpoints,)

    def check(self, key: str, endpoints: int, what: str) -> None:
        """Raise ConfigError (naming ``key``.…) unless this level fits ``endpoints``."""
        if key == "intra":
            for name, value in (("nics", self.nics), ("nic_limit", self.nic_limit),
                                ("collective.tree", self.collective.tree)):
                if value is not None:
                    raise ConfigError(f"'{name}' describes the network between nodes; it "
                                      "applies to the inter level only", key=f"intra.{name}",
                                      allowed="inter.nics, inter.nic_limit, "
                                              "inter.collective.tree")
        if self.topology in SWITCHED + ("graph",) and self.dims:
            raise ConfigError(f"'dims' applies to mesh, torus and ring topologies, not to "
                              f"{self.topology!r}", key=f"{key}.dims", value=list(self.dims))
        if self.topology in ("mesh", "torus") and not self.dims:
            raise ConfigError(f"a {self.topology} needs its sizes, e.g. dims: [4, 4]",
                              key=f"{key}.dims", allowed=f"sizes whose product is {what}")
        if self.topology == "ring" and len(self.dims) > 1:
            raise ConfigError("a ring has one dimension; use a torus for more", key=f"{key}.dims",
                              value=list(self.dims))
        if self.topology in GRID and math.prod(self.grid_dims(endpoints)) != endpoints:
            raise ConfigError(
                f"the {self.topology} sizes multiply to {math.prod(self.dims)}, but the level "
                f"joins {endpoints} endpoints ({what})", key=f"{key}.dims", value=list(self.dims),
                allowed=f"sizes whose product is {endpoints}")
        if self.topology != "graph":
            if self.edges:
                raise ConfigError("'edges' applies to the graph topology only",
                                  key=f"{key}.edges", value=[list(e) for e in self.edges])
            return
        self._check_edges(key, endpoints)

    def _check_edges(self, key: str, endpoints: int) -> None:
        if not self.edges and endpoints > 1:
            raise ConfigError("a graph needs its links: edges: [[a, b, links], …]",
                              key=f"{key}.edges")
        seen: set[tuple[int, int]] = set()
        for i, edge in enumerate(self.edges):
            where = f"{key}.edges[{i}]"
            if len(edge) not in (2, 3):
                raise ConfigError("an edge is [a, b] or [a, b, links]", key=where,
                                  value=list(edge))
            a, b = edge[0], edge[1]
            if max(a, b) >= endpoints:
                raise ConfigError(f"endpoint out of range: the level has endpoints 0 to "
                                  f"{endpoints - 1}", key=where, value=list(edge))
            if a == b:
                raise ConfigError("an edge must join two different endpoints", key=where,
                                  value=list(edge))
            if len(edge) == 3 and edge[2] < 1:
                raise ConfigError("the number of links must be >= 1", key=where,
                                  value=list(edge))
            pair = (min(a, b), max(a, b))
            if pair in seen:
                raise ConfigError("this pair is listed twice; give the link count instead",
                                  key=where, value=list(edge))
            seen.add(pair)
        reached, frontier = {0}, [0]
        while frontier:
            node = frontier.pop()
            for a, b, *_ in self.edges:
                for u, v in ((a, b), (b, a)):
                    if u == node and v not in reached:
                        reached.add(v)
                        frontier.append(v)
        if len(reached) != endpoints:
            missing = sorted(set(range(endpoints)) - reached)
            raise ConfigError(f"the graph is not connected: endpoints {missing} cannot be "
                              "reached from endpoint 0", key=f"{key}.edges")


class MemoryPassesSpec(Spec):
    """Bytes a framework's memory-bound kernels move, as a multiple of one fused pass (read
    the inputs once, write the outputs once).  An unfused implementation (e.g. an RMSNorm as
    five PyTorch ops in fp32) makes several passes; 1.0 is the fused kernel."""

    layernorm: Annotated[float, Field(ge=1)] = 1.0
    softmax: Annotated[float, Field(ge=1)] = 1.0
    elementwise: Annotated[float, Field(ge=1)] = 1.0
    embedding: Annotated[float, Field(ge=1)] = 1.0
    #: Llama-style blocks: rotary position embedding, gated activation (SiLU-and-multiply)
    rope: Annotated[float, Field(ge=1)] = 1.0
    swiglu: Annotated[float, Field(ge=1)] = 1.0


class OverlapSpec(Spec):
    """Which communication the framework runs behind computation (Megatron-Core's
    ``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--tp-comm-overlap`` and the
    interleaved schedule's ``overlap_p2p_comm``).  All off: Megatron-LM of 2021-22, where
    every collective blocks the device."""

    #: data-parallel gradient all-reduce / reduce-scatter, bucketed, during the backward pass
    grad_reduce: bool = False
    #: distributed optimizer: the parameter all-gather during the next forward pass
    param_gather: bool = False
    #: fraction of the tensor-parallel collectives that can hide behind the GEMMs they are
    #: split with (userbuffers' chunked all-gather / reduce-scatter GEMMs); 0: none
    tp_comm: Annotated[float, Field(ge=0, le=1)] = 0.0
    #: pipeline send/recv on their own stream, behind the next chunk's computation
    p2p: bool = False
    #: fraction of an MoE layer's expert-parallel all-to-alls that does not delay the
    #: device (Megatron-Core's EP-communication overlap with another micro-batch's
    #: computation, and HybridEP's dispatch that sends a token once per node), never more
    #: than the pass's GEMM time; 0: every all-to-all blocks
    ep_comm: Annotated[float, Field(ge=0, le=1)] = 0.0


class SoftwareSpec(Spec):
    """What the training framework's kernels sustain on this system's devices, and what the
    host costs to issue them (the software-stack layer, docs/software-stack.md).

    Replaces the device preset's efficiencies in training predictions: ``gemm_efficiency``
    for GEMM compute, ``memory_bound_efficiency`` for elementwise / softmax / layernorm
    streaming (fractions of the device's peak FLOP/s and main-memory bandwidth).

    The host side (all default 0: a host that is never on the critical path):

    * ``dispatch_s``: host time to issue one forward op of the workload graph (Python,
      the framework's module code, the PyTorch dispatcher and autograd recording);
    * ``backward_dispatch_s``: host time per backward (and recomputed) op, issued by the
      autograd engine;
    * ``collective_dispatch_s``: host time to issue one collective or send/recv;
    * ``kernel_launch_s``: from the host issuing a kernel until the device can start it
      (driver + launch queue), paid when the device waits for the host;
    * ``kernel_min_s``: the shortest a kernel runs on the device, however small;
    * ``iteration_s``: host time per iteration outside the passes (optimizer step issue,
      loss-scale and gradient-norm checks that synchronise with the device);
    * ``sync``: how far the host may run ahead of the device — ``none`` (across the whole
      pipeline flush), ``pass`` (it waits for the device at every pipeline send/recv, as
      Megatron does after ``batch_isend_irecv``) or ``layer`` (it also waits at every
      transformer layer) or ``backward-layer`` (at every layer of the backward pass only, where
      a reentrant activation checkpoint recomputes and back-propagates each layer in a call
      of its own).
    """

    name: str
    gemm_efficiency: Annotated[float, Field(gt=0, le=1)]
    memory_bound_efficiency: Annotated[float, Field(gt=0, le=1)]
    memory_passes: MemoryPassesSpec = Field(default_factory=MemoryPassesSpec)
    dispatch_s: NonNegative = 0.0
    backward_dispatch_s: NonNegative = 0.0
    collective_dispatch_s: NonNegative = 0.0
    kernel_launch_s: NonNegative = 0.0
    kernel_min_s: NonNegative = 0.0
    iteration_s: NonNegative = 0.0
    sync: Literal["none", "pass", "backward-layer", "layer"] = "pass"
    #: the attention kernel of workloads that do not choose one (``attention_backend``)
    attention: Literal["unfused", "flash"] = "unfused"
    #: a flash-attention kernel's fraction of peak (None: 0.8 × gemm_efficiency)
    attention_efficiency: Annotated[float, Field(gt=0, le=1)] | None = None
    #: FP8 GEMMs' fraction of the FP8 peak (None: gemm_efficiency)
    fp8_gemm_efficiency: Annotated[float, Field(gt=0, le=1)] | None = None
    #: NVFP4 GEMMs' fraction of the FP4 peak (None: fp8_gemm_efficiency — no FP4 kernel
    #: has been measured to fit one to; the GB200 NVFP4 runs check the assumption,
    #: docs/validation.md)
    fp4_gemm_efficiency: Annotated[float, Field(gt=0, le=1)] | None = None
    #: what an MoE layer's own kernels (router, top-k, permutation, grouped expert GEMMs,
    #: expert activation, un-permutation and their backward) reach as a fraction of the
    #: kernel model's time at the efficiencies above: their time is divided by it (1: as
    #: priced; small grouped GEMMs and the dispatcher's many small kernels fall short)
    moe_efficiency: Annotated[float, Field(gt=0, le=1)] = 1.0
    #: which communication hides behind computation
    overlap: OverlapSpec = Field(default_factory=OverlapSpec)
    #: bytes per parameter of the gradient the data-parallel reduction sends: 2 (reduced
    #: in the training precision, Megatron-LM's default for fp16) or 4 (Megatron-Core's
    #: ``grad_reduce_in_fp32``, on in Megatron-Bridge's bf16 mixed-precision recipes)
    grad_reduce_bytes: Literal[2, 4] = 2
    #: bytes per parameter of the gradient buffer kept in memory: Megatron-LM keeps an fp32
    #: ``main_grad`` (4, the default); Megatron-Core's buffer has the reduction's type
    main_grad_bytes: Literal[2, 4] = 4
    #: Megatron's ``--gradient-accumulation-fusion``: each weight-gradient GEMM accumulates
    #: into the ``main_grad`` buffer (C += AᵀB, ``wgrad_gemm_accum_*``), reading and writing
    #: ``main_grad_bytes`` per weight element in its epilogue, after a main loop only as
    #: long as the micro-batch's tokens; that traffic is priced after the GEMM's own time at
    #: the device's DRAM bandwidth and efficiency (False: the gradient is written once, in
    #: the GEMM's roofline)
    gradient_accumulation_fusion: bool = False

    @property
    def has_host(self) -> bool:
        """Whether the host can be on the critical path at all."""
        return bool(self.dispatch_s or self.backward_dispatch_s or self.collective_dispatch_s
                    or self.iteration_s)


#: The most devices one prediction models (a system, a parallel grid).  A model keeps a few
#: kilobytes per device (link capacities, the mapping of the grid), so 2**20 devices take
#: ~0.5 GB and ~2 s; the largest machines built are ~2e5 accelerators.
MAX_DEVICES = 2**20


def _too_many(n: int, what: str = "") -> str:
    return (f"{what}{n:,} devices: more than one prediction models ({MAX_DEVICES:,}; each "
            f"device costs memory and time in the network model)")


class SystemSpec(Spec):
    kind: Literal["system"]
    name: str
    description: str = ""
    device: str = Field(min_length=1)
    devices_per_node: Count
    num_nodes: Count
    intra: LevelSpec | None = None
    inter: LevelSpec | None = None
    collective_launch_s: NonNegative = 0.0
    #: fixed cost of one send/recv (None: collective_launch)
    p2p_launch_s: NonNegative | None = None
    software: SoftwareSpec | None = None

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes

    def with_software_fields(self, **fields) -> SystemSpec:
        """The same system with ``fields`` of its software profile replaced (``overlap`` a
        dict of the overlap fields to replace): what a calibration fit tries at each step,
        copied without validation (the fits keep their values inside their bounds)."""
        sw = self.software
        if "overlap" in fields:
            fields["overlap"] = sw.overlap.model_copy(update=fields["overlap"])
        return self.model_copy(update={"software": sw.model_copy(update=fields)})

    @model_validator(mode="after")
    def _levels_fit(self) -> SystemSpec:
        for key in ("devices_per_node", "num_nodes"):  # each alone, then their product
            if getattr(self, key) > MAX_DEVICES:
                raise ConfigError(_too_many(getattr(self, key)), key=key,
                                  value=getattr(self, key), allowed=f"at most {MAX_DEVICES:,}")
        if self.num_devices > MAX_DEVICES:
            raise ConfigError(_too_many(self.num_devices, "devices_per_node × num_nodes = "),
                              key="num_nodes", value=self.num_nodes,
                              allowed=f"at most {MAX_DEVICES // self.devices_per_node:,} "
                              f"nodes of {self.devices_per_node} devices")
        if self.devices_per_node > 1 and self.intra is None:
            raise ConfigError(f"{self.devices_per_node} devices per node need an intra-node "
                              "network", key="intra", allowed="intra: {topology: switch, …}")
        if self.num_nodes > 1 and self.inter is None:
            raise ConfigError(f"{self.num_nodes} nodes need an inter-node network", key="inter",
                              allowed="inter: {topology: fat_tree, …}")
        if self.intra is not None:
            self.intra.check("intra", self.devices_per_node, "devices_per_node")
        if self.inter is not None:
            self.inter.check("inter", self.num_nodes, "num_nodes")
        return self
