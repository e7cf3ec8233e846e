"""Time small torch kernels one at a time, as a framework user sees them: eager PyTorch,
back to back, and replayed from a CUDA graph.

    python measure_small_matmul.py [--output FILE] [--repeat 200]

Three figures per kernel (a matmul C = A @ B with A [m, k] and B [k, n], or ``add``: an
in-place ``x += 1`` on m×n elements, a kernel that does almost nothing):

* ``single_us``: the median over ``--repeat`` calls of CUDA events recorded just before and
  just after one call on an idle stream.  The GPU reaches the first event at once and waits
  for the host to dispatch the kernel, so this is the framework-timed cost of one small
  kernel (PyTorch dispatch + launch + kernel), what a user timing an op measures;
* ``back_to_back_us``: CUDA events around 100 calls issued back to back, divided by 100: the
  host runs ahead when it can, so this is the time per kernel of an eager loop;
* ``graph_us``: the same 100 calls captured once in a CUDA graph and replayed, divided by
  100: the time per kernel without per-call host dispatch (what CUDA graphs buy).

Each of the last two is the median of 10 timings.  The CSV header records the device,
torch and CUDA versions, the date and the command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys

import _record

SHAPES = ((8192, 64, 64), (4096, 64, 64), (64, 64, 64), (8192, 128, 128),
          (1024, 1024, 1024), (4096, 4096, 4096))
ADD_SIZES = ((1, 1), (1024, 1024))
CALLS = 100


def time_kernel(torch, call, repeat: int) -> tuple[float, float, float]:
    """(single_us, back_to_back_us, graph_us) of one kernel (module docstring)."""
    for _ in range(20):
        call()
    # one call at a time, each from an idle device (timings synchronises first)
    single = [_record.timings(torch, call, 1, warmup=0)[0] for _ in range(repeat)]
    eager, graph = _record.per_call(torch, call, CALLS)
    return tuple(1e6 * statistics.median(x) for x in (single, eager, graph))


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="torch_small_matmul.csv")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    rows = []
    for dtype_name in ("fp16", "bf16"):
        dtype = torch.float16 if dtype_name == "fp16" else torch.bfloat16
        for m, k, n in SHAPES:
            a = torch.randn(m, k, device=dev, dtype=dtype)
            b = torch.randn(k, n, device=dev, dtype=dtype)
            c = torch.empty(m, n, device=dev, dtype=dtype)
            rows.append(("matmul", m, k, n, dtype_name,
                         *time_kernel(torch, lambda a=a, b=b, c=c: torch.matmul(a, b, out=c),
                                      args.repeat)))
            print(rows[-1], flush=True)
    for m, n in ADD_SIZES:
        x = torch.zeros(m, n, device=dev, dtype=torch.float32)
        rows.append(("add", m, 0, n, "fp32", *time_kernel(torch, lambda x=x: x.add_(1.0),
                                                           args.repeat)))
        print(rows[-1], flush=True)
    with open(args.output, "w") as f:
        f.write(f"# device: {props.name}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
                f"capability sm_{props.major}{props.minor}; "
                f"{dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}\n")
        f.write(f"# command: python {' '.join(sys.argv)}\n")
        f.write("# single_us: median of --repeat single calls bracketed by CUDA events on an "
                "idle stream (framework-timed); back_to_back_us: 100 eager calls between two "
                "events / 100, median of 10; graph_us: the 100 calls replayed from one CUDA "
                "graph / 100, median of 10\n")
        f.write("op,M,K,N,precision,single_us,back_to_back_us,graph_us\n")
        for r in rows:
            f.write(f"{r[0]},{r[1]},{r[2]},{r[3]},{r[4]},{r[5]:.2f},{r[6]:.2f},{r[7]:.2f}\n")


if __name__ == "__main__":
    main()
