"""Named registries for pluggable components.

Every algorithm piece (advantage estimator, policy loss, KL estimator, loss
aggregation, task, ...) registers itself under a short name, so recipes and
configs can refer to it as data and users can call it from their own loops::

    from grpolab.algorithms import ADVANTAGES
    fn = ADVANTAGES.get("group_zscore")
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class UnknownComponentError(KeyError):
    """Raised when a name is not registered; the message lists valid names."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class Registry(Generic[T]):
    """A name -> object mapping with helpful errors."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownComponentError(
                f"unknown {self.kind} '{name}'; valid: {', '.join(sorted(self._items))}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
