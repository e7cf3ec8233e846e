"""Device-memory bandwidth of a GPU as torch sees it: the four STREAM kernels.

    python measure_torch_stream.py --preset h200-sxm-141gb [--output FILE] [--repeat 20]

copy (c = a), scale (b = q·c), add (c = a + b), triad (a = b + q·c) on fp32 arrays of
``--elements`` each (default 2^28: 1 GiB, 20 times a Hopper L2, so nothing is served from
cache), written with ``out=`` so no allocation is timed.  Bytes counted as STREAM counts
them: every array read once and written once.  Each row is the best of ``--repeat``
CUDA-event-timed runs after 3 warm-up runs.  The header names the hardware preset whose DRAM
efficiency the rows measure (``# preset: NAME``).  Written to a temporary file and renamed,
so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True, help="hardware preset these rows measure")
    parser.add_argument("--output", help="CSV to write (default: torch_stream_<preset>.csv here)")
    parser.add_argument("--elements", type=int, default=2**28)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    import torch

    if _record.no_cuda(torch):
        return 2
    out = Path(args.output or Path(__file__).with_name(f"torch_stream_{args.preset}.csv"))
    n, q = args.elements, 3.0
    a, b, c = (torch.rand(n, device="cuda") for _ in range(3))
    kernels = {  # name: (call, arrays moved)
        "copy": (lambda: c.copy_(a), 2),
        "scale": (lambda: torch.mul(c, q, out=b), 2),
        "add": (lambda: torch.add(a, b, out=c), 3),
        "triad": (lambda: torch.add(b, c, alpha=q, out=a), 3),
    }
    header = _record.header(torch, __file__, f"best of {args.repeat} CUDA-event-timed runs "
                            "after 3 warm-up runs; bytes = arrays moved x elements x 4",
                            args.preset, l2=True)
    rows = []
    for name, (call, arrays) in kernels.items():
        best = min(_record.timings(torch, call, args.repeat))
        moved = arrays * n * 4
        rows.append(f"{name},{n},{moved},{best:.9g},{moved / best / 1e9:.1f}")
        print(rows[-1], flush=True)
    _record.write_csv(out, header, "kernel,elements,bytes,best_s,GBps", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
