"""The study file (``kind: study``): its schema (docs/architecture.md, Studies).

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
    sampler: tpe                    # structured | gd | tpe | cmaes | random | nsga2
    sampler_options: {}             # keyword arguments of the sampler
    seed: 0
    n_trials: 500                   # the study's total: re-running resumes up to it
    storage: null                   # default: mlruns/optuna/<name>.journal (Optuna journal
                                    # file); or any Optuna storage URL (sqlite:///…,
                                    # postgresql://…) or another journal file path
    tracking_uri: null              # default: sqlite:///<cwd>/mlruns/mlflow.db

Relative paths (``mlruns/`` and files named in the study) are taken from the current
directory, as MLflow does; a YAML file named in a study is also looked for beside the study
file (:mod:`crossflow.search.study.setup`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from crossflow.config.base import Spec
from crossflow.config.loader import register_kind
from crossflow.errors import ConfigError
from crossflow.search.samplers import NAMES as SAMPLER_NAMES
from crossflow.search.samplers import canonical

#: What a study can minimise (the objective's values, see :mod:`crossflow.search.objective`).
OBJECTIVES = ("iteration_time_s", "energy_J", "power_W", "memory_per_device_bytes")


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
    objectives: tuple[Literal[OBJECTIVES], ...] = Field(  # type: ignore[valid-type]
        default=("iteration_time_s",), min_length=1)
    sampler: Literal[SAMPLER_NAMES] = "tpe"  # type: ignore[valid-type]
    sampler_options: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = Field(default=0, ge=0, lt=2**32)
    n_trials: int = Field(ge=1)
    storage: str | None = Field(default=None, min_length=1)
    tracking_uri: str | None = Field(default=None, min_length=1)
    #: the first trial of a fresh study evaluates the template's own budget split and
    #: technology (the other dimensions sampled): a feasible reference point to improve on
    baseline: bool = True

    @field_validator("sampler", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        return canonical(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        for i, name in enumerate(self.objectives):
            if name in self.objectives[:i]:
                raise ConfigError("listed twice", key=f"objectives[{i}]", value=name)
        from crossflow.search.samplers import check_objectives

        check_objectives(self.sampler, len(self.objectives))
        if self.overrides:
            from crossflow.arch.age import OVERRIDE_KEYS

            for key, value in self.overrides.items():
                if key not in OVERRIDE_KEYS:
                    raise ConfigError("unknown override", key=f"overrides.{key}",
                                      value=value, allowed=", ".join(OVERRIDE_KEYS))
                _check_override(key, value)
        if self.mapping_order is not None and self.mapping_order != "best":
            from crossflow.system import parse_order

            parse_order(self.mapping_order)
        return self


#: Overrides that are mappings ({component or level: value}), names, and numbers.
_MAPPING_OVERRIDES = ("memory", "area_fractions", "power_fractions", "perimeter_fractions")
_NAME_OVERRIDES = ("logic_node", "dram")
_LINK_OVERRIDES = ("intra_link", "inter_link")


def _check_override(key: str, value: Any) -> None:
    """The type of one override (the AGE checks the values when the study is resolved)."""
    if key in _MAPPING_OVERRIDES:
        if not isinstance(value, dict):
            raise ConfigError("must be a mapping", key=f"overrides.{key}", value=value,
                              allowed="{name: value, ...}")
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError("keys must be names", key=f"overrides.{key}", value=k)
            if key == "memory" and not isinstance(v, str):
                raise ConfigError("must be a memory technology name",
                                  key=f"overrides.{key}.{k}", value=v)
            if key != "memory" and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ConfigError("must be a fraction (a number in [0, 1])",
                                  key=f"overrides.{key}.{k}", value=v)
    elif key in _NAME_OVERRIDES and not isinstance(value, str):
        raise ConfigError("must be a technology name", key=f"overrides.{key}", value=value)
    elif key in _LINK_OVERRIDES and value is not None and not isinstance(value, str):
        raise ConfigError("must be a link technology name or null", key=f"overrides.{key}",
                          value=value)
    elif key not in (*_MAPPING_OVERRIDES, *_NAME_OVERRIDES, *_LINK_OVERRIDES) and (
            isinstance(value, bool) or not isinstance(value, int | float)):
        raise ConfigError("must be a number", key=f"overrides.{key}", value=value)


register_kind("study", "studies", StudySpec)
