"""One iteration of a kernel / data / layer-parallel workload (paper §5 and §6.5).

The workload graph is sharded for one device (:func:`crossflow.parallel.local_graph`: RC
splits a GEMM's rows of A by kp1 and columns of B by kp2, CR splits K by kp1, data
parallelism splits the batch); each node is priced by the kernel model, followed by the
collective its kernel parallelism needs (RC: all-gather of the output blocks along kp2; CR:
reduce-scatter of the partial sums along kp1 — DeepFlow's distributed GEMM, ARCHITECTURE.md
§4).  Data- and kernel-parallel replicas run in lock step, so, as the paper argues (§6.5),
only the original graph is simulated, with the pipeline stages as resources and the
activations crossing a stage boundary as transfers.  After the last backward op, the
weight gradients are all-reduced over the data-parallel group and the optimizer runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from crossflow.arch.microarch import BYTES_PER_ELEMENT, MicroArch
from crossflow.sim.engine import After, Task, simulate
from crossflow.sim.pricing import node_cost

_PHASE_ORDER = {"fwd": 0, "recompute": 1, "bwd": 1, "optimizer": 2}


@dataclass(frozen=True)
class GraphResult:
    time_s: float
    breakdown: dict[str, float]
    flops_per_device: float
    memory_per_device_bytes: float
    memory_breakdown: dict[str, float]
    energy_per_device_J: float = 0.0
    detail: dict[str, object] = field(default_factory=dict)


def _kernel_collective(attrs, strategy, network) -> tuple[str, float]:
    """(dimension, seconds) of the collective a kernel-parallel GEMM shard ends with."""
    if attrs["op"] != "gemm":
        return "", 0.0
    out = attrs["m"] * attrs["n"] * attrs["count"] * BYTES_PER_ELEMENT[attrs["precision"]]
    if strategy.kp_type == "RC" and strategy.kp2 > 1:
        return "kp2", network.collective("all_gather", out * strategy.kp2, "kp2")
    if strategy.kp_type == "CR" and strategy.kp1 > 1:
        return "kp1", network.collective("reduce_scatter", out, "kp1")
    return "", 0.0


def _operand_bytes(attrs, b_is_weight: bool) -> float:
    """A GEMM's operands that are not stored weights (B is one when the model has any)."""
    if attrs["op"] != "gemm":
        return 0.0
    m, k, n = attrs["m"], attrs["k"], attrs["n"]
    elements = m * k + m * n + (0 if b_is_weight else k * n)
    return elements * attrs["count"] * BYTES_PER_ELEMENT[attrs["precision"]]


def graph_iteration(graph: nx.DiGraph, strategy, arch: MicroArch, network) -> GraphResult:
    """Predict one iteration of ``graph`` under ``strategy`` on devices like ``arch``."""
    from crossflow.parallel import local_graph

    lg = local_graph(graph, strategy)
    order = nx.lexicographical_topological_sort(
        lg, key=lambda n: (_PHASE_ORDER[lg.nodes[n]["phase"]], lg.nodes[n].get("step", 0),
                           lg.nodes[n]["layer"], str(n)))
    tasks: list[Task] = []
    compute = memory = kernel_comm = p2p_total = 0.0
    optimizer: dict[int, float] = {}
    wgrad: dict[int, float] = {}
    weights: dict[int, float] = {}
    flops = energy = 0.0
    for name in order:
        a = lg.nodes[name]
        stage = a["stage"]
        seconds, joules = node_cost(arch, a)
        energy += joules
        flops += a["flops"]
        weights[stage] = weights.get(stage, 0.0) + a["params"]
        if a["phase"] == "optimizer":
            optimizer[stage] = optimizer.get(stage, 0.0) + seconds
            continue
        wgrad[stage] = wgrad.get(stage, 0.0) + a["wgrad_elements"]
        _, comm = _kernel_collective(a, strategy, network)
        if a["op"] == "gemm":
            compute += seconds
        else:
            memory += seconds
        kernel_comm += comm
        deps = []
        for pred, _, e in lg.in_edges(name, data=True):
            if lg.nodes[pred]["phase"] == "optimizer":
                continue
            if e.get("cross") and e["kind"] in ("act", "grad"):
                lag = network.p2p(e["bytes"], "lp")
                p2p_total += lag
                deps.append(After(pred, lag))
            else:
                deps.append(pred)
        tasks.append(Task(name, stage, seconds + comm, tuple(deps),
                          kind="gemm" if a["op"] == "gemm" else "memory"))
    schedule = simulate(tasks)
    precision_bytes = BYTES_PER_ELEMENT[graph.graph["precision"]]
    dp_time = max((network.collective("all_reduce", n * precision_bytes, "dp")
                   for n in wgrad.values() if n), default=0.0) if strategy.dp > 1 else 0.0
    opt_time = max(optimizer.values(), default=0.0)
    total = schedule.makespan_s + dp_time + opt_time
    busiest = max((schedule.busy_s(s) for s in {t.resource for t in tasks}), default=0.0)
    stage_weights = max(weights.values(), default=0.0)
    activations = sum(e["bytes"] for _, _, e in lg.edges(data=True) if e["kind"] == "stash")
    # The largest single kernel's operands must be resident too (all of A, B and C when the
    # workload is a bare GEMM with no stored weights).
    has_weights = stage_weights > 0
    workspace = max((_operand_bytes(lg.nodes[n], has_weights) for n in lg.nodes), default=0.0)
    memory_breakdown = {
        "weights_bytes": stage_weights * precision_bytes,
        "gradients_bytes": stage_weights * precision_bytes,
        "activations_bytes": activations / max(1, len(weights)),
        "workspace_bytes": workspace,
    }
    return GraphResult(
        time_s=total,
        breakdown={
            "compute_s": compute,
            "memory_bound_s": memory,
            "kernel_parallel_comm_s": kernel_comm,
            "pipeline_bubble_s": schedule.makespan_s - busiest,
            "pp_p2p_s": p2p_total,
            "dp_allreduce_s": dp_time,
            "optimizer_s": opt_time,
        },
        flops_per_device=flops,
        memory_per_device_bytes=sum(memory_breakdown.values()),
        memory_breakdown=memory_breakdown,
        energy_per_device_J=energy,
        detail={"makespan_s": schedule.makespan_s, "tasks": len(tasks)},
    )
