"""``crossflow check``: validate config files, and designs exported by a study.

A config file names its ``kind`` and is validated by its spec (the config loader).  A file
without ``kind`` whose top level has a ``predict`` mapping is a design written by
``crossflow study best NAME --export FILE`` (:func:`crossflow.search.study.export_design`):
``predict`` holds the keyword arguments of :func:`crossflow.predict` (preset names stay
names, the rest inline) and ``files`` the files written beside it, one per inline part,
which ``command`` passes to ``crossflow predict``.  Checking one validates every part —
each file beside it, each inline part and each preset name — and the mapping order.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crossflow.config.base import read_yaml
from crossflow.config.loader import load_spec
from crossflow.errors import ConfigError, InfeasibleDesignError

#: The parts of a design's ``predict`` -> the preset families each may name.
DESIGN_PARTS: dict[str, tuple[str, ...]] = {
    "workload": ("workloads",),
    "hardware": ("hardware", "templates"),
    "system": ("systems",),
    "parallelism": ("parallelism",),
}
_PREDICT_KEYS = (*DESIGN_PARTS, "mapping_order")


def is_design(data: Any) -> bool:
    """Whether a YAML document is an exported design (no ``kind``, a ``predict`` mapping)."""
    return isinstance(data, Mapping) and "kind" not in data and "predict" in data


def check_file(file: str | Path) -> str:
    """Validate ``file``; returns what it is (``architecture``, ``design of study ...``) with
    notes.  Raises :class:`~crossflow.errors.ConfigError` on the first problem."""
    file = str(file)
    if not file.strip():
        raise ConfigError("an empty name", file="command line", value=file,
                          allowed="a path to a YAML file")
    data = read_yaml(file)
    if is_design(data):
        return check_design(data, file)
    spec = load_spec(Path(file))
    if spec.kind == "study":  # resolved as 'study run' will use it (nothing is created)
        from crossflow.search.study import check_study

        check_study(spec)
    if spec.kind == "lstm":  # the unroll's size, refused by predict before any work
        from crossflow.workloads.lstm import check_size

        try:
            check_size(spec)
        except ConfigError as exc:
            raise ConfigError(exc.problem, file=file, key=exc.key, value=exc.value,
                              allowed=exc.allowed) from None
    return spec.kind + _infeasible_note(spec)


def _infeasible_note(spec) -> str:
    """For an architecture template: resolve its technology names (the AGE builds it)."""
    if getattr(spec, "kind", None) != "architecture":
        return ""
    from crossflow.predict import load_hardware

    try:
        load_hardware(spec)
    except InfeasibleDesignError as exc:
        return f"; as given the design is infeasible: {exc}"
    return ""


def _beside(path: str, design_file: str) -> Path | None:
    """A file a design names: as written (relative to where the export ran), else the file
    of that name beside the design (the design and its files were moved together)."""
    candidates = [Path(path), Path(design_file).parent / Path(path).name]
    if not Path(path).is_absolute():
        candidates.insert(1, Path(design_file).parent / path)
    return next((c for c in candidates if c.is_file()), None)


def check_design(data: Mapping[str, Any], file: str) -> str:
    """Validate an exported design document ``data`` read from ``file`` (see module doc)."""
    predict = data["predict"]
    if not isinstance(predict, Mapping):
        raise ConfigError("must be a mapping of crossflow.predict's arguments", file=file,
                          key="predict", value=predict, allowed=", ".join(_PREDICT_KEYS))
    unknown = sorted(set(predict) - set(_PREDICT_KEYS))
    if unknown:
        raise ConfigError("unknown argument of crossflow.predict", file=file,
                          key=f"predict.{unknown[0]}", allowed=", ".join(_PREDICT_KEYS))
    for part in ("workload", "hardware"):
        if predict.get(part) is None:
            raise ConfigError("required key is missing", file=file, key=f"predict.{part}")
    files = data.get("files") or {}
    if not isinstance(files, Mapping):
        raise ConfigError("must map each part to the file written for it", file=file,
                          key="files", value=files, allowed=", ".join(DESIGN_PARTS))
    for part in files:
        if part not in DESIGN_PARTS:
            raise ConfigError("not a part of a design", file=file, key=f"files.{part}",
                              allowed=", ".join(DESIGN_PARTS))
    notes = []
    for part, families in DESIGN_PARTS.items():
        value = predict.get(part)
        if part in files:
            found = _beside(str(files[part]), file)
            if found is None:
                raise ConfigError(
                    "the file written beside the design is missing (export the design "
                    "again, or keep its files beside it)", file=file, key=f"files.{part}",
                    value=files[part])
            spec = _load_part(part, str(found), families, file)
            notes.append(f"{part} {found} ({spec.kind}){_infeasible_note(spec)}")
        elif value is not None:
            spec = _load_part(part, value, families, file)
            shown = value if isinstance(value, str) else "inline"
            notes.append(f"{part} {shown} ({spec.kind}){_infeasible_note(spec)}")
    order = predict.get("mapping_order")
    if order is not None and order != "best":
        from crossflow.system.system import parse_order

        try:
            parse_order(order)
        except ConfigError as exc:
            raise _inside(exc, file, "predict") from None
    head = "design"
    if "study" in data:
        head += f" of study {data['study']}" + (f", trial {data['trial']}"
                                                 if "trial" in data else "")
    return f"{head}: " + "; ".join(notes)


def _load_part(part: str, value: Any, families: tuple[str, ...], file: str):
    """Validate one part: a file, an inline mapping (errors point into ``predict.PART``) or
    a preset name (a parallelism may also be a strategy string such as ``RC-4-2-d32-p2``)."""
    try:
        if part == "parallelism":
            from crossflow.parallel import parse_parallelism

            return parse_parallelism(value)
        return load_spec(value, *families)
    except ConfigError as exc:
        if isinstance(value, Mapping):
            raise _inside(exc, file, f"predict.{part}") from None
        if exc.file:  # the error is in the file the part names
            raise
        raise ConfigError(exc.problem, file=file, key=f"predict.{part}", value=value,
                          allowed=exc.allowed) from None


def _inside(exc: ConfigError, file: str, prefix: str) -> ConfigError:
    key = f"{prefix}.{exc.key}" if exc.key else prefix
    return ConfigError(exc.problem, file=file, key=key, value=exc.value, allowed=exc.allowed)
