"""Distributed predictions: a workload, a parallelism strategy and a system
(docs/architecture.md, "Data flow of one prediction").

The facade :func:`crossflow.predict` calls :func:`predict_distributed` for LSTM and
transformer workloads and for a GEMM given a strategy.  It builds the system, maps the
strategy's (kp1, kp2, dp, lp) grid onto it in one order of the four dimensions — or in all
24 (``mapping_order="best"``, one per class of equivalent orders) keeping the fastest — and
runs the simulator for the workload.

For searches: :func:`memory_check` gives the memory verdict without pricing a kernel (the
full prediction runs it first, so a design over capacity costs microseconds), and
:func:`predict_many` prices many (strategy, mapping order) candidates on one chip at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from crossflow.arch.hardware import load_hardware
from crossflow.arch.microarch import MicroArch
from crossflow.config.attention_window import window_details
from crossflow.config.loader import load_spec
from crossflow.config.megatron_options import check_context_parallel
from crossflow.config.system import MAX_DEVICES, SWITCHED
from crossflow.errors import ConfigError, InfeasibleDesignError
from crossflow.parallel import Strategy, check_strategy, parse_parallelism
from crossflow.parallel.spec import LAYOUT_GRAMMAR, parse_pipeline_layout
from crossflow.prediction import Prediction, infeasible
from crossflow.sim.execution import options_set
from crossflow.sim.graph_sim import graph_iteration, graph_memory
from crossflow.sim.memory import capacity_problem, check_capacity
from crossflow.sim.training import grad_bytes, transformer_iteration
from crossflow.sim.training_memory import stage_memory, stage_name
from crossflow.system import DIMS, ORDERS, build_system, order_classes, parse_order
from crossflow.system.network import MappedNetwork
from crossflow.workloads import compute_graph
from crossflow.workloads.transformer import attention_backend


class _Local:
    """A one-device 'network': every collective and transfer is free (nothing to send)."""

    def collective(self, kind: str, nbytes: float, dim: str) -> float:
        return 0.0

    def p2p(self, nbytes: float, dim: str) -> float:
        return 0.0

    def all_to_all(self, nbytes: float, size: int, stride: int = 1, copies=None) -> float:
        return 0.0

    def expert_tensor(self, kind: str, nbytes: float, size: int) -> float:
        return 0.0


def with_software(arch: MicroArch, software) -> MicroArch:
    """The device as the system's training framework drives it: fitted efficiencies, the
    minimum kernel time and the memory passes of its memory-bound ops.  Profiles that differ
    only in host constants give the same (cached) device, so kernel prices are shared."""
    if software is None:
        return arch
    return _device(arch, software.gemm_efficiency, software.memory_bound_efficiency,
                   software.kernel_min_s, tuple(software.memory_passes.model_dump().items()),
                   software.attention_efficiency, software.fp8_gemm_efficiency,
                   software.fp4_gemm_efficiency)


@lru_cache(maxsize=256)
def _device(arch: MicroArch, gemm_efficiency: float, memory_bound_efficiency: float,
            kernel_min_s: float, memory_passes: tuple, attention_efficiency: float | None = None,
            fp8_gemm_efficiency: float | None = None,
            fp4_gemm_efficiency: float | None = None) -> MicroArch:
    fp4_gemm_efficiency = fp4_gemm_efficiency or fp8_gemm_efficiency
    quantized = {"fp8": fp8_gemm_efficiency, "fp4": fp4_gemm_efficiency}
    return replace(arch, compute_efficiency=gemm_efficiency,
                   memory_bound_efficiency=memory_bound_efficiency,
                   kernel_min_s=kernel_min_s, memory_passes=dict(memory_passes),
                   attention_efficiency=attention_efficiency,
                   precision_efficiency={p: e for p, e in quantized.items() if e})


@lru_cache(maxsize=256)
def _with_attention(spec, backend: str):
    """The workload with the software profile's attention kernel where it chose none."""
    return spec.model_copy(update={"attention_backend": backend})


@lru_cache(maxsize=4096)
def _cached_parallelism(key: tuple) -> Any:
    """A validated ParallelismSpec per distinct dict, so the batch path and a study's many
    trials with the same options do not re-validate the same few specs."""
    return parse_parallelism(dict(key))


