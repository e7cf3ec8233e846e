"""Workload specs.  A GEMM is ``{kind: gemm, m, k, n, precision}`` (DESIGN.md §7):
C[m, n] = A[m, k] · B[k, n]."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from crossflow.config.base import Spec

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
