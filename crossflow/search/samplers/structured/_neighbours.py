"""Which discrete combinations are next to which: a combination's choices taken apart.

A parallelism strategy is one categorical value (``t8-d48-p4-v12-sp``,
``RC-32-16-d1-p1``), but its name spells its degrees.  :func:`parts` reads a combination as
named parts — each ``letter(s)+number`` token of a name by its letters, a bare number by
its rank among the name's bare numbers, a word by its rank among its words — so that
:func:`distance` counts the choices two combinations differ in: ``t8-d48-p4`` and
``t4-d48-p8`` differ in two (a factor of two moved from tensor to pipeline parallelism, the
device count kept), and from ``t4-d48-p8-sp`` in three.  Ranks, not places: a token that
only some names have (``v5``, virtual pipeline stages) must not shift the place of those
after it, or ``t2-d8-p16-sp`` and ``t2-d8-p16-v5-sp`` would differ in three parts instead
of one.
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
            rank = {"number": 0, "word": 0}
            for token in value.split("-"):
                m = _DEGREE.match(token)
                if m:
                    out[(name, m.group(1))] = int(m.group(2))
                    continue
                kind = "number" if token.isdigit() else "word"
                out[(name, kind, rank[kind])] = token
                rank[kind] += 1
        else:
            out[(name,)] = value
    return out


def distance(a: Mapping[tuple, Any], b: Mapping[tuple, Any]) -> int:
    """How many parts differ (one present in only one of them counts as differing)."""
    return sum(1 for k in a.keys() | b.keys() if a.get(k, _MISSING) != b.get(k, _MISSING))
