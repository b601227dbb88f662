"""Real tools for agents: ``python`` (sandboxed code execution), ``search`` (BM25) and ``calculator``.

Plain Python functions with type hints and a Google-style docstring, so their
schema comes from ``transformers.utils.get_json_schema`` as for any TRL-style
tool (``--tools grpolab.agents.tools:calculator``). Each one is safe to call
with anything: it never raises, and every failure (bad input, a timeout, a
limit hit, a refused system call) comes back as text starting with ``Error:``
so the model reads it as the tool's answer. Every answer is cut to
:data:`TOOL_OUTPUT_CHARS` characters.

* :func:`python` runs the code in :mod:`grpolab.sandbox` (a fresh forked child
  per call: CPU, memory and wall-clock limits, a scratch directory as the only
  writable place, no network; see docs/safety.md) and returns what it printed,
  the traceback if it raised (as Python prints it), and the value of a final
  expression (as a notebook cell shows it). :func:`make_python_tool` builds one
  with other limits.
* :func:`search` ranks the documents of the generated knowledge base
  (:mod:`grpolab.agents.knowledge`, the world the ``search_qa`` task asks
  about) with BM25 (the ``bm25s`` library; the index is built in-process on
  first use, nothing is downloaded). :func:`make_search_tool` builds one over
  another world or any list of ``(title, text)`` documents.
* :func:`calculator` evaluates arithmetic exactly on a whitelist of syntax
  nodes (no ``eval``): integers of any size, decimals and ``/`` as exact
  fractions, ``+ - * / // % **`` and parentheses.
"""
from __future__ import annotations

import ast
import atexit
import math
import operator
import threading
import warnings
from fractions import Fraction
from typing import Callable

from ..sandbox import Limits, Sandbox
from .knowledge import KnowledgeBase, knowledge_base

TOOL_OUTPUT_CHARS = 2000   # the longest answer any of these tools gives (the rest is cut, with a note)


def cut(text: str, limit: int = TOOL_OUTPUT_CHARS) -> str:
    """``text`` shortened to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit
    for _ in range(2):  # the note's length depends on the number it states
        note = f"\n[output cut: {len(text) - keep} more characters]"
        keep = max(0, limit - len(note))
    return text[:keep] + note


# ------------------------------------------------------------------ python
PYTHON_LIMITS = Limits(cpu_s=5, memory_mb=512, wall_s=10, file_mb=16, max_output=4 * TOOL_OUTPUT_CHARS)

# Runs in the sandbox child: the model's code as a script named <code>, tracebacks as Python prints them
# (without this runner's frame), and the repr of a final expression.
_RUNNER = """
import ast, linecache, sys, traceback
_src = {source!r}
linecache.cache["<code>"] = (len(_src), None, _src.splitlines(True), "<code>")
_g = {{"__name__": "__main__", "__builtins__": __builtins__}}
try:
    _tree = ast.parse(_src, "<code>", "exec")
    _last = _tree.body.pop() if _tree.body and isinstance(_tree.body[-1], ast.Expr) else None
    exec(compile(_tree, "<code>", "exec"), _g)
    if _last is not None:
        _v = eval(compile(ast.Expression(_last.value), "<code>", "eval"), _g)
        if _v is not None:
            print(repr(_v))
except SystemExit:
    pass
except SyntaxError as _e:
    sys.stderr.write("".join(traceback.format_exception_only(type(_e), _e)))
except BaseException as _e:
    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next if _e.__traceback__ else None)
