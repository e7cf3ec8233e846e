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

import copy
import sys

import numpy as np

from crossflow.config.loader import load_spec
from crossflow.config.system import SystemSpec
from crossflow.system import all_reduce, build_system, send_recv
from crossflow.validation.dataset import DataSet, Row, measurements_dir, read_measurements
from crossflow.validation.fitting import logistic, logit, nelder_mead

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
    return [nccl_all_reduce(), *vidur_datasets()]


def _main() -> None:  # pragma: no cover - a maintenance script
    if len(sys.argv) > 1 and sys.argv[1] == "vidur":
        held_out = "--held-out" in sys.argv
        for gpu in [a for a in sys.argv[2:] if not a.startswith("--")] or VIDUR:
            _print_vidur_fit(gpu, "pow2" if held_out else "all")
        return
    fitted = fit_nccl_all_reduce()
    print(f"# {SYSTEM}.yaml intra.collective, fitted to {NCCL_FILE}:")
    print(f"    efficiency: {fitted['efficiency']:.3f}")
    print(f"    step_latency_us: {fitted['step_latency_s'] * 1e6:.2f}")
    ds = nccl_all_reduce()
    print(ds.render())


# --- Vidur: NCCL all-reduce and send/recv from 2 KiB to 64 MiB, every rank count ---------------

#: The Vidur profiling files and the system preset that describes the machine each was taken on.
VIDUR = {
    "a100": ("vidur_all_reduce_a100_dgx.csv", "vidur_send_recv_a100_dgx.csv", "vidur-a100-dgx"),
    "h100": ("vidur_all_reduce_h100_dgx.csv", "vidur_send_recv_h100_dgx.csv", "vidur-h100-dgx"),
}
#: Tolerance (issue #12): every size 2 KiB..64 MiB, every rank count.
VIDUR_MAX_MAPE, VIDUR_MIN_SPEARMAN = 0.15, 0.9
#: The A100 all-reduce rows inside a node and across nodes are separate data sets (the
#: inter-node rows need NCCL's tree, its tuner and the node's NICs: docs/software-stack.md),
#: each within the same tolerance.


def vidur_rows(path_name: str) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """``(ranks, ranks per node) -> (bytes, median seconds)`` of one Vidur network file."""
    _, rows = read_measurements(measurements_dir() / path_name)
    out: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in rows:
        key = (int(r["num_workers"]), int(r["devices_per_node"]))
        out.setdefault(key, []).append((float(r["size_bytes"]), float(r["median_ms"]) * 1e-3))
    return {k: (np.array([s for s, _ in v]), np.array([t for _, t in v]))
            for k, v in sorted(out.items())}


