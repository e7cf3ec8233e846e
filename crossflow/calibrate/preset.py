"""The ``kind: microarch`` preset written from a measurement (:func:`preset_yaml`)."""

from __future__ import annotations

import math

from crossflow.calibrate.measure import Measurement
from crossflow.calibrate.timing import QUICK_TIMING

#: Bytes per cycle per core each cache level can deliver, as assumed for a CPU that
#: ``calibrate_cpu`` knows nothing more about.  These are AMD Zen 5's figures (Software
#: Optimization Guide for the AMD Zen5 Microarchitecture, pub. 58455 rev 1.00, 2024): L1D two
#: vector loads per cycle, L2 -> L1 64 B/cycle, L3 -> L2 32 B/cycle.
GENERIC_L2_B_PER_CYCLE = 64
GENERIC_L3_B_PER_CYCLE = 32
GENERIC_FMA_PIPES = 2  # two FMA pipes per core: every Intel core since Haswell, AMD since Zen
#: The STREAM kernel whose all-core rate becomes the DRAM bandwidth: ``add`` (c = a + b) moves
#: STREAM triad's three words per element in one ufunc; numpy's triad needs a second pass over
#: a temporary, which costs it ~20% on one core without moving any more DRAM bytes.
DRAM_KERNEL = "add"


def _num(x: float, sig: int = 4) -> str:
    """A YAML float without an exponent (PyYAML reads '1e+04' as a string)."""
    if x == 0:
        return "0"
    decimals = max(0, sig - 1 - int(math.floor(math.log10(abs(x)))))
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _line(text: str, comment: str, width: int = 32) -> str:
    return f"{text:<{width}}# {comment}" if comment else text


