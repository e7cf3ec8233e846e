"""Uncached transformer predictions with and without the software-stack layer (issue #12).

    python benchmarks/bench_software_stack.py [--repeat N]

Prints one JSON object.  Each figure is the median of N calls, every call *uncached*: every
crossflow memo but the parsed presets (kernel prices, tiling grids, devices, routes) is
cleared first, so each call prices every kernel and routes its system again (the cost of a
prediction a search has not seen before).

* ``megatron_deepspeed``: a vTrain-sized GPT (hidden 1024, 24 layers, t2 p2, micro-batch 1,
  16 micro-batches) on ``dgx-a100-megatron-deepspeed`` — the host on the critical path;
* ``reference_dgx_a100``: the same model on ``dgx-a100`` (no host constants: the pipeline
  without host tasks), measured in the same run;
* ``ratio``: the first over the second — the cost of the layer on the same machine, load
  and caches (the issue's budget: <= 1.5).

Run it on the commit before the layer with ``--reference-only`` to time the old code path.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _timing import machine

import crossflow

MODEL = {"kind": "transformer", "num_layers": 24, "hidden_size": 1024,
         "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 50304,
         "global_batch_size": 16, "micro_batch_size": 1, "activation_recompute": "full"}
PARALLEL = {"tensor_parallel": 2, "pipeline_parallel": 2, "data_parallel": 1}


def _clear() -> None:
    """Empty every memo of the crossflow modules: functools caches (kernel prices, tiling
    grids, devices, plans) and the routing tables, so each call starts from parsed specs."""
    import functools
    import sys

    for name, module in list(sys.modules.items()):
        if not name.startswith("crossflow"):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, functools._lru_cache_wrapper) and name != "crossflow.config.loader":
                value.cache_clear()
        for table in ("_ROUTES", "_TOPOLOGIES"):
            if isinstance(getattr(module, table, None), dict):
                getattr(module, table).clear()


def uncached(system: str, repeat: int) -> float:
    times = []
    for _ in range(repeat + 1):
        _clear()
        t0 = time.perf_counter()
        crossflow.predict(workload=MODEL, hardware="a100-sxm4-80gb", system=system,
                          parallelism=PARALLEL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first call also parses the presets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--reference-only", action="store_true")
    args = parser.parse_args()
    out: dict[str, object] = {"machine": machine()}
    ref = uncached("dgx-a100", args.repeat)
    out["reference_dgx_a100_ms"] = ref * 1e3
    if not args.reference_only:
        new = uncached("dgx-a100-megatron-deepspeed", args.repeat)
        out["megatron_deepspeed_ms"] = new * 1e3
        out["ratio"] = new / ref
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
