"""Mathematical answer checking: ``math_equal(pred, gold) -> bool``.

Uses Hugging Face's ``math-verify`` (``math_verify.parse`` + ``math_verify.verify``)
when it is importable: it parses LaTeX and plain expressions (``\\boxed{}``,
``\\frac``, sets, intervals, symbolic equality through SymPy). The package is
an optional dependency (``math-verify>=0.7``); it is imported lazily, so grpolab
works without it.

Without ``math-verify`` the documented fallback is used:

1. extract the answer: the content of the last ``\\boxed{...}`` (or ``\\fbox``)
   with balanced braces if there is one, else the whole string; strip ``$``,
   ``\\(``/``\\)``, ``\\left``/``\\right``, ``\\!``, ``\\,``, surrounding spaces and
   a trailing period;
2. turn ``\\frac{a}{b}``, ``\\dfrac``, ``\\tfrac`` and ``\\frac ab`` into ``(a)/(b)``,
   drop thousands separators (``1,000``) and ``%``/``\\%`` signs (no other
   unit handling);
3. if both sides are numbers (integers, decimals, ``a/b`` fractions,
   optionally parenthesised, with a sign) compare them exactly as fractions
   (decimals are exact: ``0.5 == 1/2``) and, failing that, with relative
   tolerance ``1e-9`` (for floats in scientific notation);
4. otherwise compare the normalised strings (spaces removed, case-folded).

``math_equal`` never raises: anything unparseable is simply not equal.
"""
from __future__ import annotations

import math
import re
import threading
from fractions import Fraction

from ..data import completion_text
from ..errors import OptionalDependencyWarning, warn_fallback

_MATH_VERIFY = None  # None: not tried yet; False: not importable; else the module


def math_verify_module():
    """The ``math_verify`` module, or ``None`` when it is not installed (imported once, lazily)."""
    global _MATH_VERIFY
    if _MATH_VERIFY is None:
        try:
            import math_verify  # noqa: F401
            _MATH_VERIFY = math_verify
        except Exception:  # not installed (or broken): use the documented comparison, and say so once
            _MATH_VERIFY = False
            warn_fallback("answer comparison (math_equal)", "the optional package math-verify",
                          "the documented comparison of grpolab/rewards/answers.py (pip install math-verify)",
                          category=OptionalDependencyWarning)
    return _MATH_VERIFY or None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces), or ``None``."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    i = text.find("{", idx)
    if i < 0:  # "\boxed 5"
        m = re.match(r"\\(?:boxed|fbox)\s+(\S+)", text[idx:])
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def _strip(s: str) -> str:
    s = s.strip()
    for a, b in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\(", ""),
                 ("\\)", ""), ("\\[", ""), ("\\]", ""), ("$", ""), ("\\%", ""), ("%", ""),
                 ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac")):
        s = s.replace(a, b)
    s = s.strip().rstrip(".").strip()
    # \frac{a}{b} -> (a)/(b); \frac ab -> (a)/(b)
    prev = None
    while prev != s:
        prev = s
        s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", s)
        s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"(\1)/(\2)", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)  # 1,000 -> 1000
    return s


_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_NUMBER = re.compile(rf"^\(?\s*({_NUM})\s*\)?$")
_FRACTION = re.compile(rf"^([+-]?)\(?\s*\(?\s*({_NUM})\s*\)?\s*/\s*\(?\s*({_NUM})\s*\)?\s*\)?$")


def to_number(s: str) -> Fraction | None:
    """A normalised answer string -> exact ``Fraction`` (integer, decimal, ``a/b``), else ``None``."""
    s = s.replace(" ", "")
    try:
        m = _NUMBER.match(s)
        if m:
            return Fraction(m.group(1))
        m = _FRACTION.match(s)
        if m:
            v = Fraction(m.group(2)) / Fraction(m.group(3))
            return -v if m.group(1) == "-" else v
    except (ValueError, ZeroDivisionError):
        return None
    return None


def fallback_math_equal(pred, gold) -> bool:
    """The fallback comparison (steps 1-4 of the module docstring)."""
    p, g = str(pred), str(gold)
    p = _strip(last_boxed(p) if last_boxed(p) is not None else p)
    g = _strip(last_boxed(g) if last_boxed(g) is not None else g)
    a, b = to_number(p), to_number(g)
    if a is not None and b is not None:
        if a == b:
            return True
        fa, fb = float(a), float(b)
        return math.isclose(fa, fb, rel_tol=1e-9, abs_tol=0.0)
    norm = lambda s: re.sub(r"\s+", "", s).casefold()  # noqa: E731
    return bool(norm(p)) and norm(p) == norm(g)


def math_equal(pred, gold, *, use_math_verify: bool = True) -> bool:
    """``True`` when the predicted answer equals the gold one mathematically.

    With ``math-verify`` installed (and ``use_math_verify``): ``verify(parse(gold),
    parse(pred))`` (gold first, as its docs say; ``$...$`` is added around a bare
    gold string so LaTeX extraction applies). If math-verify parses nothing from
    either side, or raises, the fallback decides. Without it: the fallback.
    """
    if pred is None or gold is None:
        return False
    mv = math_verify_module() if use_math_verify else None
    if mv is not None:
        # math-verify's own timeouts use signal.alarm, which works only in the main thread; rewards run in a
        # worker thread under reward_timeout (docs/safety.md), which then bounds the whole call instead
        main = threading.current_thread() is threading.main_thread()
        parse_kw = {} if main else {"parsing_timeout": None}
        verify_kw = {} if main else {"timeout_seconds": None}
        try:
            g = str(gold)
            gp = mv.parse(g if ("$" in g or "\\boxed" in g) else f"${g}$", **parse_kw)
            pp = mv.parse(str(pred), **parse_kw)
            if gp and pp:
                return bool(mv.verify(gp, pp, **verify_kw))
        except Exception:
            pass
    try:
        return fallback_math_equal(pred, gold)
    except Exception:
        return False


_ANSWER_LINE = re.compile(r"Answer:\s*([^\n]+)")


def extract_answer(text: str) -> str | None:
    """Final answer of a reply: the last ``\\boxed{}``, else what follows the last ``Answer:``."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    found = _ANSWER_LINE.findall(text)
    return found[-1].strip() if found else None


def math_accuracy(prompts=None, completions=None, answer=None, **kwargs) -> list[float]:
    """Reward function (TRL contract): 1.0 when the reply's final answer (``extract_answer``)
    is ``math_equal`` to the data column ``answer``, else 0.0. Use with
    ``--reward grpolab.rewards.answers:math_accuracy`` on data with an ``answer`` column."""
    out = []
    for c, a in zip(completions, answer):
        pred = extract_answer(completion_text(c))
        out.append(1.0 if pred is not None and math_equal(pred, a) else 0.0)
    return out
