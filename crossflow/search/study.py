"""Named studies: the study file, its resolution, and the runner
(docs/architecture.md, "Data flow of one study trial").

File shape (``studies/*.yaml``, ``kind: study``)::

    kind: study
    name: paper-lstm-512            # the Optuna study name and the MLflow experiment
    description: …
    workload: lstm-paper-case-study # preset name, YAML path, or inline mapping
    hardware: deepflow-case-study   # architecture template (budgets searchable) or device
                                    # preset; default: the system's device
    overrides: {logic_node: N7}     # fixed AGE overrides (technology, budgets), templates only
    system: deepflow-case-study-512 # for distributed workloads; omit for one device
    devices: 512                    # default: every device of the system
    parallelism: null               # a fixed strategy (name, preset, file or mapping) when
                                    # the search space does not search one; options such as
                                    # schedule / zero1 carry over to a searched strategy
    mapping_order: null             # a fixed order (or "best") when not searched
    search_space: joint-budgets     # search-space preset / path, or inline mapping
    objectives: [iteration_time_s]  # + energy_J / power_W / memory_per_device_bytes
    sampler: tpe                    # structured | gd | gd-paper | tpe | cmaes | random | nsga2
    sampler_options: {}             # keyword arguments of the sampler
    seed: 0
    n_trials: 500                   # the study's total: re-running resumes up to it
    storage: null                   # default: mlruns/optuna/<name>.journal (Optuna journal
                                    # file); or any Optuna storage URL (sqlite:///…,
                                    # postgresql://…) or another journal file path
    tracking_uri: null              # default: sqlite:///<cwd>/mlruns/mlflow.db

Relative paths (``mlruns/`` and files named in the study) are taken from the current
directory, as MLflow does.  :func:`load_study` resolves a study (every reference loaded and
checked, strategies enumerated) into a :class:`StudySetup`; :func:`run_study` creates or
resumes the Optuna study and runs it; :func:`best_design` / :func:`export_design` give the
best design in a form ``crossflow predict`` accepts back.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
import warnings
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from crossflow.config.base import Spec, build, read_yaml
from crossflow.config.loader import load_spec, local_names, preset_names, register_kind
from crossflow.errors import ConfigError, CrossflowError
from crossflow.search import keys
from crossflow.search.locations import MLRUNS, default_tracking_uri, git_label, is_url, redact
from crossflow.search.space import (
    STRATEGY,
    Design,
    SearchSpace,
    SearchSpaceSpec,
    resolve,
)
from crossflow.search.storage import make_storage
from crossflow.search.workers import SURPLUS, WORKER

#: Where studies keep their state by default, relative to the current directory.
OBJECTIVES = ("iteration_time_s", "energy_J", "power_W", "memory_per_device_bytes")
SAMPLER_NAMES = ("structured", "gd", "gd-paper", "tpe", "cmaes", "random", "nsga2")


class StudySpec(Spec):
    """A ``kind: study`` file (see the module docstring)."""

    kind: Literal["study"]
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    description: str = ""
    workload: str | dict[str, Any]
    hardware: str | dict[str, Any] | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    system: str | dict[str, Any] | None = None
    devices: int | None = Field(default=None, ge=1)
    parallelism: str | dict[str, Any] | None = None
    mapping_order: str | None = None
    search_space: str | dict[str, Any]
    objectives: tuple[Literal["iteration_time_s", "energy_J", "power_W",
                              "memory_per_device_bytes"], ...] = Field(
        default=("iteration_time_s",), min_length=1)
    sampler: Literal["structured", "gd", "gd-paper", "tpe", "cmaes", "random", "nsga2"] = "tpe"
    sampler_options: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = 0
    n_trials: int = Field(ge=1)
    storage: str | None = Field(default=None, min_length=1)
    tracking_uri: str | None = Field(default=None, min_length=1)
    #: the first trial of a fresh study evaluates the template's own budget split and
    #: technology (the other dimensions sampled): a feasible reference point to improve on
    baseline: bool = True

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        for i, name in enumerate(self.objectives):
            if name in self.objectives[:i]:
                raise ConfigError("listed twice", key=f"objectives[{i}]", value=name)
        from crossflow.search.samplers import check_objectives

        check_objectives(self.sampler, len(self.objectives))
        if self.overrides:
            from crossflow.arch.age import OVERRIDE_KEYS

            for key in self.overrides:
                if key not in OVERRIDE_KEYS:
                    raise ConfigError("unknown override", key=f"overrides.{key}",
                                      value=self.overrides[key],
                                      allowed=", ".join(OVERRIDE_KEYS))
        if self.mapping_order is not None and self.mapping_order != "best":
            from crossflow.system import parse_order

            parse_order(self.mapping_order)
        return self


# --- resolution -----------------------------------------------------------------------------


#: Search dimensions that pick a technology from the library (besides "memory.<level>").
TECHNOLOGY_DIMS = ("logic_node", "dram", "intra_link", "inter_link")


@dataclass(frozen=True)
class StudySetup:
    """A study resolved: its specs loaded and checked, its search space enumerated."""

    spec: StudySpec
    workload: Spec
    #: the architecture template (budgets searchable), else None
    template: Spec | None
    #: the fixed device (a datasheet preset), else None
    device: Spec | None
    system: Spec | None
    devices: int
    #: parallelism options every trial shares (schedule, zero1, …) and a fixed strategy
    parallelism_base: Mapping[str, Any]
    strategy: str | None
    mapping_order: str | None
    space: SearchSpace
    file: str | None = None
    #: the MicroArch of a fixed device (built once, so kernel prices are cached across trials)
    _arch: Any = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def objectives(self) -> tuple[str, ...]:
        return self.spec.objectives

    @property
    def distributed(self) -> bool:
        return self.system is not None

    @property
    def storage(self) -> str:
        """The Optuna storage: a URL, or a journal file path."""
        return self.spec.storage or str(Path(MLRUNS) / "optuna" / f"{self.name}.journal")

    @property
    def tracking_uri(self) -> str:
        return self.spec.tracking_uri or default_tracking_uri()

    # -- designs ---------------------------------------------------------------------------

    def design(self, params: Mapping[str, Any]) -> Design:
        """The design of a trial's parameters, with the study's fixed choices merged in."""
        d = self.space.decode(params)
        hardware = {**self.spec.overrides, **d.hardware}
        if "memory" in self.spec.overrides and "memory" in d.hardware:
            hardware["memory"] = {**self.spec.overrides["memory"], **d.hardware["memory"]}
        return Design(d.fractions, d.strategy or self.strategy,
                      d.mapping_order or self.mapping_order, hardware, d.parallelism)

    def overrides(self, design: Design) -> dict[str, Any]:
        """AGE overrides of a design (study overrides, named dimensions, fractions)."""
        return design.overrides()

    def arch(self, design: Design):
        """The MicroArch a design runs on (raises InfeasibleDesignError for an impossible
        budget, from the AGE)."""
        if self.template is None:
            return self._arch
        from crossflow.arch.age import generate

        return generate(self.template, overrides=self.overrides(design))

    def parallelism(self, design: Design) -> dict[str, Any] | None:
        """The parallelism mapping ``crossflow.predict`` takes (None: one device)."""
        if not self.distributed and design.strategy is None and not design.parallelism:
            return None
        out: dict[str, Any] = {"kind": "parallelism", **self.parallelism_base}
        if design.strategy is not None:
            out["strategy"] = design.strategy
        out.update(design.parallelism)
        return out

    def baseline_params(self) -> dict[str, Any]:
        """Parameters of the template's own design: its budget split (with the study's
        overrides) and its technology where the search space offers it.  Empty when the
        study searches no hardware."""
        if self.template is None:
            return {}
        from crossflow.search.space import SIMPLEX_OVERRIDE

        params: dict[str, Any] = {}
        for simplex in self.space.simplexes:
            key = SIMPLEX_OVERRIDE[simplex.name]
            own = {**getattr(self.template, key), **self.spec.overrides.get(key, {})}
            params.update(simplex.params_for({c: own.get(c, 0.0) for c in simplex.components}))
        t, o = self.template, self.spec.overrides
        current = {"logic_node": o.get("logic_node", t.logic_node),
                   "dram": o.get("dram", t.memory[-1].technology),
                   "intra_link": o.get("intra_link", t.links.intra),
                   "inter_link": o.get("inter_link", t.links.inter),
                   "tdp_W": o.get("tdp_W", t.tdp_W),
                   "chip_area_mm2": o.get("chip_area_mm2", t.chip_area_mm2),
                   "node_area_mm2": o.get("node_area_mm2", t.node_area_mm2)}
        for m in t.memory:
            current[f"memory.{m.name}"] = (o.get("memory") or {}).get(m.name, m.technology)
        for dim in self.space.dimensions:
            value = current.get(dim.name)
            if dim.name in current and (value in dim.choices if dim.kind == "categorical"
                                        else dim.low <= value <= dim.high):
                params[dim.name] = value
        return params

    def baseline_trials(self) -> list[dict[str, Any]]:
        """The template's design, then the same budget split under every other choice of
        each technology dimension (logic node, memories, links).  A random budget split
        on an unfamiliar technology is often infeasible or poor, so without these a
        sampler can settle on the template's technology having never seen the others at
        their best known split (on quickstart, TPE kept N12 over N5, 2.4x faster)."""
        base = self.baseline_params()
        if not base:
            return []
        trials = [base]
        for dim in self.space.dimensions:
            technology = dim.name in TECHNOLOGY_DIMS or dim.name.startswith("memory.")
            if dim.kind == "categorical" and technology and dim.name in base:
                trials += [{**base, dim.name: c} for c in dim.choices if c != base[dim.name]]
        return trials

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary of the study (logged with each launch)."""
        return {
            "study": self.spec.model_dump(mode="json"),
            "devices": self.devices,
            "search_space": self.space.describe(),
        }


