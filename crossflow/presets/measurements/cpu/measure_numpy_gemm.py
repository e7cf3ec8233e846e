#!/usr/bin/env python3
"""Record numpy GEMM timings and STREAM-like memory bandwidth on this machine.

Writes two CSVs (default: beside this script), named after the machine:

* ``numpy_gemm_<machine>.csv`` — columns m,k,n,dtype,threads,best_s,gflops: numpy matmul
  C = A @ B over a sweep of ~50 shapes, float32 and float64, with 1 BLAS thread and with one
  per physical core;
* ``stream_<machine>.csv`` — STREAM copy / scale / add / triad bandwidth, 1 thread and all cores.

Their ``#`` header lines record the command, date, CPU, SIMD flags, caches, memory, the
measured core clock, numpy and its BLAS, and how the timing was done.  The measurement code
lives in :mod:`crossflow.calibrate` (``crossflow calibrate cpu`` runs the same measurements and
writes a hardware preset from them); this file is a thin command line around it.  The full
sweep takes about 2 minutes on a 2-core machine (limit: 10).

Usage::

    python crossflow/presets/measurements/cpu/measure_numpy_gemm.py [--out-dir DIR] [--quick]
        [--preset NAME] [--suffix TEXT] [--gemm-only]

The recorded files came from these two commands, run from the repository root (the second
records, as evidence that the cores have 512-bit FMA pipes, the same sweep with OpenBLAS's
AVX-512 kernels; it validates no preset, so it lives in a subfolder)::

    python crossflow/presets/measurements/cpu/measure_numpy_gemm.py
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python crossflow/presets/measurements/cpu/measure_numpy_gemm.py --gemm-only --preset none --out-dir crossflow/presets/measurements/cpu/openblas-skylakex

(this project's sandbox sets OPENBLAS_CORETYPE=Haswell, so numpy runs OpenBLAS's AVX2 kernels
there; without it OpenBLAS picks its AVX-512 "SkylakeX" kernels on this Zen 5 CPU).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    from crossflow import calibrate
except ImportError:  # run from a checkout without installing: the repo root is 4 levels up
    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
    from crossflow import calibrate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent,
                   help="folder for the CSVs (default: beside this script)")
    p.add_argument("--quick", action="store_true", help="a few shapes and repetitions only")
    p.add_argument("--suffix", default="",
                   help="appended to the file names (e.g. when forcing OPENBLAS_CORETYPE)")
    p.add_argument("--preset", help="hardware preset these rows validate, written as the "
                   "'# preset:' header line (default: cpu-<machine>, e.g. cpu-amd-epyc-zen5-2c); "
                   "'none' for a file that validates no preset")
    p.add_argument("--gemm-only", action="store_true", help="skip the STREAM measurement")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)

    command = " ".join(["python", *sys.argv]) if argv is None else " ".join(
        ["python", Path(__file__).name, *argv])
    t0 = time.perf_counter()
    meas = calibrate.measure(
        quick=args.quick, command=command, stream=not args.gemm_only,
        progress=None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True)),
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    outputs = [(calibrate.gemm_csv_name(meas.machine), calibrate.write_gemm_csv)]
    if not args.gemm_only:
        outputs.append((calibrate.stream_csv_name(meas.machine), calibrate.write_stream_csv))
    preset = args.preset or meas.machine.preset_name
    for name, write in outputs:
        if args.suffix:
            name = name.replace(".csv", f"_{args.suffix}.csv")
        final = args.out_dir / name
        tmp = final.with_name(f".{final.name}.tmp")
        write(tmp, meas, None if preset == "none" else preset)
        tmp.replace(final)  # never leave a half-written CSV behind
        print(final)
    print(f"took {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
