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


class FallbackWarning(UserWarning):
    """A component's defining input is missing at run time and a stand-in is used instead.

    The run then does not execute the published method exactly (e.g. a reference reward replaced by a
    running mean, a per-task weight with no task column). Emitted only through :func:`warn_fallback`, so
    one filter sees every stand-in: ``warnings.simplefilter("error", FallbackWarning)`` turns them into
    errors (``tests/test_no_fallbacks.py`` does, running every recipe).
    """


class OptionalDependencyWarning(FallbackWarning):
    """An optional package is absent and a documented equivalent path is used (e.g. math-verify absent:
    the comparison of ``rewards/answers.py``). Visible, but not a stand-in for a method's input."""


def warn_fallback(component: str, missing: str, used: str, *, category: type = FallbackWarning) -> None:
    """Report that ``component`` lacks ``missing`` and uses ``used`` instead (one message form, one category)."""
    import warnings

    warnings.warn(f"{component}: {missing} is missing; using {used} instead", category, stacklevel=3)