def _rekey(exc: ConfigError, key: str, file: str | None) -> ConfigError:
    """An error from a referenced config, reported against the study's key — unless it is
    about a file of its own (then that file is named)."""
    if exc.file and exc.file not in ("command line",):
        return exc
    if not exc.key or exc.key == key or exc.key.startswith((f"{key}.", f"{key}[")):
        inner = exc.key or key
    else:
        inner = f"{key}.{exc.key}"
    return ConfigError(exc.problem, file=file, key=inner, value=exc.value, allowed=exc.allowed)


def _relative(value: Any, base: Path | None) -> Any:
    """A relative YAML path in a study file, found beside the study file if it is there."""
    if (isinstance(value, str) and base is not None and value.endswith((".yaml", ".yml"))
            and not Path(value).is_absolute() and not Path(value).exists()
            and (base / value).exists()):
        return str(base / value)
    return value


def load_study(source: str | Path | Mapping[str, Any] | StudySpec) -> StudySetup:
    """Load and resolve a study: a name (``./studies/`` first, then the shipped ones), a
    path, a mapping or a spec.  Every problem is a ConfigError naming the study's key."""
    spec = source if isinstance(source, StudySpec) else load_spec(source, "studies")
    file = spec.source_file
    base = Path(file).parent if file else None

    def ref(key: str, families: tuple[str, ...]):
        try:
            return load_spec(_relative(getattr(spec, key), base), *families)
        except ConfigError as exc:
            raise _rekey(exc, key, file) from None

    workload = ref("workload", ("workloads",))
    system = ref("system", ("systems",)) if spec.system is not None else None
    if spec.hardware is None:
        if system is None:
            raise ConfigError("required key 'hardware' is missing (a study without a system "
                              "needs a device or an architecture template)", file=file,
                              key="hardware")
        try:
            hardware = load_spec(system.device, "hardware", "templates")
        except ConfigError as exc:
            raise _rekey(exc, "system.device", file) from None
    else:
        hardware = ref("hardware", ("hardware", "templates"))
    template = hardware if hardware.kind == "architecture" else None
    device = None if template is not None else hardware

    overrides = dict(spec.overrides)
    if overrides and template is None:
        raise ConfigError("overrides apply to an architecture template, but the hardware is "
                          f"the device preset {hardware.name!r}", file=file,
                          key=f"overrides.{next(iter(overrides))}")
    arch = None
    if template is not None:
        from crossflow.arch.age import generate
        from crossflow.errors import InfeasibleDesignError

        try:
            generate(template, overrides=overrides or None)
        except InfeasibleDesignError:
            pass  # the template's own budget split may be infeasible; the search moves it
        except ConfigError as exc:
            raise _rekey(exc, "overrides", file) from None
    else:
        from crossflow.predict import load_hardware

        arch = load_hardware(hardware)

    # the fixed parallelism and the device count
    base_par: dict[str, Any] = {}
    strategy = None
    if spec.parallelism is not None:
        par = _parallelism(spec.parallelism, base, file)
        strategy = str(par.to_strategy())
        from crossflow.parallel.spec import MEGATRON_KEYS

        base_par = par.model_dump(mode="json", exclude_defaults=True,
                                  exclude={"kind", "name", "strategy", *MEGATRON_KEYS})
    if system is not None:
        devices = spec.devices or (int(strategy_devices(strategy)) if strategy
                                   else system.num_devices)
        if devices > system.num_devices:
            raise ConfigError(f"system {system.name!r} has {system.num_devices} devices",
                              file=file, key="devices", value=devices)
    else:
        devices = spec.devices or 1
        if spec.mapping_order is not None:
            raise ConfigError("a mapping order needs a system", file=file,
                              key="mapping_order", value=spec.mapping_order)
    if strategy is not None and strategy_devices(strategy) != devices:
        raise ConfigError(f"the strategy {strategy} uses {strategy_devices(strategy)} "
                          f"devices, not {devices}", file=file, key="devices",
                          value=devices)

    # the search space
    try:
        if isinstance(spec.search_space, str):
            space_spec = load_spec(_relative(spec.search_space, base), "search_spaces")
        else:
            space_spec = build(SearchSpaceSpec, {"name": spec.name, **spec.search_space})
    except ConfigError as exc:
        raise _rekey(exc, "search_space", file) from None
    space = resolve(space_spec, workload=workload, template=template,
                    template_overrides=overrides, devices=devices,
                    distributed=system is not None, prefix="search_space", file=file)
    if system is not None and strategy is None and space.dimension(STRATEGY) is None:
        raise ConfigError("a distributed study needs a strategy: give 'parallelism' or "
                          "search one (search_space strategy)", file=file, key="parallelism")
    order = spec.mapping_order
    if order is not None and order != "best":
        from crossflow.system import parse_order

        order = "-".join(parse_order(order))

    from crossflow.search.samplers import check_options

    check_options(spec.sampler, spec.sampler_options, file=file)
    return StudySetup(spec, workload, template, device, system, devices, base_par, strategy,
                      order, space, file, arch)


