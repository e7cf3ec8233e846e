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
from functools import lru_cache

import networkx as nx

from crossflow.arch.microarch import BYTES_PER_ELEMENT, MicroArch
from crossflow.parallel.supergraph import shard_graph
from crossflow.sim.pricing import kernel_key, node_cost_key

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


def _kernel_collective_key(attrs, strategy) -> tuple[str, float, str] | None:
    """``(kind, bytes, dim)`` of the collective a kernel-parallel GEMM shard ends with."""
    if attrs["op"] != "gemm":
        return None
    out = attrs["m"] * attrs["n"] * attrs["count"] * BYTES_PER_ELEMENT[attrs["precision"]]
    if strategy.kp_type == "RC" and strategy.kp2 > 1:
        return "all_gather", out * strategy.kp2, "kp2"
    if strategy.kp_type == "CR" and strategy.kp1 > 1:
        return "reduce_scatter", out, "kp1"
    return None


def _operand_bytes(attrs, b_is_weight: bool) -> float:
    """A GEMM's operands that are not stored weights (B is one when the model has any)."""
    if attrs["op"] != "gemm":
        return 0.0
    m, k, n = attrs["m"], attrs["k"], attrs["n"]
    elements = m * k + m * n + (0 if b_is_weight else k * n)
    return elements * attrs["count"] * BYTES_PER_ELEMENT[attrs["precision"]]


def graph_iteration(graph: nx.DiGraph, strategy, arch: MicroArch, network) -> GraphResult:
    """Predict one iteration of ``graph`` under ``strategy`` on devices like ``arch``.

    The chip-independent part (the sharded graph in schedule order, its distinct kernels and
    transfers, the memory per device) is compiled once per (graph, strategy) by
    :func:`graph_plan`; what remains here is pricing those kernels on ``arch`` (cached per
    device), the transfers on ``network`` and one pass of the scheduler.
    """
    return graph_plan(graph, strategy).run(arch, network)


@dataclass(frozen=True, eq=False)
class GraphPlan:
    """What one iteration of a graph under a strategy needs, independent of the chip and of
    the mapping (see :func:`graph_plan`).

    Nodes are kept in the order the simulator submits them (phase, step, layer, name), and
    every sum below adds the same numbers in the same order as walking the sharded graph
    does, so a prediction is the same to the last bit whichever way it is computed.
    """

    strategy: object
    #: distinct kernels ``(op, sharded shape, precision)`` (priced once per device)
    kernels: tuple[tuple, ...]
    #: distinct kernel-parallel collectives ``(kind, bytes, dim)`` ending a GEMM shard
    collectives: tuple[tuple[str, float, str], ...]
    #: distinct bytes of the point-to-point transfers between pipeline stages
    p2p_bytes: tuple[float, ...]
    #: every node in order: its kernel (energy is summed over all nodes, optimizer included)
    node_kernels: tuple[int, ...]
    #: optimizer nodes in order: ``(stage, kernel)``
    optimizer: tuple[tuple[object, int], ...]
    #: simulated tasks in order: ``(kernel, collective or -1, is a GEMM, stage,
    #: deps as (task, p2p transfer or -1))``
    tasks: tuple[tuple[int, int, bool, object, tuple[tuple[int, int], ...]], ...]
    #: the p2p transfers in the order their times are summed into ``pp_p2p_s``
    p2p_order: tuple[int, ...]
    #: bytes of each stage's weight-gradient all-reduce over dp (empty when dp == 1)
    dp_bytes: tuple[float, ...]
    flops_per_device: float
    memory_breakdown: dict[str, float]

    @property
    def memory_per_device_bytes(self) -> float:
        return sum(self.memory_breakdown.values())

    def run(self, arch: MicroArch, network) -> GraphResult:
        """Price the plan on ``arch`` with the transfers of ``network`` and simulate it."""
        prices = [node_cost_key(arch, key) for key in self.kernels]
        coll = [network.collective(*c) for c in self.collectives]
        lags = [network.p2p(b, "lp") for b in self.p2p_bytes]
        energy = 0.0
        for k in self.node_kernels:
            energy += prices[k][1]
        optimizer: dict = {}
        for stage, k in self.optimizer:
            optimizer[stage] = optimizer.get(stage, 0.0) + prices[k][0]
        # One pass in submission order is the event-driven schedule of
        # crossflow.sim.engine.simulate: a stage runs its tasks in that order, and every
        # dependency comes earlier in it, so each start is max(stage free, inputs arrived).
        compute = memory = kernel_comm = 0.0
        end: list[float] = []
        durations: list[float] = []
        free: dict = {}
        for kernel, c, is_gemm, stage, deps in self.tasks:
            seconds = prices[kernel][0]
            comm = coll[c] if c >= 0 else 0.0
            if is_gemm:
                compute += seconds
            else:
                memory += seconds
            kernel_comm += comm
            duration = seconds + comm
            ready = free.get(stage, 0.0)
            for task, lag in deps:
                done = end[task] + lags[lag] if lag >= 0 else end[task]
                if done > ready:
                    ready = done
            finish = ready + duration
            end.append(finish)
            durations.append(duration)
            free[stage] = finish
        p2p_total = 0.0
        for lag in self.p2p_order:
            p2p_total += lags[lag]
        makespan = max(end, default=0.0)
        dp_time = max((network.collective("all_reduce", b, "dp") for b in self.dp_bytes),
                      default=0.0)
        opt_time = max(optimizer.values(), default=0.0)
        total = makespan + dp_time + opt_time
        busiest = max((sum(d for d, t in zip(durations, self.tasks, strict=True) if t[3] == s)
                       for s in free), default=0.0)
        return GraphResult(
            time_s=total,
            breakdown={
                "compute_s": compute,
                "memory_bound_s": memory,
                "kernel_parallel_comm_s": kernel_comm,
                "pipeline_bubble_s": makespan - busiest,
                "pp_p2p_s": p2p_total,
                "dp_allreduce_s": dp_time,
                "optimizer_s": opt_time,
            },
            flops_per_device=self.flops_per_device,
            memory_per_device_bytes=self.memory_per_device_bytes,
            memory_breakdown=dict(self.memory_breakdown),
            energy_per_device_J=energy,
            detail={"makespan_s": makespan, "tasks": len(self.tasks)},
        )