def preset_yaml(
    meas: Measurement, gemm_csv: str, stream_csv: str, *,
    fma_pipes: int = GENERIC_FMA_PIPES, name: str | None = None,
) -> str:
    """The ``kind: microarch`` preset text for the measured machine, a comment on every number."""
    m = meas.machine
    f = meas.frequency_Hz
    f_src = ("[measured] all-core sustained clock, dependent-add chain (" + gemm_csv + " header)"
             if meas.clock_all_Hz else "[cpuinfo] 'cpu MHz' (could not measure the clock here)")
    bits = m.fma_datapath_bits
    lanes32, lanes64 = bits // 32, bits // 64
    peak32 = m.cores * fma_pipes * lanes32 * 2 * f
    peak64 = m.cores * fma_pipes * lanes64 * 2 * f
    threads = m.cores
    best32 = meas.best_gflops("float32", threads) * 1e9
    best64 = meas.best_gflops("float64", threads) * 1e9
    eff = min(1.0, best32 / peak32)
    eff_note = (f"[fit] best fp32 GEMM {best32 / 1e9:.1f} GFLOP/s on {threads} threads / peak "
                f"{peak32 / 1e9:.1f} ({gemm_csv}); fp64: {best64 / peak64:.2f}")
    if best32 > peak32:
        eff_note += "; measured exceeds the assumed peak: check fma pipes / vector width"
    l1, l2, l3 = m.cache(1), m.cache(2), m.cache(3)
    vec_B = m.vector_bits // 8
    reg_B = m.vector_registers * vec_B / fma_pipes
    dram = meas.stream_GBps(DRAM_KERNEL, threads)
    dram_1 = meas.stream_GBps(DRAM_KERNEL, 1)
    overhead = meas.call_overhead_s
    out = [
        f"# {m.model_name} ({m.uarch or 'unknown core'}), {m.cores} cores: written by "
        "crossflow.calibrate.calibrate_cpu",
        f"#   on {meas.date} ({'quick' if meas.timing is QUICK_TIMING else 'full'} measurement).",
        "# Sources: [measured]/[fit] the CSVs written beside this file "
        f"({gemm_csv}, {stream_csv});",
        "#   [os] /proc/cpuinfo, /proc/meminfo and /sys/devices/system/cpu (cpuid flags, cache sizes);",
        "#   [assumed] generic x86 figures (crossflow/calibrate/preset.py: two FMA pipes per core, two vector",
        "#   loads per cycle from L1, 64 B/cycle L2 -> L1, 32 B/cycle L3 -> L2 per core; AMD Zen 5 values).",
        "# Fitted constants: compute efficiency, kernel launch, DRAM bandwidth.",
        "kind: microarch",
        f"name: {name or m.preset_name}",
        f"description: {m.model_name} ({m.uarch or 'unknown core'}), {m.cores} cores, numpy BLAS",
        "compute:",
        _line(f"  num_bundles: {m.cores}", "physical cores [os]"),
        _line(f"  mcus_per_bundle: {fma_pipes}", f"{bits}-bit FMA pipes per core [assumed]"),
        _line(f"  mcu_array: [1, {lanes32}]",
              f"one FMA instruction: a broadcast element times a {lanes32}-lane fp32 vector"),
        _line(f"  frequency_GHz: {_num(f / 1e9)}", f_src),
        "  peak_GFLOPS:                  # cores x pipes x lanes x 2 FLOP/FMA x clock",
        _line(f"    fp64: {_num(peak64 / 1e9)}",
              f"{m.cores} x {fma_pipes} x {lanes64} x 2 x {f / 1e9:.3f} GHz"),
        _line(f"    fp32: {_num(peak32 / 1e9)}",
              f"{m.cores} x {fma_pipes} x {lanes32} x 2 x {f / 1e9:.3f} GHz"),
        _line(f"  efficiency: {_num(eff, 3)}", eff_note),
        "  dataflow: best",
        "memory:",
        "  - name: registers",
        "    scope: mcu",
        _line(f"    capacity_B: {_num(reg_B)}",
              f"{m.vector_registers} x {vec_B} B vector registers per core / {fma_pipes} pipes [os]"),
        _line(f"    bandwidth_TBps: {_num(m.cores * fma_pipes * 4 * bits / 8 * f / 1e12)}",
              "3 source operands + 1 result per FMA per pipe per cycle"),
        _line("    loop_orders: [os]",
              "BLAS micro-kernels accumulate the C tile in registers (Goto & van de Geijn 2008)"),
    ]
    if l1:
        out += [
            "  - name: L1d",
            "    scope: bundle",
            _line(f"    capacity_KiB: {_num(l1.size_B / l1.cores_sharing / 2**10)}", "[os]"),
            _line(f"    bandwidth_GBps: {_num(m.cores * 2 * vec_B * f / 1e9)}",
                  f"2 x {vec_B} B loads/cycle/core [assumed] x {m.cores} cores x clock"),
        ]
    if l2:  # a core's share when several cores share one L2 (e.g. Intel E-core clusters)
        share = "" if l2.cores_sharing == 1 else f" (1/{l2.cores_sharing} of a shared L2)"
        out += [
            "  - name: L2",
            "    scope: bundle",
            _line(f"    capacity_KiB: {_num(l2.size_B / l2.cores_sharing / 2**10)}", f"[os]{share}"),
            _line(f"    bandwidth_GBps: {_num(m.cores * GENERIC_L2_B_PER_CYCLE * f / 1e9)}",
                  f"{GENERIC_L2_B_PER_CYCLE} B/cycle/core [assumed] x {m.cores} cores x clock"),
        ]
    if l3:
        out += [
            "  - name: L3",
            "    scope: global",
            _line(f"    capacity_MiB: {_num(l3.size_B * l3.instances / 2**20)}", "[os]"),
            _line(f"    bandwidth_GBps: {_num(m.cores * GENERIC_L3_B_PER_CYCLE * f / 1e9)}",
                  f"{GENERIC_L3_B_PER_CYCLE} B/cycle/core [assumed] x {m.cores} cores x clock"),
        ]
    out += [
        "  - name: DRAM",
        "    scope: global",
        _line(f"    capacity_GiB: {_num(m.mem_total_B / 2**30)}", "MemTotal [os]"),
        _line(f"    bandwidth_GBps: {_num(dram)}",
              f"[fit] STREAM {DRAM_KERNEL} on {threads} threads ({stream_csv}; 1 thread: "
              f"{dram_1:.1f}); sustained, so efficiency 1"),
        _line("    latency_ns: 100", "[ref] DeepFlow DRAM latency (DeepFlow's reference configurations)"),
        _line(f"kernel_launch_us: {_num(overhead * 1e6, 3)}",
              f"[fit] numpy call overhead: the 8x8x8 matmul ({gemm_csv})"),
    ]
    return "\n".join(out) + "\n"

