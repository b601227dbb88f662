"""The errors every layer may raise (a leaf: imports nothing from grpolab)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A bad key or value; the message names it and says what is valid."""


class UnknownComponentError(KeyError):
    """Raised when a name is not registered; the message lists valid names."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded: corrupt, or holding objects a safe (code-free) load refuses."""