def _strategy(spec, parallelism):
    """The workload (with the parallelism's micro-batch and recompute mode), the strategy
    and the parallelism spec, checked against each other.  A degree that does not fit the
    workload is an error of the parallelism's file (every key these checks name is one of
    its keys), so it names that file where there is one."""
    par = None if parallelism is None else _parsed(parallelism)
    try:
        return _fitted(spec, par)
    except ConfigError as exc:
        if par is not None and par.source_file:
            raise exc.with_file(par.source_file) from None
        raise


def _parsed(parallelism):
    if isinstance(parallelism, Mapping):
        try:
            key = tuple(sorted(parallelism.items()))
            hash(key)
        except TypeError:  # nested or unhashable values: validate as given
            key = None
        if key is not None:
            return _cached_parallelism(key)
    return parse_parallelism(parallelism)


def _fitted(spec, par):
    if par is None:
        strategy = Strategy.megatron() if spec.kind == "transformer" else Strategy()
    else:
        strategy = par.to_strategy()
        if par.micro_batch_size and spec.kind == "transformer":
            spec = _with_micro_batch(spec, par.micro_batch_size)
        given = tuple((k, getattr(par, k)) for k in RECOMPUTE_KEYS
                      if getattr(par, k) is not None)
        if spec.kind == "transformer" and given:
            spec = _with_recompute(spec, given)
        check_context_parallel(spec, par.context_parallel)
        _check_experts(spec, par, strategy)
    checked, cp = spec, 1
    if par is not None and par.pipeline_model_parallel_layout is not None:
        _check_layout_fits(spec, par)
    if par is not None and spec.kind == "transformer":
        cp = par.context_parallel
        if _split(spec, par) is not None:
            # an uneven split holds the layers as its options say (chunk_split checked
            # them); what the strategy check asks of an even one does not apply
            checked = _with_layers(spec, strategy.pp * strategy.vp)
    # the grid's d is data × context; the workload's batch is split over the data ranks only
    check_strategy(checked, replace(strategy, dp=strategy.dp // cp) if cp > 1 else strategy)
    return spec, strategy, par


def _split(spec, par) -> tuple[int, ...] | None:
    """The decoder layers per pipeline chunk of ``par``'s uneven split (None: even)."""
    return par.chunk_split(spec.num_layers) if par is not None and par.uneven_pipeline else None


def _check_layout_fits(spec, par) -> None:
    """The pipeline layout holds the workload's decoder layers and MTP depths (Megatron-
    Core's ``validate_layer_layout``)."""
    layout = parse_pipeline_layout(par.pipeline_model_parallel_layout)
    have = (getattr(spec, "num_layers", None), getattr(spec, "mtp_num_layers", 0))
    if spec.kind != "transformer" or (sum(layout.decoder), layout.mtp) != have:
        raise ConfigError(
            f"the layout holds {sum(layout.decoder)} decoder layer(s) (t) and {layout.mtp} "
            f"MTP depth(s) (m); the workload has "
            + (f"num_layers {have[0]} and mtp_num_layers {have[1]}"
               if spec.kind == "transformer" else
               f"no layers (a {spec.kind})"),
            key="pipeline_model_parallel_layout", value=par.pipeline_model_parallel_layout,
            allowed=f"num_layers t and mtp_num_layers m ({LAYOUT_GRAMMAR})")


def _check_experts(spec, par, strategy) -> None:
    """Expert parallelism needs MoE layers whose experts it divides, expert tensor
    parallelism MoE layers whose experts' inner width it divides; an MoE layer under
    tensor parallelism needs sequence parallelism (Megatron-LM's arguments.py: "When using
    expert parallelism and tensor parallelism, sequence parallelism must be used")."""
    ep, etp = par.expert_parallel, par.expert_tensor_parallel
    moe = spec.kind == "transformer" and spec.moe
    for key, degree, what in (("expert_parallel", ep, "expert parallelism"),
                              ("expert_tensor_parallel", etp, "expert tensor parallelism")):
        if degree > 1 and not moe:
            raise ConfigError(f"{what} splits the experts of MoE layers, and the workload "
                              f"{spec.name!r} has none", key=key, value=degree,
                              allowed="1 (or a workload with num_moe_experts)")
    if moe and spec.num_moe_experts % ep:
        raise ConfigError(
            f"each expert-parallel rank holds the same number of experts, so expert_parallel "
            f"must divide the workload's num_moe_experts ({spec.num_moe_experts})",
            key="expert_parallel", value=ep,
            allowed=f"a divisor of {spec.num_moe_experts}")
    if moe and spec.moe_ffn % etp:
        # Megatron-Core's grouped expert GEMMs divide fc1's output and fc2's input width by
        # the expert-tensor-parallel size (TEGroupedLinear: megatron.core.utils.divide,
        # which asserts it divides)
        raise ConfigError(
            f"each expert-tensor-parallel rank holds an equal slice of every expert's inner "
            f"width, so expert_tensor_parallel must divide the workload's "
            f"moe_ffn_hidden_size ({spec.moe_ffn})", key="expert_tensor_parallel",
            value=etp, allowed="a divisor of " + str(spec.moe_ffn))
    if moe and etp > 1 and spec.moe_token_dispatcher_type == "flex":
        raise ConfigError(
            "the flex dispatcher (DeepEP, HybridEP) under expert tensor parallelism is not "
            "modelled: it dispatches over the expert-tensor and expert-parallel ranks "
            "together", key="expert_tensor_parallel", value=etp,
            allowed="1 with moe_token_dispatcher_type: flex")
    if moe and strategy.tp > 1 and not strategy.sp:
        raise ConfigError(
            "an MoE model under tensor parallelism needs sequence parallelism (Megatron-LM "
            "refuses expert and tensor parallelism without it; the experts take each tensor "
            "rank's share of the tokens)", key="sequence_parallel",
            value=strategy.sp, allowed="true when tensor_parallel > 1")


@lru_cache(maxsize=256)
def _with_layers(spec, layers: int):
    return spec.model_copy(update={"num_layers": layers})


#: the parallelism's keys that override the workload's recomputation (Megatron's names; the
#: granularity is the workload's ``activation_recompute``)
RECOMPUTE_KEYS = ("recompute_granularity", "recompute_modules", "recompute_method",
                  "recompute_num_layers")


@lru_cache(maxsize=256)
def _with_recompute(spec, given: tuple[tuple[str, object], ...]):
    """The workload under the parallelism's recomputation keys: a granularity keeps the
    workload's modules (selective) or method and layers (full) where it allows them and
    drops them where not; modules, a method or layers the parallelism names are checked
    against the model as a workload's are."""
    update = {("activation_recompute" if k == "recompute_granularity" else k): v
              for k, v in given}
    mode = update.get("activation_recompute", spec.activation_recompute)
    update["activation_recompute"] = mode
    for key, kept_under in (("recompute_modules", "selective"), ("recompute_method", "full"),
                            ("recompute_num_layers", "full")):
        if key not in update and mode != kept_under:
            update[key] = None
    if all(k == "recompute_granularity" for k, _ in given):  # nothing new to check
        return spec.model_copy(update=update)
    return type(spec).model_validate({**dict(spec), **update})


@lru_cache(maxsize=256)
def _with_micro_batch(spec, micro_batch_size: int):
    return spec.model_copy(update={"micro_batch_size": micro_batch_size})


@dataclass(frozen=True)
class MemoryCheck:
    """The memory verdict of a (workload, device, parallelism) without pricing a kernel.

    Attributes:
        feasible: whether the bytes per device fit the device's main memory.
        need_bytes: bytes resident on one device (the sum of ``breakdown``).
        capacity_bytes: the main memory's capacity.
        reason: the message the full prediction gives when it does not fit, else None.
        breakdown: bytes per component (weights, gradients, activations, …).
    """

    feasible: bool
    need_bytes: float
    capacity_bytes: float
    reason: str | None
    breakdown: Mapping[str, float] = field(default_factory=dict)


def memory_check(workload: Any, arch: Any, parallelism: Any = None,
                 system: Any = None) -> MemoryCheck:
    """Whether ``workload`` under ``parallelism`` fits the memory of devices like ``arch``.

    The bytes per device depend on the workload and the strategy only (not on the chip's
    speeds, the system or the mapping order), so they come from the chip-independent plan
    the full prediction uses (:func:`crossflow.sim.graph_sim.graph_memory`, or
    :func:`crossflow.sim.training_memory.stage_memory`), cached per strategy: a check costs
    microseconds and agrees exactly with :func:`crossflow.predict`'s memory verdict, which
    runs this check first.  Raises ConfigError for a strategy that does not fit the workload.

    Args:
        workload: a workload spec, preset name, file or dict (LSTM, transformer, or a GEMM
            with a strategy).
        arch: a MicroArch, or a hardware preset / template (as ``crossflow.predict`` takes).
        parallelism: a strategy name (``"RC-32-16-d1-p1"``), a parallelism spec, preset,
            file or dict; None: one device.
        system: the system the design runs in (a spec or preset name), as
            :func:`predict_many` takes it: its software stack sets the attention kernel
            (FlashAttention keeps no score matrix) and the gradients' precision, so the
            verdict is the prediction's; None: the device alone, no software stack.
    """
    spec = workload if hasattr(workload, "kind") and hasattr(workload, "name") else load_spec(
        workload, "workloads")
    batch = _Batch(spec, load_hardware(arch), system)
    return batch.memory(*_strategy(batch.spec, parallelism))


def _memory_breakdown(spec, strategy, par, software=None
                      ) -> tuple[str | None, dict[str, float]]:
    """(the pipeline stage a message names, or None; bytes per component) of the fullest
    device."""
    if spec.kind == "transformer":
        cp = par.context_parallel if par else 1
        stage, memory = stage_memory(
            spec, tp=strategy.tp, pp=strategy.pp, dp=strategy.dp // cp, vp=strategy.vp,
            sp=strategy.sp, schedule=par.schedule if par else "1f1b",
            zero1=par.sharded_optimizer if par else False, grad_bytes=grad_bytes(software),
            fsdp=par.fsdp if par else "",
            cp=cp, split=_split(spec, par),
            ep=par.expert_parallel if par else 1,
            etp=par.expert_tensor_parallel if par else 1)
        return stage_name(stage, strategy.pp), memory
    if spec.kind == "lstm" and spec.seq_length > 2 * _SHORT_UNROLL:
        # Every quantity of graph_memory is affine in the sequence length once it is
        # past a few steps (weights are shared over time, the largest kernel is the same,
        # stashed activations grow by one step's worth per step): two short unrolls give
        # it exactly, in milliseconds, however long the sequence (tests/test_faults_size.py
        # checks the equality against the full graph)
        a, b = (graph_memory(compute_graph(spec.model_copy(update={"seq_length": n})),
                             strategy) for n in (_SHORT_UNROLL, 2 * _SHORT_UNROLL))
        steps = (spec.seq_length - _SHORT_UNROLL) / _SHORT_UNROLL
        return None, {k: a[k] + steps * (b[k] - a[k]) for k in a}
    return None, graph_memory(compute_graph(spec), strategy)


#: The short unroll (time steps) the LSTM memory of a long sequence is extrapolated from.
_SHORT_UNROLL = 16


def _memory_check(spec, strategy, par, arch: MicroArch, software=None) -> MemoryCheck:
    where, breakdown = _memory_breakdown(spec, strategy, par, software)
    need = sum(breakdown.values())
    reason = capacity_problem(arch, breakdown, where)
    return MemoryCheck(reason is None, need, arch.main_memory.total_capacity_B, reason,
                       dict(breakdown))


#: ``Prediction.details["rejected_by"]`` of a design the memory check rejected (no kernel
#: was priced, nothing simulated).
MEMORY_CHECK = "memory_check"


class _Batch:
    """One workload on one device model in one system: what every candidate shares.

    Built once per :func:`predict_distributed` call, or once for all the candidates of a
    :func:`predict_many` call; the systems (one per node count) are built once per batch,
    and the kernel prices are shared through the price cache of the device object.
    """

    def __init__(self, spec, arch: MicroArch, system: Any) -> None:
        self.spec, self.arch = spec, arch
        self.sys_spec = None
        self.software = None   # the system's software stack, if it has one
        self.run_arch = arch
        self._systems: dict[int, Any] = {}
        if system is not None:
            self.sys_spec = system if hasattr(system, "devices_per_node") else load_spec(
                system, "systems")
            software = self.software = self.sys_spec.software
            self.run_arch = with_software(arch, software)
            if (software is not None and spec.kind == "transformer"
                    and spec.attention_backend is None):
                self.spec = _with_attention(spec, software.attention)
        if spec.kind == "transformer":
            try:  # the attention kernel is settled here: refuse what it cannot run, now
                attention_backend(self.spec)
            except ConfigError as exc:
                raise exc.with_file(spec.source_file) if spec.source_file else exc from None

    def memory(self, spec, strategy, par) -> MemoryCheck:
        """The memory verdict of one candidate (``spec, strategy, par`` as
        :func:`_strategy` gives them from this batch's spec) on this batch's device."""
        return _memory_check(spec, strategy, par, self.run_arch, self.software)

    def _system(self, nodes: int, strategy) -> Any:
        """The system cut down to the ``nodes`` the strategy needs.  A system whose network
        has a fixed shape (a torus's ``dims``) may not shrink: say so in terms of the
        strategy, not of the system file the user did not get wrong."""
        built = self._systems.get(nodes)
        if built is None:
            sys_spec = self.sys_spec
            try:
                built = build_system(sys_spec, self.arch, num_nodes=nodes)
            except ConfigError as exc:
                if nodes == sys_spec.num_nodes:
                    raise
                devices = strategy.devices
                raise ConfigError(
                    f"the strategy {strategy} uses {devices} of the {sys_spec.num_devices} "
                    f"devices of system {sys_spec.name}, and the system cannot be cut down to "
                    f"the {nodes} node(s) they fill ({exc.problem.rstrip('.')})",
                    key="parallelism", value=str(strategy),
                    allowed=f"a strategy for all {sys_spec.num_devices} devices (kp1·kp2·dp·lp"
                    f" = {sys_spec.num_devices}); or, for {devices} devices, a copy of the "
                    f"system file ({sys_spec.source_file or sys_spec.name}) with num_nodes: "
                    f"{nodes} and a network that fits {nodes} node(s)") from None
            self._systems[nodes] = built
        return built

    def predict(self, parallelism: Any, mapping_order: str | None) -> Prediction:
        arch = self.arch
        spec, strategy, par = _strategy(self.spec, parallelism)
        devices = strategy.devices
        sys_spec = self.sys_spec
        if sys_spec is None:
            if devices > 1:
                raise ConfigError(
                    f"the strategy {strategy} needs {devices} devices: give a --system",
                    key="system", value=None, allowed="a system preset or YAML file",
                )
            networks = [("local", _Local())]
        else:
            grows = sys_spec.inter is not None and sys_spec.inter.topology in SWITCHED
            if devices > MAX_DEVICES:  # before a network of that many devices is built
                raise ConfigError(
                    f"the strategy {strategy} needs {devices:,} devices, more than one "
                    f"prediction models ({MAX_DEVICES:,}; each device costs memory and time "
                    f"in the network model)", key="parallelism", value=str(strategy),
                    allowed=f"strategies of at most {MAX_DEVICES:,} devices")
            if devices > sys_spec.num_devices and not grows:
                # a switched fabric between nodes takes any number of nodes (the node count
                # follows the strategy's devices); a direct network has the shape its file gives
                raise ConfigError(
                    f"the strategy {strategy} needs {devices} devices but system "
                    f"{sys_spec.name} has {sys_spec.num_devices}", key="parallelism",
                    value=str(strategy), allowed=f"strategies of at most "
                    f"{sys_spec.num_devices} devices (or a system with more nodes)")
            built = self._system(math.ceil(devices / sys_spec.devices_per_node), strategy)
            if mapping_order == "best":
                # One order per class of equivalent orders (crossflow.system.order_classes):
                # the others give the same time, and the representative is the first of
                # its class, which is the one a scan of all 24 keeping the first best picks.
                orders = [parse_order(rep) for rep, _ in order_classes(strategy.grid)]
            else:
                orders = [parse_order(mapping_order) if mapping_order else DIMS]
            networks = [("-".join(o), MappedNetwork(built.map(strategy.grid, o)))
                        for o in orders]
        run_arch = self.run_arch
        # Memory first: a design over capacity is rejected without pricing a kernel.
        check = self.memory(spec, strategy, par)
        if not check.feasible:
            p = infeasible(spec, arch.name, check.reason, check.need_bytes)
            return replace(p, details={"strategy": str(strategy), "devices": devices,
                                       "memory_breakdown": dict(check.breakdown),
                                       "rejected_by": MEMORY_CHECK})

        best: Prediction | None = None
        for order, network in networks:
            try:
                p = _run(spec, strategy, par, run_arch, network, devices, self.software)
            except InfeasibleDesignError as exc:
                return infeasible(spec, arch.name, str(exc), exc.memory_bytes)
            p.details["mapping_order"] = order
            if best is None or p.time_s < best.time_s:
                best = p
        assert best is not None
        if mapping_order == "best":
            best.details["mapping_orders_tried"] = len(ORDERS)
        return best


def predict_distributed(spec, arch: MicroArch, *, system: Any = None, parallelism: Any = None,
                        mapping_order: str | None = None) -> Prediction:
    return _Batch(spec, arch, system).predict(parallelism, mapping_order)


def predict_many(workload: Any, hardware: Any, system: Any,
                 candidates: Sequence[tuple[Any, str | None]], *,
                 return_exceptions: bool = False) -> list[Prediction]:
    """Predict many ``(parallelism, mapping_order)`` candidates of one workload on one
    device model and system: the batch path of a screen.

    Each result is the Prediction ``crossflow.predict(workload, hardware, system,
    parallelism, mapping_order)`` gives, to the last bit; memory-infeasible candidates are
    infeasible Predictions (``details["rejected_by"] == "memory_check"``) that cost no
    pricing.  The candidates share the loaded specs, the device (so every kernel is priced
    once: shards of the same shape recur across strategies), the systems, each strategy's
    compiled plan and memory check, and each mapping's routing.

    Args:
        workload, hardware, system: as :func:`crossflow.predict` takes them (hardware a
            MicroArch, preset or template; system None for one device).
        candidates: ``(parallelism, mapping_order)`` pairs; parallelism as ``predict``
            takes it (a strategy name, a spec or dict), mapping_order an order string,
            ``"best"`` or None.
        return_exceptions: put a candidate's ConfigError (e.g. a strategy that does not
            fit the workload) or InfeasibleDesignError in its place in the list instead of
            raising it.
    """
    spec = workload if hasattr(workload, "kind") and hasattr(workload, "name") else load_spec(
        workload, "workloads")
    try:
        arch = load_hardware(hardware)
    except InfeasibleDesignError as exc:
        name = str(getattr(hardware, "name", hardware))
        return [infeasible(spec, name, str(exc), None) for _ in candidates]
    batch = _Batch(spec, arch, system)
    out: list = []
    for parallelism, order in candidates:
        try:
            out.append(batch.predict(parallelism, order))
        except (ConfigError, InfeasibleDesignError) as exc:
            if not return_exceptions:
                raise
            out.append(exc)
    return out


def _run(spec, strategy, par, arch: MicroArch, network, devices: int,
         software=None) -> Prediction:
    if spec.kind == "transformer":
        return _transformer(spec, strategy, par, arch, network, devices, software)
    return _graph(spec, strategy, arch, network, devices)


def _transformer(spec, strategy, par, arch, network, devices, software=None) -> Prediction:
    r = transformer_iteration(
        spec, arch, network, tp=strategy.tp, pp=strategy.pp,
        dp=strategy.dp // (par.context_parallel if par else 1), vp=strategy.vp,
        sp=strategy.sp, schedule=par.schedule if par else "1f1b",
        zero1=par.sharded_optimizer if par else False, fsdp=par.fsdp if par else "",
        overlap_grad_reduce=par.overlap_grad_reduce if par else False, software=software,
        cp=par.context_parallel if par else 1,
        split=_split(spec, par),
        ep=par.expert_parallel if par else 1,
        etp=par.expert_tensor_parallel if par else 1,
    )
    return _prediction(
        spec, arch, strategy, devices, time_s=r.time_s, breakdown=r.breakdown,
        memory=r.memory_breakdown, energy_J=r.energy_J,
        hardware_flops=r.hardware_flops_per_iteration, model_flops=r.flops_per_iteration,
        details={"microbatches": r.microbatches, "micro_batch_size": spec.micro_batch_size,
                 "context_parallel": par.context_parallel if par else 1,
                 "activation_recompute": spec.activation_recompute,
                 **_recompute_details(spec), **options_set(spec), **window_details(spec),
                 **({"expert_parallel": par.expert_parallel,
                     "expert_tensor_parallel": par.expert_tensor_parallel}
                    if par and spec.moe else {}),
                 "model_flops_per_iteration": r.flops_per_iteration, **r.detail},
    )


def _recompute_details(spec) -> dict:
    """What the recomputation reruns, in Megatron-LM's names, where the mode leaves a
    choice: the modules under selective recomputation, the method under full."""
    if spec.activation_recompute == "selective":
        return {"recompute_modules": sorted(spec.recomputed_modules)}
    if spec.activation_recompute == "full":
        return {"recompute_method": spec.recompute_method or "uniform",
                "recompute_num_layers": spec.recompute_num_layers or 1}
    return {}


def _graph(spec, strategy, arch, network, devices) -> Prediction:
    r = graph_iteration(compute_graph(spec), strategy, arch, network)
    check_capacity(arch, r.memory_breakdown)  # passes: the memory check ran first
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
