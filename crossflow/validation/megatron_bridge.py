"""Published NeMo / Megatron-Bridge pre-training throughput on DGX H100 against the model.

(Over 600 lines, one source on purpose: the H100, B200 and GB200 runs of the same pages
share their row parsing (:func:`case`, :func:`_published`), and the Blackwell and MoE fits
start from the H100 profile this module fits.)

``megatron_bridge_pretrain_h100.csv`` (sources in its header): tokens per second per GPU of
GPT-3, Llama-2/3/3.1 and Nemotron runs, NeMo 24.07 … Megatron-Bridge 26.06, predicted on
``dgx-h100-megatron-core``.  Tokens/s is compared, not TFLOP/s: the two page families count
model FLOPs differently (the header's caveat).

Which rows: the dense models, the printed value of each cell (``variant: main``); and,
separately (:func:`moe_dataset`, issue #22), the dropless MoE runs of the models whose
architecture the workload can express — Qwen3 30B-A3B, Qwen3 235B-A22B, GPT-OSS 120B and
DeepSeek-V3 (:func:`moe_rows`; :data:`SKIPPED` lists the MoE rows left out and why) — and
the token-dropping Qwen3 runs (:func:`tokendrop_dataset`).  The profile's constants are
fitted to the 17 rows without context
parallelism (:func:`dataset`, the issue's tolerances); the 7 with context parallelism 2
(Llama-3 8B and 70B of 24.07, every Llama-3.1 405B run) are held out (:func:`cp_dataset`).
The DGX-B200 and GB200 NVL72 runs of the same pages (:data:`BLACKWELL`) are held out whole:
:func:`blackwell_dataset` predicts them on ``dgx-b200-megatron-core`` and
``gb200-nvl72-megatron-core``, datasheet hardware with this profile's constants.
The 405B runs put 126 layers on 8 × 8 pipeline chunks: predicted with Megatron-Core's uneven
split, the embedding and the loss counted as a layer each.

Settings the tables do not print, taken as Megatron-Bridge's performance recipes set them
(assumed the same for every row): sequence parallelism wherever tensor parallelism > 1, the
distributed optimizer, no activation recomputation (Megatron-Bridge's H100 FP8 preset for
Llama-3 70B, scripts/performance/configs/llama, sets only TP 4, PP 8, VP 5 on its base
config), FP8 GEMMs for every row (the 25.09 table
states no precision; its footnote makes its plain numbers FP8 current scaling).  Rows run
with FSDP (Llama-3 8B, 25.09 / 25.11) are a held-out data set of their own
(:func:`fsdp_dataset`), predicted with Megatron-FSDP as ZeRO-3.

Where the memory model says a published run does not fit (it over-counts a little: GPT-3 20B
by 0.05 GB of 80, Nemotron-4 340B by 13 GB), the row is still predicted — on the same device
with memory enough — and its label says so: the time model is validated here, not memory.

``python -m crossflow.validation.megatron_bridge`` re-fits the profile's fitted constants
(:data:`FITTED`) and prints them with the errors.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import numpy as np

import crossflow
from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.predict import load_hardware
from crossflow.validation.dataset import DataSet, Row, measurements_dir, read_measurements
from crossflow.validation.fitting import golden, logistic, logit, nelder_mead

FILE = "megatron_bridge_pretrain_h100.csv"
ARCH_FILE = "model_architectures.csv"
SYSTEM = "dgx-h100-megatron-core"
#: Tolerances (issue #19): MAPE, Spearman, mean signed error per precision group.
MAX_MAPE, MIN_SPEARMAN, MAX_GROUP_BIAS = 0.10, 0.9, 0.03
#: model_key -> architecture columns (model_architectures.csv); GPT-3 5B / 20B print no
#: vocabulary: 51200, as NeMo's GPT-3 175B benchmark script sets it.
DEFAULT_VOCAB = 51200


@cache
def architectures() -> dict[str, dict[str, str]]:
    _, rows = read_measurements(measurements_dir() / ARCH_FILE)
    return {r["model_key"]: r for r in rows}


def _published(kind: str, file: str = FILE, fsdp: bool = False) -> list[dict[str, str]]:
    """The rows of ``file`` of models of ``kind`` (``dense``, ``moe``, ``hybrid``: the start
    of the architecture table's type) with a printed throughput, their main variant, run
    without FSDP (with it, given ``fsdp``)."""
    _, rows = read_measurements(measurements_dir() / file)
    arch = architectures()
    return [r for r in rows if r["variant"] == "main" and r["tokens_per_s_per_gpu"]
            and arch.get(r["model_key"], {}).get("type", "").startswith(kind)
            and (_int(r["fsdp"], 0) > 0) == fsdp]


@cache
def dense_rows() -> tuple[dict[str, str], ...]:
    """The rows validated here (see the module docstring)."""
    return tuple(_published("dense"))


#: MoE models left out of :func:`moe_rows`, and why (Nemotron 3 Nano, a hybrid of Mamba-2,
#: MoE and attention layers, is not an "moe" row: :func:`hybrid_rows`)
SKIPPED: dict[str, str] = {
    "deepseek_v4_flash": "its compressed sparse attention (sliding-window and compressed "
                         "blocks, hash-routed layers) is not a layer the workload has"}
#: Hybrid stacks (model_architectures.csv type "hybrid …") -> the workload preset that
#: spells out their pattern and Mamba-2 widths (the table gives them as prose)
HYBRID_PRESETS = {"nemotron_3_nano": "nemotron-3-nano", "nemotron_3_super": "nemotron-3-super",
                  "nemotron_3_5_lightning": "nemotron-3.5-lightning"}


def _tokendrop(r: dict[str, str]) -> bool:
    return "tokendrop" in r["model"]


def _moe_published(tokendrop: bool) -> tuple[dict[str, str], ...]:
    return tuple(r for r in _published("moe")
                 if r["model_key"] not in SKIPPED and _tokendrop(r) == tokendrop)


@cache
def moe_rows() -> tuple[dict[str, str], ...]:
    """The dropless MoE rows validated (none of :data:`SKIPPED`)."""
    return _moe_published(tokendrop=False)


@cache
def tokendrop_rows() -> tuple[dict[str, str], ...]:
    """The token-dropping MoE rows (25.09's "(tokendrop)" Qwen3 runs; none of
    :data:`SKIPPED`)."""
    return _moe_published(tokendrop=True)


@cache
def hybrid_rows() -> tuple[dict[str, str], ...]:
    """The runs of hybrid Mamba-2 stacks with a preset (:data:`HYBRID_PRESETS`)."""
    return tuple(r for r in _published("hybrid") if r["model_key"] in HYBRID_PRESETS)


#: The token dropping of the "(tokendrop)" rows: Megatron-Bridge 25.09's performance script
#: (NVIDIA-NeMo/Megatron-Bridge@fa0315ae2, scripts/performance/run_script.py) applies
#: ``apply_moe_token_drop(recipe.model)`` to both Qwen3 models, whose defaults
#: (src/megatron/bridge/training/utils/moe_token_drop.py) are capacity factor 1.0 with the
#: experts' input padded to the capacity
TOKENDROP_CAPACITY_FACTOR, TOKENDROP_PAD = 1.0, True


def group(r: dict[str, str]) -> str:
    """The row's precision label as printed (``unstated`` for the 25.09 table)."""
    return r["precision"] or "unstated"


def _int(value: str, default: int = 1) -> int:
    return int(value) if value and value.isdigit() else default


def _precision(r: dict[str, str]) -> str:
    """The workload precision of a row: BF16 as printed, NVFP4 as ``fp4`` (Transformer
    Engine's NVFP4 recipe), every FP8 recipe (delayed, current scaling, MXFP8) and an
    unstated precision (release 25.09, whose runs are FP8) as ``fp8``."""
    return {"BF16": "bf16", "NVFP4": "fp4"}.get(r["precision"], "fp8")


#: The norms, linear-layer biases and dropout each family's Megatron-Bridge provider sets
#: (src/megatron/bridge/models/*/ at c0b9a0003, as the workload presets cite them): Llama's
#: LlamaModelProvider and Qwen3's Qwen3MoEModelProvider RMSNorm without biases, Nemotron's
#: NemotronModelProvider LayerNorm without biases, GPTOSSProvider RMSNorm with biases, and
#: GPTProvider175B Megatron's defaults but dropout; every one without dropout.  GPT-3 5B and
#: 20B keep Megatron's defaults (GPTProvider5B / 20B set none of these)
NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
PROVIDER_KEYS = {
    "llama": {"normalization": "RMSNorm", "add_bias_linear": False, **NO_DROPOUT},
    "qwen3": {"normalization": "RMSNorm", "add_bias_linear": False, **NO_DROPOUT},
    "nemotron3_": {"add_bias_linear": False, **NO_DROPOUT},
    "nemotron4_": {"add_bias_linear": False, **NO_DROPOUT},
    "gpt_oss": {"normalization": "RMSNorm", **NO_DROPOUT},
    "gpt3_175b": NO_DROPOUT,
}


def _provider_keys(key: str) -> dict:
    return next((keys for prefix, keys in PROVIDER_KEYS.items() if key.startswith(prefix)), {})


def case(r: dict[str, str]):
    """(TransformerSpec, parallelism dict) of one row."""
    a = architectures()[r["model_key"]]
    key = r["model_key"]
    if a["type"] == "moe":
        return _moe_case(r, a)
    if key in HYBRID_PRESETS:
        return _hybrid_case(r)
    llama = key.startswith("llama")
    h, heads = int(a["hidden_size"]), int(a["num_attention_heads"])
    spec = TransformerSpec(
        kind="transformer", name=key, num_layers=int(a["num_layers"]), hidden_size=h,
        ffn_hidden_size=int(a["ffn_hidden_size"]), num_attention_heads=heads,
        num_query_groups=int(a["num_query_groups"]), kv_channels=int(a["head_dim"]),
        gated_linear_unit=llama, untie_embeddings_and_output_weights=not key.startswith("gpt3"),
        position_embedding_type="learned_absolute" if key.startswith("gpt3") else "rope",
        seq_length=int(r["seq_length"]), vocab_size=_int(a["vocab_size"], DEFAULT_VOCAB),
        global_batch_size=int(r["global_batch_size"]),
        micro_batch_size=int(r["micro_batch_size"]), precision=_precision(r),
        activation_recompute="none", **_provider_keys(key))
    par = _parallelism(r, spec.num_layers)
    return spec, par


def _parallelism(r: dict[str, str], num_layers: int) -> dict:
    tp, pp = int(r["tp"]), int(r["pp"])
    cp = _int(r["cp"])
    par = {"tensor_parallel": tp, "pipeline_parallel": pp, "context_parallel": cp,
           "data_parallel": int(r["num_gpus"]) // (tp * pp * cp),
           "virtual_pipeline_stages": _int(r["vp"]), "sequence_parallel": tp > 1,
           "use_distributed_optimizer": True}
    if _int(r["fsdp"], 0) > 0:
        # the tables' FSDP column is the sharding group, #GPUs / (TP × PP): every data ×
        # context rank; Megatron-Bridge's performance scripts run Megatron-FSDP as ZeRO-3
        # (scripts/performance/utils/overrides.py, _set_megatron_fsdp_overrides:
        # data_parallel_sharding_strategy "optim_grads_params")
        par |= {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads_params"}
    if num_layers % (pp * _int(r["vp"])):
        # Llama-3.1 405B: 126 layers on 8 x 8 chunks (Qwen3 235B: 94 on 8 x 4), which
        # Megatron-Core splits by counting the embedding and the loss as a layer each
        par |= {"account_for_embedding_in_pipeline_split": True,
                "account_for_loss_in_pipeline_split": True}
    return par


#: DeepSeek-V3's pipeline layouts (``pipeline_model_parallel_layout``), (pipeline, virtual
#: stages) -> the decoder layers of the first chunk, of each middle chunk and of the last,
#: which also holds the MTP depth and the loss: Megatron-Bridge's
#: ``_get_deepseek_v3_pipeline_layout`` (src/megatron/bridge/recipes/deepseek/h100/
#: deepseek_v3.py at 067f987df), and for 8 × 4 chunks the 25.09 H100 run's ``Et|(tt|)*30mL``
#: (scripts/performance/run_script.py at fa0315ae2)
DEEPSEEK_LAYOUTS = {(4, 1): (16, 16, 13), (8, 1): (8, 8, 5), (4, 2): (8, 8, 5),
                    (16, 1): (4, 4, 1), (8, 2): (4, 4, 1), (4, 4): (4, 4, 1), (8, 4): (1, 2, 0)}


#: The DeepSeek-V3 runs whose recipes sent tokens with Megatron-Core's all-to-all
#: dispatcher, (release, system); every other run used the flex dispatcher (DeepEP or
#: HybridEP), as the ``deepseek-v3`` preset does: 25.09 ran DeepEP on H100 and token
#: dropping without it on B200 and GB200 (scripts/performance/run_script.py at fa0315ae2);
#: v0.2.0 (25.11) set no flex backend for B200 (hybridep on GB200, deepep on H100;
#: scripts/performance/configs/deepseek/workload_base_configs.py at v0.2.0); v0.3.0 and
#: later set one for every GPU (deepseek_workload_base_configs.py at v0.3.0 … v0.4.2;
#: src/megatron/bridge/perf_recipes/deepseek/ at 067f987df)
DEEPSEEK_ALLTOALL = {("25.09", "DGX-B200"), ("25.09", "DGX-GB200"), ("25.11", "DGX-B200")}


#: The MoE runs whose recipes overlap one micro-batch's all-to-alls with another's
#: computation (Megatron-Bridge's ``moe_a2a_overlap``: Megatron-Core's
#: ``overlap_moe_expert_parallel_comm`` with ``delay_wgrad_compute``), (system, model) -> the
#: releases: scripts/performance/configs/*/*_workload_base_configs.py at v0.3.0 (26.02),
#: v0.3.1 (26.02.01), v0.4.0 (26.04), v0.4.2 (26.04.01), v0.5.0 (26.06), v0.5.1 (26.06.01) and
#: src/megatron/bridge/perf_recipes/*/ at v0.6.0 (26.08); none at v0.2.0 (25.11)
MOE_A2A_OVERLAP = {
    ("DGX-H100", "qwen3_235b_a22b"): {"26.02", "26.02.01", "26.04", "26.04.01", "26.06"},
    ("DGX-H100", "qwen3_30b_a3b"): {"26.02"},
    ("DGX-B200", "deepseek_v3"): {"26.04.01"},
    ("DGX-GB200", "gpt_oss_120b"): {"26.04", "26.04.01"},
}
#: The MXFP8 runs on GB200 whose recipes capture the whole forward-backward in one CUDA
#: graph (``cuda_graph_impl: full_iteration``, with the overlap above, HybridEP and
#: Transformer Engine's fused grouped MLP; ``_enable_hybridep_full_iteration_mxfp8`` and
#: ``_enable_deepseek_full_iteration_mxfp8`` at v0.6.0, the ``GB200_FP8_MX`` configs at v0.5.0
#: and v0.5.1), model -> whether the recipe also runs the attention in FP8
#: (``fp8_dot_product_attention``)
FULL_ITERATION_RELEASES = {"26.06", "26.06.01", "26.08"}
FULL_ITERATION = {"deepseek_v3": False, "qwen3_30b_a3b": True, "qwen3_235b_a22b": True,
                  "gpt_oss_120b": True}


#: The models every performance recipe of Megatron-Bridge runs with the flex dispatcher
#: (HybridEP), on every GPU and release it published them: Nemotron 3 Nano and Super
#: (``moe_flex_dispatcher_backend="hybridep"`` in BASE_NEMOTRON_3_NANO_CONFIG and
#: BASE_NEMOTRON_3_SUPER_CONFIG, inherited by every GPU's config, of
#: scripts/performance/configs/nemotronh/nemotron_3_workload_base_configs.py at v0.4.0 …
#: v0.5.1; src/megatron/bridge/perf_recipes/nemotronh/gb200/nemotronh.py at v0.6.0) and 3.5
#: Lightning (Nano's GB200 MXFP8 config with two MTP depths, v0.6.0).  Qwen3's and
#: GPT-OSS's recipes change dispatcher with the release and GPU (all-to-all here;
#: docs/validation.md); DeepSeek-V3's: :data:`DEEPSEEK_ALLTOALL`.
FLEX_MODELS = {"nemotron_3_nano", "nemotron_3_super", "nemotron_3_5_lightning"}


def _recipe_options(r: dict[str, str]) -> dict:
    """The workload options of an MoE row's recipe: its dispatcher (:data:`FLEX_MODELS`,
    :data:`DEEPSEEK_ALLTOALL`), :data:`MOE_A2A_OVERLAP`, :data:`FULL_ITERATION`."""
    key, release, system, out = r["model_key"], r.get("release"), r.get("system"), {}
    if key in FLEX_MODELS:
        out["moe_token_dispatcher_type"] = "flex"
    if key == "deepseek_v3" and (release, system) in DEEPSEEK_ALLTOALL:
        out["moe_token_dispatcher_type"] = "alltoall"  # the preset's is flex
    if release in MOE_A2A_OVERLAP.get((system, key), ()):
        out["overlap_moe_expert_parallel_comm"] = True
    if (system == "DGX-GB200" and release in FULL_ITERATION_RELEASES
            and r["precision"] == "MXFP8" and key in FULL_ITERATION):
        out |= {"cuda_graph_impl": "full_iteration", "overlap_moe_expert_parallel_comm": True,
                "fp8_dot_product_attention": FULL_ITERATION[key]}
    return out


def _deepseek_case(r: dict[str, str]):
    """(TransformerSpec, parallelism dict) of a DeepSeek-V3 row: the ``deepseek-v3`` preset
    (model_architectures.csv's row, MLA with its widths, the recipe's one MTP depth; none
    where the table says "w/o MTP") with the row's run settings and token dispatcher
    and options (:func:`_recipe_options`), laid out over the pipeline as the recipe does
    (:data:`DEEPSEEK_LAYOUTS`)."""
    base = load_spec("deepseek-v3", "workloads")
    spec = TransformerSpec(**(base.model_dump() | {
        "mtp_num_layers": 0 if "w/o MTP" in r["model"] else base.mtp_num_layers,
        "seq_length": int(r["seq_length"]), "global_batch_size": int(r["global_batch_size"]),
        "micro_batch_size": int(r["micro_batch_size"]),
        "precision": _precision(r)} | _recipe_options(r)))
    pp, vp = int(r["pp"]), _int(r["vp"])
    first, middle, last = DEEPSEEK_LAYOUTS[pp, vp]
    chunks = pp * vp
    layout = (f"E{'t' * first}|({'t' * middle}|)*{chunks - 2}"
              f"{'t' * last}{'m' * spec.mtp_num_layers}L")  # e.g. Et|(tt|)*30mL
    par = _parallelism(r, spec.num_layers) | {"expert_parallel": int(r["ep"])}
    par.pop("account_for_embedding_in_pipeline_split", None)
    par.pop("account_for_loss_in_pipeline_split", None)
    return spec, par | {"pipeline_model_parallel_layout": layout}


#: The layers Megatron-Bridge's NVFP4 recipes keep in BF16 (``first_last_layers_bf16``),
#: model -> (num_layers_at_start_in_bf16, num_layers_at_end_in_bf16): Nemotron 3 Super's
#: last 14 (src/megatron/bridge/training/mixed_precision.py,
#: nemotron_3_super_bf16_with_nvfp4_mixed; the start count at MixedPrecisionConfig's 0)
NVFP4_BF16_LAYERS = {"nemotron_3_super": (0, 14)}


def _hybrid_case(r: dict[str, str]):
    """(TransformerSpec, parallelism dict) of a hybrid stack's row: its preset with the
    row's run settings, expert parallelism as printed, in NVFP4 the layers the recipe keeps
    in BF16 (:data:`NVFP4_BF16_LAYERS`)."""
    base = load_spec(HYBRID_PRESETS[r["model_key"]], "workloads")
    bf16 = {}
    if r["precision"] == "NVFP4" and r["model_key"] in NVFP4_BF16_LAYERS:
        start, end = NVFP4_BF16_LAYERS[r["model_key"]]
        bf16 = {"first_last_layers_bf16": True, "num_layers_at_start_in_bf16": start,
                "num_layers_at_end_in_bf16": end}
    spec = TransformerSpec(**(base.model_dump() | {
        "seq_length": int(r["seq_length"]), "global_batch_size": int(r["global_batch_size"]),
        "micro_batch_size": int(r["micro_batch_size"]),
        "precision": _precision(r)} | bf16 | _recipe_options(r)))
    return spec, _parallelism(r, spec.num_layers) | {"expert_parallel": int(r["ep"])}


#: Sliding-window attention of the models that have it (model_architectures.csv's attention
#: column), in Megatron-LM's keys: GPT-OSS alternates 128-token windows with full attention
#: (Megatron-Bridge's GPT-OSS bridge: window_size (sliding_window - 1, 0),
#: window_attn_skip_freq 2; src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py at 067f987df)
WINDOWS = {"gpt_oss_120b": {"window_size": (127, 0), "window_attn_skip_freq": 2}}


def _moe_case(r: dict[str, str], a: dict[str, str]):
    """(TransformerSpec, parallelism dict) of an MoE row: every layer MoE (the validated
    models' layout), SwiGLU experts (GPT-OSS's clamped gated activation priced as SwiGLU),
    untied embeddings, RoPE, query and key norms where the architecture file lists them
    (Qwen3), the sliding windows of :data:`WINDOWS`; BF16 where the row says so, else FP8 like the dense rows;
    expert parallelism as printed (expert tensor parallelism 1)."""
    if r["model_key"] == "deepseek_v3":
        return _deepseek_case(r)
    spec = TransformerSpec(
        kind="transformer", name=r["model_key"], num_layers=int(a["num_layers"]),
        hidden_size=int(a["hidden_size"]), num_attention_heads=int(a["num_attention_heads"]),
        num_query_groups=int(a["num_query_groups"]), kv_channels=int(a["head_dim"]),
        gated_linear_unit=True, untie_embeddings_and_output_weights=True,
        position_embedding_type="rope", qk_layernorm="QK-layernorm" in a["attention"],
        seq_length=int(r["seq_length"]),
        vocab_size=int(a["vocab_size"]), global_batch_size=int(r["global_batch_size"]),
        micro_batch_size=int(r["micro_batch_size"]),
        precision=_precision(r), activation_recompute="none",
        num_moe_experts=int(a["num_experts"]), moe_router_topk=int(a["moe_topk"]),
        moe_ffn_hidden_size=int(a["moe_ffn_hidden_size"]),
        moe_shared_expert_intermediate_size=_int(a["shared_expert_ffn_size"], 0) or None,
        **({"moe_expert_capacity_factor": TOKENDROP_CAPACITY_FACTOR,
            "moe_pad_expert_input_to_capacity": TOKENDROP_PAD} if _tokendrop(r) else {}),
        **WINDOWS.get(r["model_key"], {}), **_provider_keys(r["model_key"]),
        **_recipe_options(r))
    return spec, _parallelism(r, spec.num_layers) | {"expert_parallel": int(r["ep"])}


def label(r: dict[str, str]) -> str:
    ep = f" e{r['ep']}" if _int(r["ep"]) > 1 else ""
    return (f"{r['release']} {group(r)} {r['model_key']} n{r['num_gpus']} t{r['tp']} "
            f"p{r['pp']} c{_int(r['cp'])} v{_int(r['vp'])}{ep} mb{r['micro_batch_size']} "
            f"gb{r['global_batch_size']}" + (" tokendrop" if _tokendrop(r) else ""))


@cache
def _roomy(name: str):
    """The device with twice its main memory (rows the memory model over-counts)."""
    arch = load_hardware(name)
    memory = (*arch.memory[:-1], replace(arch.main_memory,
                                         capacity_B=2 * arch.main_memory.capacity_B))
    return replace(arch, memory=memory)


def predict_row(r: dict[str, str], system=SYSTEM) -> tuple[float, str]:
    """Predicted tokens per second per GPU, and a note when the memory model rejected it."""
    spec, par = case(r)
    p = crossflow.predict(workload=spec, system=system, parallelism=par)
    note = ""
    if not p.feasible:
        sys_spec = system if hasattr(system, "device") else load_spec(system, "systems")
        need = p.memory_per_device_bytes
        p = crossflow.predict(workload=spec, hardware=_roomy(sys_spec.device), system=system,
                              parallelism=par)
        note = f" [memory model: {need / 1e9:.1f} GB]"
    return spec.global_batch_size * spec.seq_length / (p.time_s * int(r["num_gpus"])), note


def fit_rows() -> tuple[dict[str, str], ...]:
    """The rows the profile is fitted to and the issue's tolerances hold on: those without
    context parallelism."""
    return tuple(r for r in dense_rows() if _int(r["cp"]) == 1)


def cp_rows() -> tuple[dict[str, str], ...]:
    """The rows with context parallelism, held out from the fit."""
    return tuple(r for r in dense_rows() if _int(r["cp"]) > 1)


def _dataset(system, rows, what: str, source: str, max_mape: float, **tolerances) -> DataSet:
    """``rows`` predicted on ``system`` as a data set of tokens/s per GPU, each row in its
    precision group; its name ``training: NeMo / Megatron-Bridge`` + ``what``."""
    out, groups = [], []
    for r in rows:
        tps, note = predict_row(r, system)
        out.append(Row(label(r) + note, tps, float(r["tokens_per_s_per_gpu"])))
        groups.append((out[-1].label, group(r)))
    return DataSet(name=f"training: NeMo / Megatron-Bridge {what}", source=source,
                   quantity="tokens/s per GPU", rows=tuple(out), max_mape=max_mape,
                   group_of=tuple(groups), **{"min_spearman": 0.0} | tolerances)


def dataset(system=SYSTEM, rows=None) -> DataSet:
    """The rows without context parallelism (the fit's), with the issue's tolerances."""
    return _dataset(
        system, fit_rows() if rows is None else rows,
        "pre-training on DGX H100, dense, tokens/s/GPU",
        f"{FILE} (dense rows without context parallelism) on system {SYSTEM} (the data its "
        "fitted constants are fitted to)",
        MAX_MAPE, min_spearman=MIN_SPEARMAN, max_group_bias=MAX_GROUP_BIAS)


#: Tolerance of the held-out context-parallel rows: issue #22's target (with Transformer
#: Engine's ring attention modelled, crossflow.sim.ring_attention; docs/software-stack.md).
MAX_MAPE_CP = 0.10


def cp_dataset(system=SYSTEM) -> DataSet:
    """The rows with context parallelism 2, predicted with the profile fitted without them."""
    return _dataset(system, cp_rows(), "on DGX H100, context parallelism 2 (held out)",
                    f"{FILE} (dense rows with cp 2) on system {SYSTEM}, not fitted to",
                    MAX_MAPE_CP)


#: Tolerance of the MoE rows (issue #22): MAPE
MAX_MAPE_MOE = 0.15

#: MoE rows the two MoE constants are not fitted to: Qwen3 30B-A3B on 16 GPUs with EP 8 and
#: PP 2 in 26.02 (5113 tokens/s) ran the very configuration 26.02.01 ran at 9058, and 25.11's
#: (5275, micro-batch 2, 24 virtual stages) is as slow — the software of those releases,
#: which no constant of a single profile can follow.  They stay in the reported MAPE.
MOE_NOT_FITTED = (("26.02", "qwen3_30b_a3b"), ("25.11", "qwen3_30b_a3b"),
                  # held out, a test of what the fit did not see: multi-head latent
                  # attention, 256 experts on EP 64, the MTP depth on the recipe's
                  # pipeline layout (:data:`DEEPSEEK_LAYOUTS`)
                  ("25.09", "deepseek_v3"))


def moe_fit_rows() -> tuple[dict[str, str], ...]:
    """The MoE rows :func:`fit_moe` fits to (all but :data:`MOE_NOT_FITTED`)."""
    return tuple(r for r in moe_rows()
                 if (r["release"], r["model_key"]) not in MOE_NOT_FITTED)


def moe_dataset(system=SYSTEM, rows=None) -> DataSet:
    """The dropless MoE rows the MoE constants are fitted to (:func:`moe_fit_rows`), with
    issue #22's tolerance."""
    return _dataset(
        system, moe_fit_rows() if rows is None else rows,
        "on DGX H100, MoE (Qwen3, GPT-OSS), tokens/s/GPU",
        f"{FILE} (dropless MoE rows; "
        + (f"skipped: {', '.join(sorted(SKIPPED))}; " if SKIPPED else "")
        + f"not fitted: {MOE_NOT_FITTED}) on system {SYSTEM} (the data its two MoE "
        "constants are fitted to)", MAX_MAPE_MOE)


#: Tolerance of every dropless MoE row, the two of MOE_NOT_FITTED included: a guard
#: against getting worse, as for the context-parallel rows
MAX_MAPE_MOE_ALL = 0.20


def moe_all_dataset(system=SYSTEM) -> DataSet:
    """Every dropless MoE row (:func:`moe_rows`), the unfitted ones included."""
    return _dataset(system, moe_rows(), "on DGX H100, MoE, every dropless row",
                    f"{FILE} (dropless MoE rows, {MOE_NOT_FITTED} not fitted to) on system "
                    f"{SYSTEM}", MAX_MAPE_MOE_ALL)


#: Tolerance of the token-dropping rows, not fitted to: the every-row guard's
MAX_MAPE_TOKENDROP = MAX_MAPE_MOE_ALL


def tokendrop_dataset(system=SYSTEM) -> DataSet:
    """The token-dropping MoE rows (:func:`tokendrop_rows`): capacity factor 1.0, padded
    (:data:`TOKENDROP_CAPACITY_FACTOR`), predicted with the constants fitted dropless."""
    return _dataset(system, tokendrop_rows(),
                    "on DGX H100, MoE token-dropping (capacity 1.0, padded; held out)",
                    f"{FILE} (25.09 (tokendrop) Qwen3 rows) on system {SYSTEM}, not fitted to",
                    MAX_MAPE_TOKENDROP)


#: Tolerance of the hybrid rows (not fitted to): the every-row MoE guard's
MAX_MAPE_HYBRID = MAX_MAPE_MOE_ALL


def hybrid_dataset(system=SYSTEM) -> DataSet:
    """The hybrid Mamba-2 stacks' runs (:func:`hybrid_rows`, Nemotron 3 Nano), held out:
    the Mamba-2 layers are priced from their kernels with the constants fitted on the dense
    and MoE rows, nothing fitted to these."""
    return _dataset(system, hybrid_rows(),
                    "on DGX H100, hybrid Mamba-2 + MoE + attention (held out)",
                    f"{FILE} (Nemotron 3 Nano rows, preset nemotron-3-nano) on system "
                    f"{SYSTEM}, not fitted to", MAX_MAPE_HYBRID)


@cache
def fsdp_rows() -> tuple[dict[str, str], ...]:
    """The dense rows run with Megatron-FSDP (Llama-3 8B on 8 GPUs, 25.09 and 25.11)."""
    return tuple(_published("dense", fsdp=True))


def fsdp_dataset(system=SYSTEM) -> DataSet:
    """The dense rows run with Megatron-FSDP, held out (the profile is fitted without them),
    with the dense rows' tolerance."""
    return _dataset(system, fsdp_rows(), "on DGX H100, dense, Megatron-FSDP (held out)",
                    f"{FILE} (dense rows with FSDP > 0: ZeRO-3 over every data-parallel rank) "
                    f"on system {SYSTEM}, not fitted to", MAX_MAPE)


#: The Blackwell runs of the same pages, and the profiles that predict them: datasheet
#: hardware, and the H100 profile's software constants with its four efficiencies
#: (:data:`BLACKWELL_SCALED`) times one factor, fitted to the GB200 dense runs without FSDP
#: (:func:`fit_blackwell`, as dgx-a100-sc21's factor is fitted to SC21 Table 2); the B200
#: runs, the FSDP runs and every MoE run are held out.  name -> (measurement file, system)
BLACKWELL = {"B200": ("megatron_bridge_pretrain_b200.csv", "dgx-b200-megatron-core"),
             "GB200": ("megatron_bridge_pretrain_gb200.csv", "gb200-nvl72-megatron-core")}
BLACKWELL_SCALED = ("gemm_efficiency", "fp8_gemm_efficiency", "attention_efficiency",
                    "memory_bound_efficiency")
#: Tolerance of the held-out dense Blackwell rows: the every-row MoE guard's 20 %, the bound
#: the H100 data sets not fitted to are held to
MAX_MAPE_B200 = MAX_MAPE_MOE_ALL
#: Tolerance of the Blackwell MoE and hybrid rows: a guard against getting worse, not a
#: target.  The same model on the same machine moves between releases by more than any
#: modelling term (Qwen3 30B-A3B on 8 B200s 9299 tokens/s in 25.11, 27136 in 26.04.01;
#: GPT-OSS 120B 8213 and 13568; the files' headers), and no constant is fitted to them.
MAX_MAPE_B200_MOE = 0.45


def _blackwell_rows(name: str, moe: bool, fsdp: bool | None = None, nvfp4: bool = False
                    ) -> tuple[dict[str, str], ...]:
    """The rows of :data:`BLACKWELL`'s ``name`` the model can price: dense ones (those run
    with FSDP or without where ``fsdp`` says which; the NVFP4 runs alone where ``nvfp4``
    says so, else none of them) or MoE and hybrid ones in every precision (the hybrids with
    a preset, :data:`HYBRID_PRESETS`; no model of :data:`SKIPPED`)."""
    file = BLACKWELL[name][0]
    if moe:
        rows = [*_published("moe", file),
                *(r for r in _published("hybrid", file) if r["model_key"] in HYBRID_PRESETS)]
        rows = [r for r in rows if r["model_key"] not in SKIPPED]
    else:
        rows = [r for with_fsdp in (False, True) if fsdp in (None, with_fsdp)
                for r in _published("dense", file, fsdp=with_fsdp)]
    if moe:
        return tuple(rows)
    return tuple(r for r in rows if (r["precision"] == "NVFP4") == nvfp4)


def blackwell_fit_rows() -> tuple[dict[str, str], ...]:
    """The rows :func:`fit_blackwell` fits to: GB200's dense runs without FSDP."""
    return _blackwell_rows("GB200", moe=False, fsdp=False)


def with_blackwell_factor(alpha: float, name: str = "GB200"):
    """:data:`BLACKWELL`'s ``name`` system with the H100 profile's :data:`BLACKWELL_SCALED`
    efficiencies times ``alpha``."""
    h100 = load_spec(SYSTEM, "systems").software
    return load_spec(BLACKWELL[name][1], "systems").with_software_fields(
        **{k: getattr(h100, k) * alpha for k in BLACKWELL_SCALED})


def blackwell_loss(alpha: float) -> float:
    """Mean squared relative tokens/s error of :func:`blackwell_fit_rows` at ``alpha``."""
    system = with_blackwell_factor(alpha)
    return float(np.mean([(predict_row(r, system)[0] / float(r["tokens_per_s_per_gpu"]) - 1)
                          ** 2 for r in blackwell_fit_rows()]))


def shipped_blackwell_factor(name: str = "GB200") -> float:
    """The shipped profile's GEMM efficiency over the H100 profile's (every one of
    :data:`BLACKWELL_SCALED` has the same ratio, to their rounding)."""
    ours = load_spec(BLACKWELL[name][1], "systems").software
    return ours.gemm_efficiency / load_spec(SYSTEM, "systems").software.gemm_efficiency


def fit_blackwell() -> float:
    """The factor on the H100 profile's efficiencies that fits the GB200 dense runs without
    FSDP best (golden-section search)."""
    return golden(blackwell_loss, 0.6, 1.1)


def blackwell_dataset(name: str = "B200", moe: bool = False,
                      fsdp: bool | None = None, nvfp4: bool = False) -> DataSet:
    """:data:`BLACKWELL`'s ``name`` runs — dense (with or without FSDP where ``fsdp`` says;
    the NVFP4 ones alone where ``nvfp4`` says) or MoE and hybrid — predicted on its profile.
    Only GB200's dense FP8 runs without FSDP are fit data (of the one factor); every other
    set is held out."""
    file, preset = BLACKWELL[name]
    fitted = name == "GB200" and not moe and fsdp is False and not nvfp4
    what = ("MoE and hybrid" if moe else
            "dense" + {None: "", False: " without FSDP", True: ", Megatron-FSDP"}[fsdp]
            + (", NVFP4" if nvfp4 else ""))
    return _dataset(
        preset, _blackwell_rows(name, moe, fsdp, nvfp4),
        f"on {name}, {what}" + (" (fit data of the Blackwell factor)" if fitted
                                else " (held out)"),
        f"{file} (rows: {what}) on system {preset}, "
        + ("the rows its one factor is fitted to" if fitted else "not fitted to"),
        MAX_MAPE if fitted else MAX_MAPE_B200_MOE if moe else MAX_MAPE_B200)


def blackwell_datasets() -> list[DataSet]:
    """Every Blackwell data set: GB200's dense runs without FSDP (fit data), with FSDP, in
    NVFP4, and B200's dense runs; each system's MoE and hybrid runs."""
    return [blackwell_dataset("GB200", fsdp=False), blackwell_dataset("GB200", fsdp=True),
            blackwell_dataset("GB200", nvfp4=True), blackwell_dataset("B200"),
            blackwell_dataset("B200", moe=True), blackwell_dataset("GB200", moe=True)]


#: The MoE constants :func:`fit_moe` sets (SoftwareSpec field, lower, upper bound).  They
#: act on MoE layers only, so the dense rows' predictions do not move.  Which rows pin
#: which: with expert parallelism inside a node (GPT-OSS 120B, Qwen3 30B on EP 8) the
#: all-to-alls are small and the rows fix ``moe_efficiency``; with it across nodes (Qwen3
#: 30B on EP 16, Qwen3 235B on EP 32) the all-to-alls dominate and fix ``overlap.ep_comm``.
MOE_FITTED = (("moe_efficiency", 0.1, 1.0), ("overlap.ep_comm", 0.0, 1.0))


def with_moe_constants(values, base=None):
    """The profile's system with the MOE_FITTED constants set to ``values``."""
    efficiency, ep_comm = (float(v) for v in values)
    return (base or load_spec(SYSTEM, "systems")).with_software_fields(
        moe_efficiency=efficiency, overlap={"ep_comm": ep_comm})


def fit_moe() -> tuple[dict[str, float], DataSet, DataSet]:
    """Nelder-Mead on :data:`MOE_FITTED` (through a logistic onto their bounds) from the
    shipped values: least mean squared relative error of tokens/s over
    :func:`moe_fit_rows`.  Returns the constants, the fitted rows' data set and every
    dropless MoE row's."""
    base = load_spec(SYSTEM, "systems")
    sw = base.software
    start = [sw.moe_efficiency, sw.overlap.ep_comm]
    rows = moe_fit_rows()

    def values(x):
        return [lo + (hi - lo) * logistic(v)
                for v, (_, lo, hi) in zip(x, MOE_FITTED, strict=True)]

    def loss(x) -> float:
        ds = moe_dataset(with_moe_constants(values(x), base), rows)
        return float(np.mean([r.error ** 2 for r in ds.rows]))

    x0 = [logit(min(max((v - lo) / (hi - lo), 0.02), 0.98))
          for v, (_, lo, hi) in zip(start, MOE_FITTED, strict=True)]
    best = values(nelder_mead(loss, x0, step=0.5, iterations=200, tol=1e-7))
    system = with_moe_constants(best, base)
    return ({n: v for (n, *_), v in zip(MOE_FITTED, best, strict=True)},
            moe_dataset(system), moe_all_dataset(system))


def group_bias(ds: DataSet) -> dict[str, float]:
    """Mean signed error per precision group."""
    return ds.group_bias


#: The constants :func:`fit` sets: (SoftwareSpec field, lower bound, upper bound).  The
#: attention efficiency is capped at FlashAttention-3's forward headline (75 % of peak).
FITTED = (("fp8_gemm_efficiency", 0.4, 0.9), ("attention_efficiency", 0.3, 0.75),
          ("memory_bound_efficiency", 0.4, 0.95), ("iteration_s", 0.0, 1.0),
          ("overlap.tp_comm", 0.0, 1.0))


def with_constants(values, base=None):
    """The profile's system with the FITTED constants set to ``values``."""
    update = {}
    for (name, *_), v in zip(FITTED, values, strict=True):
        if name == "overlap.tp_comm":
            update["overlap"] = {"tp_comm": float(v)}
        else:
            update[name] = float(v)
    return (base or load_spec(SYSTEM, "systems")).with_software_fields(**update)


def fit() -> tuple[dict[str, float], DataSet]:
    """Nelder-Mead on the FITTED constants (each through a logistic onto its bounds), from
    the shipped values: least mean squared relative error of tokens/s over the rows plus
    the mean squared bias of the precision groups."""
    base = load_spec(SYSTEM, "systems")
    sw = base.software
    start = [sw.overlap.tp_comm if n == "overlap.tp_comm" else getattr(sw, n)
             for n, *_ in FITTED]

    def values(x):
        return [lo + (hi - lo) * logistic(v) for v, (_, lo, hi) in zip(x, FITTED, strict=True)]

    def loss(x) -> float:
        # the rows' squared relative errors, plus each precision group's squared mean error
        # (the tolerances hold per group: a group of one row weighs as a group)
        ds = dataset(with_constants(values(x), base), fit_rows())
        return float(np.mean([r.error ** 2 for r in ds.rows])
                     + np.mean([b ** 2 for b in group_bias(ds).values()]))

    x0 = [logit(min(max((v - lo) / (hi - lo), 0.02), 0.98))
          for v, (_, lo, hi) in zip(start, FITTED, strict=True)]
    best = values(nelder_mead(loss, x0, step=0.5, iterations=300, tol=1e-6))
    return ({n: v for (n, *_), v in zip(FITTED, best, strict=True)},
            dataset(with_constants(best, base)))


def print_fit(what: str = "") -> None:
    """Re-fit and print (``python -m crossflow.validation.megatron_bridge [moe|blackwell]``):
    the H100 profile's constants with its dense and MoE data sets, the two MoE constants,
    or the Blackwell factor with every Blackwell data set."""
    if what == "blackwell":
        print(f"Blackwell factor: {fit_blackwell():.3f} (the shipped profiles' ratio to the "
              f"H100 profile: {shipped_blackwell_factor():.3f})")
        for ds in blackwell_datasets():
            print(ds.render())
    elif what == "moe":  # the MoE constants only (the dense ones do not move them)
        constants, ds, every = fit_moe()
        print("  ".join(f"{k}: {v:.3f}" for k, v in constants.items()))
        print(ds.render())
        print(every.render())
    else:
        constants, ds = fit()
        print("  ".join(f"{k}: {v:.3f}" for k, v in constants.items()))
        print(ds.render())
        print(moe_dataset().render())
        print(moe_all_dataset().render())


if __name__ == "__main__":
    import sys

    print_fit(*sys.argv[1:2])
