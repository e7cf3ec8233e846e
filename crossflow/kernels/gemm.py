"""GEMM on one device: a hierarchical roofline with a tiling search (paper §6.1–6.3).

C[m, n] = A[m, k] · B[k, n].  Every on-chip memory level ``i`` holds a tile
``(tm, tk, tn)`` of the problem and walks it in one of three loop orders (dataflows):

* ``os`` output-stationary: the C tile stays (accumulating in registers), A and B stream;
* ``ws`` weight-stationary: a B tile stays, A streams, partial C tiles are re-read;
* ``as`` activation-stationary: an A tile stays, B streams, partial C tiles are re-read.

The tile and order of level ``i`` fix how many bytes cross from level ``i+1`` into it; those
bytes are timed at level ``i+1``'s sustained bandwidth.  The register level also pays the
register accesses of the MCU dataflow (paper eq. 5).  The tile of the outermost
bundle-scope level is the unit of work handed to compute bundles (SMs / cores): the compute
time counts padded tiles and whole waves over the bundles (tile and wave quantisation).

Kernel time = max(compute, every level's bytes / bandwidth + latency, the software profile's
minimum kernel time) + launch overhead.

The search is exhaustive over power-of-two tiles at every level, with the constraint that a
level's tile is no larger than the tile of the level outside it.  It is vectorised: each
level's cost is an array over the (tm, tk, tn) exponent grid, and the nesting constraint is a
running minimum along the three axes, so the joint optimum over all levels costs a few array
passes (min over chains of the max of level costs, by dynamic programming from the inside out).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from crossflow.arch.microarch import ACCUMULATOR_BYTES, BYTES_PER_ELEMENT, MicroArch
from crossflow.errors import ConfigError, InfeasibleDesignError
from crossflow.kernels.residency import home_level
from crossflow.kernels.result import KernelResult

ORDERS = ("ws", "os", "as")
_TIE = 1e-9


def _exponents(dim: int) -> np.ndarray:
    """Tile exponents 0..ceil(log2 dim): tiles 1, 2, 4, … up to the first power ≥ dim."""
    return np.arange(max(0, math.ceil(math.log2(dim))) + 1, dtype=np.float64)


def _running_min(a: np.ndarray) -> np.ndarray:
    """out[i,j,l] = min of a over all [≤i, ≤j, ≤l]: best inner tile no larger than (i,j,l)."""
    out = np.minimum.accumulate(a, axis=0)
    np.minimum.accumulate(out, axis=1, out=out)
    np.minimum.accumulate(out, axis=2, out=out)
    return out


def check_precision(arch: MicroArch, precision: str) -> None:
    if precision not in BYTES_PER_ELEMENT:
        raise ConfigError(
            "unknown precision", key="precision", value=precision,
            allowed=", ".join(BYTES_PER_ELEMENT),
        )
    if not arch.supports(precision):
        raise ConfigError(
            f"{arch.name} has no {precision} arithmetic",
            key="precision",
            value=precision,
            allowed=", ".join(p for p, v in arch.peak_flops.items() if v > 0),
        )


class _Grid:
    """Per-problem arrays over the tile-exponent grid, shared by all levels."""

    def __init__(self, m: int, k: int, n: int) -> None:
        self.m, self.k, self.n = m, k, n
        tm = 2.0 ** _exponents(m)
        tk = 2.0 ** _exponents(k)
        tn = 2.0 ** _exponents(n)
        self.tm, self.tk, self.tn = tm[:, None, None], tk[None, :, None], tn[None, None, :]
        # Tiles are clipped to the problem for capacity; counts use the unclipped tile.
        self.cm = np.minimum(self.tm, m)
        self.ck = np.minimum(self.tk, k)
        self.cn = np.minimum(self.tn, n)
        self.nm = np.ceil(m / self.tm)
        self.nk = np.ceil(k / self.tk)
        self.nn = np.ceil(n / self.tn)
        self.shape = (tm.size, tk.size, tn.size)


@lru_cache(maxsize=512)
def _grid(m: int, k: int, n: int) -> _Grid:
    """The tile grid of a problem, shared by every chip it is priced on (a study prices the
    same few shards on thousands of chips; the arrays are read-only)."""
    return _Grid(m, k, n)


@lru_cache(maxsize=512)
def _traffic_terms(m: int, k: int, n: int, b: int, acc: int) -> tuple[np.ndarray, ...]:
    """The chip-independent arrays of :func:`_level_traffic` for one problem: what each
    loop order moves and needs resident per tile, before any capacity is compared.  Cached
    per problem: only the capacity tests and the choice among orders depend on the chip."""
    g = _grid(m, k, n)
    a_el, b_el, c_el = m * k, k * n, m * n
    partial_c = c_el * b + c_el * (2.0 * g.nk - 2.0) * acc  # final write + partial re-reads
    stream_ab = 2.0 * (g.cm * g.ck + g.ck * g.cn) * b  # double-buffered operand tiles
    c_tile = g.cm * g.cn * acc
    os_bytes = (a_el * g.nn + b_el * g.nm) * b + c_el * b
    ws_need = g.ck * g.cn * b + 2.0 * g.cm * g.ck * b + c_tile
    ws_bytes = (a_el * g.nn + b_el) * b + partial_c
    as_need = g.cm * g.ck * b + 2.0 * g.ck * g.cn * b + c_tile
    as_bytes = (a_el + b_el * g.nm) * b + partial_c
    out = (stream_ab, c_tile, os_bytes, ws_need, ws_bytes, as_need, as_bytes)
    for array in out:
        array.flags.writeable = False
    return out


def _level_traffic(
    g: _Grid, b: int, acc: int, capacity_B: float, reg_capacity_B: float, acc_fraction: float,
    allowed: tuple[str, ...],
) -> tuple[np.ndarray, tuple[tuple[int, np.ndarray], ...]]:
    """Bytes crossing into a level for each tile (min over loop orders), and each allowed
    order's own (its index in :data:`ORDERS`, its bytes; inf where its tiles do not fit).

    ``reg_capacity_B`` is the register capacity inside one instance of this level's scope,
    where an output-stationary tile accumulates (None-like 0 means: this *is* the register
    level, so the output tile must fit in the level itself).
    """
    stream_ab, c_tile, os_raw, ws_need, ws_raw, as_need, as_raw = _traffic_terms(
        g.m, g.k, g.n, b, acc)
    inf = np.inf
    by_order = []
    for i, name in enumerate(ORDERS):
        if name not in allowed:
            continue
        if name == "ws":
            traffic = np.where(ws_need <= capacity_B, ws_raw, inf)
        elif name == "as":
            traffic = np.where(as_need <= capacity_B, as_raw, inf)
        elif reg_capacity_B > 0:  # os: accumulators in the registers under this level
            traffic = np.where((stream_ab <= capacity_B)
                               & (c_tile <= acc_fraction * reg_capacity_B), os_raw, inf)
        else:  # os at the register level: it holds accumulators and operand fragments
            traffic = np.where((c_tile <= acc_fraction * capacity_B)
                               & (stream_ab <= (1.0 - acc_fraction) * capacity_B), os_raw, inf)
        by_order.append((i, traffic))
    if not by_order:  # no loop order allowed: no tile fits
        return np.full(g.shape, inf), ()
    # full shape: the *_need arrays span all three axes.  Which order moves the least is
    # asked only of the tile chosen (:func:`_order_of`), not of every tile.
    best = by_order[0][1]
    for _, traffic in by_order[1:]:
        best = np.minimum(best, traffic)
    return best, tuple(by_order)


def _order_of(by_order: tuple[tuple[int, np.ndarray], ...], idx: tuple[int, int, int]) -> str:
    """The loop order of least traffic at tile ``idx``: the first in :data:`ORDERS` of
    those that tie (as np.argmin over the orders would pick)."""
    least = min(traffic[idx] for _, traffic in by_order)
    return ORDERS[next(i for i, traffic in by_order if traffic[idx] == least)]


def _register_accesses(
    arch: MicroArch, g: _Grid, flops: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Register accesses (elements), dataflow and reuse factor per MCU tile (paper eq. 5).

    Cached per problem and MCU array shape (integer quantities that most chips of a study
    share), see :func:`_register_accesses_of`."""
    return _register_accesses_of(g.m, g.k, g.n, arch.mcu_rows, arch.mcu_cols, arch.dataflow,
                                 flops)


