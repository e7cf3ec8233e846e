"""Timing helpers shared by the benchmark scripts (docs/architecture.md, "Benchmarks").

* :func:`timeit` — warm: the median (and 10th / 90th percentile) of ``repeat`` calls after a
  few warm-up calls, measured with ``time.perf_counter`` in this process;
* :func:`cold` — cold: the first call in a fresh Python process (empty caches: presets not
  read, chips not generated, no kernel priced yet), run ``runs`` times; ``import crossflow``
  is timed separately.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def machine() -> str:
    return (f"{platform.processor() or platform.machine()} / Python {platform.python_version()}"
            f" / numpy {np.__version__}")


def _summary(samples_s: list[float]) -> dict[str, float]:
    q = np.percentile(samples_s, [10, 90])
    return {"median_ms": statistics.median(samples_s) * 1e3, "p10_ms": q[0] * 1e3,
            "p90_ms": q[1] * 1e3, "calls": len(samples_s)}


def timeit(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    """Warm timing of ``fn()``: ``max(3, repeat // 20)`` untimed calls, then ``repeat``."""
    for _ in range(max(3, repeat // 20)):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return _summary(samples)


_COLD = """\
import json, time
t0 = time.perf_counter()
import crossflow
t1 = time.perf_counter()
{stmt}
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "first_call_s": t2 - t1}}))
"""


def cold(stmt: str, runs: int) -> dict[str, float]:
    """Cold timing of ``stmt`` (Python source using ``crossflow``): each run is a fresh
    interpreter that imports crossflow (timed apart) and then runs ``stmt`` once."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    first, imports = [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", _COLD.format(stmt=stmt)], env=env,
                             cwd=REPO, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        first.append(row["first_call_s"])
        imports.append(row["import_s"])
    return {**_summary(first), "import_crossflow_median_ms": statistics.median(imports) * 1e3}
