"""Samplers by name: ``structured`` (the structure-aware driver, the default), ``gd`` (the
paper's §7 gradient descent), ``tpe``, ``cmaes``, ``random``, ``nsga2``.

* ``structured`` — :class:`crossflow.search.samplers.structured.StructuredSampler`: an exact
  screen of the discrete choices (memory-only checks first, one mapping order per class of
  equivalent orders), axial probes of the budget split, a successive-halving race of
  local searches of the split, the winner's local search restarted while it gains, the
  race's losers resumed, then variable neighbourhood search from the incumbent, and
  IPOP-CMA-ES when no shake wins.
* ``gd`` — :class:`crossflow.search.samplers.gd.GDSampler`: the paper's eq. 6
  (momentum-projected gradient descent) from random starts.  ``gd-paper`` is an older name
  of it, still accepted.
* ``tpe`` — :class:`optuna.samplers.TPESampler`, multivariate (the simplex coordinates are
  coupled through the softmax) with the constant liar for parallel workers.
* ``cmaes`` — :class:`optuna.samplers.CmaEsSampler` on the continuous and integer
  parameters; the categoricals (strategy, mapping order, technology) are sampled explicitly
  by an independent TPE sampler (``independent_sampler``; its warning is off because that
  is the design, not a silent random fallback).  One objective only.
* ``random`` — :class:`optuna.samplers.RandomSampler`.
* ``nsga2`` — :class:`optuna.samplers.NSGAIISampler` (multi-objective; constrained
  domination reads the trials' ``infeasibility`` constraint) whose children are designs the
  study does not hold yet (:mod:`crossflow.search.samplers.nsga2`).

A study's ``sampler_options`` are keyword arguments of the sampler class (checked against
its signature when the study is loaded); ``seed`` is given separately.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crossflow.errors import ConfigError


@dataclass(frozen=True)
class SamplerInfo:
    """What the rest of CrossFlow needs to know about one sampler."""

    name: str
    #: optimises several objectives too (else one only)
    multi_objective: bool
    #: run by ``crossflow compare`` by default
    compared: bool
    #: every worker of a launch uses the launch's seed (the workers share one plan, or one
    #: set of chains, keyed by it); else worker k is seeded seed + k
    shared_seed: bool = False
    #: keyword arguments a study's sampler_options can override
    defaults: Mapping[str, Any] = field(default_factory=dict)


#: Every sampler a study can name, in the order help and tables list them: the one record
#: (the study file's schema, ``study run --sampler``, ``crossflow compare``, the launch's
#: seeds and the reports read it from here).
SAMPLERS: dict[str, SamplerInfo] = {s.name: s for s in (
    SamplerInfo("structured", multi_objective=False, compared=True, shared_seed=True),
    SamplerInfo("gd", multi_objective=False, compared=True, shared_seed=True),
    SamplerInfo("tpe", multi_objective=True, compared=True,
                defaults={"multivariate": True, "constant_liar": True}),
    SamplerInfo("cmaes", multi_objective=False, compared=True),
    SamplerInfo("random", multi_objective=True, compared=True),
    # a multi-objective method: no contender on one objective
    SamplerInfo("nsga2", multi_objective=True, compared=False),
)}
NAMES = tuple(SAMPLERS)
#: Older names still accepted, and what they stand for now.
ALIASES = {"gd-paper": "gd"}
DEFAULTS: dict[str, dict[str, Any]] = {n: dict(s.defaults) for n, s in SAMPLERS.items()}
SINGLE_OBJECTIVE = tuple(n for n, s in SAMPLERS.items() if not s.multi_objective)
MULTI_OBJECTIVE = tuple(n for n, s in SAMPLERS.items() if s.multi_objective)
COMPARED = tuple(n for n, s in SAMPLERS.items() if s.compared)


def canonical(name: str) -> str:
    """A sampler's name, an older alias replaced by the name it stands for."""
    return ALIASES.get(name, name)
#: The multi-objective samplers the Pareto report runs (random search is no contender).
PARETO = ("nsga2", "tpe")


def sampler_class(name: str):
    """The sampler class of ``name`` (imports optuna, or the gd package)."""
    name = canonical(name)
    if name == "structured":
        from crossflow.search.samplers.structured import StructuredSampler

        return StructuredSampler
    if name == "gd":
        from crossflow.search.samplers.gd import GDSampler

        return GDSampler
    if name == "nsga2":
        from crossflow.search.samplers.nsga2 import DistinctNSGAIISampler

        return DistinctNSGAIISampler
    import optuna

    classes = {"tpe": optuna.samplers.TPESampler, "cmaes": optuna.samplers.CmaEsSampler,
               "random": optuna.samplers.RandomSampler}
    if name not in classes:
        raise ConfigError("unknown sampler", key="sampler", value=name, allowed=", ".join(NAMES))
    return classes[name]


#: Arguments the factory sets itself.
_RESERVED = {"seed", "simplexes", "setup", "independent_sampler", "warn_independent_sampling"}


