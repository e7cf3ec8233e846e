"""α–β cost of the collectives distributed training uses (docs/architecture.md, "Layers").

A :class:`Group` holds what the cost model needs about the devices taking part: how many, the
bandwidth each of them has for the collective (after link sharing, paper §6.4), the latency of
one ring step and the fixed cost of launching the collective.  A mapped parallel dimension gives
one (:meth:`crossflow.system.Mapping.group`); so does a plain group on one switch
(:func:`switch_group`).

Ring algorithms (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009; the NCCL ring), ``S`` bytes per device, ``n`` devices, per-device
bandwidth ``B``, per-step latency ``α``::

    reduce-scatter, all-gather:  (n-1)·α  +  (n-1)/n · S / B
    all-reduce:                 2(n-1)·α  + 2(n-1)/n · S / B
    send/recv (point to point):       α   +        S / B_p2p
    all-to-all (p−1 concurrent sends):  α   +  slowest of the in-node and across-node shares

``S`` is the whole buffer: the all-reduce input, the reduce-scatter input, the all-gather output
(nccl-tests' "size").  nccl-tests reports ``algbw = S / t`` and ``busbw = algbw · 2(n-1)/n`` for
all-reduce (``(n-1)/n`` for the other two), so ``busbw`` tends to ``B`` for large ``S``: ``B``
is what the calibration against measured busbw fits, never algbw.

NCCL's protocol switch (NCCL docs, "Environment Variables: NCCL_PROTO"; its tuner picks per
size): where a level declares a low-latency protocol (``collective.low_latency``, NCCL's LL),
a collective costs the lesser of the two lines — the Simple protocol above, and LL with its
own (smaller) step latency ``α_LL`` and a fraction ``η_LL`` of the bandwidth::

    t = launch + min(P·α + P/n·S/B,  P·α_LL + P/n·S/(η_LL·B))      (P ring steps)

so small messages pay LL's latency and large ones Simple's bandwidth, as measured NCCL
curves do (the knee near 64 KiB–1 MiB).

Hierarchical all-reduce (two-level systems, e.g. Horovod/NCCL "2D" all-reduce): reduce-scatter
inside the node, all-reduce of the ``S/g`` shard across nodes (``g`` concurrent rings, one per
local rank), all-gather inside the node.

NCCL's tree all-reduce across nodes (NCCL ≥ 2.4: a chain through the ``g`` devices of each
node, a double binary tree across the ``k`` nodes; Sanders, Speck & Träff, "Two-tree algorithms
for full bandwidth broadcast, reduction and scan", Parallel Computing 2009), pipelined, so
its time is its latency plus its busiest link::

    tree:  launch + 2·((g-1)·α_chain + ⌈log2 k⌉·α_tree) + V / B_node,   V = S (k = 2), 2·S (k > 2)

``V`` is what each node sends (and receives) across the network: with two nodes each of the
two trees sends half the buffer up and half down, S per direction, where a ring crossing the
nodes carries 2(n-1)/n·S — so on a node-bandwidth-bound pair of nodes the tree is up to twice
as fast.  Which of ring and tree runs is NCCL's tuner's choice, by its own cost model
(``ncclTopoGetAlgoTime``, src/graph/tuning.cc): time = latency + bytes / bandwidth, with
NCCL's latency constants, the bus bandwidths its topology search assigns each algorithm, and
the tree's bandwidth multiplied by ``treeCorrectionFactor`` (:data:`TREE_CORRECTION`, a step
function of log2 of the size).  :func:`tuner_picks_tree` evaluates that model, so the choice
flips back and forth at powers of two as the correction steps, as measured NCCL times
across nodes do; :func:`nccl_all_reduce` then costs the chosen algorithm with the α–β
constants above.  NCCL's ring across nodes pays the network's step latency only on the
steps that cross a node boundary (:func:`nccl_ring`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True, slots=True)
class Group:
    """The devices of one collective, as the α–β model sees them.

    Attributes:
        size: devices in the group (``n``).
        bandwidth_Bps: per-device bandwidth of the ring, both ring directions together, after
            link sharing and efficiencies (``B``; equals the asymptotic nccl-tests busbw).
        step_latency_s: latency of one ring step (``α``): link path latency + software.
        launch_s: fixed cost of one collective call (kernel launch, setup).
        p2p_bandwidth_Bps: bandwidth of one logical edge in one direction, for send/recv
            (defaults to ``bandwidth_Bps``).
        ll_step_latency_s: step latency of the low-latency protocol (None: none).
        ll_fraction: its bandwidth as a fraction of ``bandwidth_Bps``.
        p2p_launch_s: fixed cost of one send/recv (None: ``launch_s``).
    """

    size: int
    bandwidth_Bps: float
    step_latency_s: float = 0.0
    launch_s: float = 0.0
    p2p_bandwidth_Bps: float | None = None
    ll_step_latency_s: float | None = None
    ll_fraction: float = 1.0
    p2p_launch_s: float | None = None  # fixed cost of one send/recv (None: ``launch_s``)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"a group has at least one device, but size={self.size}")
        if not self.bandwidth_Bps > 0:
            raise ValueError(f"bandwidth_Bps must be > 0, but got {self.bandwidth_Bps}")

    @property
    def send_bandwidth_Bps(self) -> float:
        return self.p2p_bandwidth_Bps or self.bandwidth_Bps


def switch_group(size: int, bandwidth_Bps: float, latency_s: float = 0.0, *,
                 efficiency: float = 1.0, step_latency_s: float = 0.0,
                 launch_s: float = 0.0, ll_step_latency_s: float | None = None,
                 ll_fraction: float = 1.0) -> Group:
    """A group of ``size`` devices on one non-blocking switch, each with ``bandwidth_Bps`` per
    direction into it: a ring uses every port once in each direction, so nothing is shared."""
    bw = bandwidth_Bps * efficiency
    ll = None if ll_step_latency_s is None else latency_s + ll_step_latency_s
    return Group(size, bw, latency_s + step_latency_s, launch_s, bw, ll, ll_fraction)


def _lines(steps: float, volume, bandwidth: float, g: Group):
    """The faster protocol for ``steps`` latency-bound steps and ``volume`` bytes (a float,
    or a NumPy array of sizes for the calibration scripts)."""
    t = steps * g.step_latency_s + volume / bandwidth
    if g.ll_step_latency_s is not None:
        ll = steps * g.ll_step_latency_s + volume / (bandwidth * g.ll_fraction)
        t = np.minimum(t, ll) if isinstance(t, np.ndarray) else min(t, ll)
    return t


def _empty(nbytes) -> bool:
    return not isinstance(nbytes, np.ndarray) and nbytes <= 0


def _ring(nbytes: float, g: Group, steps_per_pass: int) -> float:
    n = g.size
    if n == 1 or _empty(nbytes):
        return 0.0 * nbytes
    passes = steps_per_pass * (n - 1)
    return g.launch_s + _lines(passes, passes / n * nbytes, g.bandwidth_Bps, g)


def all_reduce(nbytes: float, group: Group) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` per device."""
    return _ring(nbytes, group, 2)


