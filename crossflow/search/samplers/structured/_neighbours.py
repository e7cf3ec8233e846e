"""Which discrete combinations are next to which: a combination's choices taken apart.

A parallelism strategy is one categorical value (``t8-d48-p4-v12-sp``,
``RC-32-16-d1-p1``), but its name spells its degrees.  :func:`parts` reads a combination as
named parts — each ``letter(s)+number`` token of a name by its letters, a bare number or
word by its place — so that :func:`distance` counts the choices two combinations differ
in: ``t8-d48-p4`` and ``t4-d48-p8`` differ in two (a factor of two moved from tensor to
pipeline parallelism, the device count kept), and from ``t8-d48-p4-sp`` in three.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_DEGREE = re.compile(r"^([A-Za-z]+)(\d+)$")
_MISSING = object()


def parts(combo: Mapping[str, Any]) -> dict[tuple, Any]:
    """``combo`` (dimension -> choice) as its parts: a string choice with dashes split into
    its tokens, any other choice whole."""
    out: dict[tuple, Any] = {}
    for name, value in combo.items():
        if isinstance(value, str) and "-" in value:
            for place, token in enumerate(value.split("-")):
                m = _DEGREE.match(token)
                if m:
                    out[(name, m.group(1))] = int(m.group(2))
                else:
                    out[(name, place)] = token
        else:
            out[(name,)] = value
    return out


def distance(a: Mapping[tuple, Any], b: Mapping[tuple, Any]) -> int:
    """How many parts differ (one present in only one of them counts as differing)."""
    return sum(1 for k in a.keys() | b.keys() if a.get(k, _MISSING) != b.get(k, _MISSING))
