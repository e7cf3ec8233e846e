"""The system model: devices in nodes, two network levels, mapping and link sharing.

(Over 600 lines, one job on purpose: :class:`System`'s routes, :class:`Mapping`'s placement
and the ring / hierarchy helpers below share the same routing arrays; the cost formulas of
the collectives are in :mod:`crossflow.system.collectives`.)

:func:`build_system` turns a :class:`~crossflow.config.system.SystemSpec` and the device's
:class:`~crossflow.arch.microarch.MicroArch` into a :class:`System`.  ``System.map(grid, order)``
places a 4-D parallel grid ``(kp1, kp2, dp, lp)`` on the devices greedily in the given order of
those dimensions (paper §5.2, Fig. 5), routes every logical edge and counts the logical edges on
every link direction / switch port; :class:`Mapping` then gives each parallel dimension's
collective :class:`~crossflow.system.collectives.Group` with its bandwidth derated by that
sharing (paper §6.4).

Conventions:

* Physical device ids run over the intra-node dimensions first, then the inter-node ones
  (device ``d`` is in node ``d // devices_per_node``); grid levels number their endpoints with
  dimension 0 fastest.
* **Greedy mapping** (paper §5.2): the shards of the first dimension of ``order`` take
  consecutive devices — along physical dimension 0 and, when it runs out, wrapping on to the
  next physical dimension — then the next dimension of ``order`` continues where it stopped.
  With ids as above this is a mixed-radix renumbering: the shard with grid index ``i`` sits on
  device ``i[o0] + n[o0]·(i[o1] + n[o1]·(i[o2] + n[o2]·i[o3]))``.  A grid smaller than the
  system uses the first devices.
* **Logical edges** (paper §5.1): ``kp1``, ``kp2`` and ``dp`` shards form rings (ring
  collectives); with three or more members the ring is used in both directions, each carrying
  half of the data, as NCCL does; ``lp`` stages form a chain ``i -> i+1`` (activations; the
  gradients going back use the mirror-image links).
* **Sharing**: a link direction carrying ``k`` logical edges gives each ``1/k`` of its
  bandwidth; a dimension's ring runs at the pace of its slowest edge.  By default only the
  dimension's own edges share (one collective at a time); ``concurrent=`` adds the edges of
  dimensions communicating at the same time (the paper's §6.4 count uses all of them:
  ``concurrent=DIMS``).
* Edges between nodes use the inter level only (each device's NIC traffic is pooled per node,
  as NCCL's PXN / rail-optimised routing does); the hop from a device to its NIC is free.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from collections.abc import Mapping as AnyMapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from crossflow.arch.hardware import load_hardware
from crossflow.arch.microarch import MicroArch
from crossflow.config.base import Spec
from crossflow.config.loader import load_spec
from crossflow.config.system import SWITCHED, SystemSpec
from crossflow.errors import ConfigError
from crossflow.system.collectives import (
    Group,
    Tree,
    all_gather,
    all_reduce,
    all_to_all,
    hierarchical_all_reduce,
    nccl_all_reduce,
    reduce_scatter,
    switch_group,
)
from crossflow.system.topology import INT, Level

#: The parallel dimensions, in the order of a grid tuple.
DIMS: tuple[str, ...] = ("kp1", "kp2", "dp", "lp")
#: All 4! = 24 mapping orders (the first dimension is placed first, on adjacent devices).
ORDERS: tuple[tuple[str, ...], ...] = tuple(itertools.permutations(DIMS))
_CHAIN_DIMS = frozenset({"lp"})


def parse_order(order: str | Iterable[str]) -> tuple[str, ...]:
    """``"kp1-kp2-dp-lp"`` (or ``,`` / space separated, or a sequence) -> a tuple of ORDERS.

    Raises ConfigError (key ``mapping_order``) unless it is a permutation of the four dims.
    """
    if isinstance(order, str):
        parts = tuple(p for p in order.replace(",", " ").replace("-", " ").split() if p)
    else:
        parts = tuple(order)
    if sorted(parts) != sorted(DIMS):
        raise ConfigError("a mapping order names each parallel dimension once",
                          key="mapping_order", value=order,
                          allowed="a permutation of kp1, kp2, dp, lp, e.g. 'kp1-kp2-dp-lp'")
    return parts


# --- building -----------------------------------------------------------------------------------


def build_system(spec: SystemSpec | str | Path | AnyMapping[str, Any],
                 arch: MicroArch | Spec | str | None = None, *,
                 num_nodes: int | None = None) -> System:
    """A :class:`System` from a system spec (or preset name / path / dict).

    Args:
        spec: the system.
        arch: the device; default: the one the system file names (``device``).  A study that
            generates chips passes each generated MicroArch here.
        num_nodes: override the file's node count (e.g. the nodes a parallelism needs).
    """
    if not isinstance(spec, SystemSpec):
        spec = load_spec(spec, "systems")
    if num_nodes is not None and num_nodes != spec.num_nodes:
        data = spec.model_dump()
        data["num_nodes"] = num_nodes
        try:
            spec = SystemSpec.model_validate(data)
        except ConfigError as exc:
            raise exc.with_file(spec.source_file) if spec.source_file else exc from None
    if not isinstance(arch, MicroArch):
        try:
            arch = load_hardware(arch if arch is not None else spec.device)
        except ConfigError as exc:
            if arch is not None:
                raise
            raise ConfigError(f"cannot load the device: {exc.problem}", file=spec.source_file,
                              key="device", value=spec.device, allowed=exc.allowed) from None
    return System(spec, arch)


def _level(spec: SystemSpec, arch: MicroArch, name: str, endpoints: int, replicas: int,
           per_endpoint: int) -> Level | None:
    level_spec = getattr(spec, name)
    if endpoints == 1:
        return None
    link = arch.links.get(name)
    bw = level_spec.bandwidth_Bps if level_spec and level_spec.bandwidth_Bps else None
    if bw is None:
        if link is None:
            raise ConfigError(
                f"the device {arch.name!r} has no {name} links, so the system must give their "
                "bandwidth", file=spec.source_file, key=f"{name}.bandwidth_<GBps|Gbps|…>")
        bw = link.bandwidth_Bps
    latency = level_spec.latency_s if level_spec and level_spec.latency_s is not None else (
        link.latency_s if link else 0.0)
    efficiency = level_spec.efficiency if level_spec and level_spec.efficiency else (
        link.efficiency if link else 1.0)
    if level_spec and level_spec.nics and level_spec.nic_limit:  # the node's throughput limit
        bw *= min(1.0, level_spec.nic_limit / level_spec.nics)
    return Level.from_spec(name, level_spec, endpoints, replicas, bw * per_endpoint, latency,
                           efficiency)


class System:
    """Devices, nodes and the two network levels, ready to map parallel grids onto.

    Attributes:
        spec, arch: what it was built from.
        devices_per_node, num_nodes, num_devices: the sizes.
        intra, inter: the :class:`~crossflow.system.topology.Level` s (None where a level
            has a single endpoint).
        launch_s: fixed cost of one collective (``collective_launch``).
    """

    def __init__(self, spec: SystemSpec, arch: MicroArch) -> None:
        self.spec, self.arch = spec, arch
        self.name = spec.name
        self.devices_per_node, self.num_nodes = spec.devices_per_node, spec.num_nodes
        self.num_devices = spec.num_devices
        self.launch_s = spec.collective_launch_s
        self.p2p_launch_s = spec.p2p_launch_s
        self.intra = _level(spec, arch, "intra", self.devices_per_node, self.num_nodes, 1)
        self.inter = _level(spec, arch, "inter", self.num_nodes, 1, self.devices_per_node)
        offset = 0
        caps, lats, p2p = [], [], []
        for name, level in (("intra", self.intra), ("inter", self.inter)):
            if level is not None:
                level.offset = offset
                offset += level.num_resources
                cap, lat = level.capacities()
                caps.append(cap)
                lats.append(lat)
                # send/recv at its own efficiency where the level declares one
                p2p_eff = getattr(spec, name).collective.p2p_efficiency
                p2p.append(cap if p2p_eff is None else cap * p2p_eff / level.collective_efficiency)
        self.num_resources = offset
        self.capacity = np.concatenate(caps) if caps else np.zeros(0)
        self.p2p_capacity = np.concatenate(p2p) if p2p else np.zeros(0)
        self.latency = np.concatenate(lats) if lats else np.zeros(0)
        self._maps: dict[tuple, Mapping] = {}
        self._ring_cache: dict[tuple, _Rings] = {}
        self._hier_cache: dict[tuple, tuple[Group, Group] | None] = {}
        self._topology = _topology_id(spec)

    def __repr__(self) -> str:
        return (f"System({self.name!r}: {self.num_nodes} x {self.devices_per_node} "
                f"{self.arch.name})")

    # --- mapping --------------------------------------------------------------------------

    def map(self, grid: tuple[int, int, int, int],
            order: tuple[str, ...] | str = DIMS) -> Mapping:
        """Place the grid ``(kp1, kp2, dp, lp)`` greedily in ``order`` (cached).

        Raises ConfigError when the grid needs more devices than the system has.
        """
        grid = tuple(int(g) for g in grid)
        if len(grid) != 4 or min(grid) < 1:
            raise ConfigError("a parallel grid is four sizes >= 1 (kp1, kp2, dp, lp)",
                              key="parallelism", value=grid)
        order = parse_order(order)
        # Orders that differ only in where size-1 dimensions go give the same mapping.
        key = (grid, tuple(d for d in order if grid[DIMS.index(d)] > 1))
        found = self._maps.get(key)
        if found is None:
            if math.prod(grid) > self.num_devices:
                raise ConfigError(
                    f"the parallel grid {grid} needs {math.prod(grid)} devices, but the system "
                    f"{self.name!r} has {self.num_devices} ({self.num_nodes} nodes x "
                    f"{self.devices_per_node})", key="parallelism", value=grid)
            found = self._maps[key] = Mapping(self, grid, order)
        return found

    def switch_group(self, size: int, level: str = "intra") -> Group:
        """A plain group of ``size`` endpoints on one switched level, nothing else sharing its
        ports: devices of one node (``"intra"``) or nodes (``"inter"``; a ring of one device
        per node uses the node's NICs in full, as NCCL's channels do).

        Raises ValueError for direct topologies (mesh, torus, ring, graph), where what a
        group gets depends on where it sits: use :meth:`map`.
        """
        lv = self.intra if level == "intra" else self.inter
        if lv is None or size == 1:
            return Group(1, math.inf, 0.0, self.launch_s, math.inf)
        if lv.topology not in SWITCHED:
            raise ValueError(f"the {level} level is a {lv.topology}, not a switch; use map()")
        return switch_group(size, lv.bandwidth_Bps * lv.capacity_factor, lv.latency_s,
                            step_latency_s=lv.step_latency_s, launch_s=self.launch_s,
                            ll_step_latency_s=lv.ll_step_latency_s, ll_fraction=lv.ll_fraction)

    def _rings(self, n: int, stride: int, count: int, chain: bool) -> _Rings:
        key = (n, stride, count, chain)
        found = self._ring_cache.get(key)
        if found is None:
            found = self._ring_cache[key] = _ring_stats(self, _members(n, stride, count), chain)
        return found

    def _hierarchy(self, n: int, stride: int, count: int) -> tuple[Group, Group] | None:
        key = (n, stride, count)
        if key not in self._hier_cache:
            rings = self._rings(n, stride, count, False)
            self._hier_cache[key] = (_hierarchy(self, _members(n, stride, count))
                                     if n >= 4 and rings.crosses_nodes else None)
        return self._hier_cache[key]

    # --- routing --------------------------------------------------------------------------

    def route(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Resources of the logical edges ``src[i] -> dst[i]`` (device ids): ``(edge, res)``."""
        dpn = self.devices_per_node
        node_s, node_d = src // dpn, dst // dpn
        same = node_s == node_d
        out_e, out_r = [], []
        for level, pick, a, b, rep in (
            (self.intra, same, src % dpn, dst % dpn, node_s),
            (self.inter, ~same, node_s, node_d, 0),
        ):
            idx = np.flatnonzero(pick)
            if idx.size and level is not None:
                e, r = level.route(a[idx], b[idx], rep if np.isscalar(rep) else rep[idx])
                out_e.append(idx[e])
                out_r.append(r)
        if not out_e:
            return np.zeros(0, INT), np.zeros(0, INT)
        return np.concatenate(out_e), np.concatenate(out_r)

    # --- networkx view --------------------------------------------------------------------

    @cached_property
    def graph(self):
        """The topology as a ``networkx.MultiDiGraph``.

        Nodes: ``("device", d)``, ``("switch", node)`` (intra switch of a node),
        ``("nic", node)`` (a node's network interface) and ``("fabric", 0)`` (the inter-node
        switch / fat tree).  Edges, keyed by resource id, carry ``level``, ``topology``,
        ``bandwidth_Bps`` (per direction, effective) and ``latency_s``; ``("device", d) <->
        ("nic", node)`` attachments have ``level="attach"`` and no resource.
        """
        g = nx.MultiDiGraph(name=self.name)
        dpn = self.devices_per_node
        for d in range(self.num_devices):
            g.add_node(("device", d), node=d // dpn)
        if self.intra is not None:
            for u, v, r, attrs in self.intra.graph_edges(lambda n, e: ("device", n * dpn + e)):
                g.add_edge(u, v, key=r, **attrs)
        if self.inter is not None:
            for d in range(self.num_devices):
                nic = ("nic", d // dpn)
                g.add_edge(("device", d), nic, key="attach", level="attach")
                g.add_edge(nic, ("device", d), key="attach", level="attach")
            for u, v, r, attrs in self.inter.graph_edges(lambda _, n: ("nic", n)):
                g.add_edge(u, v, key=r, **attrs)
        return g

    @cached_property
    def links(self) -> dict[int, tuple[Any, Any, int]]:
        """Resource id -> its graph edge ``(u, v, key)``."""
        return {k: (u, v, k) for u, v, k in self.graph.edges(keys=True) if k != "attach"}


# --- mapping ------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Rings:
    """The logical edges of one set of concurrent rings (or chains) and where they run."""

    size: int
    directions: int          # 2: ring used both ways (size >= 3); 1: a pair or a chain
    loads: np.ndarray        # logical edges per resource (routed edges + spread links)
    routed: np.ndarray       # resources used by routed ring edges
    spread: tuple | None     # (row, sender, resource) of graph links carrying whole rings
    p2p: np.ndarray          # resources used by any routed edge (send/recv)
    step_latency_s: float
    crosses_nodes: bool
    ll_step_latency_s: float | None = None  # the low-latency protocol's (None: no such)
    ll_fraction: float = 1.0
    alone: Group | None = None  # the group with nothing else sharing (cached)

    def bandwidth(self, cap: np.ndarray, loads: np.ndarray) -> float:
        bw = math.inf
        if self.routed.size:
            bw = self.directions * float(np.min(cap[self.routed] / loads[self.routed]))
        if self.spread is not None:
            rows, sender, res = self.spread
            per_sender = np.bincount(rows * self.size + sender, weights=cap[res] / loads[res])
            bw = min(bw, float(per_sender[per_sender > 0].min()))
        return bw

    def p2p_bandwidth(self, cap: np.ndarray, loads: np.ndarray) -> float:
        if not self.p2p.size:
            return math.inf
        return float(np.min(cap[self.p2p] / np.maximum(loads[self.p2p], 1.0)))

    def group(self, system: System, loads: np.ndarray | None = None) -> Group:
        if loads is None and self.alone is not None:
            return self.alone
        if self.size == 1:
            found = Group(1, math.inf, 0.0, system.launch_s, math.inf)
        else:
            cap, shared = system.capacity, self.loads if loads is None else loads
            found = Group(self.size, self.bandwidth(cap, shared), self.step_latency_s,
                          system.launch_s, self.p2p_bandwidth(system.p2p_capacity, shared),
                          self.ll_step_latency_s, self.ll_fraction, system.p2p_launch_s)
        if loads is None:
            self.alone = found
        return found


class Mapping:
    """One placement of a parallel grid on a system (made by :meth:`System.map`).

    The rings of a dimension depend only on its size, its stride in the placement and the
    grid's device count, so their routing is computed once per system and shared by every
    mapping (at most 8 strides per dimension over the 24 orders).

    Attributes:
        system, grid, order: what it maps.
    """

    def __init__(self, system: System, grid: tuple[int, ...], order: tuple[str, ...]) -> None:
        self.system, self.grid, self.order = system, grid, order
        self.num_devices = math.prod(grid)
        self._stride: dict[str, int] = {}
        stride = 1
        for d in order:
            self._stride[d] = stride
            stride *= grid[DIMS.index(d)]

    def __repr__(self) -> str:
        return f"Mapping({self.system.name!r}, grid={self.grid}, order={'-'.join(self.order)})"

    @cached_property
    def devices(self) -> np.ndarray:
        """Int array of shape ``grid``: the device of each shard."""
        sizes = [self.grid[DIMS.index(d)] for d in self.order]
        t = np.arange(self.num_devices, dtype=INT).reshape(sizes[::-1])
        outer_first = list(self.order[::-1])
        return t.transpose([outer_first.index(d) for d in DIMS])

    # --- public ---------------------------------------------------------------------------

    def group(self, dim: str, *, concurrent: Iterable[str] = ()) -> Group:
        """The collective group of ``dim``'s rings (all of them run at once; the slowest
        sets the pace), with the edges of the ``concurrent`` dimensions sharing the links."""
        rings, loads = self._dim(dim), None
        for other in concurrent:
            if other != dim and self.grid[DIMS.index(other)] > 1:
                loads = (rings.loads if loads is None else loads) + self._dim(other).loads
        return rings.group(self.system, loads)

    def group_bandwidth(self, dim: str, *, concurrent: Iterable[str] = ()) -> float:
        """Per-device ring bandwidth of ``dim`` after link sharing (B/s, inf for size 1)."""
        return self.group(dim, concurrent=concurrent).bandwidth_Bps

    def group_latency(self, dim: str) -> float:
        """Latency of one ring step of ``dim``: the longest edge path + software (s)."""
        return self._dim(dim).step_latency_s

    def spans_nodes(self, dim: str) -> bool:
        """Whether the groups of ``dim`` cross node boundaries."""
        return self._dim(dim).crosses_nodes

    def hierarchy(self, dim: str) -> tuple[Group, Group] | None:
        """``(intra, inter)`` groups for a two-level all-reduce of ``dim``, or None when its
        groups do not span nodes with the same number (>= 2) of members in each.

        ``intra``: the members of a group inside one node (all such sub-rings at once);
        ``inter``: one ring per local member across the nodes (all at once, sharing the NICs).
        """
        return self.system._hierarchy(*self._key(dim))

    def all_reduce(self, dim: str, nbytes: float) -> float:
        """Seconds for an all-reduce of ``nbytes`` along ``dim``: the faster of the flat ring
        and the hierarchical algorithm; where the inter level declares NCCL's tree
        (``collective.tree``), NCCL's own choice instead: the flat ring, or the tree where
        NCCL's tuner picks it."""
        hier = self.hierarchy(dim)
        tree = None if hier is None else _tree(self.system, *hier)
        if tree is not None:  # NCCL's own algorithms: its ring or its tree
            return nccl_all_reduce(nbytes, self.group(dim), hier[0], tree)
        flat = all_reduce(nbytes, self.group(dim))
        if hier is None:
            return flat
        two_level = hierarchical_all_reduce(nbytes, *hier)
        return np.minimum(flat, two_level) if isinstance(flat, np.ndarray) else min(
            flat, two_level)

    def expert_groups(self, size: int, stride: int = 1) -> np.ndarray:
        """Rows of devices of the expert-parallel groups of ``size`` ranks: Megatron-Core
        (MoE parallel folding) numbers the ranks of a pipeline stage tensor-fastest, then
        data (× context), and lays the expert grid over that sequence expert-tensor-fastest,
        then expert, then expert-data (its RankGenerator order tp-ep-dp-pp for the experts).
        An expert group takes every ``stride``-th rank (``stride``: the expert-tensor-parallel
        size), an expert-tensor group ``stride`` consecutive ranks
        (:meth:`expert_tensor_groups`).  With ``stride`` 1 an expert group is ``size``
        consecutive ranks: the tensor-parallel ranks and then ``size / kp1`` data-parallel
        replicas, wherever the mapping put them."""
        stages = self.devices[:, 0].transpose(2, 1, 0)  # (lp, dp, kp1), kp1 fastest
        ranks = stages.reshape(stages.shape[0], -1)
        if ranks.shape[1] % (size * stride):
            raise ValueError(f"{size} × {stride} does not divide the {ranks.shape[1]} ranks "
                             f"of a stage")
        if stride == 1:
            return ranks.reshape(-1, size)
        return ranks.reshape(-1, size, stride).transpose(0, 2, 1).reshape(-1, size)

    def expert_tensor_groups(self, size: int) -> np.ndarray:
        """Rows of devices of the expert-tensor-parallel groups of ``size`` ranks: ``size``
        consecutive ranks of a pipeline stage in :meth:`expert_groups`' numbering (the
        same cut as an expert group without stride)."""
        return self.expert_groups(size)

    def expert_tensor(self, kind: str, nbytes: float, size: int) -> float:
        """Seconds for a ring all-gather (``kind`` "all_gather", ``nbytes`` its output) or
        reduce-scatter ("reduce_scatter", ``nbytes`` its input) in every
        expert-tensor-parallel group of ``size`` ranks at once: the groups' rings routed on
        the system like a grid dimension's, so inside a node they take the switch and
        across nodes the network, sharing links where they meet."""
        if size <= 1:
            return 0.0
        group = _ring_stats(self.system, self.expert_tensor_groups(size)).group(self.system)
        return (all_gather if kind == "all_gather" else reduce_scatter)(nbytes, group)

    def all_to_all(self, nbytes: float, size: int, stride: int = 1,
                   copies: Callable[[int, int], tuple[float, float]] | None = None) -> float:
        """Seconds for an all-to-all of ``nbytes`` per device in every expert-parallel
        group of ``size`` ranks at once (:func:`crossflow.system.collectives.all_to_all`,
        ``copies`` a deduplicating dispatcher's), the groups of :meth:`expert_groups` with
        ``stride``: the groups' members per node decide how much crosses the network."""
        if size <= 1:
            return 0.0
        members = self.expert_groups(size, stride)
        system = self.system
        nodes = members // system.devices_per_node
        # a device with few group members in its node sends most across the network: the
        # group waits for the node holding the fewest of its members
        local = min(int(np.unique(row, return_counts=True)[1].min()) for row in nodes)
        return all_to_all(nbytes, size, local, _level_group(system, "intra"),
                          _level_group(system, "inter"), copies)

    def link_loads(self, dims: Iterable[str] = DIMS) -> dict[tuple, int]:
        """Logical edges on each used link direction / port, summed over ``dims``: a dict
        ``(u, v, key) -> count`` over :attr:`System.graph` edges."""
        loads = sum((self._dim(d).loads for d in dims), np.zeros(self.system.num_resources))
        links = self.system.links
        return {links[int(r)]: int(loads[r]) for r in np.flatnonzero(loads)}

    # --- internals ------------------------------------------------------------------------

    def _key(self, dim: str) -> tuple[int, int, int]:
        return self.grid[DIMS.index(dim)], self._stride[dim], self.num_devices

    def _dim(self, dim: str) -> _Rings:
        return self.system._rings(*self._key(dim), chain=dim in _CHAIN_DIMS)


def _level_group(system: System, name: str) -> Group | None:
    """One device's bandwidth into a level and the level's step latency (what an
    all-to-all's point-to-point sends get: each device has its own ports into the switch
    and its own NIC, and every device of a node sends at once)."""
    lv = system.intra if name == "intra" else system.inter
    if lv is None:
        return None
    # the inter level's endpoint is a node: its NICs together, shared by the node's devices
    share = 1 if name == "intra" else system.devices_per_node
    return Group(2, lv.bandwidth_Bps * lv.capacity_factor / share,
                 lv.latency_s + lv.step_latency_s, system.launch_s)


def _members(n: int, stride: int, count: int) -> np.ndarray:
    """Rows of devices ``base + j·stride`` (j < n): the groups of a dimension of size ``n``
    placed with ``stride`` among ``count`` devices."""
    t = np.arange(0, count, dtype=INT)
    bases = t[t // stride % n == 0]
    return bases[:, None] + np.arange(n, dtype=INT) * stride


#: Routes of ring / chain groups, shared by every System of the same topology: a study
#: builds one System per generated chip, and chips change link bandwidths and latencies,
#: never which links a route takes (routing reads the system spec only).  Bounded: cleared
#: when full.
_ROUTES: dict[tuple, tuple] = {}
_TOPOLOGIES: dict[SystemSpec, int] = {}
_MAX_ROUTES = 8192


_MAX_TOPOLOGIES = 256
#: Ids are never reused: a System keeps its id for its life, so an id handed out again
#: after the table is reset would look up another topology's routes under its key.
_NEXT_TOPOLOGY = itertools.count()


def _topology_id(spec: SystemSpec) -> int:
    """A small id per distinct system spec (devices, nodes, levels: all routing depends on);
    computed once per System so route lookups do not hash the spec."""
    if len(_TOPOLOGIES) >= _MAX_TOPOLOGIES:
        _TOPOLOGIES.clear()
        _ROUTES.clear()
    found = _TOPOLOGIES.get(spec)
    if found is None:
        found = _TOPOLOGIES[spec] = next(_NEXT_TOPOLOGY)
    return found


def _ring_stats(system: System, members: np.ndarray, chain: bool = False) -> _Rings:
    """Route the rings (or chains) over the rows of ``members`` and count the sharing."""
    n = members.shape[1]
    empty = np.zeros(0, INT)
    if n == 1:
        return _Rings(1, 1, np.zeros(system.num_resources), empty, None, empty, 0.0, False)
    key = (system._topology, chain, members.shape, members.tobytes())
    routes = _ROUTES.get(key)
    if routes is None:
        if len(_ROUTES) >= _MAX_ROUTES:
            _ROUTES.clear()
        routes = _ROUTES[key] = _ring_routes(system, members, chain)
    directions, src_size, edge, res, crossing, spread, loads, used, p2p = routes
    # Latency: the longest path, plus the software step cost of the level it runs on.
    path = np.bincount(edge, weights=system.latency[res], minlength=src_size)
    inter_step = system.inter.step_latency_s if system.inter else 0.0
    intra_step = system.intra.step_latency_s if system.intra else 0.0
    latency = float(np.max(path + np.where(crossing, inter_step, intra_step)))
    # The low-latency protocol, where every level the rings use declares one: its step
    # latency on the same paths, and the smallest bandwidth fraction among those levels.
    crosses = bool(crossing.any())
    used_levels = [lv for lv, on in ((system.intra, not crossing.all()),
                                     (system.inter, crosses)) if on and lv]
    ll_latency, ll_fraction = None, 1.0
    if used_levels and all(lv.ll_step_latency_s is not None for lv in used_levels):
        inter_ll = system.inter.ll_step_latency_s if crosses else 0.0
        intra_ll = system.intra.ll_step_latency_s if not crossing.all() else 0.0
        ll_latency = float(np.max(path + np.where(crossing, inter_ll, intra_ll)))
        ll_fraction = min(lv.ll_fraction for lv in used_levels)
    return _Rings(n, directions, loads, used, spread, p2p, latency, crosses, ll_latency,
                  ll_fraction)


def _ring_routes(system: System, members: np.ndarray, chain: bool) -> tuple:
    """The chip-independent part of :func:`_ring_stats` (cached in ``_ROUTES``): the routed
    edges, which cross nodes, and the logical edges per resource (arrays read-only)."""
    if chain:
        src, dst, directions = members[:, :-1].ravel(), members[:, 1:].ravel(), 1
    elif members.shape[1] == 2:
        src = np.concatenate((members[:, 0], members[:, 1]))
        dst = np.concatenate((members[:, 1], members[:, 0]))
        directions = 1
    else:
        nxt = np.roll(members, -1, axis=1).ravel()
        src = np.concatenate((members.ravel(), nxt))
        dst = np.concatenate((nxt, members.ravel()))
        directions = 2
    edge, res = system.route(src, dst)
    dpn = system.devices_per_node
    crossing = (src // dpn) != (dst // dpn)
    spread, routed = None, res
    if not chain and system.intra is not None and system.intra.topology == "graph":
        spread, keep = _spread(system, members, src.size)
        if spread is not None:
            routed = res[keep[edge]]
    loads = np.bincount(routed, minlength=system.num_resources).astype(float)
    used = np.flatnonzero(loads)
    p2p = used
    if spread is not None:
        p2p = np.flatnonzero(np.bincount(res, minlength=system.num_resources))
        loads += np.bincount(spread[2], minlength=system.num_resources)
    arrays = [edge, res, crossing, loads, used, p2p, *(spread or ())]
    for array in arrays:
        array.flags.writeable = False
    return directions, src.size, edge, res, crossing, spread, loads, used, p2p


def _spread(system: System, members: np.ndarray, num_edges: int):
    """On a ``graph`` intra level, rings inside one node whose members are linked well enough
    run over every link among them (NCCL's multiple rings) instead of one route each.

    Returns ``((row, sender, resource) of those links, mask of the edges still routed)``, or
    ``(None, None)``.
    """
    lv, dpn = system.intra, system.devices_per_node
    node = members // dpn
    inside = np.flatnonzero((node == node[:, :1]).all(1))
    if inside.size:
        inside = inside[lv.induced_rings(members[inside] % dpn)]
    if inside.size == 0:
        return None, None
    local = members[inside] % dpn
    rows, sender, receiver = np.nonzero(lv.links[local[:, :, None], local[:, None, :]] > 0)
    u, v = local[rows, sender], local[rows, receiver]
    res = lv.resource(node[inside[rows], 0], u, lv.port_of[u, v])
    spread_row = np.zeros(members.shape[0], bool)
    spread_row[inside] = True
    # Edges were laid out row by row (twice: forward, then backward / the pair reversed).
    edge_row = np.tile(np.repeat(np.arange(members.shape[0], dtype=INT),
                                 members.shape[1] if members.shape[1] > 2 else 1), 2)
    return (rows, sender, res), ~spread_row[edge_row]


def _tree(system: System, intra: Group, inter: Group) -> Tree | None:
    """NCCL's tree over the nodes of a two-level group (None where the inter level declares
    none): a chain of ``intra.size`` devices in each node; the node's network bandwidth is the
    ``intra.size`` concurrent inter-node rings' together (a ring's bandwidth is what each of
    its members sends), at the tree's efficiency instead of the ring's."""
    spec = system.spec.inter.collective.tree if system.inter else None
    if spec is None:
        return None
    level = system.inter
    node_Bps = intra.size * inter.bandwidth_Bps * spec.efficiency / level.collective_efficiency
    return Tree(inter.size, intra.size, node_Bps, intra.step_latency_s,
                level.latency_s + spec.step_latency_s, system.launch_s,
                spec.tuner_ring_busbw_Bps, spec.tuner_tree_busbw_Bps)


def _hierarchy(system: System, members: np.ndarray) -> tuple[Group, Group] | None:
    """Intra-node sub-rings and inter-node rings of the groups in ``members`` (see
    :meth:`Mapping.hierarchy`), or None when the groups are not split evenly over nodes."""
    g, n = members.shape
    node = members // system.devices_per_node
    order = np.argsort(node, axis=1, kind="stable")
    members = np.take_along_axis(members, order, 1)
    node = np.take_along_axis(node, order, 1)
    k = int(np.count_nonzero(np.diff(node[0])) + 1)
    m = n // k
    if k < 2 or m < 2 or m * k != n:
        return None
    blocks = node.reshape(g, k, m)
    if not ((blocks == blocks[:, :, :1]).all() and (np.diff(blocks[:, :, 0], axis=1) > 0).all()):
        return None
    intra = _ring_stats(system, members.reshape(g * k, m))
    inter = _ring_stats(system, members.reshape(g, k, m).transpose(0, 2, 1).reshape(g * m, k))
    return intra.group(system), inter.group(system)
