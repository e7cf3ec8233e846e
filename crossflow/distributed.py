"""Distributed predictions: a workload, a parallelism strategy and a system (DESIGN.md §4).

The facade :func:`crossflow.predict` calls :func:`predict_distributed` for LSTM and
transformer workloads and for a GEMM given a strategy.  It builds the system, maps the
strategy's (kp1, kp2, dp, lp) grid onto it in one order of the four dimensions — or in all
24 (``mapping_order="best"``) keeping the fastest — and runs the simulator for the workload.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from typing import Any

from crossflow.arch.microarch import MicroArch
from crossflow.config.loader import load_spec
from crossflow.errors import ConfigError, InfeasibleDesignError
from crossflow.predict import Prediction, infeasible


class _Local:
    """A one-device 'network': every collective and transfer is free (nothing to send)."""

    def collective(self, kind: str, nbytes: float, dim: str) -> float:
        return 0.0

    def p2p(self, nbytes: float, dim: str) -> float:
        return 0.0


def with_software(arch: MicroArch, software) -> MicroArch:
    """The device as the system's training framework drives it: fitted efficiencies, the
    minimum kernel time and the memory passes of its memory-bound ops.  Profiles that differ
    only in host constants give the same (cached) device, so kernel prices are shared."""
    if software is None:
        return arch
    return _device(arch, software.gemm_efficiency, software.memory_bound_efficiency,
                   software.kernel_min_s, tuple(software.memory_passes.model_dump().items()))


@lru_cache(maxsize=256)
def _device(arch: MicroArch, gemm_efficiency: float, memory_bound_efficiency: float,
            kernel_min_s: float, memory_passes: tuple) -> MicroArch:
    return replace(arch, compute_efficiency=gemm_efficiency,
                   memory_bound_efficiency=memory_bound_efficiency,
                   kernel_min_s=kernel_min_s, memory_passes=dict(memory_passes))


def _parallelism_spec(source):
    """A ParallelismSpec from a spec, preset, file, dict — or a bare strategy string such as
    ``RC-4-2-d32-p2`` or ``t8-d24-p8`` (paper / Megatron names, :mod:`crossflow.parallel`)."""
    from crossflow.parallel import ParallelismSpec, Strategy

    if isinstance(source, ParallelismSpec):
        return source
    try:
        return load_spec(source, "parallelism")
    except ConfigError as not_a_preset:
        if not isinstance(source, str) or source.endswith((".yaml", ".yml")):
            raise
        try:
            Strategy.parse(source)
        except ConfigError as bad:
            raise ConfigError(
                "neither a parallelism preset, a file, nor a strategy name",
                key="parallelism", value=source,
                allowed=f"{not_a_preset.allowed}; or a strategy: {bad.allowed}",
            ) from None
        return load_spec({"kind": "parallelism", "strategy": source}, "parallelism")


def _strategy(spec, parallelism):
    from crossflow.parallel import Strategy, check_strategy

    if parallelism is None:
        par = None
        strategy = Strategy.megatron() if spec.kind == "transformer" else Strategy()
    else:
        par = _parallelism_spec(parallelism)
        strategy = par.to_strategy()
        if par.micro_batch_size and spec.kind == "transformer":
            spec = spec.model_copy(update={"micro_batch_size": par.micro_batch_size})
    check_strategy(spec, strategy)
    return spec, strategy, par


def predict_distributed(spec, arch: MicroArch, *, system: Any = None, parallelism: Any = None,
                        mapping_order: str | None = None) -> Prediction:
    spec, strategy, par = _strategy(spec, parallelism)
    devices = strategy.devices
    if system is None:
        if devices > 1:
            raise ConfigError(
                f"the strategy {strategy} needs {devices} devices: give a --system",
                key="system", value=None, allowed="a system preset or YAML file",
            )
        networks = [("local", _Local())]
        software = None
    else:
        from crossflow.system import DIMS, ORDERS, build_system, parse_order
        from crossflow.system.network import MappedNetwork

        sys_spec = system if hasattr(system, "devices_per_node") else load_spec(
            system, "systems")
        if devices > sys_spec.num_devices:
            raise ConfigError(
                f"the strategy {strategy} needs {devices} devices but system "
                f"{sys_spec.name} has {sys_spec.num_devices}", key="parallelism",
                value=str(strategy), allowed=f"strategies of at most {sys_spec.num_devices} "
                "devices (or a system with more nodes)")
        nodes = math.ceil(devices / sys_spec.devices_per_node)
        built = build_system(sys_spec, arch, num_nodes=nodes)
        if mapping_order == "best":
            orders = ORDERS
        else:
            orders = (parse_order(mapping_order) if mapping_order else DIMS,)
        networks = [("-".join(o), MappedNetwork(built.map(strategy.grid, o))) for o in orders]
        software = sys_spec.software
    run_arch = with_software(arch, software)

    best: Prediction | None = None
    for order, network in networks:
        try:
            p = _run(spec, strategy, par, run_arch, network, devices, software)
        except InfeasibleDesignError as exc:
            return infeasible(spec, arch.name, str(exc), exc.memory_bytes)
        p.details["mapping_order"] = order
        if best is None or p.time_s < best.time_s:
            best = p
    assert best is not None
    if mapping_order == "best":
        best.details["mapping_orders_tried"] = len(networks)
    return best


def _run(spec, strategy, par, arch: MicroArch, network, devices: int,
         software=None) -> Prediction:
    if spec.kind == "transformer":
        return _transformer(spec, strategy, par, arch, network, devices, software)
    return _graph(spec, strategy, arch, network, devices)


def _transformer(spec, strategy, par, arch, network, devices, software=None) -> Prediction:
    from crossflow.sim.training import transformer_iteration

    r = transformer_iteration(
        spec, arch, network, tp=strategy.tp, pp=strategy.pp, dp=strategy.dp, vp=strategy.vp,
        sp=strategy.sp, schedule=par.schedule if par else "1f1b",
        zero1=par.zero1 if par else False,
        overlap_grad_reduce=par.overlap_grad_reduce if par else False, software=software,
    )
    return _prediction(
        spec, arch, strategy, devices, time_s=r.time_s, breakdown=r.breakdown,
        memory=r.memory_breakdown, energy_J=r.energy_J,
        hardware_flops=r.hardware_flops_per_iteration, model_flops=r.flops_per_iteration,
        details={"microbatches": r.microbatches, "micro_batch_size": spec.micro_batch_size,
                 "model_flops_per_iteration": r.flops_per_iteration, **r.detail},
    )


def _graph(spec, strategy, arch, network, devices) -> Prediction:
    from crossflow.sim.graph_sim import graph_iteration
    from crossflow.sim.memory import check_capacity
    from crossflow.workloads import compute_graph

    r = graph_iteration(compute_graph(spec), strategy, arch, network)
    check_capacity(arch, r.memory_breakdown)
    flops = r.flops_per_device * devices  # replicas and shards run the same work
    return _prediction(
        spec, arch, strategy, devices, time_s=r.time_s, breakdown=r.breakdown,
        memory=r.memory_breakdown, energy_J=r.energy_per_device_J * devices,
        hardware_flops=flops, model_flops=flops, details=r.detail,
    )


def _prediction(spec, arch, strategy, devices, *, time_s, breakdown, memory, energy_J,
                hardware_flops, model_flops, details) -> Prediction:
    """A feasible distributed Prediction: per-device rates, MFU, the largest component."""
    peak = arch.peak_flops[spec.precision]
    breakdown = dict(breakdown)
    return Prediction(
        workload=spec.name,
        hardware=arch.name,
        time_s=time_s,
        feasible=True,
        memory_per_device_bytes=sum(memory.values()),
        bottleneck=max(breakdown, key=breakdown.get).removesuffix("_s"),
        breakdown=breakdown,
        achieved_flops_per_s=hardware_flops / (time_s * devices),
        energy_J=energy_J,
        details={
            "strategy": str(strategy),
            "devices": devices,
            "model_flops_utilization": model_flops / (time_s * devices * peak),
            "memory_breakdown": dict(memory),
            **details,
        },
    )