def reduce_scatter(nbytes: float, group: Group) -> float:
    """Seconds for a ring reduce-scatter of an ``nbytes`` input per device."""
    return _ring(nbytes, group, 1)


def all_gather(nbytes: float, group: Group) -> float:
    """Seconds for a ring all-gather producing ``nbytes`` per device."""
    return _ring(nbytes, group, 1)


def send_recv(nbytes: float, group: Group) -> float:
    """Seconds to send ``nbytes`` to one neighbour of the group (pipeline activations)."""
    if group.size == 1 or _empty(nbytes):
        return 0.0 * nbytes
    launch = group.launch_s if group.p2p_launch_s is None else group.p2p_launch_s
    return launch + _lines(1, nbytes, group.send_bandwidth_Bps, group)


def all_to_all(nbytes: float, size: int, local: int, intra: Group, inter: Group | None,
               copies: Callable[[int, int], tuple[float, float]] | None = None) -> float:
    """Seconds for an all-to-all of ``nbytes`` per device over ``size`` devices, ``local``
    of them in each node (MoE token dispatch and combine).

    NCCL has no all-to-all kernel: it is p−1 point-to-point sends of 1/p of the buffer each,
    issued as one group (``ncclGroupStart`` … ``ncclSend``/``ncclRecv`` per peer …
    ``ncclGroupEnd``; nccl-tests ``alltoall_perf``), so the sends run concurrently and the
    latency is paid once.  Of a device's buffer, (local−1)/p stays in its node (NVSwitch,
    ``intra``) and (p−local)/p leaves it through the device's share of the node's network
    (``inter``); the two run at once and the slower bounds the time::

        t = launch + α + max((local−1)/p · S / B_intra, (p−local)/p · S / B_inter)

    ``α`` is the step latency of the slowest level the group spans.  Contention inside the
    fabric is not modelled (a non-blocking fat tree and switch).

    A deduplicating dispatcher (Megatron-Core's flex: DeepEP, HybridEP) passes ``copies``:
    given the group's size and members per node, the copies of each of ``nbytes``' tokens
    (then one copy each) that cross NVLink and the network
    (:func:`crossflow.sim.transformer.dispatched_copies`).
    """
    if size <= 1 or _empty(nbytes):
        return 0.0 * nbytes
    if copies is not None:
        inside_n, across_n = copies(size, local)
        inside = inside_n * nbytes / intra.bandwidth_Bps
        across_bytes = across_n * nbytes
    else:
        inside = (local - 1) / size * nbytes / intra.bandwidth_Bps if local > 1 else 0.0
        across_bytes = (size - local) / size * nbytes
    if local < size:
        if inter is None:
            raise ValueError("an all-to-all across nodes needs the inter-node group")
        across = across_bytes / inter.bandwidth_Bps
        latency = max(inter.step_latency_s, intra.step_latency_s if local > 1 else 0.0)
        launch = inter.launch_s
    else:
        across, latency, launch = 0.0, intra.step_latency_s, intra.launch_s
    return launch + latency + max(inside, across)


