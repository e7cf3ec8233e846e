"""Registry of file kinds -> spec classes.  Each entry imports its module lazily."""

from __future__ import annotations

from crossflow.config.loader import register_kind


def _microarch():
    from crossflow.config.hardware import MicroArchSpec

    return MicroArchSpec


def _gemm():
    from crossflow.config.workload import GemmSpec

    return GemmSpec


register_kind("microarch", "hardware", _microarch)
register_kind("gemm", "workloads", _gemm)


def _technology():
    from crossflow.config.technology import TechnologySpec

    return TechnologySpec


def _architecture():
    from crossflow.config.template import ArchitectureTemplateSpec

    return ArchitectureTemplateSpec


register_kind("technology", "tech", _technology)
register_kind("architecture", "templates", _architecture)
