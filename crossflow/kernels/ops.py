"""Memory-bound operators: elementwise, softmax, layernorm, embedding; and the fused
(flash) attention kernel, compute-bound but priced here as one fused kernel.

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
#: A flash-attention kernel's efficiency relative to the device's GEMM efficiency where no
#: software profile gives its own: FlashAttention-2 reaches up to 73 % of A100 peak forward
#: and 63 % backward (Dao 2023, arXiv:2307.08691, §4.1) where cuBLAS GEMMs sustain ~86 %
#: (the dgx-a100 profile's 0.863 before issue #19, 0.899 since): 0.68 / 0.86 ~ 0.8.
FLASH_RELATIVE_EFFICIENCY = 0.8
#: A sliding window of attention (Megatron-LM's ``--window-size``: keys left and right of each
#: query, -1 unlimited) that limits nothing
NO_WINDOW = (-1, -1)


def score_share(seq: int, causal: int, window: tuple[int, int] = NO_WINDOW) -> float:
    """Share of the seq × seq scores of one head a flash kernel computes: it skips the tiles
    its mask hides.  Each query sees the keys of its ``window`` (left, right; -1 unlimited,
    so an unlimited causal window is half the square), only those before it under a causal
    mask: the band of the square within ``left`` + 1 keys (itself included) on one side and
    ``right`` on the other, in area, as the causal half is (tiles partly inside the band are
    not counted whole)."""
    left, right = window

    def band(width: int) -> float:  # the square's area within ``width`` of its diagonal
        w = seq if width < 0 else min(width, seq)
        return w * seq - w * w / 2

    area = band(left + 1 if left >= 0 else -1) + (0.0 if causal else band(right))
    return area / (seq * seq)


def attention_flops(heads: int, seq: int, head_dim: int, gemms: int, causal: int,
                    window: tuple[int, int] = NO_WINDOW) -> float:
    """FLOPs of a flash-attention kernel: ``gemms`` (seq × seq × head_dim) products per
    head, those a causal mask or a sliding window hides skipped (the kernel skips masked
    tiles; :func:`score_share`)."""
    return 2.0 * gemms * heads * seq * seq * head_dim * score_share(seq, causal, window)


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


def fused_attention(arch: MicroArch, heads: int, seq: int, head_dim: int, gemms: int,
                    causal: int, precision: str = "bf16",
                    window: tuple[int, int] = NO_WINDOW) -> KernelResult:
    """A flash-attention kernel (FlashAttention, cuDNN fused attention): the scores are made
    and consumed tile by tile on chip, so main memory sees only q, k, v and the output
    (forward, ``gemms`` = 2: QKᵀ and PV) or q, k, v, o, dO in and dq, dk, dv out (backward,
    ``gemms`` = 5: the scores recomputed, dV, dP, dQ, dK) — no s×s tensor.  Under a causal
    mask the kernel skips the masked tiles: half the products; under a sliding ``window``
    those outside it too (:func:`score_share`).  Time: the slower of the
    products at the profile's attention efficiency (or the device's measured kernels, with
    their time per query row) and the bytes at the memory-bound efficiency, at least the
    kernel minimum, plus the launch.
    """
    check_precision(arch, precision)
    b = BYTES_PER_ELEMENT[precision]
    flops = attention_flops(heads, seq, head_dim, gemms, causal, window)
    forward = gemms <= 2
    kernel = arch.attention_kernel
    rows_time = 0.0
    if arch.attention_efficiency is None and kernel is not None:
        # the device's measured kernels: a share of peak, plus a fixed time per query row
        efficiency = ((kernel.forward_efficiency if forward else kernel.backward_efficiency)
                      * kernel.head_dim_factor(head_dim, forward))
        rows_time = heads * seq * (kernel.forward_row_s if forward else kernel.backward_row_s)
    else:
        efficiency = (arch.attention_efficiency
                      or FLASH_RELATIVE_EFFICIENCY * arch.compute_efficiency)
    compute_time = flops / (arch.peak_flops[precision] * efficiency) + rows_time
    moved = (4 if forward else 8) * heads * seq * head_dim * b
    level = arch.main_memory
    memory_time = moved / (level.bandwidth_Bps * (arch.memory_bound_efficiency
                                                  or level.efficiency)) + level.latency_s
    launch = arch.kernel_launch_s
    energy = flops * arch.energy_J_per_flop.get(precision, 0.0) + moved * level.energy_J_per_B
    return KernelResult(
        name="attention",
        time_s=max(compute_time, memory_time, arch.kernel_min_s) + launch,
        flops=flops,
        compute_time_s=compute_time,
        bytes_per_level={lv.name: (moved if lv is level else 0.0) for lv in arch.memory},
        time_per_level_s={lv.name: (memory_time if lv is level else 0.0) for lv in arch.memory},
        bottleneck="compute" if compute_time > memory_time else level.name,
        launch_s=launch,
        energy_J=energy,
        detail={"heads": heads, "seq": seq, "head_dim": head_dim, "gemms": gemms,
                "causal": bool(causal), "window": window},
    )
