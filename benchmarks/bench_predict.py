"""Prediction latency benchmarks (docs/architecture.md, "Benchmarks").  Prints one JSON object.

    python benchmarks/bench_predict.py [--repeat N]

Each figure is the median (and the 10th/90th percentile) of N timed calls after warm-up,
measured with time.perf_counter in this process (one Python thread).
"""

from __future__ import annotations

import argparse
import json

from _timing import machine, timeit

import crossflow
from crossflow.kernels.gemm import gemm
from crossflow.predict import load_hardware


def _clear_caches() -> None:
    """Empty the per-process caches a transformer prediction fills (graph, kernel prices,
    GEMM tilings, the software-profile device), so the next prediction is priced afresh."""
    import importlib

    for module, names in (("crossflow.workloads.transformer", ("_build",)),
                          ("crossflow.sim.pricing", ("_price",)),
                          ("crossflow.sim.training", ("_one_block",)),
                          ("crossflow.distributed", ("_device", "_with_attention")),
                          ("crossflow.kernels.gemm", None)):
        mod = importlib.import_module(module)
        for name in names or [n for n in dir(mod) if hasattr(getattr(mod, n), "cache_clear")]:
            fn = getattr(mod, name, None)
            if fn is not None and hasattr(fn, "cache_clear"):
                fn.cache_clear()


def _uncached_transformer() -> None:
    """GPT-3 175B, t8 p8 d24, on dgx-a100 with every model cache emptied first (the presets
    stay loaded): what a new workload or strategy costs."""
    _clear_caches()
    crossflow.predict(workload="gpt3-175b", system="dgx-a100",
                      parallelism="gpt3-175b-t8-p8-d24")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    a100 = load_hardware("a100-sxm4-80gb")
    workload = {"kind": "gemm", "m": 8192, "k": 8192, "n": 8192, "precision": "fp16"}
    results = {
        "machine": machine(),
        "gemm_8192_fp16_a100_full_tiling_search": timeit(
            lambda: gemm(a100, 8192, 8192, 8192, "fp16"), args.repeat),
        "gemm_64x12288x12288_fp16_a100": timeit(
            lambda: gemm(a100, 64, 12288, 12288, "fp16"), args.repeat),
        "predict_facade_gemm_8192_with_preset_microarch": timeit(
            lambda: crossflow.predict(workload=workload, hardware=a100), args.repeat),
    }
    results["transformer_gpt3_175b_t8_p8_d24_dgx_a100_uncached"] = timeit(
        _uncached_transformer, max(3, args.repeat // 30))
    try:
        from crossflow.arch.age import generate
        from crossflow.config.loader import load_spec, preset_names

        names = preset_names("templates")
        if names:
            template = load_spec(names[0], "templates")
            results[f"age_generate_{names[0]}"] = timeit(lambda: generate(template), args.repeat)
    except ImportError:
        pass
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
