"""Time torch's memory-bound kernels on a GPU: elementwise, normalisation and softmax.

    python measure_torch_memory_ops.py --preset h200-sxm-141gb [--output FILE]

Each op (bf16) at several sizes, from a few MB (the data stays in L2 between calls, as
between a training step's kernels) to 1 GiB: ``add`` (c = a + b), ``gelu``, ``layer_norm``
and ``rms_norm`` over rows of 4096 with weights, ``softmax`` over rows of 4096.  Two
figures per row, each the median of 10 timings with CUDA events around 20 calls, divided by
20: ``eager_s`` issued eagerly back to back, and ``graph_s`` replayed from one CUDA graph
(the device's time per kernel without host dispatch).  ``bytes`` counts each input and
output once.  The header names the hardware preset (``# preset: NAME``).  Written to a
temporary file and renamed, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import _record

ELEMENTS = (2**20, 2**22, 2**24, 2**26, 2**29)
COLS = 4096
CALLS = 20


def _time(torch, call) -> tuple[float, float]:
    for _ in range(5):
        call()
    eager, graph = _record.per_call(torch, call, CALLS)
    return statistics.median(eager), statistics.median(graph)


def _ops(torch, n: int) -> dict:
    """name -> (call, tensors read and written, per-column parameter vectors), on n
    elements in rows of COLS."""
    import torch.nn.functional as F

    x = torch.randn(n // COLS, COLS, device="cuda", dtype=torch.bfloat16)
    y, z = torch.randn_like(x), torch.empty_like(x)
    w, bias = (torch.randn(COLS, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return {
        "add": (lambda: torch.add(x, y, out=z), 3, 0),
        "gelu": (lambda: F.gelu(x), 2, 0),
        "layer_norm": (lambda: F.layer_norm(x, (COLS,), w, bias), 2, 2),
        "rms_norm": (lambda: F.rms_norm(x, (COLS,), w), 2, 1),
        "softmax": (lambda: torch.softmax(x, dim=-1), 2, 0),
    }


def main() -> int:
    parser = _record.arguments(__doc__, "torch_memory_ops", repeat=None)
    args = parser.parse_args()

    import torch

    if _record.no_cuda(torch):
        return 2
    out = Path(args.output or Path(__file__).with_name(f"torch_memory_ops_{args.preset}.csv"))
    b = 2  # bf16
    rows = []
    for n in ELEMENTS:
        for name, (call, tensors, params) in _ops(torch, n).items():
            try:
                eager, graph = _time(torch, call)
            except (RuntimeError, AttributeError) as exc:
                print(f"skipped {name} {n}: {exc}", file=sys.stderr, flush=True)
                continue
            moved = (tensors * n + params * COLS) * b
            rows.append(f"{name},{n // COLS},{COLS},bf16,{moved},{eager:.9g},{graph:.9g},"
                        f"{moved / graph / 1e9:.1f}")
            print(rows[-1], flush=True)
    header = _record.header(torch, __file__, f"median of 10 CUDA-event timings of {CALLS} "
                            f"calls / {CALLS}, eager and replayed from a CUDA graph; GBps = "
                            "bytes / graph_s", args.preset, l2=True)
    _record.write_csv(out, header, "op,rows,cols,dtype,bytes,eager_s,graph_s,GBps", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
