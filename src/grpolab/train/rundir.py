"""The run folder (``--out``): what marks it as a grpolab run, and the rule that nothing in it is lost.

A run folder holds ``grpolab_run.json`` (the run marker, written when a
:class:`~grpolab.train.trainer.Trainer` first uses the folder) next to
``config.yaml``, ``metrics.jsonl``, ``checkpoints/``, ``eval_before.json``,
``summary.json`` and ``final/``. :func:`claim_run_folder` is the one rule the
CLI and the Python API share:

* a missing or empty folder is created and marked;
* a folder with files but no run marker (and no results of an older grpolab run)
  is not a run: refused unless ``overwrite`` (``--overwrite``), because a new run
  would replace its ``config.yaml`` and ``summary.json``;
* a run folder that already has results (metrics lines or checkpoints) is
  refused unless ``resume`` (continue it) or ``overwrite`` (its metrics,
  checkpoints, summary and evaluations are deleted first);
* a marked folder without results (a run stopped before its first step) is reused.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ..config import ConfigError
from ..data import json_safe

MARKER = "grpolab_run.json"
EVAL_BEFORE = "eval_before.json"
RUN_FILES = ("metrics.jsonl", "completions.jsonl", "mlflow.db", "summary.json", EVAL_BEFORE, "reward_curve.png")
RUN_DIRS = ("checkpoints", "final", "tensorboard", "wandb", "mlartifacts", "trackio")


def has_results(out: Path) -> bool:
    """True when ``out`` holds results of a run: metrics lines or a checkpoint."""
    out = Path(out)
    metrics = out / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size > 0:
        return True
    ckpts = out / "checkpoints"
    return ckpts.is_dir() and any(p.is_dir() and not p.name.endswith(".tmp") for p in ckpts.glob("step_*"))


def is_run_folder(out: Path) -> bool:
    """A grpolab run: the marker, or (runs of grpolab versions before the marker) config.yaml with results."""
    out = Path(out)
    return (out / MARKER).exists() or ((out / "config.yaml").exists() and has_results(out))


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` in one step (a temporary file renamed over it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def claim_run_folder(out: Path, resume: bool = False, overwrite: bool = False, log=print,
                     dry_run: bool = False) -> None:
    """Check that a run may write into ``out`` (see the module docstring), then create and mark it
    (``dry_run``: only check, so a run can refuse before it loads anything and change files only after)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out: {out} is a file, not a folder; choose another --out")
    entries = [p for p in out.iterdir()] if out.is_dir() else []
    if entries and not is_run_folder(out):
        if not overwrite:
            raise ConfigError(f"out: {out} already has files ({', '.join(sorted(p.name for p in entries)[:5])}"
                              f"{', ...' if len(entries) > 5 else ''}) and is not a grpolab run folder (no "
                              f"{MARKER}); choose a new folder for --out, or pass --overwrite (Python: "
                              f"Trainer(..., overwrite=True)) to write the run into it (its config.yaml and "
                              f"summary.json would be replaced)")
        if dry_run:
            return
        log(f"[grpolab] --overwrite: writing a run into {out}, which already has other files")
    elif entries and has_results(out) and not resume:
        if not overwrite:
            raise ConfigError(f"out: {out} already holds a run; continue it with `grpolab train --resume {out}` "
                              f"(Python: Trainer(cfg, resume=True)), choose another --out, or pass --overwrite "
                              f"to delete that run and start again (nothing was overwritten)")
        if dry_run:
            return
        log(f"[grpolab] --overwrite: deleting the run in {out} (metrics, checkpoints, summary) and starting again")
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(out / name, ignore_errors=True)
    if dry_run:
        return
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).exists():
        write_atomic(out / MARKER, json.dumps({"grpolab_run": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
                     + "\n")


def save_eval_before(out: Path, result: dict) -> None:
    """Keep the "before" evaluation in the run folder, so a resumed run's summary still has it."""
    write_atomic(Path(out) / EVAL_BEFORE, json.dumps(json_safe(result), indent=2, default=str))


def load_eval_before(out: Path, log=print) -> dict | None:
    path = Path(out) / EVAL_BEFORE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, OSError) as e:
        log(f"[grpolab] warning: {path} cannot be read ({e}); the summary will lack the 'before' evaluation")
        return None
