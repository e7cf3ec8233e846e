"""The shipped presets by kind, each with a one-line description (``crossflow presets``).

A preset family is a folder of ``crossflow/presets/`` (the config loader's registry:
:data:`crossflow.config.loader.KINDS`, :func:`~crossflow.config.loader.preset_names`); its
kind is the word the command line takes (``hardware``, ``template``, ``technology``,
``workload``, ``system``, ``parallelism``, ``search-space``, ``study``) plus the measured data
sets ``validate`` compares with (``measurement``).  A preset's description is its YAML's
``description:``, else the first sentence of its leading comment (a CSV's first ``#`` line).
Studies and search spaces in ``./studies/`` and ``./search_spaces/`` are listed too, marked
as local: the loader finds them before the shipped ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from crossflow.config import loader
from crossflow.errors import ConfigError

#: preset family folder -> the kind the command line names it by, in listing order.
_KIND_OF_FAMILY = {
    "hardware": "hardware",
    "templates": "template",
    "tech": "technology",
    "workloads": "workload",
    "systems": "system",
    "parallelism": "parallelism",
    "search_spaces": "search-space",
    "studies": "study",
    "measurements": "measurement",
}
#: Families that hold data files, not YAML presets: family -> file pattern (recursive).
_DATA_FAMILIES = {"measurements": "*.csv"}


def _families() -> list[str]:
    registered = set(loader.kind_families().values()) | set(loader.FAMILY_LABELS)
    ordered = [f for f in _KIND_OF_FAMILY if f in registered or f in _DATA_FAMILIES]
    return ordered + sorted(registered - set(ordered))


def _kinds() -> dict[str, str]:
    return {_KIND_OF_FAMILY.get(f, f.replace("_", "-")): f for f in _families()}


#: kind -> preset family folder (``crossflow presets KIND`` takes the kind).
KINDS: dict[str, str] = _kinds()


def family_of(kind: str) -> str:
    """The family folder of ``kind`` (also accepts a folder name, a plural, ``search space``)."""
    word = kind.strip().lower().replace("_", "-").replace(" ", "-")
    for k, family in KINDS.items():
        label = loader.FAMILY_LABELS.get(family, k).replace(" ", "-")
        if word in (k, f"{k}s", family.replace("_", "-"), label, f"{label}s"):
            return family
    raise ConfigError("unknown preset kind", file="command line", key="KIND", value=kind,
                      allowed=", ".join(KINDS))


_SENTENCE_END = re.compile(r"(?<!et al)(?<!e\.g)(?<!i\.e)(?<!\bvs)\.(?:\s+(?=[A-Z])|\s*$)")


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    m = _SENTENCE_END.search(text)
    return text[: m.start()] if m else text


def _leading_comment(path: Path) -> str:
    lines = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            stripped = line.strip()
            if not stripped.startswith("#"):
                break
            body = stripped.lstrip("#").strip()
            if not body:
                if lines:
                    break
                continue
            lines.append(body)
    return " ".join(lines)


def describe(path: Path) -> str:
    """A preset file's one-line description."""
    if path.suffix in (".yaml", ".yml"):
        try:
            data = loader.read_yaml(str(path))
        except ConfigError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("description"), str):
            return " ".join(data["description"].split())
    text = _first_sentence(_leading_comment(path))
    return text.removeprefix("source: ")


def _entries(family: str) -> list[dict[str, Any]]:
    folder = loader.preset_dir(family)
    out: list[dict[str, Any]] = []
    if family in _DATA_FAMILIES:
        files = sorted(folder.rglob(_DATA_FAMILIES[family])) if folder.is_dir() else []
        for f in files:
            out.append({"name": f.relative_to(folder).as_posix(), "file": str(f),
                        "origin": "shipped", "description": describe(f)})
        return out
    for name in loader.preset_names(family):
        f = folder / f"{name}.yaml"
        out.append({"name": name, "file": str(f), "origin": "shipped", "description": describe(f)})
    for name in loader.local_names(family):
        f = Path(family) / f"{name}.yaml"
        shipped = folder / f"{name}.yaml"
        if shipped.is_file() and shipped.resolve() == f.resolve():
            continue  # ./studies is the shipped folder (as in the repository)
        out.append({"name": name, "file": str(f), "origin": f"local ./{family}",
                    "description": describe(f)})
    return sorted(out, key=lambda e: (e["name"], e["origin"] != "shipped"))


def catalogue(kind: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """kind -> presets (``name``, ``description``, ``file``, ``origin``): every kind, or
    ``kind``'s only.  An unknown kind is a :class:`~crossflow.errors.ConfigError`."""
    families = [family_of(kind)] if kind is not None else list(KINDS.values())
    kind_of = {f: k for k, f in KINDS.items()}
    return {kind_of[f]: _entries(f) for f in families}