def _placed(spec, ranks: int, per_node: int):
    """The system with ``per_node`` devices in each of ``ranks / per_node`` nodes: Vidur ran
    each rank count on that many GPUs of that many DGX nodes.  Where the preset's inter level
    gives the node's NICs (``nics``), the GPUs used reach the rails of their own NICs,
    ``ceil(per_node · nics / devices_per_node)`` of them, up to the node's ``nic_limit``;
    otherwise the node's whole capacity is shared by the GPUs used."""
    data = spec.model_dump()
    data.update(devices_per_node=per_node, num_nodes=max(1, ranks // per_node))
    inter = data.get("inter")
    if inter and inter.get("bandwidth_Bps"):
        node_Bps = inter["bandwidth_Bps"] * spec.devices_per_node
        if inter.get("nics"):
            rails = -(-per_node * inter["nics"] // spec.devices_per_node)
            node_Bps *= min(rails, inter.get("nic_limit") or rails) / inter["nics"]
            inter.update(nics=None, nic_limit=None)
        inter["bandwidth_Bps"] = node_Bps / per_node
    if per_node == 1:
        data["intra"] = None
    return build_system(SystemSpec.model_validate(data))


def vidur_predict(spec, kind: str, ranks: int, per_node: int, sizes):
    """Predicted seconds of one Vidur group (``kind``: all_reduce | send_recv) at ``sizes``."""
    system = _placed(spec, ranks, per_node)
    if kind == "all_reduce":
        return system.map((ranks, 1, 1, 1)).all_reduce("kp1", sizes)
    return send_recv(sizes, system.map((1, 1, 1, ranks)).group("lp"))


def vidur_collective(gpu: str, kind: str, spec=None, where: str = "all") -> DataSet:
    """One Vidur file against ``vidur-<gpu>-dgx``; ``where``: all | intra | inter rows
    (groups inside one node, or across nodes)."""
    ar_file, sr_file, system = VIDUR[gpu]
    path_name = ar_file if kind == "all_reduce" else sr_file
    spec = spec or load_spec(system, "systems")
    rows = []
    for (n, g), (sizes, times) in vidur_rows(path_name).items():
        if where != "all" and (n > g) != (where == "inter"):
            continue
        predicted = vidur_predict(spec, kind, n, g, sizes)
        rows += [Row(f"{int(s)} B x{n} ({g}/node)", float(p), float(t))
                 for s, p, t in zip(sizes, predicted, times, strict=True)]
    scope = {"all": "", "intra": ", inside a node", "inter": ", across nodes"}[where]
    return DataSet(
        name=f"collectives: NCCL {kind.replace('_', '-')}, {gpu.upper()} DGX{scope}, "
             "2 KiB-64 MiB (Vidur)",
        source=f"{path_name} (median kernel time) on preset {system}",
        quantity="time_s", rows=tuple(rows),
        max_mape=VIDUR_MAX_MAPE,
        min_spearman=VIDUR_MIN_SPEARMAN)


def vidur_datasets() -> list[DataSet]:
    return [vidur_collective("a100", "all_reduce", where="intra"),
            vidur_collective("a100", "all_reduce", where="inter"),
            vidur_collective("a100", "send_recv"),
            vidur_collective("h100", "all_reduce"),
            vidur_collective("h100", "send_recv")]


#: The constants the Vidur fit sets: (YAML path, scale: 'log' for positive, 'frac' for (0, 1]).
VIDUR_PARAMS = (
    ("collective_launch_s", "log"), ("p2p_launch_s", "log"),
    ("intra.collective.efficiency", "frac"), ("intra.collective.step_latency_s", "log"),
    ("intra.collective.low_latency.step_latency_s", "log"),
    ("intra.collective.low_latency.efficiency", "frac"),
    ("inter.collective.efficiency", "frac"), ("inter.collective.step_latency_s", "log"),
    ("inter.collective.low_latency.step_latency_s", "log"),
    ("inter.collective.low_latency.efficiency", "frac"),
    ("inter.nic_limit", "log"), ("intra.collective.p2p_efficiency", "frac"), ("inter.collective.p2p_efficiency", "frac"),
    ("inter.collective.tree.efficiency", "frac"), ("inter.collective.tree.step_latency_s", "log"),
    ("inter.collective.tree.tuner_ring_busbw_Bps", "log"),
    ("inter.collective.tree.tuner_tree_busbw_Bps", "log"),
)


def _get(data: dict, path: str):
    for part in path.split("."):
        data = data[part]
    return data


def _set(data: dict, path: str, value: float) -> None:
    *head, last = path.split(".")
    for part in head:
        data = data[part]
    data[last] = value


def power_of_two_rows(sizes: np.ndarray) -> np.ndarray:
    """Mask of the rows nearest each power of two (2 KiB .. 64 MiB) among ``sizes``: Vidur's
    sizes are 2 KiB + 8 KiB steps below 1 MiB, so most powers of two below it are not rows."""
    mask = np.zeros(sizes.shape, bool)
    for k in range(11, 27):
        mask[int(np.argmin(np.abs(np.log(sizes / 2.0**k))))] = True
    return mask


def fit_vidur_collectives(gpu: str, rows: str = "all") -> dict[str, float]:
    """Fit the network constants of ``vidur-<gpu>-dgx`` to its all-reduce and send/recv files.

    The model is the system's (crossflow.system.collectives: ring / two-level all-reduce,
    NCCL's tree and its tuner's choice across nodes, send/recv, Simple and LL protocols,
    launch costs); the loss is the mean absolute log error over the rows (every row, or with
    ``rows="pow2"`` only those of :func:`power_of_two_rows`, to check the others held out),
    minimised by Nelder–Mead over the constants in :data:`VIDUR_PARAMS` (positive ones on a
    log scale, fractions through a logistic), from the preset's values.  Levels the data does
    not reach (no inter-node rows on H100) and constants the preset does not declare keep
    their preset values.
    """
    ar_file, sr_file, system = VIDUR[gpu]
    base = load_spec(system, "systems").model_dump()
    groups = [("all_reduce", k, v) for k, v in vidur_rows(ar_file).items()] + [
        ("send_recv", k, v) for k, v in vidur_rows(sr_file).items()]
    if rows == "pow2":
        groups = [(kind, key, (s[m], t[m])) for kind, key, (s, t) in groups
                  for m in [power_of_two_rows(s)]]
    inter_used = any(n > g for _, (n, g), _ in groups)
    params = [(p, sc) for p, sc in VIDUR_PARAMS if inter_used or not p.startswith("inter.")]

    params = [(p, sc) for p, sc in params
              if not p.endswith((".p2p_efficiency", ".nic_limit")) or _get(base, p) is not None]
    params = [(p, sc) for p, sc in params
              if all(f".{part}." not in p or _get(base, p.split(f".{part}.")[0] + f".{part}")
                     is not None for part in ("low_latency", "tree"))]

    def decode(x):
        data = copy.deepcopy(base)
        for (path, scale), v in zip(params, x, strict=True):
            _set(data, path, float(np.exp(v)) if scale == "log" else logistic(v))
        return data

    def loss(x) -> float:
        spec = SystemSpec.model_validate(decode(x))
        total, count = 0.0, 0
        for kind, (n, g), (sizes, times) in groups:
            r = np.log(vidur_predict(spec, kind, n, g, sizes) / times)
            total += float(np.sum(np.abs(r)))
            count += r.size
        return total / count

    x0 = [np.log(max(_get(base, p), 1e-7)) if sc == "log" else logit(min(_get(base, p), 0.99))
          for p, sc in params]
    best = nelder_mead(loss, x0, iterations=1500)
    fitted = decode(best)
    return {p: float(_get(fitted, p)) for p, _ in params}


def _print_vidur_fit(gpu: str, rows: str = "all") -> None:  # pragma: no cover - a script
    """Fit and print the constants in the preset's units and the MAPE they give; with
    ``rows="pow2"`` (``--held-out``), fitted on :func:`power_of_two_rows` only, the MAPE of the
    fitted and of the held-out rows apart."""
    fitted = fit_vidur_collectives(gpu, rows)
    what = "the rows nearest each power of two of" if rows == "pow2" else "every row of"
    print(f"# {VIDUR[gpu][2]}.yaml, fitted to {what} {VIDUR[gpu][0]} and {VIDUR[gpu][1]}:")
    data = load_spec(VIDUR[gpu][2], "systems").model_dump()
    for path, value in fitted.items():
        _set(data, path, value)
        if path.endswith("_s"):
            print(f"    {path.removesuffix('_s')}_us: {value * 1e6:.3f}")
        elif path.endswith("_Bps"):
            print(f"    {path.removesuffix('_Bps')}_GBps: {value / 1e9:.2f}")
        else:
            print(f"    {path}: {value:.3f}")
    spec = SystemSpec.model_validate(data)
    for kind in ("all_reduce", "send_recv"):
        for where in ("intra", "inter"):
            ds = vidur_collective(gpu, kind, spec, where)
            if not ds.rows:
                continue
            line = f"#   {ds.name}: MAPE {ds.mape * 100:.1f}%, Spearman {ds.spearman:.3f}"
            if rows == "pow2":
                err = np.array([abs(r.error) for r in ds.rows])
                sizes = np.array([float(r.label.split()[0]) for r in ds.rows])
                grid = np.unique(sizes)  # every group of a file has the same sizes
                fit = np.isin(sizes, grid[power_of_two_rows(grid)])
                line += (f"; fitted rows {err[fit].mean() * 100:.1f}%, held-out rows "
                         f"{err[~fit].mean() * 100:.1f}%")
            print(line)


if __name__ == "__main__":  # pragma: no cover
    _main()
