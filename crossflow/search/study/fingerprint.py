"""What a stored study was made from: a fingerprint of the resolved study, kept as the
study's user attribute ``fingerprint`` and compared at each launch, ``show`` and ``best``
(docs/architecture.md, Studies).

A study file edited under an existing study (``./studies/quickstart.yaml`` shadowing the
shipped preset with another search space, say) would otherwise go on in the old storage:
Optuna then dies on a distribution that changed, and an export decodes old trials with the
new space (a design that does not reproduce its trial's value).  The fingerprint holds
what decides the meaning of a trial — the search space (its simplexes and every
dimension's distribution), the workload, the hardware, the system, the device count, the
fixed parallelism and mapping order, the overrides and the objectives; configs by name
and a digest of their resolved content — and :func:`changes` says in words what differs.
A study stored before fingerprints existed gets one on its next launch, silently.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

#: The study user attribute that holds the fingerprint.
ATTR = "fingerprint"
#: Bumped when the fingerprint's shape changes (a stored one of another version is
#: replaced, not compared).
VERSION = 1
#: Keys of a resolved config that do not change what it computes.
_COSMETIC = ("name", "description")


def _digest(spec: Any) -> dict[str, Any] | None:
    if spec is None:
        return None
    doc = spec.model_dump(mode="json")
    body = {k: v for k, v in doc.items() if k not in _COSMETIC}
    text = json.dumps(body, sort_keys=True, default=str)
    return {"name": doc.get("name"), "digest": hashlib.sha256(text.encode()).hexdigest()[:16]}


def fingerprint(setup) -> dict[str, Any]:
    """The fingerprint of a resolved study (a :class:`~crossflow.search.study.StudySetup`):
    JSON-able, the same for the same resolved study in any process."""
    space = setup.space
    doc = {
        "version": VERSION,
        "search_space": {
            "simplexes": {s.name: {"components": list(s.components),
                                   "fixed": {k: float(v) for k, v in s.fixed.items()}}
                          for s in space.simplexes},
            "dimensions": {d.name: d.describe() for d in space.dimensions},
        },
        "workload": _digest(setup.workload),
        "hardware": _digest(setup.template if setup.template is not None else setup.device),
        "system": _digest(setup.system),
        "devices": setup.devices,
        "parallelism": {"strategy": setup.strategy, **dict(setup.parallelism_base)},
        "mapping_order": setup.mapping_order,
        "overrides": dict(setup.spec.overrides),
        "objectives": list(setup.objectives),
    }
    # as the storage gives it back (tuples become lists), so equal studies compare equal
    return json.loads(json.dumps(doc, sort_keys=True, default=str))


def _named(part: Mapping[str, Any] | None) -> str:
    return "none" if part is None else str(part.get("name"))


def _space_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, what in (("simplexes", "budget simplex"), ("dimensions", "dimension")):
        a, b = old.get(key, {}), new.get(key, {})
        for name in b:
            if name not in a:
                out.append(f"{what} {name} added")
        for name in a:
            if name not in b:
                out.append(f"{what} {name} removed")
        for name in a:
            if name not in b or a[name] == b[name]:
                continue
            if key == "dimensions":
                kind = "choices" if isinstance(b[name], list) else "range"
                out.append(f"{name} {kind} changed")
            else:  # a simplex's searched components are its dimensions (area.core, ...)
                ca, cb = a[name].get("components", []), b[name].get("components", [])
                out += [f"dimension {name}.{c} added" for c in cb if c not in ca]
                out += [f"dimension {name}.{c} removed" for c in ca if c not in cb]
                if a[name].get("fixed") != b[name].get("fixed"):
                    out.append(f"{name} fixed fractions changed")
    return out


def changes(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between a stored fingerprint and the current one, in words (empty: the
    same study)."""
    out: list[str] = []
    space = _space_changes(stored.get("search_space", {}), current.get("search_space", {}))
    if space:
        out.append("search space: " + "; ".join(space))
    for key in ("workload", "hardware", "system"):
        a, b = stored.get(key), current.get(key)
        if a == b:
            continue
        if _named(a) != _named(b):
            out.append(f"{key}: {_named(a)} -> {_named(b)}")
        else:
            out.append(f"{key}: {_named(b)} has other contents")
    for key, label in (("devices", "devices"), ("parallelism", "fixed parallelism"),
                       ("mapping_order", "mapping order"), ("overrides", "overrides"),
                       ("objectives", "objectives")):
        a, b = stored.get(key), current.get(key)
        if a != b:
            out.append(f"{label}: {_show(a)} -> {_show(b)}")
    return out


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) \
        else value
    return text if len(text) <= 80 else text[:77] + "..."


def check(study, setup, *, store: bool, storage: str) -> None:
    """Compare ``study``'s stored fingerprint with ``setup``'s: a ConfigError saying what
    changed and how to go on when they differ; without one (a study older than
    fingerprints, or a fresh one), store it if ``store``."""
    from crossflow.errors import ConfigError

    current = fingerprint(setup)
    stored = study.user_attrs.get(ATTR)
    if not isinstance(stored, Mapping) or stored.get("version") != VERSION:
        if store:
            study.set_user_attr(ATTR, current)
        return
    diff = changes(stored, current)
    if not diff:
        return
    from crossflow.search.locations import is_url

    source = setup.file or f"the preset {setup.name!r}"
    delete = (f"delete {storage}" if not is_url(storage) else
              f"delete the study from that database ('optuna delete-study --storage URL "
              f"--study-name {setup.name}')")
    raise ConfigError(
        f"the study {setup.name!r} in {storage} was made from another version of this "
        f"study ({source} now differs: {'; '.join(diff)}), so its trials do not stand for "
        "the same designs any more.  To go on, start a new study: give the study file "
        f"another 'name:', or pass --storage elsewhere; or {delete} to start this one over",
        file=setup.file, key=_first_key(diff))


def _first_key(diff: list[str]) -> str:
    head = diff[0].split(":", 1)[0]
    return {"fixed parallelism": "parallelism", "mapping order": "mapping_order",
            "search space": "search_space"}.get(head, head)
