"""Time torch matmuls on a GPU and record them for `crossflow validate gemm`.

    python measure_torch_matmul.py --preset h100-sxm5-80gb [--output FILE] [--repeat 20]

Each row is the best of ``--repeat`` timed runs (CUDA events around one matmul, after
warm-up), C = A @ B with A [m, k] and B [k, n] in the given precision.  tf32 is fp32 inputs
with ``torch.backends.cuda.matmul.allow_tf32 = True``; fp32 is the same with it off; fp8 is
``torch._scaled_mm`` on e4m3 operands with unit scales and a bf16 output (B column-major, as
cuBLASLt's fp8 kernels require), the way Transformer Engine runs an fp8 linear layer.  The
CSV header records the device, driver, torch and CUDA versions, the date and the command,
and names the hardware preset the rows validate (``# preset: NAME``).  Written to a
temporary file and renamed at the end, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import sys
from pathlib import Path

import _record

SHAPES = (
    # square
    *[(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192, 16384)],
    # the published A100 M-sweep shape family (small M: weight streaming)
    *[(m, 12288, 12288) for m in (64, 128, 256, 512, 1024, 2048, 4096, 8192)],
    # transformer-like shapes (tokens x hidden x 3*hidden, 4*hidden, …)
    (8192, 4096, 12288), (8192, 4096, 16384), (8192, 16384, 4096), (2048, 12288, 49152),
    (4096, 128, 4096), (16384, 16384, 128),
)
DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16",
          "fp8": "float8_e4m3fn"}


def _product(torch, m: int, k: int, n: int, precision: str):
    """A zero-argument callable computing one m×k×n product in ``precision``."""
    dtype = getattr(torch, DTYPES[precision])
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    if precision == "fp8":
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = torch.randn(n, k, device="cuda").to(dtype).t()
        one = torch.ones((), device="cuda")
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    return lambda: torch.matmul(a, b)


def time_matmul(torch, m: int, k: int, n: int, precision: str, repeat: int) -> float:
    return min(_record.timings(torch, _product(torch, m, k, n, precision), repeat))


def main() -> int:
    parser = _record.arguments(__doc__, "torch_matmul")
    parser.add_argument("--precisions", default="fp32,tf32,fp16,bf16,fp8")
    args = parser.parse_args()

    import torch

    if _record.no_cuda(torch):
        return 2
    out = Path(args.output or Path(__file__).with_name(f"torch_matmul_{args.preset}.csv"))
    header = _record.header(torch, __file__, f"best of {args.repeat} CUDA-event-timed runs "
                            "after 3 warm-up runs; cuBLAS via torch.matmul (fp8: "
                            "torch._scaled_mm)", args.preset)
    rows = []
    for precision in args.precisions.split(","):
        for m, k, n in SHAPES:
            try:
                best = time_matmul(torch, m, k, n, precision, args.repeat)
            except RuntimeError as exc:  # a precision this device or torch build lacks
                print(f"skipped {m}x{k}x{n} {precision}: {exc}", file=sys.stderr, flush=True)
                continue
            rows.append(f"{m},{k},{n},{precision},{best:.9g},{2 * m * k * n / best / 1e12:.2f}")
            print(rows[-1], flush=True)
    _record.write_csv(out, header, "m,k,n,dtype,best_s,tflops", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
