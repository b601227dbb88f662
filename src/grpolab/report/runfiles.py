"""Tolerant readers of a run folder's files (a run in progress may have a half-written last line)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import yaml


def read_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    """``(rows, notes)``: every parseable JSON object line; an unparseable line is skipped and noted
    (the last line of a run in progress may be truncated)."""
    rows, notes = [], []
    if not path.exists():
        return rows, notes
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            where = "last line (run in progress?)" if i == len(lines) else f"line {i}"
            notes.append(f"{path.name}: {where} is not valid JSON; skipped")
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, notes


def read_metrics(run: Path) -> tuple[list[dict], list[str]]:
    rows, notes = read_jsonl(Path(run) / "metrics.jsonl")
    return [r for r in rows if isinstance(r.get("step"), (int, float))], notes


def _read_mapping(path: Path, parse: Callable[[str], Any], error: type[Exception]) -> dict[str, Any]:
    """The mapping the file at ``path`` holds (read with ``parse``), or ``{}`` when it is missing, does not
    parse (``error``) or holds something else."""
    if not path.exists():
        return {}
    try:
        out = parse(path.read_text())
    except error:
        return {}
    return out if isinstance(out, dict) else {}


def read_summary(run: Path) -> dict[str, Any]:
    return _read_mapping(Path(run) / "summary.json", json.loads, json.JSONDecodeError)


def read_config(run: Path) -> dict[str, Any]:
    return _read_mapping(Path(run) / "config.yaml", yaml.safe_load, yaml.YAMLError)


def check_run_folder(run: Path) -> Path:
    run = Path(run)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run folder (give the --out folder of a grpolab train run)")
    if not any((run / n).exists() for n in RUN_SIGNS):  # a config.yaml alone may be a user's config folder
        has = " (only a config.yaml)" if (run / "config.yaml").exists() else ""
        raise FileNotFoundError(f"{run}: not a run folder: none of {', '.join(RUN_SIGNS)} is there{has} (give "
                                f"the --out folder of a grpolab train run)")
    return run


# what only a run folder holds: the marker a run writes when it starts (grpolab.train.rundir.MARKER), or, from
# runs of grpolab versions before the marker, its metrics or summary
RUN_SIGNS = ("grpolab_run.json", "metrics.jsonl", "summary.json")


def series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` for every row where ``key`` is a finite number."""
    out = []
    for r in rows:
        v = r.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
            continue
        out.append((int(r["step"]), float(v)))
    return out
