"""Workload specs (docs/architecture.md, "Config kinds").

A GEMM is ``{kind: gemm, m, k, n, precision}``: C[m, n] = A[m, k] · B[k, n].  A transformer
uses Megatron-LM's names (num_layers, hidden_size, …), the LSTM the same names where they
mean the same thing.  How a workload runs on many devices is a separate parallelism file
(``kind: parallelism``, validated by the parallel layer).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from crossflow.config.base import Spec
from crossflow.errors import ConfigError

Dim = Annotated[int, Field(ge=1)]
PrecisionName = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8"]


class GemmSpec(Spec):
    kind: Literal["gemm"]
    name: str = "gemm"
    m: Dim
    k: Dim
    n: Dim
    precision: PrecisionName = "fp16"
    #: how many identical GEMMs run one after another (e.g. a batched matmul's batch)
    count: Dim = 1


Recompute = Literal["none", "selective", "full"]


def _divides(spec: Spec, part: str, whole: str, what: str = "") -> None:
    """Raise a ConfigError naming ``part`` unless spec.part divides spec.whole."""
    p, w = getattr(spec, part), getattr(spec, whole)
    if w % p:
        raise ConfigError(f"must divide {whole} ({w}){what}", key=part, value=p)


class TransformerSpec(Spec):
    """A GPT-style decoder-only transformer in the Megatron-LM layout (keys:
    docs/architecture.md, "Config kinds").

    Narayanan et al., SC21 (arXiv:2104.04473) and Korthikanti et al., MLSys 2023
    (arXiv:2205.05198).  ``global_batch_size`` counts sequences per iteration;
    ``micro_batch_size`` sequences go through the pipeline at a time.
    """

    kind: Literal["transformer"]
    name: str = "transformer"
    num_layers: Dim
    hidden_size: Dim
    num_attention_heads: Dim
    seq_length: Dim
    vocab_size: Dim
    global_batch_size: Dim
    micro_batch_size: Dim = 1
    precision: PrecisionName = "fp16"
    activation_recompute: Recompute = "none"
    #: the MLP's inner width; Megatron's default is 4 · hidden_size
    ffn_hidden_size: Dim | None = None

    @property
    def ffn(self) -> int:
        """The MLP's inner width (``ffn_hidden_size``, default 4h)."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @model_validator(mode="after")
    def _shapes_fit(self) -> TransformerSpec:
        _divides(self, "num_attention_heads", "hidden_size")
        _divides(self, "micro_batch_size", "global_batch_size")
        return self


class LstmSpec(Spec):
    """The paper's LSTM language model (§9; DeepFlow's LSTM mode, ARCHITECTURE.md §5).

    ``num_layers`` stacked LSTM layers of width ``hidden_size`` (the embedding width too, no
    projection), unrolled over ``seq_length`` time steps, then a vocabulary projection and
    softmax at every step.  ``global_batch_size`` sequences per iteration.
    """

    kind: Literal["lstm"]
    name: str = "lstm"
    global_batch_size: Dim
    hidden_size: Dim
    vocab_size: Dim
    num_layers: Dim
    seq_length: Dim
    #: input, forget, cell and output gates
    num_gates: Dim = 4
    precision: PrecisionName = "fp16"
