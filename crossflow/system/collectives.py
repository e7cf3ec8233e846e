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
"""

from __future__ import annotations

import math
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


def bus_bandwidth(nbytes: float, seconds: float, n: int, collective: str = "all_reduce") -> float:
    """nccl-tests' busbw of a measured or predicted time: algbw · 2(n-1)/n for all-reduce,
    algbw · (n-1)/n for reduce-scatter and all-gather."""
    factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}[collective]
    return nbytes / seconds * factor * (n - 1) / n if seconds > 0 else math.inf