@lru_cache(maxsize=512)
def _register_accesses_of(m: int, k: int, n: int, mcu_rows: int, mcu_cols: int,
                          dataflow: str, flops: float
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_register_accesses` of a problem on an MCU array of ``mcu_rows x mcu_cols``.

    The reuse factor K is how often an element held in the MCU array is used before the
    array fetches a new one: the tile extent along the streamed loop over the array extent
    (ws: rows of A streaming past a stationary B block; os: the k depth accumulated in place;
    as: columns of B streaming past a stationary A block).
    """
    g = _grid(m, k, n)
    nx, ny = float(mcu_rows), float(mcu_cols)
    reuse = {
        "ws": np.maximum(g.cm / nx, 1.0),
        "os": np.maximum(g.ck / nx, 1.0),
        "as": np.maximum(g.cn / ny, 1.0),
    }
    flows = ORDERS if dataflow == "best" else (dataflow,)
    factors = np.stack(np.broadcast_arrays(*(reuse[f] for f in flows)))
    per = flops * (nx * ny + factors * nx + factors * ny) / (2.0 * factors * nx * ny)
    idx = np.argmin(per, axis=0)
    pick = idx[None]
    # each over the whole tile grid (one dataflow alone leaves the axes it does not vary
    # on at 1), so that a chosen tile indexes it directly
    out = tuple(np.array(np.broadcast_to(a, g.shape)) for a in (
        np.take_along_axis(per, pick, axis=0)[0], np.array(flows)[idx],
        np.take_along_axis(factors, pick, axis=0)[0]))
    for array in out:
        array.flags.writeable = False
    return out


def _compute_time(arch: MicroArch, g: _Grid, per_bundle: float, fill_s: float) -> np.ndarray:
    """Arithmetic time when work tiles (tm, tk, tn) are dealt to the bundles in waves.

    A tile narrower than the MCU array is padded to it; a tile too small to give every MCU
    of the bundle one array-sized block leaves MCUs idle (occupancy < 1).  Each wave also
    pays ``fill_s``: its tiles' first operands arrive one memory latency after they are
    asked for, and nothing overlaps that wait (the pipeline prologue of a GEMM kernel).
    """
    pm = np.maximum(g.tm, arch.mcu_rows)
    pn = np.maximum(g.tn, arch.mcu_cols)
    blocks = (pm / arch.mcu_rows) * (pn / arch.mcu_cols)
    occupancy = np.minimum(1.0, blocks / arch.mcus_per_bundle)
    waves = np.ceil(g.nm * g.nn / arch.num_bundles)
    return waves * ((2.0 * pm * pn * g.nk * g.tk) / (per_bundle * occupancy) + fill_s)


def gemm(
    arch: MicroArch, m: int, k: int, n: int, precision: str = "fp16", count: int = 1,
    *, warm: bool = True,
) -> KernelResult:
    """Predict one GEMM (repeated ``count`` times) on ``arch``.

    ``warm``: operands that fit a chip-global cache are read from it (a kernel that follows
    the one that wrote them); ``False``: from main memory (the weights of a model whose
    working set is larger than the cache, which every other layer's weights have evicted).

    C = A·B can equally run as Cᵀ = Bᵀ·Aᵀ (a library swaps the operands; the work and the
    data are the same).  When the MCU array is not square and a side of C is narrower than
    the array, the two orientations pad differently (a 16-lane vector unit runs a GEMV along
    its long side), so both are searched and the faster is kept.
    """
    check_precision(arch, precision)
    if min(m, k, n) < 1 or count < 1:
        raise ConfigError("GEMM dimensions and count must be ≥ 1", value=(m, k, n, count))
    result = _gemm(arch, m, k, n, precision, count, warm)
    if arch.mcu_rows != arch.mcu_cols and (m < arch.mcu_rows or n < arch.mcu_cols):
        swapped = _gemm(arch, n, k, m, precision, count, warm)
        if swapped.time_s < result.time_s:
            return swapped
    return result


def _gemm(arch: MicroArch, m: int, k: int, n: int, precision: str, count: int,
          warm: bool = True) -> KernelResult:
    b, acc = BYTES_PER_ELEMENT[precision], ACCUMULATOR_BYTES[precision]
    # Operands live where the memory-bound ops say data lives between kernels: on chip
    # when the whole problem fits a chip-global level (warm), else in main memory.
    home = home_level(arch, (m * k + k * n + m * n) * b) if warm else arch.main_memory
    levels = arch.memory[: arch.memory.index(home) + 1]
    onchip = levels[:-1]
    g = _grid(m, k, n)
    flops = 2.0 * m * n * k

    # The unit of work dealt to bundles is the tile of the outermost on-chip level that is
    # not chip-global (SM shared memory; a CPU core's L2); without one, the innermost level.
    dist = max((i for i, lv in enumerate(onchip) if lv.scope != "global"), default=0)
    reg = levels[0] if levels[0].scope == "mcu" else None
    # Register capacity inside one instance of a scope, where output-stationary tiles
    # accumulate.  0 for the register level itself (it holds its own accumulators).
    regs_in_scope = {
        "mcu": 0.0,
        "bundle": reg.capacity_B * arch.mcus_per_bundle if reg else 0.0,
        "global": reg.capacity_B * arch.num_mcus if reg else 0.0,
    }
    efficiency = arch.precision_efficiency.get(precision, arch.compute_efficiency)
    per_bundle = arch.peak_flops[precision] * efficiency / arch.num_bundles
    compute = _compute_time(arch, g, per_bundle, levels[-1].latency_s)
    reg_bytes = reg_flow = reg_reuse = None

    traffics, orders, owns, bests = [], [], [], []  # per on-chip level
    for i, level in enumerate(onchip):
        outer = levels[i + 1]
        traffic, by_order = _level_traffic(
            g, b, acc, level.capacity_B, regs_in_scope[level.scope] if i > 0 else 0.0,
            arch.accumulator_fraction, level.loop_orders,
        )
        own = traffic / outer.effective_bandwidth_Bps + outer.latency_s
        cost = own
        if i == 0 and reg is not None:
            reg_el, reg_flow, reg_reuse = _register_accesses(arch, g, flops)
            reg_bytes = reg_el * b
            cost = np.maximum(cost, reg_bytes / level.effective_bandwidth_Bps + level.latency_s)
            # An MCU tile narrower than the MCU array only pads it: not a useful tiling
            # unless the problem itself is that narrow.
            too_small = (g.tm < min(arch.mcu_rows, m)) | (g.tn < min(arch.mcu_cols, n))
            cost = np.where(too_small, np.inf, cost)
        if i == dist:
            cost = np.maximum(cost, compute)
        bests.append(cost if not bests else np.maximum(cost, _running_min(bests[-1])))
        traffics.append(traffic)  # full shape, as _level_traffic returns it
        orders.append(by_order)  # each allowed loop order's traffic, asked at one tile
        owns.append(own)

    total = float(np.min(bests[-1]))
    if not math.isfinite(total):
        raise InfeasibleDesignError(
            f"no tiling of a {m}x{k}x{n} {precision} GEMM fits {arch.name}'s on-chip memories "
            f"({', '.join(f'{lv.name} {lv.capacity_B:.0f} B' for lv in onchip)})"
        )

    # Walk back out-to-in: choose each level's tile among those within the chosen outer
    # tile, preferring (among equally fast chains) the one that moves the fewest bytes.
    chosen: list[tuple[int, int, int]] = [(0, 0, 0)] * len(onchip)
    limit = tuple(s - 1 for s in g.shape)
    for i in range(len(onchip) - 1, -1, -1):
        box = (slice(limit[0] + 1), slice(limit[1] + 1), slice(limit[2] + 1))
        sub = bests[i][box]
        pick = np.where(sub <= float(np.min(sub)) * (1 + _TIE), owns[i][box], np.inf)
        chosen[i] = limit = tuple(int(x) for x in np.unravel_index(int(np.argmin(pick)), sub.shape))

    # Report the chosen chain: bytes per level, tiles, orders, waves.
    bytes_per_level = {lv.name: 0.0 for lv in arch.memory}
    tiles, loop_orders = {}, {}
    for i, idx in enumerate(chosen):
        bytes_per_level[levels[i + 1].name] += float(traffics[i][idx])
        tiles[onchip[i].name] = [int(min(g.tm[idx[0], 0, 0], m)), int(min(g.tk[0, idx[1], 0], k)),
                                 int(min(g.tn[0, 0, idx[2]], n))]
        loop_orders[onchip[i].name] = _order_of(orders[i], idx)
    detail: dict[str, object] = {"tiles_mkn": tiles, "loop_orders": loop_orders}
    if reg_bytes is not None:
        idx = chosen[0]
        bytes_per_level[levels[0].name] += float(reg_bytes[idx])
        detail["mcu_dataflow"] = str(reg_flow[idx])
        detail["register_reuse_factor"] = float(reg_reuse[idx])
    idx = chosen[dist]
    work_tiles = int(g.nm[idx[0], 0, 0] * g.nn[0, 0, idx[2]])
    waves = math.ceil(work_tiles / arch.num_bundles)
    compute_s = float(compute[idx])
    detail.update(work_tiles=work_tiles, waves=waves, bundles=arch.num_bundles,
                  wave_efficiency=work_tiles / (waves * arch.num_bundles))

    time_per_level = {
        lv.name: bytes_per_level[lv.name] / lv.effective_bandwidth_Bps + lv.latency_s
        if bytes_per_level[lv.name] > 0 else 0.0
        for lv in arch.memory
    }
    candidates = {"compute": compute_s, **time_per_level}
    launch = arch.kernel_launch_s
    one = max(total, compute_s, arch.kernel_min_s) + launch
    energy = flops * arch.energy_J_per_flop.get(precision, 0.0) + sum(
        bytes_per_level[lv.name] * lv.energy_J_per_B for lv in levels
    )
    return KernelResult(
        name="gemm",
        time_s=one * count,
        flops=flops * count,
        compute_time_s=compute_s * count,
        bytes_per_level={name: v * count for name, v in bytes_per_level.items()},
        time_per_level_s={name: v * count for name, v in time_per_level.items()},
        bottleneck=max(candidates, key=candidates.get),
        launch_s=launch * count,
        energy_J=energy * count,
        detail={"m": m, "k": k, "n": n, "precision": precision, "count": count, **detail},
    )
