"""The super-graph transformation of paper §5.1, and the per-device graph a simulator uses.

Each parallelism replaces every node of the compute graph by the same small graph, in the
order of the paper's Fig. 5 (G0 → G4):

1. **pipeline** (lp): no node changes; the graph is cut into lp consecutive stages
   (:func:`assign_stages`) and edges between stages become cross-edges;
2. **data** (dp): each node becomes a ring of dp replicas (ring all-reduce); the ring
   edges are cross-edges;
3. **kernel**: RC-kp1-kp2 makes each node a kp1 × kp2 torus (a ring along each dimension);
   CR-kp1 and Megatron's t make it a ring of kp1.  Torus / ring edges are cross-edges.

A ring of n ≥ 2 nodes has n directed edges i → (i + 1) mod n (for n = 2: both directions);
a ring of 1 has none.  Node ids of the super-graph are ``(node, d, i, j)``: the original
node, its data-parallel replica and its kernel shard (j = 0 without kp2).  Every node has
``device`` = (i, j, d, stage), its coordinate in the (kp1, kp2, dp, lp) grid that device
mapping lays out (§5.2), and its shard's shapes (:func:`shard_node`).  Every edge has
``cross`` (bool) and, for cross-edges, ``dim`` ∈ {"lp", "dp", "kp1", "kp2"}; ring and torus
edges have ``kind`` "collective" and indicative ``bytes`` (dp: the node's weight-gradient
shard; kernel: its output shard) — the collective model decides the real traffic.

The super-graph has (nodes × devices) nodes, so it is for small cases and for checking;
a simulator wants :func:`local_graph`, one device's view, which is as small as the input.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import networkx as nx

from crossflow.arch.microarch import BYTES_PER_ELEMENT
from crossflow.errors import ConfigError
from crossflow.parallel.strategy import Strategy
from crossflow.workloads.graph import node_flops, output_elements

#: Refuse to build super-graphs larger than this many nodes (use local_graph instead).
MAX_SUPERGRAPH_NODES = 2_000_000


def _ceil(x: int, parts: int) -> int:
    return -(-x // parts)


def assign_stages(g: nx.DiGraph, lp: int, vp: int = 1) -> dict[int, tuple[int, int]]:
    """Pipeline unit -> (stage, virtual chunk), by the graph's ``pipeline_policy``.

    "megatron": blocks in lp·vp equal chunks, chunk c on stage c mod lp (interleaved,
    SC21 §2.2.2); embedding with the first chunk, head with the last.  "balanced": stage =
    unit · lp // units (vp must be 1).
    """
    units = g.graph["pipeline_units"]
    if g.graph["pipeline_policy"] == "megatron":
        layers = units - 2
        if layers % (lp * vp):
            key, value = (("pipeline_parallel", lp) if layers % lp
                          else ("virtual_pipeline_stages", vp))
            raise ConfigError(f"pipeline_parallel × virtual_pipeline_stages = {lp * vp} "
                              f"must divide num_layers ({layers})", key=key, value=value)
        per_chunk = layers // (lp * vp)
        out = {0: (0, 0), units - 1: (lp - 1, vp - 1)}
        for layer in range(layers):
            chunk = layer // per_chunk
            out[layer + 1] = (chunk % lp, chunk // lp)
        return out
    if vp != 1:
        raise ConfigError("interleaved virtual stages apply to transformers only",
                          key="virtual_pipeline_stages", value=vp)
    if lp > units:
        raise ConfigError(f"cannot cut {units} pipeline units into {lp} stages",
                          key="pipeline_parallel", value=lp)
    return {u: (u * lp // units, 0) for u in range(units)}


def shard_node(a: dict[str, Any], s: Strategy, dp_mode: str = "batch") -> dict[str, Any]:
    """The attributes of one device's shard of a node (shapes ceil-divided, i.e. padded).

    Data parallelism divides ``batch_key`` when ``dp_mode`` is "batch".  RC divides a GEMM's
    m by kp1 and n by kp2 (inner product); CR divides k by kp1 (outer product: a full-size
    partial C); other ops are divided along their rows / elements (and columns by kp2).
    Megatron's t divides ``tp_key`` (and ``sp_key`` under sequence parallelism).
    """
    out = dict(a)
    op = a["op"]
    if dp_mode == "batch" and s.dp > 1 and a["batch_key"]:
        out[a["batch_key"]] = _ceil(a[a["batch_key"]], s.dp)
    param_div = 1
    if s.kp_type == "TP":
        if s.kp1 > 1:
            key = a["tp_key"] or (a["sp_key"] if s.sp else None)
            if key:
                out[key] = _ceil(out[key], s.kp1)
            if a["tp_key"]:
                param_div = s.kp1
    elif s.kernel_degree > 1:
        k1, k2 = s.kp1, s.kp2
        rows, cols = {
            "gemm": ("k", None) if s.kp_type == "CR" else ("m", "n"),
            "elementwise": ("elements", None),
            "softmax": ("rows", "cols"),
            "layernorm": ("rows", "cols"),
            "embedding": ("tokens", "hidden"),
            "attention": ("heads", None),
        }[op]
        if op == "elementwise":
            k1 = s.kernel_degree
        out[rows] = _ceil(out[rows], k1)
        if cols and s.kp_type == "RC":
            out[cols] = _ceil(out[cols], k2)
        if op == "gemm":  # the weight operand B (k × n): CR splits k, RC splits n
            param_div = s.kp1 if s.kp_type == "CR" else s.kp2
        elif op == "embedding" and s.kp_type == "RC":
            param_div = s.kp2
    if a["params"]:
        out["params"] = _ceil(a["params"], param_div)
    if a["wgrad_elements"]:
        if op == "gemm":  # dW shard: the share of the m × n output this device computes
            out["wgrad_elements"] = _ceil(a["wgrad_elements"] * out["m"] * out["n"],
                                          a["m"] * a["n"])
        else:
            out["wgrad_elements"] = _ceil(a["wgrad_elements"], param_div)
    out["flops"] = node_flops(out)
    return out


@lru_cache(maxsize=16)  # a GPT-3 local graph is ~6 MB
def local_graph(g: nx.DiGraph, s: Strategy) -> nx.DiGraph:
    """One device's view: every node sharded by ``s``, with ``stage`` and ``chunk``.

    Cached per (graph object, strategy) and frozen.  It still holds every stage (select a
    stage's nodes by their ``stage``) and the shards of one data-parallel replica.

    Edge bytes shrink with their source's output; edges between stages are marked
    ``cross`` (dim "lp").  ``graph['microbatches']`` becomes the micro-batches one replica
    runs per iteration (transformers: divided by dp).
    """
    shards, edges, micro = shard_graph(g, s)
    out = nx.DiGraph(**{**g.graph, "microbatches": micro, "strategy": str(s)})
    out.add_nodes_from(shards.items())
    out.add_edges_from(edges)
    return nx.freeze(out)


def shard_graph(g: nx.DiGraph, s: Strategy
                ) -> tuple[dict[Any, dict[str, Any]], list[tuple[Any, Any, dict]], int]:
    """The content of :func:`local_graph` without building a networkx graph (the
    simulator's compiled plans and the memory-only check read it directly, for every
    strategy of a screen): ``(node -> shard attributes in g's node order, edges (u, v,
    attributes) in g's adjacency order, micro-batches per replica)``."""
    stages = assign_stages(g, s.lp, s.vp)
    mode = g.graph["dp_mode"]
    micro = g.graph["microbatches"]
    if mode == "microbatches":
        if micro % s.dp:
            raise ConfigError(f"must divide the {micro} micro-batches of an iteration",
                              key="data_parallel", value=s.dp)
        micro //= s.dp
    shards, ratio = {}, {}
    for n, a in g.nodes(data=True):
        la = shard_node(a, s, mode)
        la["stage"], la["chunk"] = stages[a["unit"]]
        shards[n] = la
        full = output_elements(a)
        ratio[n] = output_elements(la) / full if full else 1.0
    edges = []
    for u, nbrs in g.adjacency():
        r, stage = ratio[u], shards[u]["stage"]
        for v, e in nbrs.items():
            if stage != shards[v]["stage"]:
                attrs = {**e, "bytes": e["bytes"] * r, "cross": True, "dim": "lp"}
            else:
                attrs = {**e, "bytes": e["bytes"] * r, "cross": False}
            edges.append((u, v, attrs))
    return shards, edges, micro


def _ring(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)] if n >= 2 else []


