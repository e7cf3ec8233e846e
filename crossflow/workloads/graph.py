"""Compute-graph conventions shared by the workload builders (paper §3.1, §5).

A workload is a networkx ``DiGraph`` of operators.  Every node is one kernel launch (or
``count`` identical ones) that the kernel model prices directly:

========== ========================================== =========================================
``op``      shape attributes                          priced by (``crossflow.kernels``)
========== ========================================== =========================================
gemm        m, k, n, count                            ``gemm(arch, m, k, n, precision, count)``
elementwise elements, inputs, outputs,                ``ops.elementwise(...)``
            flops_per_element
softmax     rows, cols                                ``ops.softmax(arch, rows, cols, ...)``
layernorm   rows, cols                                ``ops.layernorm(arch, rows, cols, ...)``
embedding   tokens, hidden, vocab (table rows)        ``ops.embedding(arch, tokens, hidden, ...)``
attention   heads, seq, head_dim, gemms, causal,      ``ops.fused_attention(...)``: a flash
            window                                    kernel (``gemms`` s×s×d products per
                                                      head: 2 forward, 5 backward; the
                                                      mask's and the sliding window's
                                                      share, ``ops.score_share``)
========== ========================================== =========================================

Other node attributes: ``name`` (e.g. ``"qkv.dW"``), ``phase`` (fwd / bwd / recompute /
optimizer), ``layer`` (-1 embedding, 0..L-1 blocks, L output head), ``unit`` (the pipeline
unit the node belongs to, see :data:`PIPELINE_POLICIES`), ``precision``, ``flops``,
``params`` (parameter elements a forward node owns), ``wgrad_elements`` (parameter-gradient
elements a backward node produces) and three sharding hints that say which shape attribute
a parallel degree divides: ``batch_key`` (data parallelism over the batch), ``tp_key``
(Megatron tensor parallelism; None = replicated) and ``sp_key`` (sequence parallelism).

Every edge has ``bytes`` (the tensor it carries, on one device before any collective) and
``kind``: ``act`` (forward activation), ``grad`` (activation gradient), ``stash`` (a saved
forward tensor a backward or recompute node reads), ``wgrad`` (weight gradient into the
optimizer) or ``control`` (ordering only, 0 bytes: a recomputation waits for its gradient).

Graph attributes: ``kind``, ``name``, ``precision``, ``batch`` (sequences in one pass of the
graph), ``microbatches`` (passes per iteration, all replicas together; the optimizer nodes
run once per iteration), ``dp_mode`` ("batch": data parallelism divides ``batch_key``;
"microbatches": it divides the micro-batch count), ``pipeline_policy``, ``pipeline_units``
and ``kernel_types`` (the kernel-parallel types the workload supports).

Built graphs are cached per spec and frozen (``nx.freeze``); copy one to modify it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import networkx as nx

from crossflow.arch.microarch import BYTES_PER_ELEMENT
from crossflow.kernels.ops import (
    LAYERNORM_FLOPS_PER_ELEMENT,
    NO_WINDOW,
    SOFTMAX_FLOPS_PER_ELEMENT,
    attention_flops,
)

OPS: tuple[str, ...] = ("gemm", "elementwise", "softmax", "layernorm", "embedding",
                        "attention")
PHASES: tuple[str, ...] = ("fwd", "bwd", "recompute", "optimizer")
EDGE_KINDS: tuple[str, ...] = ("act", "grad", "stash", "wgrad", "control")
SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "k", "n", "count"),
    "elementwise": ("elements", "inputs", "outputs", "flops_per_element"),
    "softmax": ("rows", "cols"),
    "layernorm": ("rows", "cols"),
    "embedding": ("tokens", "hidden", "vocab"),
    "attention": ("heads", "seq", "head_dim", "gemms", "causal", "window"),
}
#: How pipeline parallelism cuts the units (``unit`` node attribute, 0..units-1):
#: "megatron" — units 1..L are the blocks, cut into lp·vp equal chunks (lp·vp | L); unit 0
#: (embedding) joins the first stage and unit L+1 (output head) the last (SC21 §2.2);
#: "balanced" — every unit is a layer, stage = unit · lp // units (DeepFlow's LSTM puts the
#: embedding and the softmax layer on stages of their own, ARCHITECTURE.md §5).
PIPELINE_POLICIES: tuple[str, ...] = ("megatron", "balanced")


def output_elements(a: dict[str, Any]) -> int:
    """Elements of a node's output tensor(s)."""
    op = a["op"]
    if op == "gemm":
        return a["m"] * a["n"] * a["count"]
    if op == "elementwise":
        return a["elements"] * a["outputs"]
    if op == "embedding":
        return a["tokens"] * a["hidden"]
    if op == "attention":
        return a["heads"] * a["seq"] * a["head_dim"]
    return a["rows"] * a["cols"]


