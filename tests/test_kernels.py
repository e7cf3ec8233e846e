"""Kernel model: roofline sanity, quantisation effects and monotonicity properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossflow.arch.microarch import BYTES_PER_ELEMENT
from crossflow.errors import ConfigError
from crossflow.kernels import ops
from crossflow.kernels.gemm import gemm
from crossflow.kernels.residency import home_level
from crossflow.predict import load_hardware

dims = st.integers(min_value=1, max_value=20000)
PRESETS = ["a100-sxm4-80gb", "v100-sxm2-32gb", "h100-sxm5-80gb", "h200-sxm-141gb"]


def _scaled(arch, level_index=None, bandwidth=1.0, flops=1.0):
    memory = list(arch.memory)
    if level_index is not None:
        lv = memory[level_index]
        memory[level_index] = replace(lv, bandwidth_Bps=lv.bandwidth_Bps * bandwidth)
    return replace(arch, memory=tuple(memory),
                   peak_flops={p: v * flops for p, v in arch.peak_flops.items()})


@settings(max_examples=60, deadline=None)
@given(m=dims, k=dims, n=dims, precision=st.sampled_from(["fp16", "fp32", "tf32", "bf16"]))
def test_roofline_bounds_hold(a100, m, k, n, precision):
    r = gemm(a100, m, k, n, precision)
    assert r.time_s >= r.flops / a100.peak_flops[precision]
    dram = a100.main_memory
    assert r.time_s >= r.bytes_per_level[dram.name] / dram.bandwidth_Bps
    b = BYTES_PER_ELEMENT[precision]
    compulsory = (m * k + k * n + m * n) * b
    home = home_level(a100, compulsory)  # operands live in L2 when all of them fit
    assert r.bytes_per_level[home.name] >= compulsory * (1 - 1e-12)
    outer = a100.memory[a100.memory.index(home) + 1:]
    assert all(r.bytes_per_level[lv.name] == 0 for lv in outer)
    assert r.time_s >= a100.kernel_launch_s


@pytest.mark.parametrize("preset", PRESETS)
def test_fp32_is_slower_than_fp16_on_tensor_core_gpus(preset):
    arch = load_hardware(preset)
    fp16 = gemm(arch, 4096, 4096, 4096, "fp16").time_s
    fp32 = gemm(arch, 4096, 4096, 4096, "fp32").time_s
    assert fp32 > 4 * fp16  # CUDA-core fp32 is 8-16x below the tensor-core fp16 peak


def test_a_hardware_files_fp8_efficiency_prices_fp8_matmuls_alone():
    h200 = load_hardware("h200-sxm-141gb")
    fp8 = h200.precision_efficiency["fp8"]
    assert fp8 < h200.compute_efficiency  # measured: Hopper's fp8 matmuls reach less of peak
    as_bf16 = replace(h200, precision_efficiency={})
    shape = (16384, 16384, 16384)  # compute-bound in both precisions
    assert gemm(h200, *shape, "fp8").compute_time_s == pytest.approx(
        gemm(as_bf16, *shape, "fp8").compute_time_s * h200.compute_efficiency / fp8, rel=1e-3)
    assert gemm(h200, *shape, "bf16").time_s == gemm(as_bf16, *shape, "bf16").time_s


def test_a_software_profile_replaces_the_devices_fp8_efficiency():
    from crossflow.config.loader import load_spec
    from crossflow.distributed import with_software

    software = load_spec("dgx-h100-megatron-core", "systems").software
    driven = with_software(load_hardware("h100-sxm5-80gb"), software)
    e = software.fp8_gemm_efficiency
    # NVFP4 GEMMs take the FP8 ones' share of their peak unless the profile says otherwise
    assert driven.precision_efficiency == {"fp8": e, "fp4": e}
    own = software.model_copy(update={"fp4_gemm_efficiency": 0.4})
    assert with_software(load_hardware("gb200-186gb"), own).precision_efficiency == {
        "fp8": e, "fp4": 0.4}


def test_unsupported_precision_is_a_config_error(a100):
    with pytest.raises(ConfigError, match="has no fp8 arithmetic"):
        gemm(a100, 128, 128, 128, "fp8")


def test_wave_quantisation_makes_one_more_tile_cost_a_wave(a100):
    # One extra row beyond a whole number of waves costs a partial wave of tiles.
    exact = gemm(a100, 2048, 12288, 12288, "fp16")
    plus = gemm(a100, 2049, 12288, 12288, "fp16")
    assert plus.time_s > exact.time_s * 1.01
    assert 0 < exact.detail["wave_efficiency"] <= 1


def test_small_m_is_memory_bound_large_m_compute_bound(a100):
    assert gemm(a100, 64, 12288, 12288, "fp16").bottleneck == "DRAM"
    assert gemm(a100, 16384, 12288, 12288, "fp16").bottleneck == "compute"


def test_cpu_gemv_runs_along_the_vector_units_long_side():
    cpu = load_hardware("cpu-amd-epyc-zen5-2c")  # MCU = one 1x16-lane FMA pipe
    assert gemm(cpu, 2048, 2048, 1, "fp32").time_s == pytest.approx(
        gemm(cpu, 1, 2048, 2048, "fp32").time_s)


def test_output_write_back_is_counted(a100):
    # k = 1: an outer product whose cost is almost all the output write.
    r = gemm(a100, 8192, 1, 8192, "fp16")
    assert r.bytes_per_level["DRAM"] >= 8192 * 8192 * 2


def test_register_accesses_follow_eq5(a100):
    r = gemm(a100, 4096, 4096, 4096, "fp16")
    reuse = r.detail["register_reuse_factor"]
    nx, ny = a100.mcu_rows, a100.mcu_cols
    expected = r.flops * (nx * ny + reuse * nx + reuse * ny) / (2 * reuse * nx * ny) * 2
    assert r.bytes_per_level["registers"] == pytest.approx(expected)


def test_count_repeats_the_kernel(a100):
    one = gemm(a100, 1024, 1024, 1024, "fp16")
    three = gemm(a100, 1024, 1024, 1024, "fp16", count=3)
    assert three.time_s == pytest.approx(3 * one.time_s)
    assert three.flops == pytest.approx(3 * one.flops)


@settings(max_examples=40, deadline=None)
@given(m=dims, k=dims, n=dims, level=st.integers(0, 3),
       factor=st.floats(min_value=1.0, max_value=8.0))
def test_more_bandwidth_is_never_slower(a100, m, k, n, level, factor):
    base = gemm(a100, m, k, n, "fp16").time_s
    faster = gemm(_scaled(a100, level, bandwidth=factor), m, k, n, "fp16").time_s
    assert faster <= base * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(m=dims, k=dims, n=dims, factor=st.floats(min_value=1.0, max_value=8.0))
def test_more_flops_is_never_slower(a100, m, k, n, factor):
    base = gemm(a100, m, k, n, "fp16").time_s
    assert gemm(_scaled(a100, flops=factor), m, k, n, "fp16").time_s <= base * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(m=dims, k=dims, n=dims, extra=st.integers(1, 4096), axis=st.integers(0, 2))
def test_a_bigger_gemm_is_never_faster(a100, m, k, n, extra, axis):
    shape = [m, k, n]
    bigger = list(shape)
    bigger[axis] += extra
    assert gemm(a100, *bigger, "fp16").time_s >= gemm(a100, *shape, "fp16").time_s * (1 - 1e-12)


@pytest.mark.parametrize("op", ["elementwise", "softmax", "layernorm", "embedding"])
def test_memory_bound_ops_run_at_dram_not_register_bandwidth(a100, op):
    rows, cols = 16384, 12288  # 400 MB in fp16: lives in DRAM
    r = {
        "elementwise": lambda: ops.elementwise(a100, rows * cols, "fp16", inputs=2),
        "softmax": lambda: ops.softmax(a100, rows, cols, "fp16"),
        "layernorm": lambda: ops.layernorm(a100, rows, cols, "fp16"),
        "embedding": lambda: ops.embedding(a100, rows, cols, "fp16"),
    }[op]()
    assert r.detail["home_level"] == "DRAM"
    moved = r.bytes_per_level["DRAM"]
    assert moved >= 2 * rows * cols * 2
    assert r.time_s >= moved / a100.main_memory.bandwidth_Bps


def test_small_working_set_lives_in_l2(a100):
    r = ops.softmax(a100, 1024, 1024, "fp16")  # 4 MB in and out: fits the 40 MB L2
    assert r.detail["home_level"] == "L2"
    big = ops.softmax(a100, 65536, 1024, "fp16")
    assert big.detail["home_level"] == "DRAM"
    per_byte_l2 = r.time_per_level_s["L2"] / r.bytes_per_level["L2"]
    per_byte_dram = big.time_per_level_s["DRAM"] / big.bytes_per_level["DRAM"]
    assert per_byte_dram > per_byte_l2


def test_measured_attention_kernels_reach_more_of_peak_on_longer_rows():
    h200 = load_hardware("h200-sxm-141gb")
    kernel = h200.attention_kernel
    rate = {s: ops.fused_attention(h200, 32, s, 128, 2, 1).flops
            / ops.fused_attention(h200, 32, s, 128, 2, 1).compute_time_s for s in (1024, 32768)}
    assert rate[1024] < rate[32768] < kernel.forward_efficiency * h200.peak_flops["bf16"]
    assert rate[32768] > 0.9 * kernel.forward_efficiency * h200.peak_flops["bf16"]


def test_a_software_profiles_attention_efficiency_replaces_the_devices_kernels():
    h200 = load_hardware("h200-sxm-141gb")
    profiled = replace(h200, attention_efficiency=0.5)
    r = ops.fused_attention(profiled, 32, 4096, 128, 5, 1)
    assert r.compute_time_s == pytest.approx(r.flops / (0.5 * h200.peak_flops["bf16"]))


def test_the_presets_attention_block_is_the_fit_to_its_measurements():
    """The shares and row times are fitted to the 128-wide rows of every H200 attention
    file, 2K to 128K tokens (an extrapolation from 2K-8K alone priced 128K tokens 21 % too
    fast)."""
    from crossflow.validation.attention import _files, fit

    files = [p.name for p in _files("h200-sxm-141gb")]
    assert files == ["torch_attention_h200-sxm-141gb.csv",
                     "torch_attention_head_dims_h200-sxm-141gb.csv",
                     "torch_attention_long_h200-sxm-141gb.csv"]
    fitted = fit()
    kernel = load_hardware("h200-sxm-141gb").attention_kernel
    assert fitted["forward_efficiency"] == pytest.approx(kernel.forward_efficiency, abs=5e-4)
    assert fitted["backward_efficiency"] == pytest.approx(kernel.backward_efficiency, abs=5e-4)
    assert fitted["forward_row_ns"] * 1e-9 == pytest.approx(kernel.forward_row_s, rel=1e-3)
    assert fitted["backward_row_ns"] * 1e-9 == pytest.approx(kernel.backward_row_s, rel=1e-3)


def test_the_presets_head_dimension_table_is_the_fit_to_its_measurements():
    from crossflow.validation.attention import REFERENCE_HEAD_DIM, fit_head_dims
    from crossflow.validation.dataset import measurements_dir

    fitted = fit_head_dims(
        measurements_dir() / "gpu" / "torch_attention_head_dims_h200-sxm-141gb.csv")
    kernel = load_hardware("h200-sxm-141gb").attention_kernel
    assert [d for d, _, _ in kernel.head_dims] == sorted(fitted) == [64, 96, 128, 192, 256]
    for d, forward, backward in kernel.head_dims:
        assert (forward, backward) == pytest.approx(fitted[d], abs=5e-4)
    assert fitted[REFERENCE_HEAD_DIM] == (1.0, 1.0)
    # the H100 carries the H200's kernels (same die and clocks)
    assert load_hardware("h100-sxm5-80gb").attention_kernel.head_dims == kernel.head_dims


def test_attention_efficiency_follows_the_head_dimension_table():
    """Measured head dimensions take their own multipliers; between two, the multiplier is
    interpolated in log(head dim); beyond the table, the nearest end's; without a table, 1.
    cuDNN's backward at head dimension 192 runs at 0.61 of its 128-wide rate, and the priced
    kernel follows it."""
    h200 = load_hardware("h200-sxm-141gb")
    kernel = h200.attention_kernel
    table = {d: (f, b) for d, f, b in kernel.head_dims}
    assert kernel.head_dim_factor(192, False) == table[192][1] < 0.65
    assert kernel.head_dim_factor(32, True) == table[64][0]
    assert kernel.head_dim_factor(512, False) == table[256][1]
    between = kernel.head_dim_factor(160, False)  # log-midway is ~157
    assert min(table[128][1], table[192][1]) < between < max(table[128][1], table[192][1])
    assert replace(kernel, head_dims=()).head_dim_factor(192, False) == 1.0

    def product_time(arch, d):
        return ops.fused_attention(arch, 16, 8192, d, 5, 1).compute_time_s

    plain = replace(h200, attention_kernel=replace(kernel, head_dims=()))
    rows_s = 16 * 8192 * kernel.backward_row_s
    assert (product_time(h200, 192) - rows_s) == pytest.approx(
        (product_time(plain, 192) - rows_s) / table[192][1])


def test_the_loop_order_reported_is_the_first_of_least_traffic_at_the_chosen_tile():
    """``_order_of`` (the order is found at the chosen tile only): ties go to the first in
    ORDERS, as np.argmin over the orders would; an order whose tiles do not fit (inf) is
    never it; a level allowed one order reports that order."""
    import numpy as np

    from crossflow.kernels.gemm import ORDERS, _order_of

    ws, os_, as_ = (np.full((2, 2, 2), v) for v in (5.0, 5.0, 7.0))
    os_[1, 1, 1], as_[0, 1, 0], ws[0, 0, 1] = 3.0, 1.0, np.inf
    by_order = tuple(zip(range(3), (ws, os_, as_), strict=True))
    assert ORDERS == ("ws", "os", "as")
    assert _order_of(by_order, (0, 0, 0)) == "ws"  # ws and os tie: the first
    assert _order_of(by_order, (1, 1, 1)) == "os"
    assert _order_of(by_order, (0, 1, 0)) == "as"
    assert _order_of(by_order, (0, 0, 1)) == "os"  # ws does not fit there
    assert _order_of(by_order[1:], (0, 0, 0)) == "os"  # ws not allowed


def test_a_level_allowed_one_loop_order_reports_it(a100):
    level = next(lv for lv in a100.memory if lv.name == "L1")
    for order in ("ws", "os", "as"):
        only = replace(a100, memory=tuple(replace(lv, loop_orders=(order,)) if lv is level
                                          else lv for lv in a100.memory))
        r = gemm(only, 4096, 4096, 4096, "fp16")
        assert r.detail["loop_orders"]["L1"] == order
        assert r.time_s >= gemm(a100, 4096, 4096, 4096, "fp16").time_s * (1 - 1e-12)
