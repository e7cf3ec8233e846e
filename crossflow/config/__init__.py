"""Config files -> validated, immutable specs (see :mod:`crossflow.config.base`)."""

from crossflow.config.base import Spec, build, read_yaml
from crossflow.config.loader import load_spec, preset_names

__all__ = ["Spec", "build", "load_spec", "preset_names", "read_yaml"]