"""


def _format_run(res) -> str:
    parts = [s.rstrip("\n") for s in (res.stdout, res.stderr) if s.strip()]
    if not res.ok:
        parts.append(f"Error: {res.error}")
    return "\n".join(parts) if parts else "(no output)"


_WARNED: set[int] = set()


def _warn_without_jail(box: Sandbox) -> None:
    """Say once per sandbox when this machine gives model-written code no jail (docs/safety.md)."""
    iso = box.isolation or {}
    if iso.get("view") == "jail" or id(box) in _WARNED:
        return
    _WARNED.add(id(box))
    warnings.warn(f"the python tool runs model-written code without the sandbox's jail on this machine "
                  f"({iso.get('note') or iso}); only resource limits, Landlock and seccomp where the kernel has "
                  f"them, and a Python audit hook hold it. See docs/safety.md.", RuntimeWarning, stacklevel=3)


def make_python_tool(limits: Limits | None = None) -> Callable[[str], str]:
    """A ``python(code) -> str`` tool whose calls run in their own sandbox worker with ``limits``.

    The worker starts on the first call and is closed when the process exits.
    """
    box = Sandbox(limits=limits or PYTHON_LIMITS)
    atexit.register(box.close)

    def python(code: str) -> str:
        """Run Python code in a sandbox and return what it printed.

        Each call starts a fresh interpreter (nothing is kept between calls). Print what you want to see; the
        value of a final expression is shown too. No network, no files outside a scratch folder, a few seconds
        of CPU.

        Args:
            code: the Python source code to run, e.g. "print(sum(range(10)))".
        """
        if not isinstance(code, str):
            return f"Error: 'code' must be a string of Python source, got {type(code).__name__}"
        try:
            res = box.run_python(_RUNNER.format(source=code))
        except Exception as e:  # noqa: BLE001 - the worker itself failed; the caller gets text
            return f"Error: the sandbox failed to run the code ({type(e).__name__}: {e})"
        _warn_without_jail(box)
        return cut(_format_run(res))

    return python


python = make_python_tool()


# ------------------------------------------------------------------ search
SEARCH_MAX_K = 10


class BM25Index:
    """BM25 (the ``bm25s`` library, Lucene variant, English stop words) over ``(title, text)`` documents."""

    def __init__(self, documents: list[tuple[str, str]]):
        import bm25s
        self._bm25s = bm25s
        self.documents = list(documents)
        self._lock = threading.Lock()
        self._retriever = bm25s.BM25()
        corpus = [f"{title}. {text}" for title, text in self.documents]
        self._retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)

    def top(self, query: str, k: int) -> list[tuple[int, float]]:
        """Indices and scores of the ``k`` best documents with a positive score, best first."""
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:   # nothing but stop words / punctuation
            return []
        k = min(k, len(self.documents))
        with self._lock:
            idx, scores = self._retriever.retrieve(tokens, k=k, show_progress=False)
        return [(int(i), float(s)) for i, s in zip(idx[0], scores[0]) if s > 0]


def make_search_tool(documents: KnowledgeBase | list[tuple[str, str]]) -> Callable[..., str]:
    """A ``search(query, k=3) -> str`` tool over ``documents`` (a :class:`KnowledgeBase` or ``(title, text)``
    pairs); the BM25 index is built on the first call."""
    docs = documents.documents if isinstance(documents, KnowledgeBase) else list(documents)
    holder: dict = {}
    lock = threading.Lock()

    def index() -> BM25Index:
        with lock:
            if "index" not in holder:
                holder["index"] = BM25Index(docs)
            return holder["index"]

    def search(query: str, k: int = 3) -> str:
        """Search the encyclopedia and return the best matching entries.

        Args:
            query: what to look for, e.g. a name ("Anna Pold") or a few keywords.
            k: how many entries to return (1 to 10).
        """
        if not isinstance(query, str) or not query.strip():
            return "Error: 'query' must be a non-empty string, e.g. a name or a few keywords"
        if isinstance(k, bool) or not isinstance(k, (int, float, str)):
            return f"Error: 'k' must be a whole number from 1 to {SEARCH_MAX_K}, got {k!r}"
        try:
            k = int(k)
        except ValueError:
            return f"Error: 'k' must be a whole number from 1 to {SEARCH_MAX_K}, got {k!r}"
        if not 1 <= k <= SEARCH_MAX_K:
            return f"Error: 'k' must be a whole number from 1 to {SEARCH_MAX_K}, got {k}"
        hits = index().top(query[:1000], k)
        if not hits:
            return f"No entry matches {query!r}. Try a name or other keywords."
        ix = index()
        return cut("\n".join(f"[{n}] {ix.documents[i][0]}: {ix.documents[i][1]}" for n, (i, _) in
                             enumerate(hits, 1)))

    return search


search = make_search_tool(knowledge_base(0))


# -------------------------------------------------------------- calculator
CALC_MAX_CHARS = 500        # longest expression accepted
CALC_MAX_DIGITS = 2000      # largest result (and intermediate value) in decimal digits
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class CalculatorError(ValueError):
    pass


def _digits(x: Fraction) -> int:
    return max(len(str(abs(x.numerator))), len(str(x.denominator)))


def _check_size(x: Fraction) -> Fraction:
    if _digits(x) > CALC_MAX_DIGITS:
        raise CalculatorError(f"the result has more than {CALC_MAX_DIGITS} digits")
    return x


def _power(base: Fraction, exp: Fraction) -> Fraction:
    if exp.denominator != 1:
        raise CalculatorError("only whole-number exponents are supported (the result must stay exact)")
    e = int(exp)
    if base == 0 and e < 0:
        raise CalculatorError("division by zero (0 to a negative power)")
    if abs(base) not in (0, 1) and abs(e) * max(1, _digits(base) - 1) > CALC_MAX_DIGITS:
        raise CalculatorError(f"the result has more than {CALC_MAX_DIGITS} digits")
    return _check_size(base ** e)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"{node.value!r} is not a number")
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError(f"{node.value!r} is not a finite number")
        return _check_size(Fraction(node.value) if isinstance(node.value, int) else Fraction(repr(node.value)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _eval(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Pow):
            return _power(_eval(node.left), _eval(node.right))
        if isinstance(node.op, ast.BitXor):
            raise CalculatorError("'^' is not a power here: write a ** b")
        fn = _BIN.get(type(node.op))
        if fn is None:
            raise CalculatorError(f"operator {type(node.op).__name__} is not supported (use + - * / // % **)")
        left, right = _eval(node.left), _eval(node.right)
        if right == 0 and fn in (operator.truediv, operator.floordiv, operator.mod):
            raise CalculatorError("division by zero")
        return _check_size(Fraction(fn(left, right)))
    if isinstance(node, ast.Name):
        raise CalculatorError(f"unknown name '{node.id}': only numbers and + - * / // % ** ( ) are allowed")
    if isinstance(node, ast.Call):
        raise CalculatorError("functions are not supported: only numbers and + - * / // % ** ( ) are allowed")
    raise CalculatorError(f"'{type(node).__name__}' is not arithmetic: only numbers and + - * / // % ** ( ) "
                          f"are allowed")


def _show(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    whole, rest = divmod(abs(x.numerator), x.denominator)
    digits = []
    for _ in range(12):
        if not rest:
            break
        rest *= 10
        digits.append(str(rest // x.denominator))
        rest %= x.denominator
    approx = f"{'-' if x < 0 else ''}{whole}.{''.join(digits)}{'...' if rest else ''}"
    return f"{x.numerator}/{x.denominator} (= {approx})"


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Supports whole numbers of any size, decimals, + - * / // % ** and parentheses. Division gives an exact
    fraction (e.g. 7/2 -> "7/2 (= 3.5)").

    Args:
        expression: the arithmetic expression, e.g. "123456 * 789012 + 5".
    """
    if not isinstance(expression, (str, int, float)) or isinstance(expression, bool):
        return f"Error: 'expression' must be a string like \"12 * 34\", got {type(expression).__name__}"
    text = str(expression).strip().replace("×", "*").replace("÷", "/").replace("−", "-")
    if not text:
        return "Error: empty expression; write e.g. \"12 * 34\""
    if len(text) > CALC_MAX_CHARS:
        return f"Error: the expression is longer than {CALC_MAX_CHARS} characters"
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        return f"Error: not a valid expression ({e.msg} at column {e.offset}); write e.g. \"12 * 34\""
    except (ValueError, RecursionError, MemoryError):
        return "Error: the expression could not be read (too deeply nested or malformed)"
    try:
        return cut(_show(_eval(tree)))
    except CalculatorError as e:
        return f"Error: {e}"
    except RecursionError:
        return "Error: the expression is too deeply nested"