def strategy_devices(strategy: str) -> int:
    from crossflow.parallel import Strategy

    return Strategy.parse(strategy).devices


def _parallelism(source: Any, base: Path | None, file: str | None):
    from crossflow.parallel import Strategy

    try:
        return load_spec(_relative(source, base), "parallelism")
    except ConfigError as exc:
        if isinstance(source, str) and not source.endswith((".yaml", ".yml")):
            try:
                Strategy.parse(source)
                return load_spec({"kind": "parallelism", "strategy": source}, "parallelism")
            except ConfigError:
                pass
        raise _rekey(exc, "parallelism", file) from None


# --- storage --------------------------------------------------------------------------------


def open_study(setup: StudySetup, storage: str | None = None, *, create: bool = True,
               sampler=None, heartbeat_s: float | None = None):
    """The Optuna study of ``setup`` in ``storage`` (default: the study's), created if
    ``create`` (else a ConfigError when it is not there).  ``heartbeat_s``: seconds between
    heartbeats of running trials on an RDB storage (see :mod:`crossflow.search.storage`)."""
    import optuna

    url = storage or setup.storage
    if not create and "://" not in url and not Path(url).is_file():
        raise ConfigError(f"no study {setup.name!r}: {url} does not exist; run it first "
                          f"('crossflow study run {setup.name}')", key="storage", value=url)
    backend = make_storage(url, heartbeat_s=heartbeat_s)
    if create:
        study = optuna.create_study(storage=backend, study_name=setup.name, sampler=sampler,
                                    directions=["minimize"] * len(setup.objectives),
                                    load_if_exists=True)
    else:
        try:
            study = optuna.load_study(study_name=setup.name, storage=backend, sampler=sampler)
        except KeyError:
            raise ConfigError(f"no study {setup.name!r} in {redact(url)}: run it first "
                              f"('crossflow study run {setup.name}')", key="storage",
                              value=redact(url)) from None
    stored = study.user_attrs.get("objectives")
    if stored is None and create:
        study.set_user_attr("objectives", list(setup.objectives))
    elif stored is not None and list(stored) != list(setup.objectives):
        raise ConfigError(f"the stored study {setup.name!r} optimises {stored}, the study file "
                          f"{list(setup.objectives)}: use another name or storage",
                          file=setup.file, key="objectives", value=list(setup.objectives))
    return study