def check_options(name: str, options: Mapping[str, Any], *, file: str | None = None) -> None:
    """Raise a ConfigError naming ``sampler_options.<key>`` unless every option is a keyword
    argument of the sampler."""
    name = canonical(name)
    if name not in NAMES:
        raise ConfigError("unknown sampler", file=file, key="sampler", value=name,
                          allowed=", ".join(NAMES))
    cls = sampler_class(name)
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    allowed = sorted(k for k in params if k not in ("self", *_RESERVED))
    if not isinstance(options, Mapping):
        raise ConfigError("must be a mapping of option names to values", file=file,
                          key="sampler_options", value=options,
                          allowed=", ".join(allowed))
    hints = _hints(cls)
    for key, value in options.items():
        if key not in allowed:
            raise ConfigError(f"not an option of the {name} sampler", file=file,
                              key=f"sampler_options.{key}", value=value,
                              allowed=", ".join(allowed))
        if key in hints and _matches(value, hints[key]) is False:
            raise ConfigError(f"wrong type for this option of the {name} sampler", file=file,
                              key=f"sampler_options.{key}", value=value,
                              allowed=_type_name(hints[key]))
    if name == "structured":  # the values too, as the launch will (check = run)
        from crossflow.search.samplers.structured import Settings

        try:
            Settings(**dict(options))
        except ValueError as exc:
            bad = next((k for k in options if f"`{k}" in str(exc)), None)
            raise ConfigError(str(exc), file=file,
                              key=f"sampler_options.{bad}" if bad else "sampler_options",
                              value=options.get(bad) if bad else dict(options)) from None


def _hints(cls) -> dict[str, Any]:
    """The annotations of ``cls.__init__``'s parameters, each resolved on its own (one
    that names a type the module imports only for type checking is left out)."""
    import collections.abc
    import sys
    import typing

    try:
        return typing.get_type_hints(cls.__init__)
    except Exception:  # noqa: BLE001 - resolve those that can be, one by one
        pass
    module = sys.modules.get(getattr(cls.__init__, "__module__", ""), None)
    namespace = {**vars(collections.abc), **vars(typing), **(vars(module) if module else {})}
    out: dict[str, Any] = {}
    for key, p in inspect.signature(cls.__init__).parameters.items():
        hint = p.annotation
        if hint is inspect.Parameter.empty:
            continue
        if isinstance(hint, str):
            try:
                hint = eval(hint, namespace)  # noqa: S307 - the sampler library's own annotation
            except Exception:  # noqa: BLE001
                continue
        out[key] = hint
    return out


def _matches(value: Any, hint: Any) -> bool | None:
    """Whether a YAML ``value`` fits the annotation ``hint`` (None: cannot tell)."""
    import collections.abc
    import types
    import typing

    if hint is Any or hint is inspect.Parameter.empty:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        found = [_matches(value, h) for h in typing.get_args(hint)]
        return True if True in found else (None if None in found else False)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is None or hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    base = origin or hint
    if base in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        return isinstance(value, Mapping)
    if base in (list, tuple, collections.abc.Sequence):
        return isinstance(value, list | tuple)
    if base is collections.abc.Callable:
        return callable(value)
    if isinstance(base, type):
        return isinstance(value, base)
    return None


def _type_name(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if not hasattr(hint, "__args__") else None
    return text or str(hint).replace("typing.", "").replace("collections.abc.", "")


def check_objectives(name: str, n_objectives: int, *, key: str = "sampler",
                     file: str | None = None) -> None:
    """Raise a ConfigError when sampler ``name`` optimises one objective and the study has
    several (checked before a study is created)."""
    if canonical(name) in SINGLE_OBJECTIVE and n_objectives > 1:
        raise ConfigError(f"the {name} sampler optimises one objective and the study has "
                          f"{n_objectives}; use {', '.join(MULTI_OBJECTIVE)} for several",
                          file=file,
                          key=key, value=name)


def make_sampler(name: str, *, seed: int | None, options: Mapping[str, Any] | None = None,
                 space=None, n_objectives: int = 1, setup=None):
    """The Optuna sampler ``name`` for a study whose search space is ``space`` (a
    :class:`crossflow.search.space.SearchSpace`; ``gd`` needs its simplexes) and
    whose setup is ``setup`` (a StudySetup: the ``structured`` driver reads the
    template, the workload and the system)."""
    name = canonical(name)
    options = {**DEFAULTS.get(name, {}), **dict(options or {})}
    check_options(name, options)
    check_objectives(name, n_objectives)
    cls = sampler_class(name)
    try:
        if name == "cmaes":
            import optuna

            categorical = optuna.samplers.TPESampler(seed=seed, multivariate=False)
            return cls(seed=seed, independent_sampler=categorical,
                       warn_independent_sampling=False, **options)
        if name == "structured":
            if setup is None:
                raise ConfigError(f"the {name} sampler needs the study's setup", key="sampler",
                                  value=name)
            return cls(setup=setup, seed=seed, **options)
        if name == "gd":
            simplexes = space.simplex_components() if space is not None else {}
            return cls(simplexes=simplexes, seed=seed, **options)
        return cls(seed=seed, **options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"the {name} sampler rejects these options: {exc}",
                          key="sampler_options", value=dict(options)) from None
