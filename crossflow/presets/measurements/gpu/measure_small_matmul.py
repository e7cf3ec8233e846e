"""Time small torch matmuls one at a time, as a framework user sees them (eager PyTorch).

    python measure_small_matmul.py [--output FILE] [--repeat 200]

Two figures per shape and precision, C = A @ B with A [m, k] and B [k, n]:

* ``single_us``: the median over ``--repeat`` calls of CUDA events recorded just before and
  just after one ``torch.matmul`` on an idle stream.  The GPU reaches the first event at once
  and waits for the host to dispatch the matmul, so this is the framework-timed cost of one
  small kernel (PyTorch dispatch + launch + kernel), what a user timing an op measures;
* ``back_to_back_us``: CUDA events around 100 matmuls issued back to back, divided by 100:
  the host runs ahead, so this is the device time per kernel once launches are hidden.

The CSV header records the device, driver, torch and CUDA versions, the date and the command.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys

SHAPES = ((8192, 64, 64), (4096, 64, 64), (64, 64, 64), (8192, 128, 128),
          (1024, 1024, 1024), (4096, 4096, 4096))


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
            for _ in range(20):
                torch.matmul(a, b)
            torch.cuda.synchronize()
            single = []
            for _ in range(args.repeat):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                s.record()
                torch.matmul(a, b)
                e.record()
                e.synchronize()
                single.append(s.elapsed_time(e) * 1e3)
            runs = []
            for _ in range(10):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                s.record()
                for _ in range(100):
                    torch.matmul(a, b)
                e.record()
                e.synchronize()
                runs.append(s.elapsed_time(e) * 1e3 / 100)
            rows.append((m, k, n, dtype_name, statistics.median(single),
                         statistics.median(runs)))
            print(rows[-1], flush=True)
    with open(args.output, "w") as f:
        f.write(f"# device: {props.name}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
                f"driver/capability sm_{props.major}{props.minor}; "
                f"{dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}\n")
        f.write(f"# command: python {' '.join(sys.argv)}\n")
        f.write("# single_us: median of --repeat single matmuls bracketed by CUDA events on an "
                "idle stream (framework-timed); back_to_back_us: 100 matmuls between two "
                "events / 100, median of 10 (device time per kernel)\n")
        f.write("M,K,N,precision,single_us,back_to_back_us\n")
        for r in rows:
            f.write(f"{r[0]},{r[1]},{r[2]},{r[3]},{r[4]:.2f},{r[5]:.2f}\n")


if __name__ == "__main__":
    main()
