"""Parallelism (docs/architecture.md, "Layers"; paper §3.3 and §5.1): strategies, the
parallelism file, enumeration of valid strategies and the super-graph transformation.

Importing this package registers the ``parallelism`` config kind
(:mod:`crossflow.parallel.spec`).
"""

from __future__ import annotations

from crossflow.parallel.enumerate import check_strategy, enumerate_strategies
from crossflow.parallel.spec import ParallelismSpec, parse_parallelism
from crossflow.parallel.strategy import GRAMMAR, Strategy
from crossflow.parallel.supergraph import assign_stages, local_graph, shard_node, supergraph

__all__ = [
    "GRAMMAR",
    "ParallelismSpec",
    "Strategy",
    "assign_stages",
    "check_strategy",
    "enumerate_strategies",
    "local_graph",
    "parse_parallelism",
    "shard_node",
    "supergraph",
]
