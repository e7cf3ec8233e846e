"""Collective data sets: NCCL all-reduce measured on 8x A100 against the system model.

``nccl_allreduce_8xA100_vtrain.csv`` (vTrain's nccl-tests ``all_reduce_perf`` trace, one DGX
A100-class node, float32, 1 MiB..1 GiB in 1 MiB steps) against a ring all-reduce on the
``dgx-a100`` preset's NVSwitch level.  The file's 1024 sizes are evenly spaced, so 99% of them
lie above 10 MiB where any α–β line fits; the data set (and the fit of the NCCL constants in the
preset) uses two sizes per octave instead, 20 rows from 1 MiB to 1 GiB, so small and large
messages weigh alike.

Run ``python -m crossflow.validation.collectives`` to re-fit the constants; it prints them in
the form the preset holds (``intra.collective`` of ``presets/systems/dgx-a100.yaml``).
"""

from __future__ import annotations

import numpy as np

from crossflow.system import all_reduce, build_system
from crossflow.validation import DataSet, Row, measurements_dir, read_measurements

NCCL_FILE = "nccl_allreduce_8xA100_vtrain.csv"
SYSTEM = "dgx-a100"
#: Tolerances (issue #3).
MAX_MAPE, MIN_SPEARMAN = 0.15, 0.9
MiB = 1 << 20
#: Two sizes per octave, 1 MiB .. 1 GiB (every size in the file is a whole number of MiB).
SIZES_MiB: tuple[int, ...] = tuple(sorted(m * 2**k for k in range(11) for m in (1, 3)
                                          if m * 2**k <= 1024))


def nccl_measurements() -> tuple[np.ndarray, np.ndarray, int]:
    """``(bytes, out-of-place seconds, GPUs)`` of the NCCL file at :data:`SIZES_MiB`."""
    header, rows = read_measurements(measurements_dir() / NCCL_FILE)
    by_size = {int(r["size_bytes"]): float(r["oop_time_ns"]) * 1e-9 for r in rows}
    sizes = np.array([s * MiB for s in SIZES_MiB], dtype=float)
    return sizes, np.array([by_size[int(s)] for s in sizes]), 8


def fit_nccl_all_reduce() -> dict[str, float]:
    """Fit the NCCL ring constants of the ``dgx-a100`` intra level to the measurements.

    Model (crossflow.system.collectives): ``t = launch + 2(n-1)(ℓ + α) + 2(n-1)/n · S/(η·B)``
    with the preset's ``launch`` (collective_launch), NVSwitch ``ℓ`` (intra latency) and ``B``
    (intra bandwidth × link efficiency).  ``t`` is linear in ``S``; the intercept and slope are
    fitted by least squares on the *relative* residual (each row weighted by 1/t), then read
    back as ``η`` (``efficiency``) and ``α`` (``step_latency``).
    """
    sizes, times, n = nccl_measurements()
    system = build_system(SYSTEM, num_nodes=1)
    level, launch = system.intra, system.launch_s
    bandwidth = level.bandwidth_Bps * level.efficiency
    x = 2 * (n - 1) / n * sizes
    design = np.stack([np.ones_like(x), x], axis=1) / times[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    steps = 2 * (n - 1)
    return {
        "efficiency": float(1.0 / (slope * bandwidth)),
        "step_latency_s": float((intercept - launch) / steps - level.latency_s),
    }


def nccl_all_reduce() -> DataSet:
    sizes, times, n = nccl_measurements()
    system = build_system(SYSTEM, num_nodes=1)
    group = system.map((n, 1, 1, 1)).group("kp1")
    rows = tuple(Row(f"{int(s) // MiB} MiB x{n}", all_reduce(s, group), t)
                 for s, t in zip(sizes, times, strict=True))
    return DataSet(
        name="collectives: NCCL all-reduce, 8x A100 NVSwitch (vTrain)",
        source=f"{NCCL_FILE} (out-of-place time) on preset {SYSTEM}",
        quantity="time_s",
        rows=rows,
        max_mape=MAX_MAPE,
        min_spearman=MIN_SPEARMAN,
    )


def collective_datasets() -> list[DataSet]:
    return [nccl_all_reduce()]


if __name__ == "__main__":  # pragma: no cover - a maintenance script
    fitted = fit_nccl_all_reduce()
    print(f"# {SYSTEM}.yaml intra.collective, fitted to {NCCL_FILE}:")
    print(f"    efficiency: {fitted['efficiency']:.3f}")
    print(f"    step_latency_us: {fitted['step_latency_s'] * 1e6:.2f}")
    ds = nccl_all_reduce()
    print(ds.render())
