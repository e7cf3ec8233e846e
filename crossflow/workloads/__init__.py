"""Workloads as compute graphs (docs/architecture.md, "Layers"; conventions in :mod:`.graph`).

``compute_graph(spec)`` dispatches on the spec's kind; builders are cached per spec and
return frozen networkx DiGraphs.
"""

from __future__ import annotations

import networkx as nx

from crossflow.config.base import Spec
from crossflow.workloads.flops import (
    hardware_flops,
    lstm_flops,
    megatron_eq3_flops,
    model_flops,
    parameter_count,
    transformer_flops,
)
from crossflow.workloads.graph import graph_flops, node_flops, output_elements
from crossflow.workloads.lstm import lstm_graph
from crossflow.workloads.simple import feedforward_graph, gemm_graph
from crossflow.workloads.transformer import transformer_graph

__all__ = [
    "compute_graph", "feedforward_graph", "gemm_graph", "graph_flops", "hardware_flops",
    "lstm_flops", "lstm_graph", "megatron_eq3_flops", "model_flops", "node_flops",
    "output_elements", "parameter_count", "transformer_flops", "transformer_graph",
]


def compute_graph(spec: Spec, *, micro_batch_size: int | None = None) -> nx.DiGraph:
    """The compute graph of a gemm, lstm or transformer spec (cached, frozen)."""
    kind = getattr(spec, "kind", None)
    if kind == "gemm":
        return gemm_graph(spec)
    if kind == "lstm":
        return lstm_graph(spec)
    if kind == "transformer":
        return transformer_graph(spec, micro_batch_size=micro_batch_size)
    raise TypeError(f"no compute graph for workload kind {kind!r}")
