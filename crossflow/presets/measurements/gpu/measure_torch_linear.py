"""Time a transformer block's linear layers on a GPU as nn.Linear runs them: the forward
(y = x·Wᵀ), the input gradient (dx = dy·W) and the weight gradient (dW = dyᵀ·x), bf16.

    python measure_torch_linear.py --preset h200-sxm-141gb [--output FILE] [--repeat 20]

A bare ``torch.matmul(A, B)`` with both operands row-major (``measure_torch_matmul.py``) is
one of the layouts cuBLAS sees; a linear layer's three products use the others (the weight
transposed forward, the activation transposed for the weight gradient); each layer's
forward is also timed as that bare matmul (``matmul``), for comparison.  Per product: the
median of ``--repeat`` CUDA-event-timed calls after 3 warm-up calls (``median_s``) and the
kernels' device time per call from torch's profiler (``kernel_s``,
:func:`_record.kernel_seconds`), with its rate.  The shapes are the linear layers of the
blocks ``measure_torch_block.py`` times (8192 tokens; GPT-3 1.3B's 16384).  Written to a
temporary file and renamed, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import _record

#: (layer, tokens, in features, out features): Llama-3 8B's QKV, output projection, gated
#: MLP up and down; the same of one TP-8 rank of Llama-3 70B; GPT-3 1.3B's QKV and MLP.
LAYERS = (
    ("llama3-8b.qkv", 8192, 4096, 6144), ("llama3-8b.proj", 8192, 4096, 4096),
    ("llama3-8b.fc1", 8192, 4096, 28672), ("llama3-8b.fc2", 8192, 14336, 4096),
    ("llama3-70b-tp8.qkv", 8192, 8192, 1280), ("llama3-70b-tp8.proj", 8192, 1024, 8192),
    ("llama3-70b-tp8.fc1", 8192, 8192, 7168), ("llama3-70b-tp8.fc2", 8192, 3584, 8192),
    ("gpt3-1.3b.qkv", 16384, 2048, 6144), ("gpt3-1.3b.fc1", 16384, 2048, 8192),
)


def products(torch, tokens: int, k: int, n: int):
    """{"matmul": the forward as a bare row-major matmul (``measure_torch_matmul.py``'s
    layout), "fwd": x·Wᵀ, "dgrad": dy·W, "wgrad": dyᵀ·x} as zero-argument callables, each
    with its (m, k, n)."""
    import torch.nn.functional as F

    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    wt = w.t().contiguous()
    return {"matmul": (lambda: x @ wt, (tokens, k, n)),
            "fwd": (lambda: F.linear(x, w), (tokens, k, n)),
            "dgrad": (lambda: dy @ w, (tokens, n, k)),
            "wgrad": (lambda: dy.t() @ x, (n, tokens, k))}


def main() -> int:
    parser = _record.arguments(__doc__, "torch_linear")
    args = parser.parse_args()

    import torch

    if _record.no_cuda(torch):
        return 2
    rows = []
    for layer, tokens, k, n in LAYERS:
        for pass_, (call, (pm, pk, pn)) in products(torch, tokens, k, n).items():
            median = statistics.median(_record.timings(torch, call, args.repeat))
            kernel = _record.kernel_seconds(torch, call)
            rows.append(f"{layer},{pass_},{pm},{pk},{pn},bf16,{median:.9g},{kernel:.9g},"
                        f"{2.0 * pm * pk * pn / kernel / 1e12:.1f}")
            print(rows[-1], flush=True)
    out = Path(args.output or Path(__file__).with_name(f"torch_linear_{args.preset}.csv"))
    header = _record.header(torch, __file__, f"median_s: median of {args.repeat} "
                            "CUDA-event-timed calls after 3 warm-up calls; kernel_s: the "
                            "kernels' device time per call from torch.profiler over 10 calls; "
                            "tflops: FLOPs / kernel_s", args.preset)
    _record.write_csv(out, header, "layer,pass,m,k,n,dtype,median_s,kernel_s,tflops", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
