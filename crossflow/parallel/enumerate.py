"""Which strategies fit a workload: checks and exhaustive enumeration.

Rules (shards must be whole; DeepFlow's GEMM mode and Megatron-LM's argument checks):

* **gemm** — kernel parallelism only (a single GEMM has no replicas or layers: d1-p1);
  RC: kp1 | m and kp2 | n; CR: kp1 | k.
* **lstm** — RC or CR; dp | batch; lp ≤ layers + 2 (embedding, layers, softmax layer);
  RC: kp1 | batch/dp and kp2 | hidden; CR: kp1 | hidden.  The vocabulary is padded.
* **transformer** — Megatron t only; t | heads and t | ffn (hence t | hidden); with
  sequence parallelism t | seq_length; pp·vp | layers; dp·micro_batch | global batch; with
  interleaving (vp > 1) pp | micro-batches per replica.  The vocabulary is padded (Megatron
  pads it to a multiple of 128·t).

Errors name the parallelism key at fault ("strategy" for a paper strategy name).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from crossflow.config.base import Spec
from crossflow.errors import ConfigError
from crossflow.parallel.strategy import KERNEL_TYPES, Strategy


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _problem(w: Spec, s: Strategy, mbs: int | None) -> ConfigError | None:
    """The first reason ``s`` does not fit ``w`` (as an error to raise), else None."""
    kind = w.kind

    def paper(msg: str) -> ConfigError:
        return ConfigError(msg, key="strategy", value=str(s))

    def divides(degree: int, what: str, size: int, name: str) -> ConfigError | None:
        if size % degree:
            return paper(f"{what} = {degree} must divide {name} ({size})")
        return None

    if kind == "gemm":
        if s.kp_type == "TP":
            return paper("a GEMM workload takes RC or CR kernel parallelism, not t")
        if s.dp > 1 or s.lp > 1:
            return paper("a single GEMM has no model replicas or layers: use d1-p1 "
                         "(a distributed GEMM is kernel parallelism)")
        if s.kp_type == "RC":
            return divides(s.kp1, "kp1", w.m, "m") or divides(s.kp2, "kp2", w.n, "n")
        return divides(s.kp1, "kp1", w.k, "k")
    if kind == "lstm":
        if s.kp_type == "TP":
            return paper("the LSTM takes RC or CR kernel parallelism, not t")
        if s.vp > 1:
            return paper("interleaved virtual stages apply to transformers only")
        err = divides(s.dp, "dp", w.global_batch_size, "global_batch_size")
        if err:
            return err
        if s.lp > w.num_layers + 2:
            return paper(f"lp = {s.lp} exceeds the {w.num_layers + 2} pipeline units "
                         "(embedding, each layer, softmax)")
        if s.kp_type == "RC":
            return (divides(s.kp1, "kp1", w.global_batch_size // s.dp, "the batch per "
                            "replica") or divides(s.kp2, "kp2", w.hidden_size, "hidden_size"))
        return divides(s.kp1, "kp1", w.hidden_size, "hidden_size")
    if kind == "transformer":
        if s.kp_type != "TP":
            return paper("a transformer takes Megatron tensor parallelism (t{tp}), not "
                         f"{s.kp_type}")
        tp, pp, dp, vp = s.tp, s.pp, s.dp, s.vp
        mamba = "M" in (w.hybrid_override_pattern or "")
        for size, name in ((w.num_attention_heads, "num_attention_heads"),
                           (w.ffn, "ffn_hidden_size"),
                           *(((w.mamba_heads, "Mamba-2 heads"),
                              (w.mamba_num_groups, "mamba_num_groups")) if mamba else ())):
            if size % tp:
                return ConfigError(f"must divide the workload's {name} ({size})",
                                   key="tensor_parallel", value=tp)
        if s.sp and w.seq_length % tp:
            return ConfigError(f"sequence parallelism needs tensor_parallel ({tp}) to "
                               f"divide seq_length ({w.seq_length})",
                               key="sequence_parallel", value=True)
        if w.num_layers % pp:
            return ConfigError(f"must divide the workload's num_layers ({w.num_layers})",
                               key="pipeline_parallel", value=pp)
        if (w.num_layers // pp) % vp:
            return ConfigError(f"must divide the {w.num_layers // pp} layers per pipeline "
                               "stage", key="virtual_pipeline_stages", value=vp)
        mbs = mbs or w.micro_batch_size
        if w.global_batch_size % (dp * mbs):
            return ConfigError(f"data_parallel × micro_batch_size = {dp * mbs} must divide "
                               f"global_batch_size ({w.global_batch_size})",
                               key="data_parallel", value=dp)
        per_replica = w.global_batch_size // (dp * mbs)
        if vp > 1 and per_replica % pp:
            return ConfigError(f"the interleaved schedule needs pipeline_parallel ({pp}) "
                               f"to divide the {per_replica} micro-batches per replica",
                               key="virtual_pipeline_stages", value=vp)
        return None
    raise TypeError(f"no parallelism rules for workload kind {kind!r}")


def check_strategy(workload: Spec, strategy: Strategy, *, devices: int | None = None,
                   micro_batch_size: int | None = None) -> None:
    """Raise a ConfigError naming the key unless ``strategy`` fits ``workload`` (and, if
    given, uses exactly ``devices``)."""
    err = _problem(workload, strategy, micro_batch_size)
    if err is None and devices is not None and strategy.devices != devices:
        key = "data_parallel" if strategy.kp_type == "TP" else "strategy"
        value = strategy.dp if key == "data_parallel" else str(strategy)
        err = ConfigError(f"the strategy uses {strategy.devices} devices but the system has "
                          f"{devices}", key=key, value=value)
    if err is not None:
        raise err


@lru_cache(maxsize=256)
def _enumerate(workload: Spec, devices: int, kernel_types: tuple[str, ...],
               max_tp: int | None, virtual_stages: tuple[int, ...],
               sequence_parallel: tuple[bool, ...], mbs: int | None
               ) -> tuple[Strategy, ...]:
    found = []
    for kp_type in kernel_types:
        for kp1 in _divisors(devices):
            for kp2 in _divisors(devices // kp1) if kp_type == "RC" else (1,):
                if max_tp is not None and kp1 * kp2 > max_tp:
                    continue
                rest = devices // (kp1 * kp2)
                for dp in _divisors(rest):
                    for vp in virtual_stages:
                        for sp in sequence_parallel:
                            try:
                                s = Strategy(kp_type, kp1, kp2, dp, rest // dp, vp, sp)
                            except ConfigError:
                                continue
                            if _problem(workload, s, mbs) is None:
                                found.append(s)
    return tuple(found)


def enumerate_strategies(
    workload: Spec,
    devices: int,
    *,
    kernel_types: Sequence[str] | None = None,
    max_tp: int | None = None,
    virtual_stages: Sequence[int] = (1,),
    sequence_parallel: Sequence[bool] = (False,),
    micro_batch_size: int | None = None,
) -> tuple[Strategy, ...]:
    """Every strategy using exactly ``devices`` devices that fits ``workload``.

    ``kernel_types`` defaults to RC and CR (gemm, lstm) or t (transformer); ``max_tp`` caps
    the kernel-parallel group kp1·kp2 (e.g. devices per node); ``virtual_stages`` and
    ``sequence_parallel`` list the options to combine.  Order: kernel type as given, then
    kp1, kp2, dp ascending (lp follows), then the options in the order given.  Cached.
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigError("the device count must be an integer >= 1", key="devices",
                          value=devices)
    if kernel_types is None:
        kernel_types = ("TP",) if workload.kind == "transformer" else ("RC", "CR")
    for kp_type in kernel_types:
        if kp_type not in KERNEL_TYPES:
            raise ConfigError("unknown kernel-parallelism type", key="kernel_types",
                              value=kp_type, allowed=", ".join(KERNEL_TYPES))
    return _enumerate(workload, devices, tuple(kernel_types), max_tp, tuple(virtual_stages),
                      tuple(sequence_parallel), micro_batch_size)
