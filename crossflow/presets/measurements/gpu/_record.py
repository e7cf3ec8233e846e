"""What the GPU measurement scripts beside this file share: their common arguments, the
refusal without a GPU, the CSV header that records where and how a file was measured, and
the write that leaves nothing half-written.

The scripts run as ``python measure_X.py`` from this folder on a machine with a GPU (the
project need not be installed there), so this is a plain module beside them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
from pathlib import Path


def arguments(doc: str, stem: str, repeat: int | None = 20) -> argparse.ArgumentParser:
    """A parser with every script's arguments: ``--preset`` (the hardware preset the rows
    validate), ``--output`` (default ``<stem>_<preset>.csv`` beside the script) and, unless
    ``repeat`` is None, ``--repeat`` (timed calls per measurement, default ``repeat``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--preset", required=True, help="hardware preset these rows validate")
    parser.add_argument("--output", help=f"CSV to write (default: {stem}_<preset>.csv here)")
    if repeat is not None:
        parser.add_argument("--repeat", type=int, default=repeat)
    return parser


def no_cuda(torch) -> bool:
    """True (having said so on stderr) when torch sees no CUDA device: nothing to measure."""
    if torch.cuda.is_available():
        return False
    print("no CUDA device: nothing measured", file=sys.stderr)
    return True


def header(torch, script: str, timing: str, preset: str | None = None,
           cudnn: bool = False, l2: bool = False) -> list[str]:
    """The header lines: the script, the command, the date, the device, the versions, how
    the rows were timed and (``preset``) the hardware preset the rows validate."""
    props = torch.cuda.get_device_properties(0)
    device = (f"device: {props.name}, {props.multi_processor_count} SMs, "
              f"{props.total_memory / 2**30:.1f} GiB")
    versions = f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    lines = [
        f"source: measured by crossflow/presets/measurements/gpu/{Path(script).name}",
        f"command: python {' '.join(sys.argv)}",
        f"date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}",
        device + (f", L2 {props.L2_cache_size / 2**20:.0f} MiB" if l2 else ""),
        versions + (f", cuDNN {torch.backends.cudnn.version()}" if cudnn else ""),
        f"timing: {timing}",
    ]
    return lines + ([f"preset: {preset}"] if preset else [])


def write_csv(out: Path, lines: list[str], columns: str, rows: list[str]) -> None:
    """``rows`` under ``columns`` and the ``# `` header ``lines``, written to a temporary
    file beside ``out`` and renamed onto it."""
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(f"# {line}\n" for line in lines))
        fh.write(columns + "\n")
        fh.write("\n".join(rows) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out}")


def timings(torch, call, repeat: int, warmup: int = 3) -> list[float]:
    """Seconds of each of ``repeat`` calls of ``call``, each between two CUDA events on the
    current stream, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        stop.record()
        stop.synchronize()
        out.append(start.elapsed_time(stop) * 1e-3)
    return out


def per_call(torch, call, calls: int, repeat: int = 10) -> tuple[list[float], list[float]]:
    """Seconds per call of ``call``, ``repeat`` times each: ``calls`` calls issued eagerly
    back to back between two CUDA events, then the same ``calls`` calls captured once in a
    CUDA graph and replayed (warmed up on a side stream, as capture requires, and replayed
    once untimed)."""
    eager = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            call()
        stop.record()
        stop.synchronize()
        eager.append(start.elapsed_time(stop) * 1e-3 / calls)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    replay = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        replay.append(start.elapsed_time(stop) * 1e-3 / calls)
    return eager, replay


def profiled(torch, call, calls: int, gpu: bool = True):
    """torch's profiler over ``calls`` calls of ``call`` after 3 warm-up calls: its
    ``key_averages()``, one entry per kernel (per op's CPU self time with ``gpu`` False, a
    check of a script on a machine without one)."""
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if gpu else (lambda: None)
    for _ in range(3):
        call()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
        sync()
    return prof.key_averages()


def kernel_seconds(torch, call, calls: int = 10) -> float:
    """Seconds of GPU kernels per call of ``call``: every kernel's device time from torch's
    profiler (:func:`profiled`), summed and divided by ``calls`` — the device's own time,
    without the host's dispatch that an event-timed single call includes."""
    return sum(e.self_device_time_total for e in profiled(torch, call, calls)) * 1e-6 / calls