def hierarchical_all_reduce(nbytes: float, intra: Group, inter: Group) -> float:
    """Seconds for reduce-scatter in ``intra`` → all-reduce of the shard in ``inter`` →
    all-gather in ``intra``, launched once (``intra.launch_s``).

    ``inter`` describes one of the ``intra.size`` concurrent inter-node rings (its bandwidth
    already shared among them, as :meth:`crossflow.system.Mapping.hierarchy` computes it).
    """
    intra_free = replace(intra, launch_s=0.0)
    inter_free = replace(inter, launch_s=0.0)
    shard = nbytes / intra.size
    phases = (2 * reduce_scatter(nbytes, intra_free) + all_reduce(shard, inter_free))
    if not isinstance(phases, np.ndarray) and phases == 0.0:
        return 0.0
    return intra.launch_s + phases


#: NCCL's ``treeCorrectionFactor`` for the Simple protocol (NCCL 2.12-2.19, src/graph/tuning.cc,
#: "Trees are not perfectly sticking to the model for medium sizes. Applying a static correction
#: factor is not ideal but works quite well."): its tuner multiplies the tree's bandwidth by entry
#: ``log2i(bytes >> 6)`` (64 B, 128 B, ... 256 MiB); none from 512 MiB up.
TREE_CORRECTION: tuple[float, ...] = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5,
                                      .6, .7, .8, .7, .7, .8, .9, .9)
_TREE_TABLE = np.array((*TREE_CORRECTION, 1.0))


def tree_correction(nbytes):
    """NCCL's tree correction factor of ``nbytes`` (a float, or a NumPy array of sizes)."""
    size = np.maximum(np.asarray(nbytes, dtype=float), 64.0)
    index = np.floor(np.log2(size / 64.0)).astype(int)  # log2i(nBytes >> 6)
    factor = _TREE_TABLE[np.minimum(index, len(TREE_CORRECTION))]
    return factor if isinstance(nbytes, np.ndarray) else float(factor)


#: NCCL's tuner latencies for the Simple protocol, µs (NCCL 2.12-2.19 src/graph/tuning.cc:
#: ``baseLat``, ``hwLat``; ring across nodes ×1.4, "Plateau effect of ring", on sm80 and
#: newer).  The ring's per-step cost inside a node is the larger of NVLink's 3.4 and the
#: network overhead ``getNetOverhead`` × 3 = 6.0 (2.0 on AMD EPYC hosts, as DGX A100 nodes have).
NCCL_RING_BASE_US, NCCL_RING_INTRA_US, NCCL_RING_NET_US, NCCL_RING_PLATEAU = 8.4, 6.0, 9.6, 1.4
NCCL_TREE_HOP_US = 28.0  # Tree/Simple per hop, NVLink and network alike ("a 256kB chunk")


@dataclass(frozen=True, slots=True)
class Tree:
    """NCCL's tree all-reduce over ``nodes`` nodes of ``local`` devices each, as the α–β model
    sees it (see the module docstring), and NCCL's tuner's view of it.

    Attributes:
        nodes, local: nodes (``k``) and devices per node in the group (``g``).
        bandwidth_Bps: what one node's tree traffic gets across the network, per direction.
        chain_latency_s: latency of one hop of the chain inside a node (``α_chain``).
        step_latency_s: latency of one tree hop across nodes (``α_tree``).
        launch_s: fixed cost of the call.
        tuner_ring_Bps, tuner_tree_Bps: the bus bandwidths NCCL's tuner assigns the ring and
            the tree (None: the tuner never picks the tree).
    """

    nodes: int
    local: int
    bandwidth_Bps: float
    chain_latency_s: float = 0.0
    step_latency_s: float = 0.0
    launch_s: float = 0.0
    tuner_ring_Bps: float | None = None
    tuner_tree_Bps: float | None = None

    @property
    def latency_s(self) -> float:
        return self.launch_s + 2 * ((self.local - 1) * self.chain_latency_s
                                    + math.ceil(math.log2(self.nodes)) * self.step_latency_s)

    @property
    def volume_factor(self) -> float:
        """Bytes each node sends across the network per byte of the buffer."""
        return 1.0 if self.nodes == 2 else 2.0


