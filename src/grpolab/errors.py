"""The errors every layer may raise (a leaf: imports nothing from grpolab)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A bad key or value; the message names it and says what is valid."""


class UnknownComponentError(KeyError):
    """Raised when a name is not registered; the message lists valid names."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class RunStalled(RuntimeError):
    """A run stopped because nothing could be learned (``stall_steps``); the message says why and what to change."""