# --- best design and export -----------------------------------------------------------------


def is_feasible(trial) -> bool:
    """A completed trial with a feasible design (see :func:`crossflow.search.keys.is_feasible`)."""
    from optuna.trial import TrialState

    return trial.state == TrialState.COMPLETE and keys.is_feasible(trial)


def best_trials(study) -> list:
    """The feasible trials that are best: one (single objective) or the Pareto front,
    ordered by the first objective."""
    from optuna.trial import TrialState

    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if is_feasible(t)]
    if not trials:
        return []
    if len(study.directions) == 1:
        return [min(trials, key=lambda t: (t.values[0], t.number))]
    import numpy as np

    v = np.array([t.values for t in trials], dtype=float)
    front = [t for t, row in zip(trials, v, strict=True)
             if not np.any(np.all(v <= row, axis=1) & np.any(v < row, axis=1))]
    return sorted(front, key=lambda t: (t.values, t.number))


def best_trial(study):
    """The feasible trial with the lowest first objective on the Pareto front (None if no
    trial is feasible yet)."""
    front = best_trials(study)
    return front[0] if front else None


def _reference(value: Any, families: tuple[str, ...], base: Path | None) -> Any:
    """A preset name stays a name; a file becomes its mapping (self-contained export)."""
    if isinstance(value, str):
        names = {n for f in families for n in preset_names(f)}
        if value in names and not Path(value).exists():
            return value
        return read_yaml(_relative(value, base))
    return dict(value)


def template_document(template: Spec, overrides: Mapping[str, Any], name: str,
                      description: str) -> dict[str, Any]:
    """The architecture template of a design: the study's template with the design's
    technology choices and budget fractions written in (a ``kind: architecture`` file)."""
    doc = template.model_dump(mode="json")
    doc["name"], doc["description"] = name, description
    o = overrides
    if "logic_node" in o:
        doc["logic_node"] = o["logic_node"]
    memory = doc["memory"]
    if "dram" in o:
        memory[-1]["technology"] = o["dram"]
    for level, tech in (o.get("memory") or {}).items():
        next(m for m in memory if m["name"] == level)["technology"] = tech
    for kind in ("intra", "inter"):
        if f"{kind}_link" in o:
            doc["links"][kind] = o[f"{kind}_link"]
    for key in ("tdp_W", "chip_area_mm2", "node_area_mm2"):
        if key in o:
            doc[key] = float(o[key])
    for key in ("area_fractions", "power_fractions", "perimeter_fractions"):
        if key in o:
            doc[key] = {**doc[key], **{k: float(v) for k, v in o[key].items()}}
    return doc


