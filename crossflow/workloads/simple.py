"""The smallest graphs: one GEMM, and the paper's Fig. 5 feed-forward network."""

from __future__ import annotations

from functools import lru_cache

import networkx as nx

from crossflow.config.workload import GemmSpec
from crossflow.workloads.graph import GraphBuilder


@lru_cache(maxsize=256)
def gemm_graph(spec: GemmSpec) -> nx.DiGraph:
    """One node: C[m, n] = A[m, k] · B[k, n], ``count`` times (forward only).

    A distributed GEMM is this graph with a kernel-parallel strategy (RC / CR, paper §3.3);
    there is no batch of replicas and no layer to pipeline.
    """
    g = GraphBuilder(spec.precision, kind="gemm", name=spec.name, batch=spec.m,
                     microbatches=1, dp_mode="batch", pipeline_policy="balanced",
                     pipeline_units=1, kernel_types=("RC", "CR"))
    g.context = {"phase": "fwd", "layer": 0, "unit": 0}
    g.gemm("gemm", "gemm", spec.m, spec.k, spec.n, count=spec.count)
    return g.build()


@lru_cache(maxsize=64)
def feedforward_graph(num_layers: int = 3, batch: int = 1024, width: int = 1024,
                      precision: str = "fp16") -> nx.DiGraph:
    """A chain of ``num_layers`` fully connected layers, forward only: G0 of the paper's
    Fig. 5 (each layer one GEMM (batch, width) × (width, width), node ``L{i}.fc``)."""
    g = GraphBuilder(precision, kind="feedforward", name=f"ff{num_layers}", batch=batch,
                     microbatches=1, dp_mode="batch", pipeline_policy="balanced",
                     pipeline_units=num_layers, kernel_types=("RC", "CR"))
    prev = None
    for i in range(num_layers):
        g.context = {"phase": "fwd", "layer": i, "unit": i}
        node = g.gemm(f"L{i}.fc", "fc", batch, width, width, params=width * width)
        if prev is not None:
            g.edge(prev, node, "act")
        prev = node
    return g.build()
