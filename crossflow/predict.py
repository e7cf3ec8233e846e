"""The prediction facade: specs in, one `Prediction` out (docs/architecture.md, "Data
flow of one prediction").

    >>> import crossflow
    >>> p = crossflow.predict(workload={"kind": "gemm", "m": 8192, "k": 8192, "n": 8192},
    ...                       hardware="a100-sxm4-80gb")
    >>> p.feasible, p.bottleneck
    (True, 'compute')

``Prediction`` (:mod:`crossflow.prediction`) and ``load_hardware``
(:mod:`crossflow.arch.hardware`) are re-exported here, where users and the search layer
find them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from crossflow.arch.hardware import load_hardware
from crossflow.arch.microarch import BYTES_PER_ELEMENT, MicroArch
from crossflow.config.base import Spec
from crossflow.config.loader import load_spec
from crossflow.errors import ConfigError, CrossflowError, InfeasibleDesignError
from crossflow.kernels.gemm import check_precision, gemm
from crossflow.prediction import Prediction, infeasible
from crossflow.units import fmt_gb

__all__ = ["Prediction", "infeasible", "load_hardware", "predict"]

Source = str | Path | Mapping[str, Any] | Spec

#: ``Prediction.details["breakdown_overlap"]`` of a single-device GEMM: its breakdown does
#: not add up to ``time_s``.
GEMM_BREAKDOWN_OVERLAP = (
    "roofline: compute and the per-level memory times overlap, so they do not add up; "
    "time_s is the slowest of them (the bottleneck) plus launch"
)


#: ``Prediction.details["breakdown_overlap"]`` of a single-device GEMM: why its breakdown
#: does not add up to ``time_s``.
GEMM_BREAKDOWN_OVERLAP = (
    "roofline: compute and the per-level memory times overlap, so they do not add up; "
    "time_s is the slowest of them (the bottleneck) plus launch, and at least the "
    "framework floor"
)
#: A GEMM predicted on bare hardware (no system, so no software profile) is timed as a user
#: times one matmul from a framework: no shorter than the framework takes to issue it.
#: 21 us: LLMCompass adds ~21 us of launch overhead to its predictions of PyTorch matmuls on
#: A100 (header of presets/measurements/gemm_a100_fp16_msweep.csv); on H100 one eager torch
#: matmul costs 18-21 us issued back to back and 26-44 us timed alone
#: (presets/measurements/gpu/torch_small_matmul_h100.csv, measure_small_matmul.py).
FRAMEWORK_FLOOR_S = 21e-6


def predict(
    workload: Source,
    hardware: Source | MicroArch | None = None,
    system: Source | None = None,
    parallelism: Source | None = None,
    mapping_order: str | None = None,
) -> Prediction:
    """Predict ``workload`` on ``hardware`` (and, for distributed workloads, ``system``).

    ``hardware`` may be left out when ``system`` is given: the device is then the one the
    system file names (``device``).  Given both, ``hardware`` runs with the system's network
    and software, and when it is not the system's own device the Prediction says so
    (``device_overrides_system`` and a note) — also for a file that keeps the device's name
    with other numbers.

    Bad input raises :class:`~crossflow.errors.ConfigError`.  A design that cannot run
    (memory over capacity, no tiling fits, an impossible budget) is returned with
    ``feasible=False`` and the reason, so searches can record it and go on.
    """
    arch = unbuildable = None
    if hardware is not None:
        try:
            arch = load_hardware(hardware)
        except InfeasibleDesignError as exc:  # a template whose budgets build no chip
            unbuildable = exc
    spec = load_spec(workload, "workloads")
    if spec.kind == "gemm" and parallelism is None and (
            system is not None or mapping_order is not None):
        raise ConfigError(
            "a single GEMM runs on one device; --system and --mapping-order apply with "
            "a --parallelism strategy",
            key="kind", value=spec.kind,
        )
    sys_spec = None
    if system is not None:
        from crossflow.config.system import SystemSpec  # not for a GEMM on one device

        sys_spec = system if isinstance(system, SystemSpec) else load_spec(system, "systems")
    from_system = hardware is None
    if from_system:
        if sys_spec is None:
            raise ConfigError(
                "no device to predict on: give hardware (--hardware), or a system (--system) "
                "whose file names its device", key="hardware",
                allowed="a hardware preset, architecture template or YAML file")
        hardware = sys_spec.device
        try:
            arch = load_hardware(hardware)
        except InfeasibleDesignError as exc:
            unbuildable = exc
        except ConfigError as exc:
            raise ConfigError(f"cannot load the device the system names: {exc.problem}",
                              file=sys_spec.source_file, key="device", value=sys_spec.device,
                              allowed=exc.allowed) from None
    if unbuildable is not None:
        return infeasible(spec, str(getattr(hardware, "name", hardware)), str(unbuildable),
                          None)
    try:
        # before any pricing: a memory check would otherwise speak first, of a design that
        # cannot run on this device at any size
        check_precision(arch, spec.precision)
    except ConfigError as exc:
        raise exc.with_file(spec.source_file) from None
    if spec.kind == "gemm" and parallelism is None:
        p = _predict_gemm(spec, arch)
    else:
        from crossflow.distributed import predict_distributed  # (networkx) not for a GEMM

        p = predict_distributed(spec, arch, system=sys_spec, parallelism=parallelism,
                                mapping_order=mapping_order)
    if sys_spec is None:
        return p
    if from_system:
        return replace(p, notes=(f"device {sys_spec.device} from system {sys_spec.name}",))
    if _same_device(hardware, arch, sys_spec.device):
        return p
    given = hardware if isinstance(hardware, str | Path) else arch.name
    # a file may reuse the device's name with other numbers: the name alone would hide that
    # the system's fitted constants meet a different chip
    renamed = (f" ({given} has that device's name, {arch.name}, with other numbers)"
               if arch.name == sys_spec.device else "")
    return replace(p, device_overrides_system=True, notes=(
        f"hardware {given if renamed else arch.name} overrides the device system "
        f"{sys_spec.name} names ({sys_spec.device}){renamed}: the system's network and "
        f"software (fitted for {sys_spec.device}) are used with it",))


def _same_device(hardware: Any, arch: MicroArch, device: str) -> bool:
    """Whether ``hardware`` (loaded: ``arch``) is the device a system file names: that
    very name, or a device with every number the same (a copy of its file).  A name alone
    is not enough: a file may keep the device's name and change its numbers."""
    if str(hardware) == device:
        return True
    try:
        own = load_hardware(device)
    except CrossflowError:  # the system's device does not load: it is not this one
        return False
    return own is arch or dataclasses.asdict(own) == dataclasses.asdict(arch)


