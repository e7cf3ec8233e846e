"""Parallelism (DESIGN.md §4, paper §3.3 and §5.1): strategies, the parallelism file,
enumeration of valid strategies and the super-graph transformation.

``crossflow.parallel.strategy`` and ``crossflow.parallel.spec`` are light (config code
loads them); the graph modules are imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from crossflow.parallel.strategy import GRAMMAR, Strategy

_LAZY = {
    "ParallelismSpec": "crossflow.parallel.spec",
    "parse_parallelism": "crossflow.parallel.spec",
    "enumerate_strategies": "crossflow.parallel.enumerate",
    "check_strategy": "crossflow.parallel.enumerate",
    "assign_stages": "crossflow.parallel.supergraph",
    "local_graph": "crossflow.parallel.supergraph",
    "shard_node": "crossflow.parallel.supergraph",
    "supergraph": "crossflow.parallel.supergraph",
}

__all__ = ["GRAMMAR", "Strategy", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
