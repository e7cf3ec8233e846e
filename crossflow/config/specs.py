"""Registry of file kinds -> spec classes ("module:Class", imported on first use)."""

from __future__ import annotations

from crossflow.config.loader import register_kind

register_kind("microarch", "hardware", "crossflow.config.hardware:MicroArchSpec")
register_kind("architecture", "templates", "crossflow.config.template:ArchitectureTemplateSpec")
register_kind("technology", "tech", "crossflow.config.technology:TechnologySpec")
register_kind("gemm", "workloads", "crossflow.config.workload:GemmSpec")