def node_flops(a: dict[str, Any]) -> float:
    """Arithmetic of one node (2mnk per GEMM; the kernels' per-element counts otherwise)."""
    op = a["op"]
    if op == "gemm":
        return 2.0 * a["m"] * a["n"] * a["k"] * a["count"]
    if op == "elementwise":
        return float(a["elements"] * a["flops_per_element"])
    if op == "softmax":
        return float(a["rows"] * a["cols"] * SOFTMAX_FLOPS_PER_ELEMENT)
    if op == "layernorm":
        return float(a["rows"] * a["cols"] * LAYERNORM_FLOPS_PER_ELEMENT)
    if op == "attention":
        return attention_flops(a["heads"], a["seq"], a["head_dim"], a["gemms"], a["causal"],
                               a["window"])
    return 0.0


def graph_flops(g: nx.DiGraph, *, ops: Iterable[str] | None = None,
                phases: Iterable[str] | None = None) -> float:
    """Sum of node FLOPs, optionally only of some ops / phases (one pass of the graph)."""
    ops = set(ops) if ops is not None else None
    phases = set(phases) if phases is not None else None
    return sum(
        a["flops"] for _, a in g.nodes(data=True)
        if (ops is None or a["op"] in ops) and (phases is None or a["phase"] in phases)
    )


class GraphBuilder:
    """Collects nodes and edges, then builds the DiGraph in one go (fast)."""

    def __init__(self, precision: str, **graph_attrs: Any) -> None:
        self.precision = precision
        self.graph_attrs = {"precision": precision, **graph_attrs}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.edges: list[tuple[str, str, dict[str, Any]]] = []
        #: defaults for the next nodes (layer, unit, phase, ...)
        self.context: dict[str, Any] = {}

    def _add(self, node: str, op: str, name: str, shape: dict[str, Any], *,
             batch: str | None, tp: str | None = None, sp: str | None = None,
             params: int = 0, wgrad: int = 0, precision: str | None = None,
             **extra: Any) -> str:
        if node in self.nodes:
            raise ValueError(f"duplicate node {node!r}")
        attrs = {
            "op": op, "name": name, **self.context, **extra, **shape,
            "precision": precision or self.precision,
            "params": params, "wgrad_elements": wgrad,
            "batch_key": batch, "tp_key": tp, "sp_key": sp,
        }
        attrs["flops"] = node_flops(attrs)
        self.nodes[node] = attrs
        return node

    def gemm(self, node: str, name: str, m: int, k: int, n: int, *, count: int = 1,
             batch: str | None = "m", **kw: Any) -> str:
        return self._add(node, "gemm", name, {"m": m, "k": k, "n": n, "count": count},
                         batch=batch, **kw)

    def elementwise(self, node: str, name: str, elements: int, *, inputs: int = 1,
                    outputs: int = 1, flops_per_element: float = 1.0,
                    batch: str | None = "elements", **kw: Any) -> str:
        shape = {"elements": elements, "inputs": inputs, "outputs": outputs,
                 "flops_per_element": flops_per_element}
        return self._add(node, "elementwise", name, shape, batch=batch, **kw)

    def rowwise(self, node: str, op: str, name: str, rows: int, cols: int,
                **kw: Any) -> str:
        return self._add(node, op, name, {"rows": rows, "cols": cols}, batch="rows", **kw)

    def embedding(self, node: str, name: str, tokens: int, hidden: int, vocab: int,
                  **kw: Any) -> str:
        shape = {"tokens": tokens, "hidden": hidden, "vocab": vocab}
        return self._add(node, "embedding", name, shape, batch="tokens", **kw)

    def attention(self, node: str, name: str, heads: int, seq: int, head_dim: int, *,
                  gemms: int, causal: int, window: tuple[int, int] = NO_WINDOW,
                  **kw: Any) -> str:
        shape = {"heads": heads, "seq": seq, "head_dim": head_dim, "gemms": gemms,
                 "causal": causal, "window": window}
        return self._add(node, "attention", name, shape, batch="heads", **kw)

    def edge(self, u: str, v: str, kind: str, nbytes: float | None = None) -> None:
        """Edge u -> v; ``nbytes`` defaults to u's output (0 for control edges)."""
        if nbytes is None:
            a = self.nodes[u]
            nbytes = 0 if kind == "control" else output_elements(a) * BYTES_PER_ELEMENT[
                a["precision"]]
        self.edges.append((u, v, {"bytes": nbytes, "kind": kind}))

    def build(self) -> nx.DiGraph:
        g = nx.DiGraph(**self.graph_attrs)
        g.add_nodes_from(self.nodes.items())
        g.add_edges_from(self.edges)
        if g.number_of_edges() != len(self.edges):
            raise AssertionError("two edges between the same pair of nodes")
        return nx.freeze(g)