def best_design(setup: StudySetup, study, trial=None) -> dict[str, Any] | None:
    """The design of ``trial`` (default: :func:`best_trial`) as the export writes it.

    Keys: ``study``, ``trial``, ``objectives`` (name -> value), ``design`` (decoded
    fractions, strategy, mapping order, technology and parallelism options) and ``predict``
    — exactly the keyword arguments of :func:`crossflow.predict` (``workload``, ``hardware``,
    ``system``, ``parallelism``, ``mapping_order``; preset names stay names, everything
    else is inline: the hardware of a template study is the generated chip's template with
    the design's fractions and technology written in).  None when no trial is feasible.
    """
    trial = trial if trial is not None else best_trial(study)
    if trial is None:
        return None
    design = setup.design(trial.params)
    base = Path(setup.file).parent if setup.file else None
    order = trial.user_attrs.get("mapping_order", design.mapping_order)
    if setup.template is not None:
        hardware: Any = template_document(
            setup.template, setup.overrides(design), f"{setup.name}-trial-{trial.number}",
            f"study {setup.name}, trial {trial.number}: {setup.template.name} with the "
            "searched budgets and technology")
    else:
        hardware = _reference(setup.spec.hardware or setup.system.device,
                              ("hardware", "templates"), base)
    predict_args: dict[str, Any] = {
        "workload": _reference(setup.spec.workload, ("workloads",), base),
        "hardware": hardware,
    }
    if setup.system is not None:
        predict_args["system"] = _reference(setup.spec.system, ("systems",), base)
    par = setup.parallelism(design)
    if par is not None:
        predict_args["parallelism"] = par
    if order is not None:
        predict_args["mapping_order"] = order
    values = trial.values or []
    return {
        "study": setup.name,
        "trial": trial.number,
        "objectives": dict(zip(setup.objectives, values, strict=False)),
        "design": {
            **{f"{s}_fractions": dict(fr) for s, fr in design.fractions.items()},
            **({"strategy": design.strategy} if design.strategy else {}),
            **({"mapping_order": order} if order else {}),
            **({"technology": dict(design.hardware)} if design.hardware else {}),
            **({"parallelism_options": dict(design.parallelism)}
               if design.parallelism else {}),
        },
        "predict": predict_args,
    }


