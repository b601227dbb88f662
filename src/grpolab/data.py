"""Prompt data: JSONL files and prompt formatting."""
from __future__ import annotations

import json
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
