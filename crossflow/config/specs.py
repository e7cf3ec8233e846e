"""Registry of file kinds -> spec classes ("module:Class", imported on first use)."""

from __future__ import annotations

from crossflow.config.loader import register_kind

register_kind("microarch", "hardware", "crossflow.config.hardware:MicroArchSpec")
register_kind("architecture", "templates", "crossflow.config.template:ArchitectureTemplateSpec")
register_kind("technology", "tech", "crossflow.config.technology:TechnologySpec")
register_kind("gemm", "workloads", "crossflow.config.workload:GemmSpec")
register_kind("transformer", "workloads", "crossflow.config.workload:TransformerSpec")
register_kind("lstm", "workloads", "crossflow.config.workload:LstmSpec")
# Parallelism files may leave out ``kind`` (loader.DEFAULT_KINDS).
register_kind("parallelism", "parallelism", "crossflow.parallel.spec:ParallelismSpec")
register_kind("system", "systems", "crossflow.config.system:SystemSpec")
# Studies and search spaces (crossflow.search; optuna is imported only to run one).
register_kind("search_space", "search_spaces", "crossflow.search.space:SearchSpaceSpec")
register_kind("study", "studies", "crossflow.search.study:StudySpec")
