"""Pricing one (sharded) compute-graph node with the kernel model, cached per device."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from crossflow.arch.microarch import MicroArch
from crossflow.kernels import ops
from crossflow.kernels.gemm import gemm
from crossflow.workloads.graph import SHAPE_KEYS


@lru_cache(maxsize=65536)
def _price(arch: MicroArch, op: str, shape: tuple, precision: str) -> float:
    """Seconds of one graph node's kernel (shape: the node's sharded shape attributes)."""
    if op == "gemm":
        m, k, n, count = shape
        one = gemm(arch, m, k, n, precision)
        # a batched GEMM is one kernel: its work adds up over the batch, one launch
        return (one.time_s - one.launch_s) * count + one.launch_s
    if op == "softmax":
        return ops.softmax(arch, *shape, precision).time_s
    if op == "layernorm":
        return ops.layernorm(arch, *shape, precision).time_s
    if op == "elementwise":
        elements, inputs, outputs, flops = shape
        return ops.elementwise(arch, elements, precision, inputs=inputs, outputs=outputs,
                               flops_per_element=flops).time_s
    if op == "embedding":
        tokens, hidden, _vocab = shape
        return ops.embedding(arch, tokens, hidden, precision).time_s
    raise ValueError(f"unknown op {op!r}")


def node_time(arch: MicroArch, attrs: Mapping) -> float:
    """Seconds of one (sharded) graph node on ``arch``."""
    op = attrs["op"]
    shape = tuple(attrs[k] for k in SHAPE_KEYS[op])
    return _price(arch, op, shape, attrs["precision"])


