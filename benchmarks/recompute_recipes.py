"""What Megatron-Bridge's recomputation settings buy on published runs, by the model.

    python benchmarks/recompute_recipes.py

For runs of the published Megatron-Bridge tables whose recipes set ``recompute_modules``
(Megatron-Bridge 067f987df, ``src/megatron/bridge/perf_recipes/<model>/<gpu>/``), the
memory per GPU and the iteration time CrossFlow predicts without and with the recipe's
modules, and the throughput's error against the published figure both ways (times on the
device with memory to spare where a design is over memory, as the validation data sets
price such runs).  Then full recomputation's methods on NVIDIA's 24.07 Llama 3 8B run on
8 H100s (Megatron-Bridge's H100 recipe for it recomputes the first 5 layers: ``block``).
The validation data sets themselves predict these runs without recomputation
(docs/validation.md).
"""

from __future__ import annotations

import crossflow
from crossflow.config import load_spec
from crossflow.validation import megatron_bridge as mb

#: (table, system, model_key, precision as the table states it, the recipe's modules)
RECIPES = (
    ("megatron_bridge_pretrain_h100.csv", "dgx-h100-megatron-core", "deepseek_v3", "",
     ("mla_up_proj", "mlp")),
    ("megatron_bridge_pretrain_b200.csv", "dgx-b200-megatron-core", "gpt_oss_120b", "BF16",
     ("layernorm", "moe_act")),
    ("megatron_bridge_pretrain_b200.csv", "dgx-b200-megatron-core", "nemotron_3_super",
     "MXFP8", ("moe_act", "layernorm")),
)


def _rows(table: str, key: str, precision: str) -> list[dict[str, str]]:
    rows = [r for kind in ("moe", "hybrid") for r in mb._published(kind, table)]
    return [r for r in rows if r["model_key"] == key and r["precision"] == precision]


def main() -> None:
    print(f"{'run':<58} {'modules':<24} {'GB/GPU':>15} {'time s':>17} {'error':>17}")
    for table, system, key, precision, modules in RECIPES:
        roomy = mb._roomy(load_spec(system, "systems").device)
        for r in _rows(table, key, precision):
            spec, par = mb.case(r)
            runs = []
            for extra in ({}, {"recompute_granularity": "selective",
                               "recompute_modules": modules}):
                p = crossflow.predict(workload=spec, system=system, parallelism=par | extra)
                t = crossflow.predict(workload=spec, system=system, hardware=roomy,
                                      parallelism=par | extra).time_s
                tokens = spec.global_batch_size * spec.seq_length / (t * int(r["num_gpus"]))
                runs.append((p.memory_per_device_bytes / 1e9, t,
                             tokens / float(r["tokens_per_s_per_gpu"]) - 1))
            (m0, t0, e0), (m1, t1, e1) = runs
            print(f"{mb.label(r)[:58]:<58} {', '.join(modules):<24} {m0:6.1f} -> {m1:5.1f}"
                  f" {t0:7.3f} -> {t1:6.3f} {e0:+7.1%} -> {e1:+6.1%}")


def methods() -> None:
    row = next(r for r in mb.dense_rows() if r["model_key"] == "llama3_8b")
    spec, par = mb.case(row)
    print(f"\n{mb.label(row)}: full recomputation's methods")
    for name, extra in (("none", {}), ("block 5", {"recompute_method": "block",
                                                   "recompute_num_layers": 5}),
                        ("uniform 1", {}), ("uniform 4", {"recompute_method": "uniform",
                                                          "recompute_num_layers": 4})):
        if name != "none":
            extra = {"recompute_granularity": "full", **extra}
        p = crossflow.predict(workload=spec, system=mb.SYSTEM, parallelism=par | extra)
        print(f"  {name:<10} {p.time_s:7.3f} s  {p.memory_per_device_bytes / 1e9:5.1f} GB/GPU")


if __name__ == "__main__":
    main()
    methods()
