"""Time fused (flash) attention through torch's scaled_dot_product_attention on a GPU.

    python measure_torch_attention.py --preset h200-sxm-141gb [--output FILE] [--repeat 20]
        [--set blocks|head-dims|long]

For each shape (batch, query heads, key/value heads, sequence, head dimension, causal) and
each backend torch offers on the device (FlashAttention-2 and cuDNN fused attention), bf16:

* ``fwd``: one forward call;
* ``bwd``: one backward call of the same attention (dq, dk, dv from dO), the graph retained
  so the same forward serves every timed backward.

Each row is the median of ``--repeat`` CUDA-event-timed runs after 3 warm-up runs
(``median_s``: what a user timing one call sees, the host's dispatch of a short call
included) and the kernels' own device time per call from torch's profiler (``kernel_s``,
:func:`_record.kernel_seconds`: what the kernel model prices), with the FLOPs of the products (4·b·h·s²·d forward, 10·b·h·s²·d backward with the scores recomputed;
halved under a causal mask) and the rate they give.  A backend that refuses a shape is
skipped and said so on stderr.  The header names the hardware preset (``# preset: NAME``).
Written to a temporary file and renamed, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import _record

#: (batch, query heads, key/value heads, sequence, head dim, causal): GPT-3-like and
#: Llama-like layers per tensor-parallel rank, with and without grouped-query attention, and
#: the attention of each block ``measure_torch_block.py`` times.
SHAPES = (
    (4, 16, 16, 2048, 128, 1),
    (4, 32, 32, 2048, 128, 1),
    (2, 32, 8, 4096, 128, 1),
    (1, 8, 1, 8192, 128, 1),
    (1, 32, 32, 4096, 128, 1),
    (1, 64, 8, 4096, 128, 1),
    (1, 32, 8, 8192, 128, 1),
    (2, 16, 16, 2048, 64, 1),
    (1, 32, 32, 4096, 128, 0),
)

#: ``--set head-dims``: attention about 4096 wide (query heads × head dimension) at head
#: dimensions 64 to 256 — GPT-2/GPT-OSS, Phi-3, Llama, DeepSeek's MLA query-key, Gemma — at
#: 8192 tokens in sequences of 2048 to 8192, causal, with a key/value head per query head
#: and per eight.
_HEADS = {64: 64, 96: 40, 128: 32, 192: 24, 256: 16}
HEAD_DIMS = tuple((8192 // s, h, kv, s, d, 1) for d, h in _HEADS.items()
                  for s in (2048, 4096, 8192) for kv in (h, h // 8))
#: ``--set long``: one sequence of 16K to 128K tokens, the lengths context parallelism splits
#: — a Llama-3-8B-like attention (32 query heads, 8 key/value heads, head dimension 128),
#: causal, and at 32K tokens without the mask and at head dimensions 64 and 192 (measured to
#: check the constants fitted at 2K-8K tokens, which it failed; now part of their fit).
LONG = (tuple((1, 32, 8, s, 128, 1) for s in (16384, 32768, 65536, 131072))
        + ((1, 32, 8, 32768, 128, 0), (1, 64, 8, 32768, 64, 1), (1, 24, 3, 32768, 192, 1)))
#: ``--set`` name -> (shapes, the file-name part after ``torch_attention``).
SETS = {"blocks": (SHAPES, ""), "head-dims": (HEAD_DIMS, "_head_dims"), "long": (LONG, "_long")}


def _median_time(torch, call, repeat: int) -> float:
    return statistics.median(_record.timings(torch, call, repeat))


def time_shape(torch, shape: tuple[int, ...], repeat: int) -> tuple[float, ...]:
    """Median forward and backward seconds of one attention shape on the active backend,
    then its kernels' device seconds per forward and per backward call."""
    import torch.nn.functional as F

    b, h, hkv, s, d, causal = shape
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal),
                                              enable_gqa=hkv != h)

    fwd = _median_time(torch, forward, repeat)
    o = forward()
    grad = torch.randn_like(o)

    def backward():
        return torch.autograd.grad(o, (q, k, v), grad, retain_graph=True)

    bwd = _median_time(torch, backward, repeat)
    return (fwd, bwd, _record.kernel_seconds(torch, forward),
            _record.kernel_seconds(torch, backward))


def main() -> int:
    parser = _record.arguments(__doc__, "torch_attention")
    parser.add_argument("--set", default="blocks", choices=tuple(SETS),
                        help="the shapes: blocks (SHAPES), head-dims (HEAD_DIMS) or long (LONG)")
    args = parser.parse_args()
    shapes, part = SETS[args.set]

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if _record.no_cuda(torch):
        return 2
    out = Path(args.output or Path(__file__).with_name(
        f"torch_attention{part}_{args.preset}.csv"))
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    rows = []
    for b, h, hkv, s, d, causal in shapes:
        for name, backend in backends.items():
            try:
                with sdpa_kernel([backend]):
                    fwd, bwd, fwd_k, bwd_k = time_shape(torch, (b, h, hkv, s, d, causal),
                                                        args.repeat)
            except RuntimeError as exc:
                print(f"skipped {name} {(b, h, hkv, s, d, causal)}: {str(exc)[:200]}",
                      file=sys.stderr, flush=True)
                continue
            scale = 0.5 if causal else 1.0
            for pass_, t, k, gemms in (("fwd", fwd, fwd_k, 2), ("bwd", bwd, bwd_k, 5)):
                flops = 2.0 * gemms * b * h * s * s * d * scale
                rows.append(f"{b},{h},{hkv},{s},{d},{causal},{name},{pass_},bf16,"
                            f"{t:.9g},{k:.9g},{flops / k / 1e12:.1f}")
                print(rows[-1], flush=True)
    header = _record.header(torch, __file__, f"median_s: median of {args.repeat} "
                            "CUDA-event-timed runs after 3 warm-up runs; kernel_s: the "
                            "kernels' device time per call from torch.profiler over 10 calls; "
                            "tflops: FLOPs / kernel_s", args.preset, cudnn=True)
    _record.write_csv(out, header, "batch,heads,kv_heads,seq,head_dim,causal,backend,pass,"
                      "dtype,median_s,kernel_s,tflops", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
