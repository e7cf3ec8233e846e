"""Finding and loading configs: preset names, paths or dicts -> validated specs.

Presets live inside the package (``crossflow/presets/<family>/<name>.yaml``) so a name works
after any kind of install.  Each file names its ``kind`` (parallelism files may leave it
out, :data:`DEFAULT_KINDS`); :data:`KINDS` maps kinds to the spec classes that validate
them.

Registration flows upward (docs/architecture.md, "Config kinds"): the config layer lists
its own kinds here; a layer above that defines a kind registers it with
:func:`register_kind` when its module is imported; and :data:`ENTRY_POINTS`, filled by
the package root with :func:`declare_entry_points`, says which module to import for a kind
not registered yet.  This module names no module above the config layer.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from crossflow.config.base import Spec, build, did_you_mean, read_yaml
from crossflow.errors import ConfigError

#: kind -> (preset family folder, its Spec class or "module:Class" imported on first use).
#: The config layer's own kinds; layers above add theirs with :func:`register_kind`.
KINDS: dict[str, tuple[str, type[Spec] | str]] = {
    "microarch": ("hardware", "crossflow.config.hardware:MicroArchSpec"),
    "architecture": ("templates", "crossflow.config.template:ArchitectureTemplateSpec"),
    "technology": ("tech", "crossflow.config.technology:TechnologySpec"),
    "gemm": ("workloads", "crossflow.config.workload:GemmSpec"),
    "transformer": ("workloads", "crossflow.config.workload:TransformerSpec"),
    "lstm": ("workloads", "crossflow.config.workload:LstmSpec"),
    "system": ("systems", "crossflow.config.system:SystemSpec"),
}

#: kind -> (preset family folder, module that registers the kind when imported), for kinds
#: defined above the config layer; filled by :func:`declare_entry_points` (the package
#: root, ``crossflow/__init__.py``, declares the shipped ones).
ENTRY_POINTS: dict[str, tuple[str, str]] = {}


#: How a preset family is named in messages.
FAMILY_LABELS = {
    "hardware": "hardware",
    "templates": "architecture template",
    "workloads": "workload",
    "tech": "technology",
    "systems": "system",
    "parallelism": "parallelism",
    "studies": "study",
    "search_spaces": "search space",
}

#: Families also looked up in a folder of that name in the current directory, before the
#: shipped presets: users keep their own ``studies/`` and ``search_spaces/`` beside their
#: ``mlruns/`` (in the repository these folders link to the shipped ones).
LOCAL_FAMILIES = ("studies", "search_spaces")

#: Families whose files may leave ``kind`` out; it then defaults to this kind.
DEFAULT_KINDS = {"parallelism": "parallelism"}


def register_kind(kind: str, family: str, spec: type[Spec] | str) -> None:
    """Declare that files with ``kind: <kind>`` (presets in ``presets/<family>/``) validate
    with ``spec``, a Spec class or ``"module:Class"``.  A layer calls this for the kinds it
    defines when its module is imported."""
    KINDS[kind] = (family, spec)


def declare_entry_points(entry_points: Mapping[str, tuple[str, str]]) -> None:
    """Declare ``{kind: (family, module)}``: importing ``module`` registers ``kind``.  The
    loader imports it the first time a file of that kind is loaded."""
    ENTRY_POINTS.update(entry_points)


def kind_families() -> dict[str, str]:
    """kind -> preset family, registered or declared."""
    return {**{k: fam for k, (fam, _) in ENTRY_POINTS.items()},
            **{k: fam for k, (fam, _) in KINDS.items()}}


def spec_class(kind: str) -> type[Spec]:
    if kind not in KINDS and kind in ENTRY_POINTS:
        importlib.import_module(ENTRY_POINTS[kind][1])  # registers the kind
    if kind not in KINDS:
        declared = f" (importing {ENTRY_POINTS[kind][1]} did not register it)" if (
            kind in ENTRY_POINTS) else ""
        raise ConfigError(f"no spec class is registered for kind {kind!r}{declared}",
                          key="kind", value=kind, allowed=", ".join(sorted(kind_families())))
    spec = KINDS[kind][1]
    if isinstance(spec, str):
        module, _, name = spec.partition(":")
        spec = getattr(importlib.import_module(module), name)
    return spec


def preset_dir(family: str) -> Path:
    return Path(str(resources.files("crossflow") / "presets" / family))


@cache
def preset_names(family: str) -> tuple[str, ...]:
    folder = preset_dir(family)
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.stem for p in folder.glob("*.yaml")))


def local_names(family: str) -> tuple[str, ...]:
    """Names in ``./<family>/`` of the current directory (for :data:`LOCAL_FAMILIES`)."""
    folder = Path(family)
    if family not in LOCAL_FAMILIES or not folder.is_dir():
        return ()
    return tuple(sorted(p.stem for p in folder.glob("*.yaml")))


def _default_kind(data: Mapping[str, Any], families: tuple[str, ...]) -> str | None:
    """The kind of a file without ``kind``: its family's default, if it has one.

    With no family given (``crossflow check``), only a file whose keys all belong to the
    default kind's spec is taken as that kind.
    """
    for family in families:
        if family in DEFAULT_KINDS:
            return DEFAULT_KINDS[family]
    if not families:
        for kind in DEFAULT_KINDS.values():
            if data and set(data) <= set(spec_class(kind).model_fields):
                return kind
    return None


def _kind_of(data: Mapping[str, Any], file: str | None, families: tuple[str, ...]) -> str:
    kind = data.get("kind") if "kind" in data else _default_kind(data, families)
    allowed = sorted(k for k, fam in kind_families().items() if not families or fam in families)
    if kind is None:
        raise ConfigError("required key 'kind' is missing", file=file, key="kind",
                          allowed=", ".join(allowed))
    if kind not in allowed:
        raise ConfigError(f"unknown kind {kind!r} here", file=file, key="kind", value=kind,
                          allowed=", ".join(allowed))
    return kind


def load_spec(source: str | Path | Mapping[str, Any], *families: str) -> Spec:
    """Load a spec from a preset name, a YAML path or a dict.

    ``families`` restricts which kinds are acceptable (e.g. ``"hardware"``); a bare name is
    looked up among those families' presets.
    """
    if isinstance(source, Spec):  # already validated
        _kind_of({"kind": getattr(source, "kind", None)}, source.source_file, families)
        return source
    if isinstance(source, Mapping):
        data = dict(source)
        return build(spec_class(_kind_of(data, None, families)), data)
    file = _locate(str(source), families)
    try:
        stamp = Path(file).stat().st_mtime_ns
    except OSError:
        stamp = None  # read_yaml reports the problem
    return _load_file(file, stamp, families)


@lru_cache(maxsize=512)
def _load_file(file: str, stamp: int | None, families: tuple[str, ...]) -> Spec:
    """Specs are immutable, so one per (file, modification time) serves every caller: a
    search predicting thousands of designs reads each preset once."""
    data = read_yaml(file)
    kind = _kind_of(data, file, families)
    return build(spec_class(kind), data, file=file)


def _locate(source: str, families: tuple[str, ...]) -> str:
    path = Path(source)
    try:
        exists = path.exists()
    except OSError:  # a name too long, say: read_yaml says so
        exists = True
    if path.suffix in (".yaml", ".yml") or exists or "/" in source:
        if not source.strip():
            raise ConfigError("an empty name", value=source,
                              allowed="a preset name or a path to a YAML file")
        return str(path)
    for family in families:
        if family in LOCAL_FAMILIES:
            candidate = Path(family) / f"{source}.yaml"
            if candidate.is_file():
                return str(candidate)
        candidate = preset_dir(family) / f"{source}.yaml"
        if candidate.is_file():
            return str(candidate)
    names = sorted({n for fam in families for n in (*local_names(fam), *preset_names(fam))})
    what = " or ".join(FAMILY_LABELS.get(f, f) for f in families) or "config"
    raise ConfigError(
        f"unknown {what} preset {source!r}, and no file of that name"
        + did_you_mean(source, names),
        value=source,
        allowed=", ".join(names) + " (or a path to a YAML file)",
    )
