"""Parallelism strategies and their names (paper §3.3; Megatron-LM's t/p/d).

The paper names a strategy ``RC-{KP1}-{KP2}-d{DP}-p{LP}`` or ``CR-{KP1}-d{DP}-p{LP}``:

* **RC** (row–column, inner product): each GEMM C = A·B is split ``kp1`` ways along the rows
  of A and ``kp2`` ways along the columns of B; device (i, j) computes block C[i, j] with
  the full reduction dimension (then all-gathers).
* **CR** (column–row, outer product): the reduction dimension K is split ``kp1`` ways; every
  device computes a full-size partial C (then reduce-scatters).
* **d** data parallelism (model replicas, each on a shard of the batch) and **p** layer
  (pipeline) parallelism (the layers cut into consecutive stages).

Transformers use Megatron's tensor parallelism instead (Narayanan et al. SC21 §2.3): a
kernel-parallel type of its own, ``t{T}``, that splits the first GEMM of each pair by
columns and the second by rows (one all-reduce per pair).  It may add interleaved virtual
stages ``v{V}`` (SC21 §2.2.2) and sequence parallelism ``sp`` (Korthikanti et al. 2022).

This module depends on nothing but :mod:`crossflow.errors`, so config code can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from crossflow.errors import ConfigError

KernelType = Literal["RC", "CR", "TP"]
KERNEL_TYPES: tuple[str, ...] = ("RC", "CR", "TP")

GRAMMAR = (
    "RC-{kp1}-{kp2}-d{dp}-p{lp} or CR-{kp1}-d{dp}-p{lp} (paper §3.3), or t{tp}-d{dp}-p{pp} "
    "(Megatron tensor parallelism), optionally followed by -v{stages} (interleaved pipeline) "
    "and -sp (sequence parallelism, with t only); parts may come in any order, e.g. "
    "P2-D3-RC-4-2 as in the paper's Fig. 5; a missing d or p means 1; degrees are integers >= 1"
)

_NUMBER = re.compile(r"[Kk]?([0-9]+)")
_TAGGED = re.compile(r"(?i)(tp|t|d|p|v)([0-9]+)")
_TAG_FIELD = {"tp": "kp1", "t": "kp1", "d": "dp", "p": "lp", "v": "vp"}


def _bad(problem: str, text: object) -> ConfigError:
    return ConfigError(problem, key="strategy", value=text, allowed=GRAMMAR)


@dataclass(frozen=True, slots=True)
class Strategy:
    """A point of the parallelism space: the device grid (kp1, kp2, dp, lp) and its options.

    ``kp_type`` is "RC" (kp1 × kp2 torus), "CR" (ring of kp1; kp2 = 1) or "TP" (Megatron
    tensor parallelism of degree kp1 = tp; kp2 = 1).  Build one from a name with
    :meth:`parse`, from Megatron's degrees with :meth:`megatron`, or directly.
    """

    kp_type: KernelType = "RC"
    kp1: int = 1
    kp2: int = 1
    dp: int = 1
    lp: int = 1
    #: interleaved (virtual) pipeline stages per device, SC21 §2.2.2
    vp: int = 1
    #: sequence parallelism over the tensor-parallel group (Korthikanti et al. 2022 §4.2.2)
    sp: bool = False

    def __post_init__(self) -> None:
        if self.kp_type not in KERNEL_TYPES:
            raise ConfigError("unknown kernel-parallelism type", key="kp_type",
                              value=self.kp_type, allowed=", ".join(KERNEL_TYPES))
        for name in ("kp1", "kp2", "dp", "lp", "vp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError("a parallel degree must be an integer >= 1", key=name,
                                  value=value)
        if not isinstance(self.sp, bool):
            raise ConfigError("must be true or false", key="sp", value=self.sp)
        if self.kp_type != "RC" and self.kp2 != 1:
            raise ConfigError(f"{self.kp_type} kernel parallelism has one degree (kp1); kp2 "
                              "must be 1", key="kp2", value=self.kp2)
        if self.vp > 1 and self.lp == 1:
            raise ConfigError("interleaved virtual stages need pipeline parallelism (lp > 1)",
                              key="vp", value=self.vp)
        if self.sp and not (self.kp_type == "TP" and self.kp1 > 1):
            raise ConfigError("sequence parallelism splits the sequence over the tensor-"
                              "parallel group, so it needs tensor parallelism t > 1",
                              key="sp", value=self.sp)

    # --- Megatron names ----------------------------------------------------------------

    @classmethod
    def megatron(cls, tp: int = 1, pp: int = 1, dp: int = 1, vp: int = 1,
                 sp: bool = False) -> Strategy:
        """Megatron's tensor / pipeline / data degrees (t, p, d), virtual stages, SP."""
        return cls("TP", kp1=tp, dp=dp, lp=pp, vp=vp, sp=sp)

    @property
    def tp(self) -> int:
        """Tensor-parallel degree (kp1 for "TP", else 1)."""
        return self.kp1 if self.kp_type == "TP" else 1

    @property
    def pp(self) -> int:
        """Pipeline-parallel degree (the paper's lp)."""
        return self.lp

    # --- shape -------------------------------------------------------------------------

    @property
    def kernel_degree(self) -> int:
        """Devices per kernel-parallel group (kp1 · kp2)."""
        return self.kp1 * self.kp2

    @property
    def devices(self) -> int:
        return self.kp1 * self.kp2 * self.dp * self.lp

    @property
    def grid(self) -> tuple[int, int, int, int]:
        """(kp1, kp2, dp, lp): the parallel grid that device mapping lays out (§5.2)."""
        return (self.kp1, self.kp2, self.dp, self.lp)

    # --- names -------------------------------------------------------------------------

    def __str__(self) -> str:
        if self.kp_type == "RC":
            head = f"RC-{self.kp1}-{self.kp2}"
        elif self.kp_type == "CR":
            head = f"CR-{self.kp1}"
        else:
            head = f"t{self.kp1}"
        text = f"{head}-d{self.dp}-p{self.lp}"
        if self.vp > 1:
            text += f"-v{self.vp}"
        return text + ("-sp" if self.sp else "")

    @classmethod
    def parse(cls, text: str) -> Strategy:
        """Read a strategy name (see :data:`GRAMMAR`); ``str()`` gives the canonical one."""
        if not isinstance(text, str) or not text.strip():
            raise _bad("a strategy name must be a non-empty string", text)
        tokens = text.strip().split("-")
        values: dict[str, object] = {}
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            upper = tok.upper()
            if upper in ("RC", "CR"):
                n = 2 if upper == "RC" else 1
                numbers = [_NUMBER.fullmatch(t) for t in tokens[i + 1 : i + 1 + n]]
                if len(numbers) < n or not all(numbers):
                    raise _bad(f"{upper} must be followed by {n} degree(s), e.g. "
                               f"{'RC-4-2' if n == 2 else 'CR-8'}", text)
                field_values = {"kp1": int(numbers[0].group(1))}
                if n == 2:
                    field_values["kp2"] = int(numbers[1].group(1))
                _put(values, "kp_type", upper, text)
                for name, value in field_values.items():
                    _put(values, name, value, text)
                i += 1 + n
                continue
            if tok.lower() == "sp":
                _put(values, "sp", True, text)
            elif m := _TAGGED.fullmatch(tok):
                tag = m.group(1).lower()
                if tag in ("t", "tp"):
                    _put(values, "kp_type", "TP", text)
                _put(values, _TAG_FIELD[tag], int(m.group(2)), text)
            elif _NUMBER.fullmatch(tok):
                raise _bad(f"unexpected degree {tok!r} (RC takes two degrees, CR one)", text)
            else:
                raise _bad(f"cannot read {tok!r}", text)
            i += 1
        try:
            return cls(**values)  # type: ignore[arg-type]
        except ConfigError as exc:
            raise _bad(f"{exc.key} {exc.problem}", text) from None


def _put(values: dict[str, object], name: str, value: object, text: str) -> None:
    if name in values:
        what = "kernel parallelism" if name in ("kp_type", "kp1", "kp2") else name
        raise _bad(f"{what} is given twice", text)
    values[name] = value
