"""Hardware presets: each loads, the GPU ones match hardware.csv, the CPU one matches what was
measured on this project's machine, and ``calibrate_cpu`` writes a loadable preset."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from conftest import assert_numbers_have_sources

import crossflow
from crossflow.calibrate import DRAM_KERNEL
from crossflow.config import load_spec, preset_names

PACKAGE = Path(crossflow.__file__).resolve().parent
MEASUREMENTS = PACKAGE / "presets" / "measurements"
CPU_MEASUREMENTS = MEASUREMENTS / "cpu"

GPUS = {  # preset -> hardware.csv row
    "v100-sxm2-32gb": "V100",
    "a100-sxm4-80gb": "A100",
    "h100-sxm5-80gb": "H100",
    "h200-sxm-141gb": "H200",
}
CPU_PRESET = "cpu-amd-epyc-zen5-2c"
CPU_SLUG = "amd-epyc-zen5_2c"


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(ln for ln in fh if not ln.startswith("#")))


def _header(path: Path) -> str:
    with open(path, encoding="utf-8") as fh:
        return "".join(ln for ln in fh if ln.startswith("#"))


def _lead(text: str) -> float | None:
    """The number a csv cell starts with (``'9.7 (19.5 FP64 tensor)'`` -> 9.7), else None."""
    m = re.match(r"\s*~?([0-9]+(?:\.[0-9]+)?)", text)
    return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def hardware_csv() -> dict[str, dict[str, str]]:
    return {r["gpu"]: r for r in _rows(MEASUREMENTS / "hardware.csv")}


def _arch(name: str):
    return load_spec(name, "hardware").to_microarch()


def _level(arch, name: str):
    return next(m for m in arch.memory if m.name == name)


# --- every preset -----------------------------------------------------------------------------


def test_the_expected_presets_ship():
    assert set(GPUS) | {CPU_PRESET} <= set(preset_names("hardware"))


@pytest.mark.parametrize("name", preset_names("hardware"))
def test_every_hardware_preset_loads(name):
    arch = _arch(name)
    assert arch.name == name
    assert arch.peak_flops and all(v > 0 for v in arch.peak_flops.values())
    assert arch.memory[0].scope == "mcu" and arch.main_memory.scope == "global"
    assert 0 < arch.compute_efficiency <= 1
    capacities = [m.total_capacity_B for m in arch.memory]
    assert capacities[-1] == max(capacities)  # main memory is the biggest


@pytest.mark.parametrize("name", preset_names("hardware"))
def test_every_number_has_a_source_comment(name):
    assert_numbers_have_sources(PACKAGE / "presets" / "hardware" / f"{name}.yaml")


# --- GPUs against hardware.csv ----------------------------------------------------------------


#: L2 sizes measured on the device itself where hardware.csv only assumed one: torch's
#: L2_cache_size on an H200 (the header of gpu/torch_stream_h200-sxm-141gb.csv).
L2_MEASURED = {"h200-sxm-141gb": 60 * 2**20}


@pytest.mark.parametrize("name", GPUS)
def test_gpu_preset_matches_hardware_csv(name, hardware_csv):
    row, arch = hardware_csv[GPUS[name]], _arch(name)
    assert arch.num_bundles == int(row["sm_count"])
    peaks = {
        "fp16": row["peak_fp16_tensor_dense_tflops"],
        "bf16": row["peak_bf16_tensor_dense_tflops"],
        "fp8": row["peak_fp8_tensor_dense_tflops"],
        "tf32": row["peak_tf32_tensor_dense_tflops"],
        "fp32": row["peak_fp32_nontensor_tflops"],
    }
    fp64 = re.search(r"\(([0-9.]+) FP64 tensor\)", row["peak_fp64_tflops"])
    peaks["fp64"] = fp64.group(1) if fp64 else row["peak_fp64_tflops"]
    for precision, cell in peaks.items():
        expected = _lead(cell)
        if expected is None:  # "n/a (no BF16)": the device lacks it, so must the preset
            assert not arch.supports(precision), (name, precision)
        else:
            assert arch.peak_flops[precision] == pytest.approx(expected * 1e12), (name, precision)

    dram = arch.main_memory
    assert dram.bandwidth_Bps == pytest.approx(float(row["hbm_bandwidth_GBps"]) * 1e9)
    sizes = [float(x) for x in re.findall(r"[0-9.]+", row["hbm_capacity_GB"])]
    assert any(dram.capacity_B in (pytest.approx(s * 1e9), pytest.approx(s * 2**30))
               for s in sizes)
    l2 = _level(arch, "L2").capacity_B
    if name in L2_MEASURED:  # the table only assumed its L2; the device reported its own
        assert l2 == L2_MEASURED[name] != pytest.approx(float(row["l2_cache_MB"]) * 1e6)
    else:
        assert l2 == pytest.approx(float(row["l2_cache_MB"]) * 1e6)

    nvlink = arch.links["intra"]
    assert nvlink.bandwidth_Bps == pytest.approx(float(row["nvlink_per_direction_GBps"]) * 1e9)
    assert nvlink.count == int(row["nvlink_gen_links"].split("x")[-1])
    ib = re.search(r"=\s*([0-9.]+)\s*GB/s per GPU per dir", row["typical_internode_per_gpu"])
    assert arch.links["inter"].bandwidth_Bps == pytest.approx(float(ib.group(1)) * 1e9)
    assert arch.tdp_W == _lead(row["tdp_W"])


@pytest.mark.parametrize("name", GPUS)
def test_tensor_core_peak_is_bundles_x_mcus_x_array_x_clock(name):
    """Datasheet peak = SMs x tensor cores x FMA/clk x 2 x clock (hardware.csv 'Derived checks')."""
    a = _arch(name)
    derived = a.num_bundles * a.mcus_per_bundle * a.mcu_rows * a.mcu_cols * 2 * a.frequency_Hz
    assert derived == pytest.approx(a.peak_flops["fp16"], rel=0.01)


@pytest.mark.parametrize("name", GPUS)
def test_precision_peaks_are_ordered(name):
    a = _arch(name)
    p = a.peak_flops
    assert p["fp16"] > p["fp32"]  # tensor cores, never fp32 at the tensor-core rate
    assert a.supports("fp8") == (name.startswith(("h100", "h200")))
    if a.supports("tf32"):
        assert p["fp32"] < p["tf32"] < p["fp16"]
    if a.supports("fp8"):
        assert p["fp8"] == pytest.approx(2 * p["fp16"], rel=1e-3)


@pytest.mark.parametrize("name", GPUS)
def test_gpu_efficiency_is_the_measured_max_matmul_fraction(name, hardware_csv):
    def measured(gpu: str) -> list[tuple[float, str]]:
        cell = hardware_csv[gpu]["measured_max_matmul_tflops"]
        if "same as H100" in cell:
            return measured("H100")
        return [(float(v), p.lower()) for v, p in re.findall(r"([0-9.]+) (BF16|FP16)", cell)]

    a = _arch(name)
    fractions = [v * 1e12 / a.peak_flops[p] for v, p in measured(GPUS[name])]
    if not fractions:
        pytest.skip(f"hardware.csv has no measured matmul for {GPUS[name]} (preset says [assumed])")
    assert a.compute_efficiency == pytest.approx(max(fractions), abs=0.01)


# --- the CPU measurement and preset -------------------------------------------------------------


@pytest.fixture(scope="module")
def gemm_rows() -> list[dict[str, str]]:
    return _rows(CPU_MEASUREMENTS / f"numpy_gemm_{CPU_SLUG}.csv")


@pytest.fixture(scope="module")
def stream_rows() -> list[dict[str, str]]:
    return _rows(CPU_MEASUREMENTS / f"stream_{CPU_SLUG}.csv")


def test_recorded_cpu_gemm_csv(gemm_rows):
    path = CPU_MEASUREMENTS / f"numpy_gemm_{CPU_SLUG}.csv"
    header = _header(path)
    for what in ("command:", "date:", "cpu:", "cores:", "simd flags:", "avx512f", "caches:",
                 "numpy", "BLAS", "timing:", "clock:"):
        assert what in header, what
    assert list(gemm_rows[0]) == ["m", "k", "n", "dtype", "threads", "best_s", "gflops"]
    assert {r["dtype"] for r in gemm_rows} == {"float32", "float64"}
    threads = {int(r["threads"]) for r in gemm_rows}
    assert threads == {1, 2}
    shapes = {(r["m"], r["k"], r["n"]) for r in gemm_rows}
    assert 40 <= len(shapes) <= 60
    # every shape was timed for every dtype and thread count
    assert len(gemm_rows) == len(shapes) * 2 * len(threads)
    for r in gemm_rows:
        flops = 2 * int(r["m"]) * int(r["k"]) * int(r["n"])
        assert float(r["gflops"]) == pytest.approx(flops / float(r["best_s"]) / 1e9, rel=1e-3)


def test_recorded_cpu_stream_csv(stream_rows):
    assert {r["kernel"] for r in stream_rows} == {"copy", "scale", "add", "triad"}
    assert {int(r["threads"]) for r in stream_rows} == {1, 2}
    for r in stream_rows:
        assert int(r["elements"]) * 8 >= 4 * 32 * 2**20  # arrays well beyond the 32 MiB L3
        assert float(r["GBps"]) == pytest.approx(
            int(r["bytes_per_pass"]) / float(r["best_s"]) / 1e9, rel=1e-3)


def test_cpu_preset_fits_are_the_recorded_measurements(gemm_rows, stream_rows):
    """The three fitted constants of the CPU preset are read off the recorded CSVs."""
    a = _arch(CPU_PRESET)
    best32 = max(float(r["gflops"]) for r in gemm_rows
                 if r["dtype"] == "float32" and r["threads"] == "2")
    assert a.compute_efficiency == pytest.approx(best32 * 1e9 / a.peak_flops["fp32"], abs=0.005)
    add = next(float(r["GBps"]) for r in stream_rows
               if r["kernel"] == DRAM_KERNEL and r["threads"] == "2")
    assert a.main_memory.effective_bandwidth_Bps == pytest.approx(add * 1e9, rel=0.01)
    overhead = min(float(r["best_s"]) for r in gemm_rows)
    assert a.kernel_launch_s == pytest.approx(overhead, rel=0.05)
    # 2 cores x 2 pipes x 16 fp32 lanes x 2 FLOP per FMA; fp64 has half the lanes
    assert a.peak_flops["fp32"] == pytest.approx(128 * a.frequency_Hz, rel=1e-3)
    assert a.peak_flops["fp64"] == pytest.approx(a.peak_flops["fp32"] / 2, rel=1e-3)
    assert a.mcu_rows * a.mcu_cols == 16
    # nothing measured may beat the peak
    assert max(float(r["gflops"]) for r in gemm_rows) * 1e9 < a.peak_flops["fp32"]


def test_calibrate_cpu_quick_writes_a_loadable_preset(tmp_path):
    pytest.importorskip("threadpoolctl")
    from crossflow.calibrate import calibrate_cpu

    path = calibrate_cpu(tmp_path / "this-cpu.yaml", quick=True)
    assert path == tmp_path / "this-cpu.yaml"
    # quick is the short schedule (its speed is a benchmark's business, not a test's: a
    # busy CI machine took 19 s where an idle one takes 8)
    assert "(quick measurement)" in path.read_text()
    arch = load_spec(path, "hardware").to_microarch()
    assert arch.name == "this-cpu"
    assert {"fp32", "fp64"} <= set(arch.peak_flops)
    assert 0 < arch.compute_efficiency <= 1
    assert arch.kernel_launch_s > 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert not [f for f in files if f.endswith(".tmp")]  # no temporary left behind
    assert files == ["numpy_gemm_this-cpu.csv", "stream_this-cpu.csv", "this-cpu.yaml"]


def test_calibrate_cpu_into_a_folder_names_the_preset_after_the_machine(tmp_path):
    pytest.importorskip("threadpoolctl")
    from crossflow.calibrate import calibrate_cpu, machine

    path = calibrate_cpu(tmp_path, quick=True)
    assert path == tmp_path / f"{machine().preset_name}.yaml"
    assert load_spec(path, "hardware").to_microarch().num_bundles == machine().cores
