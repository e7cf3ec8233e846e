"""Network levels: resources (link directions, switch ports) and routing (paper §4.2.3, §5.2).

A system has up to two levels (paper §4.2.3): *intra* joins the devices of a node and is
replicated once per node; *inter* joins the nodes.  Each level owns a block of **resources** —
one per link direction or switch port, numbered ``offset + endpoint·ports + port`` — with a
bandwidth per direction and a latency.  Routing a logical edge returns the resources its path
uses; counting the logical edges on each resource gives the sharing that derates bandwidth
(paper §6.4).

Topologies:

* ``switch`` / ``crossbar`` / ``fat_tree``: every endpoint has one port into a non-blocking
  fabric; a path is (up port of the source, down port of the destination), so the limit is the
  endpoint's injection bandwidth, not any fabric link.  ``latency`` is one traversal.
* ``mesh`` / ``torus`` / ``ring``: endpoints on a grid, each with ``2·D`` ports (+ and − along
  every dimension) that split its bandwidth evenly (as DeepFlow's per-neighbour bandwidth =
  links·rate / degree); dimension-order (XY) routing, the shorter way round on a torus (ties
  go +); ``latency`` per hop.
* ``graph``: explicit links (``[a, b, links]``), each endpoint's bandwidth split per link;
  shortest-path routing (fewest hops, then the fattest first hop, then the lowest id).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from crossflow.config.system import GRID, SWITCHED, LevelSpec

INT = np.int64


@dataclass(eq=False)
class Level:
    """One network level of a system (see the module docstring).

    Attributes:
        name: ``"intra"`` (endpoints = the devices of one node, replicated per node) or
            ``"inter"`` (endpoints = nodes).
        topology: as in the system file.
        endpoints: endpoints of one replica.
        replicas: copies of the level (nodes for intra, 1 for inter).
        dims: grid sizes (mesh / torus / ring) or ``(endpoints,)``.
        bandwidth_Bps: raw bandwidth per endpoint per direction, all its ports together.
        latency_s: per hop (direct networks) or per traversal (switched).
        efficiency: sustained fraction of the link bandwidth (the link's own).
        collective_efficiency: achievable fraction for collective traffic (NCCL's).
        step_latency_s: software latency per collective ring step on this level.
        ll_step_latency_s, ll_fraction: the low-latency protocol's step latency and its
            bandwidth as a fraction of the collective bandwidth (None: no such protocol).
        offset: id of this level's first resource.
    """

    name: str
    topology: str
    endpoints: int
    replicas: int
    dims: tuple[int, ...]
    bandwidth_Bps: float
    latency_s: float
    efficiency: float
    collective_efficiency: float
    step_latency_s: float
    ll_step_latency_s: float | None = None
    ll_fraction: float = 1.0
    offset: int = 0
    edges: tuple[tuple[int, int, int], ...] = ()
    ports: int = field(init=False)

    def __post_init__(self) -> None:
        if self.topology in SWITCHED:
            self.ports = 2
        elif self.topology in GRID:
            self.ports = 2 * len(self.dims)
            self.wrap = self.topology in ("torus", "ring")
            self.strides = np.cumprod((1,) + self.dims[:-1]).astype(INT)
            self.coords = (np.arange(self.endpoints, dtype=INT)[:, None] // self.strides
                           % np.asarray(self.dims, INT))
        else:
            self._build_graph()

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def from_spec(cls, name: str, spec: LevelSpec | None, endpoints: int, replicas: int,
                  bandwidth_Bps: float, latency_s: float, efficiency: float) -> Level:
        topology = spec.topology if spec else "switch"
        return cls(
            name=name, topology=topology, endpoints=endpoints, replicas=replicas,
            dims=spec.grid_dims(endpoints) if spec and topology in GRID else (endpoints,),
            bandwidth_Bps=bandwidth_Bps, latency_s=latency_s,
            efficiency=efficiency,
            collective_efficiency=spec.collective.efficiency if spec else 1.0,
            step_latency_s=spec.collective.step_latency_s if spec else 0.0,
            ll_step_latency_s=(spec.collective.low_latency.step_latency_s
                               if spec and spec.collective.low_latency else None),
            ll_fraction=(spec.collective.low_latency.efficiency
                         if spec and spec.collective.low_latency else 1.0),
            edges=tuple((e[0], e[1], e[2] if len(e) == 3 else 1) for e in spec.edges)
            if spec else (),
        )

    def _build_graph(self) -> None:
        n = self.endpoints
        links = np.zeros((n, n), INT)
        for a, b, k in self.edges:
            links[a, b] = links[b, a] = k
        self.links = links
        self.neighbours = [np.flatnonzero(links[u]) for u in range(n)]
        self.ports = max((len(nb) for nb in self.neighbours), default=1)
        self.port_of = np.full((n, n), -1, INT)
        for u, nb in enumerate(self.neighbours):
            self.port_of[u, nb] = np.arange(len(nb))
        dist = np.full((n, n), n, INT)  # BFS from every destination
        for d in range(n):
            dist[d, d] = 0
            queue = deque([d])
            while queue:
                u = queue.popleft()
                for w in self.neighbours[u]:
                    if dist[d, w] > dist[d, u] + 1:
                        dist[d, w] = dist[d, u] + 1
                        queue.append(w)
        self.next_hop = np.zeros((n, n), INT)
        for u in range(n):
            for d in range(n):
                if u != d:
                    self.next_hop[u, d] = min(self.neighbours[u],
                                              key=lambda w, u=u, d=d: (dist[d, w], -links[u, w], w))
        self.diameter = int(dist.max()) if n > 1 else 0

    @property
    def capacity_factor(self) -> float:
        """Link efficiency × collective efficiency: the usable fraction of the bandwidth."""
        return self.efficiency * self.collective_efficiency

    # --- resources ------------------------------------------------------------------------

    @property
    def num_resources(self) -> int:
        return self.replicas * self.endpoints * self.ports

    def resource(self, replica, endpoint, port):
        """Resource id(s) of ``port`` of ``endpoint`` in ``replica`` (numpy-broadcastable)."""
        return self.offset + (replica * self.endpoints + endpoint) * self.ports + port

    def capacities(self) -> tuple[np.ndarray, np.ndarray]:
        """(effective bandwidth, latency) of each resource of this level, per direction."""
        shape = (self.endpoints, self.ports)
        if self.topology in SWITCHED:
            cap = np.full(shape, self.bandwidth_Bps)
            lat = np.zeros(shape)
            lat[:, 0] = self.latency_s  # the up port carries the traversal latency
        elif self.topology in GRID:
            cap = np.full(shape, self.bandwidth_Bps / self.ports)
            lat = np.full(shape, self.latency_s)
        else:
            per_link = self.bandwidth_Bps / max(1, int(self.links.sum(1).max()))
            cap = np.zeros(shape)
            for u, nb in enumerate(self.neighbours):
                cap[u, : len(nb)] = per_link * self.links[u, nb]
            lat = np.full(shape, self.latency_s)
        cap = np.tile(cap.ravel() * self.capacity_factor, self.replicas)
        return cap, np.tile(lat.ravel(), self.replicas)

    # --- routing --------------------------------------------------------------------------

    def route(self, src: np.ndarray, dst: np.ndarray,
              replica: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """Resources used by each logical edge ``src[i] -> dst[i]`` (local endpoint ids).

        Returns ``(edge, resource)``: parallel arrays, one entry per hop, ``edge`` indexing
        the input edges.
        """
        replica = np.broadcast_to(np.asarray(replica, INT), src.shape)
        if self.topology in SWITCHED:
            edge = np.arange(src.size, dtype=INT)
            return (np.concatenate((edge, edge)),
                    np.concatenate((self.resource(replica, src, 0),
                                    self.resource(replica, dst, 1))))
        if self.topology in GRID:
            return self._route_grid(src, dst, replica)
        return self._route_graph(src, dst, replica)

    def _route_grid(self, src, dst, replica):
        """Dimension-order (XY) routing: dimension 0 first (paper §5.2)."""
        edges, resources = [], []
        for k, size in enumerate(self.dims):
            stride = int(self.strides[k])
            a, b = src // stride % size, dst // stride % size
            if self.wrap:
                fwd = (b - a) % size
                minus = fwd > size - fwd
                hops = np.where(minus, size - fwd, fwd)
            else:
                minus = b < a
                hops = np.abs(b - a)
            total = int(hops.sum())
            if total == 0:
                continue
            edge = np.repeat(np.arange(src.size, dtype=INT), hops)
            step = np.arange(total, dtype=INT) - np.repeat(np.cumsum(hops) - hops, hops)
            back = minus[edge]
            pos = (a[edge] + np.where(back, -step, step)) % size
            # Dimensions before k are already at the destination, those after still at the source.
            base = dst % stride + src - src % (stride * size)
            endpoint = base[edge] + pos * stride
            edges.append(edge)
            resources.append(self.resource(replica[edge], endpoint, 2 * k + back))
        if not edges:
            return np.zeros(0, INT), np.zeros(0, INT)
        return np.concatenate(edges), np.concatenate(resources)

    def _route_graph(self, src, dst, replica):
        edges, resources = [], []
        cur, idx = src.copy(), np.arange(src.size, dtype=INT)
        for _ in range(self.diameter):
            live = cur != dst[idx]
            cur, idx = cur[live], idx[live]
            if idx.size == 0:
                break
            nxt = self.next_hop[cur, dst[idx]]
            edges.append(idx)
            resources.append(self.resource(replica[idx], cur, self.port_of[cur, nxt]))
            cur = nxt
        if not edges:
            return np.zeros(0, INT), np.zeros(0, INT)
        return np.concatenate(edges), np.concatenate(resources)

    # --- graph-level multi-ring collectives ---------------------------------------------------

    def induced_rings(self, members: np.ndarray) -> np.ndarray:
        """For rows of local endpoint ids on a ``graph`` level: whether the links among each
        row's members can carry its ring collective on their own — a direct link for two
        members, else a connected subgraph in which every member has two linked neighbours
        (NCCL then builds one ring per link-disjoint cycle, e.g. two on a DGX-1)."""
        linked = self.links[members[:, :, None], members[:, None, :]] > 0
        m = members.shape[1]
        if m == 2:
            return linked[:, 0, 1]
        ok = linked.sum(2).min(1) >= 2
        reach = linked | np.eye(m, dtype=bool)
        for _ in range(max(1, math.ceil(math.log2(m)))):
            reach = np.matmul(reach, reach)
        return ok & reach.all((1, 2))

    # --- networkx view --------------------------------------------------------------------

    def graph_edges(self, device_of):
        """``(u, v, resource, attrs)`` for every resource that is a physical link direction.

        ``device_of(replica, endpoint)`` names an endpoint as a graph node.
        """
        level = {"level": self.name, "topology": self.topology}
        cap, lat = self.capacities()
        for rep in range(self.replicas):
            for u in range(self.endpoints):
                for port in range(self.ports):
                    peer = self._peer(u, port)
                    if peer is None:
                        continue
                    r = int(self.resource(rep, u, port))
                    attrs = {**level, "bandwidth_Bps": float(cap[r - self.offset]),
                             "latency_s": float(lat[r - self.offset])}
                    me = device_of(rep, u)
                    if peer == "fabric":
                        hub = ("switch", rep) if self.name == "intra" else ("fabric", 0)
                        yield (me, hub, r, attrs) if port == 0 else (hub, me, r, attrs)
                    else:
                        yield me, device_of(rep, peer), r, attrs

    def _peer(self, u: int, port: int):
        if self.topology in SWITCHED:
            return "fabric"
        if self.topology in GRID:
            k, minus = divmod(port, 2)
            c = int(self.coords[u, k]) + (-1 if minus else 1)
            if not self.wrap and not 0 <= c < self.dims[k]:
                return None
            c %= self.dims[k]
            if self.dims[k] == 1:
                return None
            return u + (c - int(self.coords[u, k])) * int(self.strides[k])
        nb = self.neighbours[u]
        return int(nb[port]) if port < len(nb) else None