def tree_all_reduce(nbytes: float, tree: Tree) -> float:
    """Seconds for NCCL's tree all-reduce of ``nbytes`` per device (whether or not NCCL's
    tuner would pick it)."""
    if _empty(nbytes):
        return 0.0 * nbytes
    return tree.latency_s + tree.volume_factor * nbytes / tree.bandwidth_Bps


def tuner_picks_tree(nbytes, tree: Tree):
    """Whether NCCL's tuner (``ncclTopoGetAlgoTime``) rates the Simple-protocol tree faster
    than the Simple ring for ``nbytes`` (a bool, or a boolean array for an array of sizes):
    each is its latency (:data:`NCCL_RING_BASE_US` …, NCCL's own constants) plus the bytes over
    its algorithm bandwidth — the ring's bus bandwidth × n / 2(n-1), the tree's × 1/2 ×
    :func:`tree_correction`."""
    if tree.tuner_ring_Bps is None or tree.tuner_tree_Bps is None:
        return np.zeros(np.shape(nbytes), bool) if isinstance(nbytes, np.ndarray) else False
    n = tree.nodes * tree.local
    steps = 2 * (n - 1)
    crossing = min(2 * tree.nodes, steps)
    ring_lat = NCCL_RING_PLATEAU * 1e-6 * (NCCL_RING_BASE_US + (steps - crossing)
                                           * NCCL_RING_INTRA_US + crossing * NCCL_RING_NET_US)
    tree_lat = 2e-6 * NCCL_TREE_HOP_US * ((tree.local - 1) + math.ceil(math.log2(tree.nodes)))
    ring = ring_lat + nbytes * steps / n / tree.tuner_ring_Bps
    estimate = tree_lat + nbytes / (0.5 * tree.tuner_tree_Bps * tree_correction(nbytes))
    return estimate < ring


def nccl_ring(ring: Group, intra: Group, nodes: int) -> Group:
    """The flat ring ``ring`` across ``nodes`` nodes with NCCL's per-hop latency: a chunk's
    trip round the ring crosses the network only at the node boundaries, so of its ``P`` steps
    ``2·nodes`` (all-reduce: two passes) pay the ring's network step latency and the rest the
    step latency inside a node (``intra``; NCCL's tuner: ``(nsteps - nInterSteps)·intraLat +
    nInterSteps·interLat``).  Returned as a group whose step latencies are the per-step mean,
    so :func:`all_reduce` of it is that sum."""
    steps = 2 * (ring.size - 1)
    crossing = min(2 * nodes, steps)

    def mean(inter: float | None, local: float | None) -> float | None:
        if inter is None or local is None:
            return None
        return (crossing * inter + (steps - crossing) * local) / steps

    return replace(ring, step_latency_s=mean(ring.step_latency_s, intra.step_latency_s),
                   ll_step_latency_s=mean(ring.ll_step_latency_s, intra.ll_step_latency_s))


def nccl_all_reduce(nbytes: float, ring: Group, intra: Group, tree: Tree):
    """Seconds for the all-reduce NCCL runs across ``tree.nodes`` nodes: its flat ring
    (:func:`nccl_ring` of ``ring``), or its tree where :func:`tuner_picks_tree`."""
    ring_s = all_reduce(nbytes, nccl_ring(ring, intra, tree.nodes))
    if tree.nodes < 2 or _empty(nbytes):
        return ring_s
    picks = tuner_picks_tree(nbytes, tree)
    if isinstance(ring_s, np.ndarray):
        return np.where(picks, tree_all_reduce(nbytes, tree), ring_s)
    return tree_all_reduce(nbytes, tree) if picks else ring_s


def bus_bandwidth(nbytes: float, seconds: float, n: int, collective: str = "all_reduce") -> float:
    """nccl-tests' busbw of a measured or predicted time: algbw · 2(n-1)/n for all-reduce,
    algbw · (n-1)/n for reduce-scatter and all-gather."""
    factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}[collective]
    return nbytes / seconds * factor * (n - 1) / n if seconds > 0 else math.inf
