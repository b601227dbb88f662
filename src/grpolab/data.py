"""Prompt data: JSONL files, prompt formatting, completion text."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path


class DataError(ValueError):
    """A malformed data file; the message names the file and line."""


class JsonlRows(list):
    """The rows of a JSONL file; ``where(i)`` names row ``i`` by its file and line (for error messages)."""

    def __init__(self, rows=(), path: Path | None = None, lines: list[int] | None = None):
        super().__init__(rows)
        self.path = path
        self.lines = lines or []

    def where(self, i: int) -> str:
        return f"{self.path}:{self.lines[i]}" if self.path is not None and i < len(self.lines) else f"row {i + 1}"


def where(rows: list, i: int) -> str:
    """``FILE:LINE`` of row ``i`` of rows read by :func:`load_jsonl`, else ``row N`` (1-based)."""
    return rows.where(i) if isinstance(rows, JsonlRows) else f"row {i + 1}"


def json_safe(obj):
    """``obj`` with every non-finite float (NaN, inf) replaced by None: JSON has no NaN, and most tools reject
    the ``NaN`` token Python's json module writes by default."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def to_json(obj, **kwargs) -> str:
    """``json.dumps`` for every file and stdout JSON grpolab writes: non-finite floats become ``null``."""
    return json.dumps(json_safe(obj), allow_nan=False, **kwargs)


def load_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file. Each needs a ``prompt``: a string or a list of
    ``{"role", "content"}`` messages with string contents. Any other keys are data columns.
    Returns a :class:`JsonlRows` (a list that knows each row's line)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"--data: file {p} does not exist")
    rows, lines = [], []
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{p}:{lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{p}:{lineno}: each line must be a JSON object, got {type(row).__name__}")
            if "prompt" not in row:
                raise DataError(f"{p}:{lineno}: missing key 'prompt' (keys: {', '.join(row) or 'none'})")
            prompt = row["prompt"]
            ok = isinstance(prompt, str) or (
                isinstance(prompt, list) and prompt
                and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt))
            if not ok:
                raise DataError(f"{p}:{lineno}: 'prompt' must be a string or a list of "
                                f"{{\"role\": ..., \"content\": ...}} messages")
            if isinstance(prompt, list):
                for j, m in enumerate(prompt):
                    if not isinstance(m["content"], str):
                        raise DataError(f"{p}:{lineno}: message {j + 1} of 'prompt' has a 'content' of type "
                                        f"{type(m['content']).__name__} ({str(m['content'])[:40]!r}); a message's "
                                        f"content must be a string (write it in quotes)")
                    if not isinstance(m["role"], str):
                        raise DataError(f"{p}:{lineno}: message {j + 1} of 'prompt' has a 'role' that is not a "
                                        f"string; use \"system\", \"user\" or \"assistant\"")
            rows.append(row)
            lines.append(lineno)
    if not rows:
        raise DataError(f"--data: {p} has no rows")
    return JsonlRows(rows, p, lines)


def columns_of(rows: list[dict]) -> set[str]:
    """Columns present in every row (the ones a reward function may rely on)."""
    cols = set(rows[0])
    for r in rows[1:]:
        cols &= set(r)
    return cols - {"prompt"}


def render_prompt(tokenizer, prompt) -> str:
    """Chat messages go through the tokenizer's chat template with the generation
    prompt; plain strings are used as they are (TRL's behaviour)."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


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


def model_texts(rows: list[dict]) -> list[str]:
    """Every string of ``rows`` (plain values and chat-message contents): what a tiny model's tokenizer must cover."""
    out = []
    for row in rows:
        for v in row.values():
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, list):
                out.extend(m["content"] for m in v if isinstance(m, dict) and "content" in m)
    return out