def export_design(design: Mapping[str, Any], path: str | Path) -> dict[str, Path]:
    """Write ``design`` (from :func:`best_design`) for ``crossflow predict``.

    ``path`` (say ``design.yaml``) gets the whole design, and each inline part of
    ``predict`` goes to a file beside it that ``crossflow predict`` takes:
    ``design.hardware.yaml`` (``kind: architecture``, or the device), ``design.parallelism.yaml``
    and, when they are not preset names, ``design.workload.yaml`` / ``design.system.yaml``.
    ``design.yaml`` lists them under ``files`` with the ``command`` that predicts the design.
    Returns what was written, by part (``design`` for ``path``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    written: dict[str, Path] = {}
    args = design["predict"]
    command = ["crossflow", "predict"]
    for part in ("workload", "hardware", "system", "parallelism"):
        value = args.get(part)
        if value is None:
            continue
        if isinstance(value, Mapping):
            side = path.with_name(f"{stem}.{part}.yaml")
            side.write_text(yaml.safe_dump(dict(value), sort_keys=False), encoding="utf-8")
            written[part] = side
            value = str(side)
        command += [f"--{part}", str(value)]
    if args.get("mapping_order"):
        command += ["--mapping-order", args["mapping_order"]]
    doc = {**design, "files": {k: str(v) for k, v in written.items()},
           "command": " ".join(command)}
    header = (f"# Best design of study {design['study']} (trial {design['trial']}).\n"
              "# 'predict' holds the keyword arguments of crossflow.predict(**predict);\n"
              f"# from the shell:\n#   {doc['command']}\n")
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    written["design"] = path
    return written


# --- summaries ------------------------------------------------------------------------------


def study_summary(setup: StudySetup, study) -> dict[str, Any]:
    """What ``crossflow study show`` prints: trials by state, launches, the best design."""
    from collections import Counter

    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    # a FAIL trial is a retried one (its worker died) or a surplus one (no slot was left)
    states = Counter("FAIL_surplus" if t.state == TrialState.FAIL and t.user_attrs.get(
        SURPLUS) else t.state.name for t in trials)
    infeasible = sum(1 for t in trials
                     if t.state == TrialState.COMPLETE and not is_feasible(t))
    launches = [v for k, v in sorted(study.user_attrs.items()) if k.startswith("launch.")]
    best = best_trials(study)
    return {
        "study": setup.name,
        "description": setup.spec.description,
        "storage": setup.storage,
        "objectives": list(setup.objectives),
        "n_trials": int(launches[-1].get("n_trials", setup.spec.n_trials)) if launches
        else setup.spec.n_trials,
        "finished": states.get("COMPLETE", 0) + states.get("PRUNED", 0),
        "trials": len(trials),
        "states": {"COMPLETE_feasible": states.get("COMPLETE", 0) - infeasible,
                   "COMPLETE_infeasible": infeasible,
                   **{s: n for s, n in states.items() if s != "COMPLETE"}},
        "sampler": launches[-1].get("sampler") if launches else setup.spec.sampler,
        "launches": launches,
        "best": [{"trial": t.number,
                  "values": dict(zip(setup.objectives, t.values, strict=True)),
                  "design": best_design(setup, study, t)["design"]} for t in best[:10]],
        "pareto_size": len(best) if len(setup.objectives) > 1 else None,
        "workers": len({t.user_attrs[WORKER] for t in trials if WORKER in t.user_attrs}),
        # the structured driver's memory screen and the trials of each of its phases
        "memory_rejected": len(study.user_attrs.get("structured.memory_rejected", [])),
        "phases": dict(Counter(t.user_attrs[keys.PHASE] for t in trials
                               if keys.PHASE in t.user_attrs)),
    }


def list_studies() -> list[dict[str, Any]]:
    """Every study by name (``./studies/`` and the shipped ones) with its state in its
    default storage, when that is a journal file that exists."""
    out = []
    for name in sorted(set(local_names("studies")) | set(preset_names("studies"))):
        try:
            spec = load_spec(name, "studies")
        except ConfigError as exc:
            out.append({"name": name, "error": str(exc)})
            continue
        storage = spec.storage or str(Path(MLRUNS) / "optuna" / f"{spec.name}.journal")
        row: dict[str, Any] = {"name": spec.name, "description": spec.description,
                               "sampler": spec.sampler, "n_trials": spec.n_trials,
                               "storage": storage, "trials": None}
        if "://" not in storage and Path(storage).is_file():
            row["trials"] = _count_trials(storage, spec.name)
        out.append(row)
    return out


def _count_trials(path: str, name: str) -> int | None:
    import optuna

    try:
        summaries = optuna.get_all_study_summaries(make_storage(path))
    except Exception:  # noqa: BLE001 - a damaged file should not break the listing
        return None
    return next((s.n_trials for s in summaries if s.study_name == name), None)


# --- running --------------------------------------------------------------------------------


@dataclass
class RunResult:
    """What one :func:`run_study` launch did."""

    study: Any                   # the optuna.Study
    trials_run: int              # trials this launch finished
    total: int                   # trials in the study now (any state)
    interrupted: bool
    elapsed_s: float
    best: dict[str, Any] | None  # best_design(), None if nothing is feasible


class _Progress:
    """A one-line progress report on stderr (a bar on a terminal, else every ~10 %): an
    Optuna callback (this process's trials) or :meth:`poll` (all workers' trials)."""

    def __init__(self, name: str, done: int, total: int, enabled: bool) -> None:
        self.name, self.done, self.total, self.enabled = name, done, total, enabled
        self.start_done, self.t0, self.last = done, time.perf_counter(), 0.0
        self.tty = enabled and sys.stderr.isatty()
        self.step = max(1, (total - done) // 10)
        self.shown = 0        # steps printed (not a terminal)
        self._last_done = done
        self.best: float | None = None
        self.infeasible = 0
        self.printed = False  # the current count is on the last line (not a terminal)

    def _add(self, trial) -> None:
        if trial.state.name not in ("COMPLETE", "PRUNED"):
            return  # failed (retried), or surplus: not a finished trial
        self.done += 1
        if trial.values is not None:
            if keys.is_feasible(trial):
                if self.best is None or trial.values[0] < self.best:
                    self.best = trial.values[0]
            else:
                self.infeasible += 1

    def __call__(self, study, trial) -> None:
        self._add(trial)
        self._show()

    def poll(self, study) -> None:
        """Count every finished trial in the storage (trials of other processes)."""
        from optuna.trial import TrialState

        self.done, self.best, self.infeasible = 0, None, 0
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,
                                                          TrialState.PRUNED)):
            self._add(t)
        self._show()

    def _show(self) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.done != self._last_done:
            self._last_done, self.printed = self.done, False
        steps = (self.done - self.start_done) // self.step
        if self.tty and now - self.last > 0.1:
            self.last = now
            print("\r" + self.line(now), end="", file=sys.stderr, flush=True)
        elif not self.tty and steps > self.shown:
            self.shown = steps
            self.printed = True
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float) -> str:
        n = self.done - self.start_done
        width = 24
        filled = min(width, int(width * self.done / max(1, self.total)))
        best = "-" if self.best is None else f"{self.best:.6g}"
        rate = n / max(1e-9, now - self.t0)
        return (f"{self.name} [{'#' * filled}{'.' * (width - filled)}] "
                f"{self.done}/{self.total} trials, best {best}, "
                f"{self.infeasible} infeasible, {rate:.1f} trials/s")

    def close(self) -> None:
        if self.enabled and (self.tty or not self.printed):
            print(("\r" if self.tty else "") + self.line(time.perf_counter()), file=sys.stderr,
                  flush=True)


def _tracker(setup: StudySetup, tracking_uri: str, launch: Mapping[str, Any]):
    try:
        from crossflow.search.tracking import StudyTracker
    except ImportError as exc:
        raise CrossflowError(
            "MLflow tracking is not available (crossflow.search.tracking.StudyTracker could "
            f"not be imported: {exc}); run the study without it ('--no-tracking', or "
            "run_study(track=False))") from None
    return StudyTracker(study_name=setup.name, tracking_uri=tracking_uri,
                        launch_params=dict(launch), search_space=setup.describe())




def worker_seed(sampler: str, seed: int | None, index: int) -> int | None:
    """The sampler seed of worker ``index`` of a launch seeded ``seed``.  Worker 0 keeps the
    launch's seed (one worker is reproducible); ``structured``, ``gd`` and ``gd-paper`` keep
    it on every worker (the workers share one plan, or one set of chains, keyed by it);
    other samplers get distinct seeds, or the workers would propose the same points."""
    if seed is None or sampler in ("structured", "gd", "gd-paper") or index == 0:
        return seed
    return (seed + 7919 * index) % 2**32  # numpy's seed range


def run_study(setup: StudySetup, *, n_trials: int | None = None, sampler: str | None = None,
              seed: int | None | Literal["study"] = "study",
              sampler_options: Mapping[str, Any] | None = None, storage: str | None = None,
              tracking_uri: str | None = None, track: bool = True,
              progress: bool = True, workers: int = 1,
              heartbeat_s: float | None = None) -> RunResult:
    """Create or resume the study and run it until it has ``n_trials`` (default: the
    study's) finished trials; Ctrl-C stops it cleanly after logging what finished.

    ``n_trials`` counts the study's total, so re-running resumes.  Launch k (0 for the
    first) seeds its sampler with ``seed + k``: a fresh single-worker study is reproducible
    for its seed, and a resumed or extra worker does not replay the first launch's draws.
    Each trial is logged as an MLflow child run (``track``) off the critical path.

    ``workers`` > 1 runs that many ``crossflow study worker`` processes on this launch (see
    :mod:`crossflow.search.workers`); the study must then be one the workers can load by
    name or file (not an inline mapping).  ``heartbeat_s``: seconds between heartbeats of
    running trials on an RDB storage (a dead worker's trial is retried after about three).
    """
    if workers < 1:
        raise ConfigError("must be >= 1", key="--workers", value=workers)
    return _quietly(_run, setup, n_trials, sampler, seed, sampler_options, storage,
                    tracking_uri, track, progress, workers, heartbeat_s)


def join_study(setup: StudySetup, *, storage: str | None = None, launch: str | None = None,
               worker_index: int | None = None, tracking_uri: str | None = None,
               track: bool = True, progress: bool = True,
               heartbeat_s: float | None = None) -> RunResult:
    """``crossflow study worker``: join a launch of an existing study (default: its latest)
    and run its trials until the launch's ``n_trials`` are finished, with the launch's
    sampler, options and seed (see :func:`worker_seed`; a worker without an index gets a
    seed of its own)."""
    return _quietly(_join, setup, storage, launch, worker_index, tracking_uri, track,
                    progress, heartbeat_s)


def _quietly(fn, *args) -> RunResult:
    import optuna

    verbosity = optuna.logging.get_verbosity()
    # the progress line replaces Optuna's log lines; a trial fails only on a bug (the
    # objective records infeasible designs), and then the exception is raised
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        with warnings.catch_warnings():
            # CMA-ES ranks infeasible trials by their penalty values, not by constraints
            warnings.filterwarnings("ignore", message="Constraints have been set, but CmaEs")
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            return fn(*args)
    finally:
        optuna.logging.set_verbosity(verbosity)


def _storage_url(setup: StudySetup, storage: str | None) -> str:
    """The storage URL, a journal file as an absolute path (workers may start elsewhere)."""
    url = storage or setup.storage
    return url if is_url(url) else str(Path(url).resolve())


def _run(setup: StudySetup, n_trials, sampler, seed, sampler_options, storage, tracking_uri,
         track, progress, workers, heartbeat_s) -> RunResult:
    from crossflow import __version__
    from crossflow.search.samplers import check_objectives, check_options, make_sampler

    total = n_trials if n_trials is not None else setup.spec.n_trials
    if total < 1:
        raise ConfigError("must be >= 1", key="n_trials", value=total)
    sampler_name = sampler or setup.spec.sampler
    if sampler_name not in SAMPLER_NAMES:
        raise ConfigError("unknown sampler", key="sampler", value=sampler_name,
                          allowed=", ".join(SAMPLER_NAMES))
    if sampler_options is None:
        sampler_options = setup.spec.sampler_options if sampler_name == setup.spec.sampler \
            else {}
    check_options(sampler_name, sampler_options)
    check_objectives(sampler_name, len(setup.objectives))  # before anything is created
    base_seed = setup.spec.seed if seed == "study" else seed
    url = _storage_url(setup, storage)
    study = open_study(setup, url, heartbeat_s=heartbeat_s)

    if setup.spec.baseline and not study.get_trials(deepcopy=False):
        for params in setup.baseline_trials():
            study.enqueue_trial(params, user_attrs={"baseline": True}, skip_if_exists=True)
    index = sum(1 for k in study.user_attrs if k.startswith("launch."))
    launch_seed = None if base_seed is None else base_seed + index
    launch = {
        "study": setup.name, "launch": index, "sampler": sampler_name,
        "sampler_options": dict(sampler_options), "seed": launch_seed,
        "n_trials": total, "objectives": list(setup.objectives), "storage": redact(url),
        "workers": workers, "crossflow_version": __version__, "git_revision": git_label(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "pid": os.getpid(),
    }
    uri = tracking_uri or setup.tracking_uri
    if not uri.startswith(("sqlite:", "file:")) and "://" in uri:
        launch["tracking_uri"] = redact(uri)  # where workers that join log (a server, a DB)
    key = f"launch.{index:04d}.{uuid.uuid4().hex[:8]}"
    study.set_user_attr(key, launch)
    if workers > 1:
        return _supervise(setup, study, url, key, launch, uri, track, progress, heartbeat_s)
    study.sampler = make_sampler(sampler_name, seed=launch_seed, options=sampler_options,
                                 space=setup.space, n_objectives=len(setup.objectives),
                                 setup=setup)
    return _work(setup, study, launch, total, uri, track, progress, summary=True)


def _join(setup: StudySetup, storage, launch_key, worker_index, tracking_uri, track, progress,
          heartbeat_s) -> RunResult:
    from crossflow.search.samplers import make_sampler

    url = _storage_url(setup, storage)
    study = open_study(setup, url, create=False, heartbeat_s=heartbeat_s)
    launches = {k: v for k, v in study.user_attrs.items() if k.startswith("launch.")}
    if not launches:
        raise ConfigError(f"study {setup.name!r} has no launch to join: start it with "
                          f"'crossflow study run {setup.name} --storage URL' first",
                          key="storage", value=redact(url))
    if launch_key is None:
        launch_key = max(launches)
    elif launch_key not in launches:
        raise ConfigError("no such launch in the study", key="--launch", value=launch_key,
                          allowed=", ".join(sorted(launches)))
    launch = launches[launch_key]
    if worker_index is None:  # a worker joining from anywhere: a seed of its own
        worker_index = 1 + (os.getpid() * 1_000_003 + time.time_ns()) % 99_991
    seed = worker_seed(launch["sampler"], launch.get("seed"), worker_index)
    study.sampler = make_sampler(launch["sampler"], seed=seed,
                                 options=launch.get("sampler_options") or {},
                                 space=setup.space, n_objectives=len(setup.objectives),
                                 setup=setup)
    joined = {**launch, "worker_index": worker_index, "seed": seed, "role": "worker",
              "host": socket.gethostname(), "pid": os.getpid()}
    uri = tracking_uri or launch.get("tracking_uri") or setup.tracking_uri
    return _work(setup, study, joined, int(launch["n_trials"]), uri, track, progress,
                 summary=False)


def _work(setup: StudySetup, study, launch: Mapping[str, Any], total: int, tracking_uri: str,
          track: bool, progress: bool, *, summary: bool) -> RunResult:
    """Run trials in this process until the study has ``total`` finished ones."""
    from crossflow.search.objective import Objective
    from crossflow.search.workers import GracefulStop, census, work

    heartbeats = is_url(str(launch["storage"]))
    start = census(study, total, heartbeats=heartbeats)
    bar = _Progress(setup.name, start.done, total, progress and not start.finished)
    interrupted = False
    t0 = time.perf_counter()
    tracking = _tracker(setup, tracking_uri, launch) if track else nullcontext()
    with tracking as tracker:
        stop = GracefulStop()
        callbacks: list[Any] = [bar]
        if tracker is not None:
            callbacks.insert(0, tracker)  # logged before any stop
        try:
            with stop:
                work(study, Objective(setup), total, callbacks=callbacks, stop=stop,
                     heartbeats=heartbeats)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            bar.close()
        interrupted = interrupted or stop.requested
        best = best_design(setup, study)
        if tracker is not None and summary:
            tracker.finish(study, best_design=best)
    return RunResult(study, bar.done - start.done, len(study.get_trials(deepcopy=False)),
                     interrupted, time.perf_counter() - t0, best)


def _supervise(setup: StudySetup, study, url: str, key: str, launch: Mapping[str, Any],
               tracking_uri: str, track: bool, progress: bool,
               heartbeat_s: float | None) -> RunResult:
    """``study run --workers K``: K worker processes on launch ``key``, their trials logged to
    MLflow from the storage by one tracker here, one progress line, Ctrl-C forwarded."""
    from crossflow.search.workers import census, check_workers, start_workers, supervise

    total, k = int(launch["n_trials"]), int(launch["workers"])
    start = census(study, total, heartbeats=is_url(url))
    bar = _Progress(f"{setup.name} ({k} workers)", start.done, total,
                    progress and not start.finished)
    t0 = time.perf_counter()
    tracking = _tracker(setup, tracking_uri, launch) if track else nullcontext()
    with tracking as tracker:
        procs = start_workers(setup.file or setup.name, url, key, k, heartbeat_s=heartbeat_s)

        def tick() -> None:
            if tracker is not None:
                tracker.sweep(study)
            bar.poll(study)

        interrupted = supervise(procs, tick=tick)
        tick()
        bar.close()
        end = census(study, total, heartbeats=is_url(url))
        for line in check_workers(procs, interrupted=interrupted, finished=end.finished):
            print(f"crossflow: warning: {line}", file=sys.stderr)
        best = best_design(setup, study)
        if tracker is not None:
            tracker.finish(study, best_design=best)
    return RunResult(study, end.done - start.done, len(study.get_trials(deepcopy=False)),
                     interrupted, time.perf_counter() - t0, best)


register_kind("study", "studies", StudySpec)