def _predict_gemm(spec, arch: MicroArch) -> Prediction:
    b = BYTES_PER_ELEMENT[spec.precision]
    memory = float((spec.m * spec.k + spec.k * spec.n + spec.m * spec.n) * b)
    capacity = arch.main_memory.total_capacity_B
    if memory > capacity:
        return infeasible(
            spec, arch.name,
            f"A, B and C need {fmt_gb(memory)} but {arch.main_memory.name} holds "
            f"{fmt_gb(capacity)}",
            memory,
        )
    try:
        result = gemm(arch, spec.m, spec.k, spec.n, spec.precision, spec.count)
    except InfeasibleDesignError as exc:
        return infeasible(spec, arch.name, str(exc), memory)
    breakdown = {"compute_s": result.compute_time_s, "launch_s": result.launch_s}
    breakdown.update({f"{name}_s": t for name, t in result.time_per_level_s.items()})
    time_s, notes, bottleneck = result.time_s, (), result.bottleneck
    if time_s < FRAMEWORK_FLOOR_S:
        time_s, bottleneck = FRAMEWORK_FLOOR_S, "framework_floor"
        breakdown["framework_floor_s"] = FRAMEWORK_FLOOR_S
        notes = (f"the kernel takes {result.time_s * 1e6:.3g} us on the device; a framework "
                 f"takes at least {FRAMEWORK_FLOOR_S * 1e6:.0f} us to issue one matmul "
                 "(crossflow.predict.FRAMEWORK_FLOOR_S), which is the time given",)
    return Prediction(
        workload=spec.name,
        hardware=arch.name,
        time_s=time_s,
        feasible=True,
        memory_per_device_bytes=memory,
        bottleneck=bottleneck,
        breakdown=breakdown,
        achieved_flops_per_s=result.flops / time_s,
        energy_J=result.energy_J,
        notes=notes,
        details={
            "model_flops_utilization": result.flops / (time_s
                                                       * arch.peak_flops[spec.precision]),
            "breakdown_overlap": GEMM_BREAKDOWN_OVERLAP,
            "flops": result.flops,
            "bytes_per_level": dict(result.bytes_per_level),
            "time_per_level_s": dict(result.time_per_level_s),
            "kernel": dict(result.detail),
            "microarch": arch.to_dict(),
        },
    )
