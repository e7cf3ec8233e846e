"""Memory-bound operators: elementwise, softmax, layernorm, embedding.

They move every byte once and do little arithmetic, so their time is the roofline of the
bytes at the memory level where their data lives — the smallest chip-global level that holds
the whole working set (an L2 that fits it), otherwise main memory — and the arithmetic at the
vector (non-tensor, fp32) rate.  Never at register bandwidth: registers are private to one
MCU and hold nothing between kernels (the reference implementation priced every such op at
register-file bandwidth, BUGS.md).
"""

from __future__ import annotations

from crossflow.arch.microarch import BYTES_PER_ELEMENT, MicroArch
from crossflow.kernels.gemm import check_precision
from crossflow.kernels.residency import home_level
from crossflow.kernels.result import KernelResult

#: Arithmetic per element.  Softmax: max, subtract, exp, sum, divide (5).  LayerNorm: mean,
#: subtract, square, sum, rsqrt-scale, gamma multiply, beta add (≈8; Megatron fused kernel).
SOFTMAX_FLOPS_PER_ELEMENT = 5.0
LAYERNORM_FLOPS_PER_ELEMENT = 8.0
#: Token ids are int64 in PyTorch/Megatron embedding lookups.
INDEX_BYTES = 8


def vector_rate(arch: MicroArch) -> float:
    """FLOP/s of the non-tensor vector units, used by elementwise arithmetic."""
    rate = arch.peak_flops.get("fp32") or min(arch.peak_flops.values())
    return rate * arch.compute_efficiency


def memory_bound(
    arch: MicroArch,
    name: str,
    *,
    bytes_read: float,
    bytes_written: float,
    flops: float,
    count: int = 1,
    detail: dict[str, object] | None = None,
    warm: bool = True,
) -> KernelResult:
    """Roofline of a streaming kernel at the level its data lives in.

    A software profile may say its implementation of ``name`` moves the bytes several times
    (``arch.memory_passes``, e.g. an unfused RMSNorm: each pass a kernel of its own) and that
    no kernel runs shorter than ``arch.kernel_min_s``.  ``warm=False``: the data is read from
    main memory even where it would fit a cache (as :func:`crossflow.kernels.gemm.gemm`).
    """
    passes = arch.memory_passes.get(name, 1.0)
    moved = (bytes_read + bytes_written) * passes
    level = home_level(arch, moved) if warm else arch.main_memory
    efficiency = arch.memory_bound_efficiency or level.efficiency
    memory_time = moved / (level.bandwidth_Bps * efficiency) + level.latency_s
    compute_time = flops / vector_rate(arch)
    launch = arch.kernel_launch_s
    bottleneck = "compute" if compute_time > memory_time else level.name
    energy = flops * arch.energy_J_per_flop.get("fp32", 0.0) + moved * level.energy_J_per_B
    return KernelResult(
        name=name,
        time_s=(max(memory_time, compute_time, passes * arch.kernel_min_s) + launch) * count,
        flops=flops * count,
        compute_time_s=compute_time * count,
        bytes_per_level={lv.name: (moved * count if lv is level else 0.0) for lv in arch.memory},
        time_per_level_s={
            lv.name: (memory_time * count if lv is level else 0.0) for lv in arch.memory
        },
        bottleneck=bottleneck,
        launch_s=launch * count,
        energy_J=energy * count,
        detail={"home_level": level.name, **(detail or {})},
    )


def elementwise(
    arch: MicroArch,
    elements: int,
    precision: str = "fp16",
    *,
    inputs: int = 1,
    outputs: int = 1,
    flops_per_element: float = 1.0,
    count: int = 1,
    name: str = "elementwise",
    warm: bool = True,
) -> KernelResult:
    """``outputs`` tensors computed element by element from ``inputs`` tensors."""
    check_precision(arch, precision)
    b = BYTES_PER_ELEMENT[precision]
    return memory_bound(
        arch, name,
        bytes_read=elements * inputs * b,
        bytes_written=elements * outputs * b,
        flops=elements * flops_per_element,
        count=count,
        detail={"elements": elements},
        warm=warm,
    )


def _rowwise(arch: MicroArch, name: str, rows: int, cols: int, precision: str, count: int,
             params_per_col: int, flops_per_element: float, warm: bool = True) -> KernelResult:
    """A fused row-wise kernel: read the matrix (and per-column parameters), write it."""
    check_precision(arch, precision)
    b = BYTES_PER_ELEMENT[precision]
    elements = rows * cols
    return memory_bound(
        arch, name,
        bytes_read=(elements + params_per_col * cols) * b, bytes_written=elements * b,
        flops=elements * flops_per_element, count=count,
        detail={"rows": rows, "cols": cols}, warm=warm,
    )


def softmax(arch: MicroArch, rows: int, cols: int, precision: str = "fp16",
            count: int = 1) -> KernelResult:
    """Row-wise softmax, fused (one read, one write of the matrix)."""
    return _rowwise(arch, "softmax", rows, cols, precision, count, 0, SOFTMAX_FLOPS_PER_ELEMENT)


def layernorm(arch: MicroArch, rows: int, cols: int, precision: str = "fp16",
              count: int = 1, *, warm: bool = True) -> KernelResult:
    """LayerNorm over the last dimension, fused: read x, gamma, beta; write y."""
    return _rowwise(arch, "layernorm", rows, cols, precision, count, 2,
                    LAYERNORM_FLOPS_PER_ELEMENT, warm)


def embedding(arch: MicroArch, tokens: int, hidden: int, precision: str = "fp16",
              count: int = 1, *, warm: bool = True) -> KernelResult:
    """Embedding lookup: gather ``tokens`` rows of width ``hidden`` from the table.

    Only the gathered rows move; the table's size matters for where it lives, which is
    main memory for any realistic vocabulary.
    """
    check_precision(arch, precision)
    b = BYTES_PER_ELEMENT[precision]
    moved = tokens * hidden * b
    return memory_bound(
        arch, "embedding",
        bytes_read=moved + tokens * INDEX_BYTES, bytes_written=moved, flops=0.0, count=count,
        detail={"tokens": tokens, "hidden": hidden}, warm=warm,
    )