@lru_cache(maxsize=64)
def schedule_order(graph: nx.DiGraph) -> tuple:
    """The nodes in the order the simulator submits them: phase (forward, backward,
    optimizer), step, layer, name, as a topological order.  Sharding changes neither the
    edges nor these keys, so one order serves every strategy (cached per graph object)."""
    nodes = graph.nodes
    return tuple(nx.lexicographical_topological_sort(
        graph, key=lambda n: (_PHASE_ORDER[nodes[n]["phase"]], nodes[n].get("step", 0),
                              nodes[n]["layer"], str(n))))


@lru_cache(maxsize=1024)
def graph_plan(graph: nx.DiGraph, strategy) -> GraphPlan:
    """Compile ``graph`` sharded by ``strategy`` (cached per graph object and strategy).

    Everything here is independent of the chip and of the device mapping: the schedule order
    (:func:`schedule_order`), each node's kernel, the collectives and transfers it needs,
    and the bytes each device holds (:func:`graph_memory`).  A study prices the same few
    strategies on thousands of chips, and a screen prices every strategy and mapping order
    on one chip: both reuse the plan.  It reads the shards of
    :func:`crossflow.parallel.supergraph.shard_graph` (what ``local_graph`` holds) without
    building a networkx graph: a node's dependencies are its in-edges in the order
    ``local_graph`` adds them.
    """
    shards, edges, _ = shard_graph(graph, strategy)
    preds: dict = {}
    for u, v, e in edges:
        preds.setdefault(v, []).append((u, e))
    kernels: dict[tuple, int] = {}
    collectives: dict[tuple, int] = {}
    p2p: dict[float, int] = {}
    node_kernels, optimizer, tasks, p2p_order = [], [], [], []
    index: dict = {}
    wgrad: dict = {}
    flops = 0.0
    for name in schedule_order(graph):
        a = shards[name]
        stage = a["stage"]
        k = kernels.setdefault(kernel_key(a), len(kernels))
        node_kernels.append(k)
        flops += a["flops"]
        if a["phase"] == "optimizer":
            optimizer.append((stage, k))
            continue
        wgrad[stage] = wgrad.get(stage, 0.0) + a["wgrad_elements"]
        c = _kernel_collective_key(a, strategy)
        c = -1 if c is None else collectives.setdefault(c, len(collectives))
        deps = []
        for pred, e in preds.get(name, ()):
            if shards[pred]["phase"] == "optimizer":
                continue
            if e.get("cross") and e["kind"] in ("act", "grad"):
                lag = p2p.setdefault(e["bytes"], len(p2p))
                p2p_order.append(lag)
                deps.append((index[pred], lag))
            else:
                deps.append((index[pred], -1))
        index[name] = len(tasks)
        tasks.append((k, c, a["op"] == "gemm", stage, tuple(deps)))
    precision_bytes = BYTES_PER_ELEMENT[graph.graph["precision"]]
    dp_bytes = tuple(n * precision_bytes for n in wgrad.values() if n) if strategy.dp > 1 else ()
    return GraphPlan(strategy, tuple(kernels), tuple(collectives), tuple(p2p),
                     tuple(node_kernels), tuple(optimizer), tuple(tasks), tuple(p2p_order),
                     dp_bytes, flops, graph_memory(graph, strategy))


@lru_cache(maxsize=4096)
def graph_memory(graph: nx.DiGraph, strategy) -> dict[str, float]:
    """Bytes per device of ``graph`` under ``strategy``: the busiest stage's weights and
    gradients, the stashed activations per stage, and the largest kernel's operands (cached
    per graph object and strategy; no kernel is priced)."""
    shards, edges, _ = shard_graph(graph, strategy)
    weights: dict = {}
    for name in schedule_order(graph):
        a = shards[name]
        weights[a["stage"]] = weights.get(a["stage"], 0.0) + a["params"]
    precision_bytes = BYTES_PER_ELEMENT[graph.graph["precision"]]
    stage_weights = max(weights.values(), default=0.0)
    activations = sum(e["bytes"] for _, _, e in edges if e["kind"] == "stash")
    # The largest single kernel's operands must be resident too (all of A, B and C when the
    # workload is a bare GEMM with no stored weights).
    has_weights = stage_weights > 0
    workspace = max((_operand_bytes(a, has_weights) for a in shards.values()), default=0.0)
    return {
        "weights_bytes": stage_weights * precision_bytes,
        "gradients_bytes": stage_weights * precision_bytes,
        "activations_bytes": activations / max(1, len(weights)),
        "workspace_bytes": workspace,
    }
