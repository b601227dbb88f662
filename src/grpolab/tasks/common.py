"""Helpers shared by built-in reward functions."""
from __future__ import annotations

import re

_INT = re.compile(r"-?\d+")


def completion_text(completion) -> str:
    """Text of a completion given as a string or as chat messages (TRL's two formats)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def last_int(text: str) -> int | None:
    found = _INT.findall(text)
    return int(found[-1]) if found else None
