"""How a transformer workload's Megatron execution options change what its kernels and host
cost (docs/model.md, "CUDA graphs and overlapped expert all-to-alls").

The system's software profile is fitted to runs without these options; each option below
replaces the part of the profile it makes untrue, and nothing else:

* ``cuda_graph_impl: full_iteration`` — the forward-backward of every micro-batch is one CUDA
  graph, replayed with one launch: no kernel, collective or pass waits for the host to
  issue it (the device's and the profile's per-kernel launch costs and the profile's
  per-op dispatch costs drop out).  The optimizer step stays outside the graph
  (Megatron-Core's ``FullCudaGraphWrapper``), so the profile's iteration tail stays.
* a graph that captures the MoE layers' experts (:func:`experts_captured`) — the
  profile's ``moe_efficiency``, the shortfall of the eager dropless MoE layer's many
  small, host-synchronised kernels, does not apply: the layer costs what its kernels cost.
* per-layer graphs (``cuda_graph_impl: local`` or ``transformer_engine``, of the
  ``cuda_graph_modules`` or of whole layers, :func:`graphed_ops`) — the captured kernels
  run without the device's per-kernel launch cost, and the host issues each captured run of
  them as one replay: one op's dispatch, not one per kernel.
* ``overlap_moe_expert_parallel_comm`` — Megatron-Core interleaves one micro-batch's forward
  with another's backward, each one's all-to-alls on a stream of their own beside the
  other's computation (with ``delay_wgrad_compute``, the weight gradients behind the
  combine): every all-to-all may hide, as far as the GEMM time lasts, in place of the
  profile's fitted share (``overlap.ep_comm``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache

from crossflow.config.megatron_options import experts_captured

#: The execution options of a transformer workload (the graph reads fp8_dot_product_attention)
OPTIONS = ("cuda_graph_impl", "cuda_graph_modules", "overlap_moe_expert_parallel_comm",
           "fp8_dot_product_attention")


def options_set(spec) -> dict:
    """The execution options ``spec`` sets (those not at their defaults), as a prediction's
    details report them."""
    fields = type(spec).model_fields
    return {k: list(v) if isinstance(v, tuple) else v for k in OPTIONS
            if (v := getattr(spec, k)) != fields[k].default}


def as_executed(arch, software, spec):
    """(device, software profile) as ``spec``'s execution options run them: the arguments
    themselves where the workload sets none of the options."""
    full = spec.cuda_graph_impl == "full_iteration"
    if full:
        arch = graph_replayed(arch)
    if software is None:
        return arch, None
    update = {}
    if full:
        update |= {"dispatch_s": 0.0, "backward_dispatch_s": 0.0, "collective_dispatch_s": 0.0,
                   "kernel_launch_s": 0.0}
    if spec.moe and experts_captured(spec):
        update["moe_efficiency"] = 1.0
    if spec.overlap_moe_expert_parallel_comm:
        update["overlap"] = software.overlap.model_copy(update={"ep_comm": 1.0})
    return arch, software.model_copy(update=update) if update else software


@lru_cache(maxsize=64)
def graph_replayed(arch):
    """The device without its per-kernel launch cost (one device per device, so kernel
    prices cached on it are shared by every prediction that replays a graph)."""
    return replace(arch, kernel_launch_s=0.0)


#: A layer's ops on its mixer's side of the residual (attention, MLA, a Mamba-2 mixer), by
#: the op a node's id names after its layer (``L0.qkv.dW``: ``qkv``); every other op of a
#: layer is on its feed-forward side (a dense MLP or an MoE layer).  Megatron-Core's
#: ``attn`` and ``mamba`` graphs capture the first side, ``mlp`` and ``moe`` the second
#: (TransformerLayer._forward_attention / _forward_mlp)
MIXER_OPS = frozenset({
    "ln1", "ln1_cast", "qkv", "qk_ln", "rope", "attn", "qk", "softmax", "attn_dropout", "av",
    "proj", "proj_cast", "proj_residual", "q_proj", "q_down", "q_ln", "q_up", "kv_down",
    "kv_ln", "kv_up", "in_proj", "conv1d", "ssd_chunk", "ssd_state", "mamba_norm", "out_cast",
    "out_proj"})
#: what ``moe_router`` captures of an MoE layer (up to the router: its norm, the router,
#: the shared expert) and ``moe_preprocess`` (the dispatcher's preprocessing: the tokens'
#: permutation into expert order)
ROUTER_OPS = frozenset({"ln2", "ln2_cast", "router", "router_topk", "aux_loss", "shared_fc1",
                        "shared_act", "shared_fc2"})
PREPROCESS_OPS = frozenset({"permute"})


def graphed_ops(spec, kind: str) -> Callable[[str], bool] | None:
    """Whether a per-layer CUDA graph captures an op (:data:`MIXER_OPS`' names) of a layer
    of ``kind`` (:attr:`~crossflow.config.workload.TransformerSpec.layer_kinds`' symbols);
    None where it captures none of them (no per-layer graphs, or none of this layer's
    modules; a full-iteration graph is :func:`as_executed`'s)."""
    if spec.cuda_graph_impl not in ("local", "transformer_engine"):
        return None
    modules = set(spec.cuda_graph_modules)
    mixer = "attn" if "*" in kind else "mamba" if "M" in kind else None
    ffn = "moe" if "E" in kind else "mlp" if "-" in kind else None
    whole = not modules
    mixer_on = mixer is not None and (whole or mixer in modules)
    ffn_on = ffn is not None and (whole or ffn in modules)
    parts = (ROUTER_OPS if ffn == "moe" and "moe_router" in modules else frozenset()) | (
        PREPROCESS_OPS if ffn == "moe" and "moe_preprocess" in modules else frozenset())
    if not (mixer_on or ffn_on or parts):
        return None

    def graphed(op: str) -> bool:
        return mixer_on if op in MIXER_OPS else ffn_on or op in parts

    return graphed
