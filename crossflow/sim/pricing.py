"""Pricing one (sharded) compute-graph node with the kernel model, cached per device."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from crossflow.arch.microarch import MicroArch
from crossflow.config.system import MemoryPassesSpec
from crossflow.kernels import ops
from crossflow.kernels.gemm import gemm
from crossflow.workloads.graph import SHAPE_KEYS


@lru_cache(maxsize=65536)
def _price(arch: MicroArch, op: str, shape: tuple, precision: str) -> tuple[float, float]:
    """(seconds, joules) of one graph node's kernel (shape: its sharded shape attributes)."""
    if op == "gemm":
        m, k, n, count = shape
        one = gemm(arch, m, k, n, precision)
        # a batched GEMM is one kernel: its work adds up over the batch, one launch
        return (one.time_s - one.launch_s) * count + one.launch_s, one.energy_J * count
    if op == "softmax":
        r = ops.softmax(arch, *shape, precision)
    elif op == "layernorm":
        r = ops.layernorm(arch, *shape, precision)
    elif op == "elementwise":
        elements, inputs, outputs, flops, name = shape
        r = ops.elementwise(arch, elements, precision, inputs=inputs, outputs=outputs,
                            flops_per_element=flops, name=name)
    elif op == "embedding":
        tokens, hidden, _vocab = shape
        r = ops.embedding(arch, tokens, hidden, precision)
    elif op == "attention":
        *dims, window = shape
        r = ops.fused_attention(arch, *dims, precision, window=window)
    else:
        raise ValueError(f"unknown op {op!r}")
    return r.time_s, r.energy_J


#: Elementwise nodes a software profile's ``memory_passes`` prices by their own name (forward
#: and backward: ``rope``, ``rope.bwd``): its keys that are no op kind of their own (rope,
#: swiglu); every other elementwise node is ``elementwise``.
OWN_PASSES = frozenset(MemoryPassesSpec.model_fields) - frozenset(SHAPE_KEYS)


def kernel_key(attrs: Mapping) -> tuple[str, tuple, str]:
    """``(op, sharded shape, precision)``: what the price of a graph node depends on (an
    elementwise node's shape ends with the name its memory passes are looked up by)."""
    op = attrs["op"]
    shape = tuple(attrs[k] for k in SHAPE_KEYS[op])
    if op == "elementwise":
        base = str(attrs.get("name", "")).split(".")[0]
        shape += (base if base in OWN_PASSES else "elementwise",)
    return op, shape, attrs["precision"]


def node_cost_key(arch: MicroArch, key: tuple[str, tuple, str]) -> tuple[float, float]:
    """:func:`node_cost` of a node given by its :func:`kernel_key`."""
    return _price(arch, *key)


def node_cost(arch: MicroArch, attrs: Mapping) -> tuple[float, float]:
    """(seconds, joules) of one (sharded) graph node on ``arch``: the kernel model's time
    and its dynamic energy from the technology's energy per FLOP and per byte moved."""
    return _price(arch, *kernel_key(attrs))


