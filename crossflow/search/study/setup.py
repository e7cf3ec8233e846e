"""A study resolved: :func:`load_study` loads and checks every reference of a study file
into a :class:`StudySetup`; :func:`open_study` opens (or creates) its Optuna study
(docs/architecture.md, Studies).

Relative paths (``mlruns/`` and files named in the study) are taken from the current
directory, as MLflow does; a YAML file named in a study is also looked for beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crossflow.config.base import Spec, build
from crossflow.config.loader import load_spec
from crossflow.errors import ConfigError
from crossflow.parallel import Strategy
from crossflow.search.keys import OBJECTIVES
from crossflow.search.knobs import SCALAR_DIMS, TECHNOLOGY_DIMS, template_hardware
from crossflow.search.locations import default_storage, default_tracking_uri, is_url, redact
from crossflow.search.space import STRATEGY, Design, SearchSpace, SearchSpaceSpec, resolve
from crossflow.search.storage import make_storage
from crossflow.search.study.spec import StudySpec

#: Chips a study keeps (:meth:`StudySetup.arch`): more than a batch of the structured
#: driver's points.
CHIPS_KEPT = 512


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
    #: the chips the AGE built last, by :meth:`Design.chip_key`: the structured driver keys
    #: a point by its chip and checks its memory before the trial evaluates it (one build,
    #: not three); cleared when full
    _chips: dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                   compare=False)

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
        return self.spec.storage or default_storage(self.name)

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

        key = design.chip_key()
        chip = self._chips.get(key)
        if chip is None:
            chip = generate(self.template, overrides=self.overrides(design))
            if len(self._chips) >= CHIPS_KEPT:
                self._chips.clear()
            self._chips[key] = chip
        return chip

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
        current = template_hardware(self.template, self.spec.overrides)
        for dim in self.space.dimensions:
            value = current.get(dim.name)
            if dim.name in current and (value in dim.choices if dim.kind == "categorical"
                                        else dim.low <= value <= dim.high):
                params[dim.name] = value
        return params

    def start_params(self) -> dict[str, Any]:
        """A whole point of the space at the template's own design (:meth:`baseline_params`):
        every other dimension at its first choice, but a hardware size (``tdp_W``,
        ``chip_area_mm2``, ...) at the middle of its range, integer or float (a log range
        at the geometric middle): its first value would start a search at one end of it.  A micro-batch size range starts at its
        smallest, the one that divides every batch."""
        params = self.baseline_params()
        for dim in self.space.dimensions:
            if dim.name in params:
                continue
            if dim.log and (dim.kind == "float" or dim.name in SCALAR_DIMS):
                # the middle of the coordinate a search moves it in (its logarithm), as
                # Optuna's CMA-ES starts a log range
                params[dim.name] = dim.on_grid(math.sqrt(dim.low * dim.high))
            elif dim.kind == "float":
                params[dim.name] = (dim.low + dim.high) / 2
            elif dim.kind == "int" and dim.name in SCALAR_DIMS:
                values = dim.values()
                params[dim.name] = values[len(values) // 2]
            else:
                params[dim.name] = dim.values()[0]
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

    def enqueue_baselines(self, study, total: int) -> None:
        """Enqueue :meth:`baseline_trials` in ``study`` when the study file asks for them
        (``baseline``), each marked ``baseline``; a total below their number takes that
        many of them (the study's total counts them)."""
        if not self.spec.baseline:
            return
        for params in self.baseline_trials()[:total]:
            study.enqueue_trial(params, user_attrs={"baseline": True}, skip_if_exists=True)

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
    def one(exc: ConfigError) -> ConfigError:
        if exc.file and exc.file not in ("command line",):
            return exc
        if not exc.key or exc.key == key or exc.key.startswith((f"{key}.", f"{key}[")):
            inner = exc.key or key
        else:
            inner = f"{key}.{exc.key}"
        return ConfigError(exc.problem, file=file, key=inner, value=exc.value,
                           allowed=exc.allowed)

    return exc.map(one)


def _relative(value: Any, base: Path | None) -> Any:
    """A relative YAML path in a study file, found beside the study file if it is there."""
    if (isinstance(value, str) and base is not None and value.endswith((".yaml", ".yml"))
            and not Path(value).is_absolute() and not Path(value).exists()
            and (base / value).exists()):
        return str(base / value)
    return value


def load_study(source: str | Path | Mapping[str, Any] | StudySpec, *,
               problems: list[ConfigError] | None = None) -> StudySetup:
    """Load and resolve a study: a name (``./studies/`` first, then the shipped ones), a
    path, a mapping or a spec.  Every problem is a ConfigError naming the study's key;
    those that leave the setup buildable (the sampler's options) are appended to
    ``problems`` when it is given (``crossflow check`` goes on to check the rest)."""
    spec = source if isinstance(source, StudySpec) else load_spec(source, "studies")
    file = spec.source_file
    base = Path(file).parent if file else None

    # the parts that do not depend on each other are all loaded, and every error among
    # them reported together
    errors: list[ConfigError] = []

    def ref(key: str, families: tuple[str, ...]):
        try:
            return load_spec(_relative(getattr(spec, key), base), *families)
        except ConfigError as exc:
            errors.append(_rekey(exc, key, file))
            return None

    def space_spec_of():
        try:
            if isinstance(spec.search_space, str):
                return load_spec(_relative(spec.search_space, base), "search_spaces")
            return build(SearchSpaceSpec, {"name": spec.name, **spec.search_space})
        except ConfigError as exc:
            errors.append(_rekey(exc, "search_space", file))
            return None

    def sampler_options_checked() -> None:
        from crossflow.search.samplers import check_options

        try:
            check_options(spec.sampler, spec.sampler_options, file=file)
        except ConfigError as exc:
            if problems is None or errors:
                errors.append(exc)
            else:
                problems.append(exc)

    workload = ref("workload", ("workloads",))
    system = ref("system", ("systems",)) if spec.system is not None else None
    given_hardware = (ref("hardware", ("hardware", "templates")) if spec.hardware is not None
                      else None)
    space_spec = space_spec_of()
    sampler_options_checked()
    if errors:
        raise ConfigError.together(errors)
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
        hardware = given_hardware
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
        devices = spec.devices or (Strategy.parse(strategy).devices if strategy
                                   else system.num_devices)
        if devices > system.num_devices:
            raise ConfigError(f"system {system.name!r} has {system.num_devices} devices",
                              file=file, key="devices", value=devices)
    else:
        devices = spec.devices or 1
        if spec.mapping_order is not None:
            raise ConfigError("a mapping order needs a system", file=file,
                              key="mapping_order", value=spec.mapping_order)
    if strategy is not None and Strategy.parse(strategy).devices != devices:
        raise ConfigError(f"the strategy {strategy} uses {Strategy.parse(strategy).devices} "
                          f"devices, not {devices}", file=file, key="devices",
                          value=devices)

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
    return StudySetup(spec, workload, template, device, system, devices, base_par, strategy,
                      order, space, file, arch)


def check_precision_of(setup: StudySetup) -> None:
    """The chip a study builds must have the workload's arithmetic (a bf16 workload on the
    case-study template, which has fp16 and fp32 only): else every trial of the run would
    be refused, one by one, for the same reason."""
    from crossflow.errors import InfeasibleDesignError
    from crossflow.kernels.gemm import check_precision

    precision = getattr(setup.workload, "precision", None)
    if precision is None:
        return
    try:  # the other dimensions (strategy, order, ...) do not change the chip's arithmetic
        arch = setup.arch(setup.design(setup.start_params()))
    except (InfeasibleDesignError, ConfigError):
        return  # the template's own design cannot be built: each trial says why
    # an fp8 transformer runs its other kernels at its activation precision (bf16)
    needed = dict.fromkeys((precision, getattr(setup.workload, "activation_precision",
                                               precision)))
    for p in needed:
        try:
            check_precision(arch, p)
        except ConfigError as exc:
            raise ConfigError(f"the chip this study builds ({arch.name}) has no {p} "
                              "arithmetic for the workload's precision", file=setup.file,
                              key="workload", value=f"precision: {precision}",
                              allowed=exc.allowed) from None


def _parallelism(source: Any, base: Path | None, file: str | None):
    """The study's fixed parallelism (a preset, a file beside the study, a mapping or a
    strategy name), read by :func:`crossflow.parallel.parse_parallelism`."""
    from crossflow.parallel import parse_parallelism

    try:
        return parse_parallelism(_relative(source, base))
    except ConfigError as exc:
        raise _rekey(exc, "parallelism", file) from None


# --- the Optuna study -----------------------------------------------------------------------


def open_study(setup: StudySetup, storage: str | None = None, *, create: bool = True,
               sampler=None, heartbeat_s: float | None = None, for_reading: bool = False,
               on_create=None):
    """The Optuna study of ``setup`` in ``storage`` (default: the study's), created if
    ``create`` (else a ConfigError when it is not there); ``on_create(study)`` is called
    when this call created it, by one process only where several open a fresh storage at
    once (the others load the study the first one made).  ``heartbeat_s``: seconds between
    heartbeats of running trials on an RDB storage (see :mod:`crossflow.search.storage`).
    ``for_reading`` (with ``create=False``): the caller only reads, so a journal in a
    read-only place is opened read-only."""
    import optuna

    url = storage or setup.storage
    if not create and not is_url(url) and not Path(url).is_file():
        raise ConfigError(f"no study {setup.name!r}: {url} does not exist; run it first "
                          f"('crossflow study run {setup.name}')", key="storage", value=url)
    backend = make_storage(url, heartbeat_s=heartbeat_s,
                           for_reading=for_reading and not create)
    created = False
    try:  # loaded first: an existing study that is refused below gets nothing written
        study = optuna.load_study(study_name=setup.name, storage=backend, sampler=sampler)
    except KeyError:
        if not create:
            raise ConfigError(f"no study {setup.name!r} in {redact(url)}: run it first "
                              f"('crossflow study run {setup.name}')", key="storage",
                              value=redact(url)) from None
        try:
            study = optuna.create_study(storage=backend, study_name=setup.name,
                                        sampler=sampler,
                                        directions=["minimize"] * len(setup.objectives))
        except optuna.exceptions.DuplicatedStudyError:  # another process made it meanwhile
            study = optuna.load_study(study_name=setup.name, storage=backend, sampler=sampler)
        else:
            created = True
    stored = study.user_attrs.get(OBJECTIVES)
    if stored is None and create:
        study.set_user_attr(OBJECTIVES, list(setup.objectives))
    elif stored is not None and list(stored) != list(setup.objectives):
        raise ConfigError(f"the stored study {setup.name!r} optimises {stored}, the study file "
                          f"{list(setup.objectives)}: use another name or storage",
                          file=setup.file, key="objectives", value=list(setup.objectives))
    # the study the storage holds must be this one (its space, workload, hardware, ...)
    from crossflow.search.study.fingerprint import check

    check(study, setup, store=create, storage=redact(url))
    if created and on_create is not None:
        on_create(study)
    return study
