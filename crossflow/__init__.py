"""CrossFlow: cross-stack performance model for distributed AI training systems."""

__version__ = "0.1.0"