def supergraph(g: nx.DiGraph, s: Strategy) -> nx.DiGraph:
    """G4 of the paper's Fig. 5: the compute graph with pipeline, data and kernel
    parallelism applied (see the module docstring for ids and attributes)."""
    size = g.number_of_nodes() * s.devices
    if size > MAX_SUPERGRAPH_NODES:
        raise ValueError(f"the super-graph would have {size} nodes (limit "
                         f"{MAX_SUPERGRAPH_NODES}); use local_graph for a simulation")
    local = local_graph(g, s)
    k1, k2, dp = s.kp1, s.kp2, s.dp
    shards = [(i, j) for i in range(k1) for j in range(k2)]
    nodes = []
    for v, a in local.nodes(data=True):
        for d in range(dp):
            for i, j in shards:
                nodes.append(((v, d, i, j), {**a, "device": (i, j, d, a["stage"])}))
    edges = []
    for u, v, e in local.edges(data=True):  # original edges, shard to shard
        for d in range(dp):
            for i, j in shards:
                edges.append(((u, d, i, j), (v, d, i, j), e))
    for v, a in local.nodes(data=True):
        nb = BYTES_PER_ELEMENT[a["precision"]]
        out_bytes = output_elements(a) * nb
        grad_bytes = a["wgrad_elements"] * nb
        for x, y in _ring(dp):  # data parallelism: all-reduce of weight gradients
            for i, j in shards:
                edges.append(((v, x, i, j), (v, y, i, j),
                              {"bytes": grad_bytes, "kind": "collective", "cross": True,
                               "dim": "dp"}))
        for d in range(dp):  # kernel parallelism: torus (RC) or ring (CR, t)
            for j in range(k2):
                for x, y in _ring(k1):
                    edges.append(((v, d, x, j), (v, d, y, j),
                                  {"bytes": out_bytes, "kind": "collective", "cross": True,
                                   "dim": "kp1"}))
            for i in range(k1):
                for x, y in _ring(k2):
                    edges.append(((v, d, i, x), (v, d, i, y),
                                  {"bytes": out_bytes, "kind": "collective", "cross": True,
                                   "dim": "kp2"}))
    out = nx.DiGraph(**local.graph)
    out.add_nodes_from(nodes)
    out.add_edges_from(edges)
    return out
