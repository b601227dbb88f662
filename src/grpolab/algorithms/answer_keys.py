"""Answer keys (``ANSWER_KEYS``): completion text -> a hashable key; completions with equal keys give one answer.

Components that cluster answers (SEED-GRPO's ``seed_equivalence``) name a key registered here or a
``module:function`` of the user's (:func:`resolve_answer_key`).
"""
from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Callable

from ..registry import ANSWER_KEYS

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


@ANSWER_KEYS.register("final_line", needs=("text",))
def final_line_key(text: str) -> str:
    """The last non-empty line, stripped ('' for an empty completion).

    Provenance: grpolab's own — a clustering key for answer-based components (SEED-GRPO); implements no
    published method.
    """
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@ANSWER_KEYS.register("last_number", needs=("text",))
def last_number_key(text: str) -> str:
    """The last number in the text (``3``, ``3.0`` and ``3.00`` are one answer; ``a/b`` kept as
    written); the stripped final line when the text has no number.

    Provenance: grpolab's own — a clustering key for answer-based components (SEED-GRPO); implements no
    published method.
    """
    found = _NUMBER.findall(text)
    if not found:
        return final_line_key(text)
    s = found[-1]
    if "/" in s:
        return s
    v = float(s)
    return str(int(v)) if v.is_integer() else repr(v)


@ANSWER_KEYS.register("exact", needs=("text",))
def exact_key(text: str) -> str:
    """The whole completion, stripped.

    Provenance: grpolab's own — a clustering key for answer-based components (SEED-GRPO); implements no
    published method.
    """
    return text.strip()


def resolve_answer_key(spec: str) -> Callable[[str], object]:
    """A registered answer-key name or ``module:function`` (``text -> hashable key``)."""
    if spec in ANSWER_KEYS:
        return ANSWER_KEYS.get(spec)
    module_name, _, func_name = spec.partition(":")
    if not module_name or not func_name:
        raise ValueError(f"seed_equivalence: '{spec}' is neither a registered answer key "
                         f"({', '.join(ANSWER_KEYS.names())}) nor module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"seed_equivalence: cannot load '{spec}' ({e})") from None
    if not callable(fn):
        raise ValueError(f"seed_equivalence: '{spec}' is not callable")
    return fn
