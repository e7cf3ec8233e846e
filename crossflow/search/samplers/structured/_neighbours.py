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

:func:`between` and :func:`away` add the mapping order: a point in another class of
orders than the incumbent's is :data:`ORDER_STEP` choices further (the classes come from
the study's :class:`._problem.Problem`, passed in).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from crossflow.search.orders import without_order
from crossflow.search.space import MAPPING_ORDER

_DEGREE = re.compile(r"^([A-Za-z]+)(\d+)$")
_MISSING = object()

#: In the descent a mapping order outside the incumbent's class counts as this many
#: choices: the first neighbourhood (reach 2) holds the incumbent's own other order
#: classes, the second (reach 3) every one-choice change in another class as well: a
#: strategy's best order is often in another class, and counted as one choice every order
#: would be a neighbour, which makes each neighbourhood 2.5x larger (docs/search-history.md,
#: "A twenty-second round").
ORDER_STEP = 2


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


def away(P, pool: list[dict[str, Any]], pool_parts: list[dict], best: Mapping[str, Any],
         reach: int) -> list[tuple[dict[str, Any], int]]:
    """Every point of ``pool`` (each combination, whose :func:`parts` are ``pool_parts``, in
    each of its order classes under ``P``) within ``reach`` of ``best``, with its
    :func:`between` distance."""
    order = best.get(MAPPING_ORDER)
    here = parts(dict(without_order(best)))
    out = []
    for c, q in zip(pool, pool_parts, strict=True):
        d = distance(here, q)
        if d > reach:
            continue
        for o in P.order_classes(c):
            step = d + _order_step(P, c, order, o)
            if step <= reach:
                out.append((P.with_order(c, o), step))
    return out


def between(P, a: Mapping[str, Any], b: Mapping[str, Any]) -> int:
    """How far point ``b`` is from ``a``: the choices its combination differs in
    (:func:`distance`), and :data:`ORDER_STEP` more for a mapping order outside the class
    of ``a``'s — so that a strategy that is better only in another order class (virtual
    stages added, whose interleaving wants the pipeline degree laid out before the data
    degree) is further away, not out of reach."""
    combo = dict(without_order(b))
    return (distance(parts(dict(without_order(a))), parts(combo))
            + _order_step(P, combo, a.get(MAPPING_ORDER), b.get(MAPPING_ORDER)))


def _order_step(P, combo: Mapping[str, Any], order: str | None, other: str | None) -> int:
    """:data:`ORDER_STEP` when ``other`` (a mapping order of ``combo``) is outside the class
    of ``order`` (another point's), else 0; 0 in a study that does not search orders."""
    if order is None:
        return 0
    return 0 if other == (P.same_class(combo, order) or P.canonical_order(combo)) \
        else ORDER_STEP
