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
* ``overlap_moe_expert_parallel_comm`` — Megatron-Core interleaves one micro-batch's forward
  with another's backward, each one's all-to-alls on a stream of their own beside the
  other's computation (with ``delay_wgrad_compute``, the weight gradients behind the
  combine): every all-to-all may hide, as far as the GEMM time lasts, in place of the
  profile's fitted share (``overlap.ep_comm``).
"""

from __future__ import annotations

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
        arch = _graph_replayed(arch)
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
def _graph_replayed(arch):
    """The device without its per-kernel launch cost (one device per device, so kernel
    prices cached on it are shared by every prediction that replays a graph)."""
    return replace(arch, kernel_launch_s=0.0)
