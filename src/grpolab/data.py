"""Prompt data: JSONL files, prompt formatting, completion text."""
from __future__ import annotations

import json
import re
from pathlib import Path


class DataError(ValueError):
    """A malformed data file; the message names the file and line."""


def load_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file. Each needs a ``prompt``: a string or a list of
    ``{"role", "content"}`` messages. Any other keys are data columns."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"--data: file {p} does not exist")
    rows = []
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
            rows.append(row)
    if not rows:
        raise DataError(f"--data: {p} has no rows")
    return rows


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
