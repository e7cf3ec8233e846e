"""One transformer block's forward and backward pass timed on a GPU, against the block's
passes as CrossFlow prices them inside a training step (:func:`crossflow.sim.training._passes`).

* ``gpu/torch_block_*.csv``: GPT-3- and Llama-3-style decoder blocks written in plain torch
  (bf16, cuDNN fused attention, grouped-query attention where the model has it) and timed by
  ``gpu/measure_torch_block.py`` on the preset its header names, one GPU, no parallelism.

The same hardware preset the kernels were measured on, with no software profile: the check is
of how the block is put together — which GEMMs, which memory-bound kernels, the attention
core, the backward's two GEMMs per weight — not of a fitted efficiency.  Plain torch writes
each parameter's gradient once (no accumulation into a gradient buffer) and runs unfused
normalisation, activation and rotary kernels: ``gpu/torch_block_kernels_*.csv`` (the same
script's ``--profile``) shows where that costs (docs/validation.md, "One transformer block
on a GPU").  The dense blocks are checked; the mixture-of-experts layer, written once as a
loop over the experts (a host synchronisation for the token counts) and once with grouped
GEMMs, is recorded beside them (:func:`moe_rows`): its permutation is plain torch's index
copies, not the fused permutation of a production MoE layer.

Each file is checked twice: on the bare preset, and with the unfused rotary embedding and
SiLU·mul of PyTorch eager as the ``vidur-a100-dgx`` software profile prices them (its
``memory_passes.rope`` and ``.swiglu``, fitted to Vidur's per-op times on an A100 and
nothing here): whether what was learnt of eager PyTorch on one GPU and code base carries to
another.
"""

from __future__ import annotations

from dataclasses import replace

from crossflow.config.loader import load_spec
from crossflow.config.workload import TransformerSpec
from crossflow.predict import load_hardware
from crossflow.sim.training import _passes
from crossflow.validation.dataset import DataSet, Row, measurements_dir, read_preset_measurements

#: Tolerances: the DeepFlow paper reports 16 % mean error on its GPU workloads (§8); a block
#: is GEMMs and fused attention whose kernels are each within ~10 % (the matmul and attention
#: data sets of the same device).
BLOCK_MAX_MAPE, BLOCK_MIN_SPEARMAN = 0.15, 0.9
#: The software profile whose PyTorch-eager passes the second check of each file uses, and
#: the ops taken from it (plain torch here fuses its norms: torch's own LayerNorm and
#: RMSNorm kernels, where Vidur's code ran RMSNorm as several ops).
EAGER_SYSTEM, EAGER_OPS = "vidur-a100-dgx", ("rope", "swiglu")


def eager_passes() -> dict[str, float]:
    """The memory passes of :data:`EAGER_OPS` in :data:`EAGER_SYSTEM`'s software profile."""
    passes = load_spec(EAGER_SYSTEM, "systems").software.memory_passes
    return {op: getattr(passes, op) for op in EAGER_OPS}


def block_spec(r: dict[str, str]) -> TransformerSpec:
    """The measured block as a one-layer CrossFlow transformer in Megatron-LM's keys."""
    b, experts = int(r["micro_batch"]), int(r["experts"])
    moe = {"num_moe_experts": experts, "moe_router_topk": int(r["topk"]),
           "moe_ffn_hidden_size": int(r["ffn"])} if experts else {}
    return TransformerSpec(**moe,
        kind="transformer", name=r["block"], num_layers=1, hidden_size=int(r["hidden"]),
        num_attention_heads=int(r["heads"]), num_query_groups=int(r["query_groups"]),
        kv_channels=int(r["head_dim"]), ffn_hidden_size=int(r["ffn"]),
        gated_linear_unit=r["gated"] == "1", seq_length=int(r["seq"]),
        micro_batch_size=b, global_batch_size=b, vocab_size=32000, precision=r["dtype"],
        position_embedding_type="rope" if r["rope"] == "1" else "learned_absolute",
        attention_backend="flash", causal=True)


def block_passes(arch, r: dict[str, str]):
    """CrossFlow's forward and backward PassTimes of the measured block on ``arch`` (one GPU:
    no collective is ever priced)."""
    blocks, _ = _passes(arch, block_spec(r), 1, False, lambda kind, nbytes: 0.0)
    (forward, backward), = blocks.values()
    return forward, backward


def predicted(arch, r: dict[str, str]) -> tuple[float, float]:
    """CrossFlow's forward and backward seconds of the measured block on ``arch``."""
    forward, backward = block_passes(arch, r)
    return forward.total, backward.total


def _files():
    """(path, preset, rows) of every block timing file (not the kernel breakdowns)."""
    for path in sorted(measurements_dir().glob("gpu/torch_block_*.csv")):
        if not path.stem.startswith("torch_block_kernels_"):
            yield path, *read_preset_measurements(path)


def _rows(arch, rows: list[dict[str, str]]) -> list[Row]:
    out = []
    for r in rows:
        fwd, bwd = predicted(arch, r)
        experts = (f", {r['experts']} experts top-{r['topk']} ({r['expert_kernels']})"
                   if r["experts"] != "0" else "")
        label = (f"{r['block']} (b{r['micro_batch']} s{r['seq']} h{r['hidden']} "
                 f"{r['heads']}/{r['query_groups']} heads ffn {r['ffn']}{experts})")
        out += [Row(f"{label} forward", fwd, float(r["fwd_s"])),
                Row(f"{label} backward", bwd, float(r["bwd_s"]))]
    return out


def moe_rows() -> list[Row]:
    """The recorded (unchecked) mixture-of-experts rows of every file."""
    return [row for _, preset, rows in _files()
            for row in _rows(load_hardware(preset), [r for r in rows if r["experts"] != "0"])]


def block_datasets() -> list[DataSet]:
    sets = []
    eager = eager_passes()
    passes = ", ".join(f"{op} {v:g}" for op, v in eager.items())
    for path, preset, rows in _files():
        bare = load_hardware(preset)
        dense = [r for r in rows if r["experts"] == "0"]
        for arch, name, source in (
                (bare, "", "no software profile"),
                (replace(bare, memory_passes={**bare.memory_passes, **eager}),
                 ", PyTorch-eager passes",
                 f"memory passes {passes} from {EAGER_SYSTEM}, fitted to Vidur's A100 ops")):
            sets.append(DataSet(
                name=f"training: one transformer block, plain torch on GPU ({path.stem}{name})",
                source=f"{path.relative_to(measurements_dir())} on preset {preset}, {source}",
                quantity="time_s", rows=tuple(_rows(arch, dense)),
                max_mape=BLOCK_MAX_MAPE, min_spearman=BLOCK_MIN_SPEARMAN))
    return sets
