"""Hardware configs -> a :class:`~crossflow.arch.microarch.MicroArch`.

``--hardware`` takes a datasheet preset (``kind: microarch``, converted as written) or an
architecture template (``kind: architecture``, which the AGE, :mod:`crossflow.arch.age`,
turns into a chip from technology and budgets), by preset name, path, dict or spec.  The
system layer resolves a system file's ``device`` through this too.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from crossflow.arch.microarch import MicroArch
from crossflow.config.base import Spec
from crossflow.config.loader import load_spec
from crossflow.errors import ConfigError

#: What ``load_hardware`` accepts besides a MicroArch.
Source = str | Path | Mapping[str, Any] | Spec


def load_hardware(hardware: Source | MicroArch) -> MicroArch:
    """A MicroArch from a preset name, a path or dict (a preset or an AGE template).

    Raises ConfigError for bad input, InfeasibleDesignError for a template whose budgets
    cannot build a chip.
    """
    if isinstance(hardware, MicroArch):
        return hardware
    if isinstance(hardware, str | Path):
        return _load_named_hardware(str(hardware), _file_key(Path(hardware)))
    return _microarch(hardware if isinstance(hardware, Spec)
                      else load_spec(hardware, "hardware", "templates"))


def _file_key(path: Path) -> tuple[str, int] | None:
    """A file's absolute path and modification time: one relative path in two folders, or a
    file rewritten, is another device."""
    try:
        return (str(path.resolve()), path.stat().st_mtime_ns) if path.is_file() else None
    except OSError:
        return None


@lru_cache(maxsize=64)
def _load_named_hardware(source: str, key: tuple[str, int] | None = None) -> MicroArch:
    """One MicroArch per preset name or file (``key``), so kernel prices cached per device
    are reused across predictions (a search calls predict thousands of times)."""
    return _microarch(load_spec(source, "hardware", "templates"))


def _microarch(spec: Spec) -> MicroArch:
    if hasattr(spec, "to_microarch"):  # a datasheet preset
        return spec.to_microarch()
    from crossflow.arch.age import generate  # (the technology library) not for a datasheet

    try:  # an architecture template: the AGE builds the chip
        return generate(spec)
    except ConfigError as exc:  # e.g. a technology name the library does not have
        raise exc.with_file(spec.source_file) if spec.source_file else exc from None
