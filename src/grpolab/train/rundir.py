"""The run folder (``--out``): what marks it as a grpolab run, and the rule that nothing in it is lost.

A run folder holds ``grpolab_run.json`` (the run marker, written when a
:class:`~grpolab.train.trainer.Trainer` first uses the folder) next to
``config.yaml``, ``metrics.jsonl``, ``checkpoints/``, ``eval_before.json``,
``summary.json`` and ``final/``. The marker records the working directory the
run was started in (``cwd``: what relative paths in ``config.yaml`` are relative
to, :func:`run_workdir`). It is also the run's manifest: its
``owned`` list names every file and folder of ``OUT`` that grpolab writes there
(:func:`run_paths`: the run's files, and each tracker's, e.g. ``tensorboard/``);
a name enters it only while nothing of that name exists, so what the list names
is grpolab's, and a folder it names is grpolab's with all it holds.
:func:`claim_run_folder` is the one rule the CLI and the Python API share:

* a name the run would write that exists and is not in the manifest (a user's
  ``metrics.jsonl`` or ``checkpoints/``) is refused, ``--overwrite`` or not, naming
  it: the run would replace it or write into it;
* a missing or empty folder is created and marked;
* a folder with files but no run marker (and no results of an older grpolab run)
  is not a run: refused unless ``overwrite`` (``--overwrite``); with it the run
  is written next to those files, none of which is changed;
* a run folder that already has results (metrics lines or checkpoints) is
  refused unless ``resume`` (continue it) or ``overwrite`` (what the manifest
  names is deleted first, and nothing else);
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
from .runlock import LOCK

MARKER = "grpolab_run.json"
EVAL_BEFORE = "eval_before.json"
# what every run writes in its folder, and what each tracker (report_to) writes there
RUN_PATHS = ("config.yaml", "metrics.jsonl", "completions.jsonl", "summary.json", EVAL_BEFORE, "reward_curve.png",
             "checkpoints", "final")
TRACKER_PATHS = {"tensorboard": ("tensorboard",), "wandb": ("wandb",), "mlflow": ("mlflow.db", "mlartifacts"),
                 "trackio": ("trackio",)}
# everything a run of any configuration writes: a run folder of a grpolab version before the manifest owns these
LAYOUT = RUN_PATHS + tuple(p for paths in TRACKER_PATHS.values() for p in paths)


def run_paths(trackers=()) -> list[str]:
    """The names a run writes in its folder: :data:`RUN_PATHS` and those of its ``trackers`` (names of
    ``report_to``)."""
    return list(RUN_PATHS) + [p for t in trackers for p in TRACKER_PATHS.get(t, ())]


def has_results(out: Path) -> bool:
    """True when ``out`` holds results of a run: metrics lines or a checkpoint."""
    out = Path(out)
    metrics = out / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size > 0:
        return True
    ckpts = out / "checkpoints"
    return ckpts.is_dir() and any(p.is_dir() and not p.name.endswith(".tmp") for p in ckpts.glob("step_*"))


def is_run_folder(out: Path) -> bool:
    """A grpolab run: the marker, or (runs of grpolab versions before the marker) grpolab's config.yaml with
    results."""
    out = Path(out)
    return (out / MARKER).exists() or (_grpolab_config(out / "config.yaml") and has_results(out))


def _grpolab_config(path: Path) -> bool:
    """``path`` is a config.yaml grpolab wrote (a mapping with the keys every run's config has)."""
    import yaml

    try:
        keys = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(keys, dict) and {"model", "num_generations", "learning_rate"} <= set(keys)


def _read_marker(out: Path) -> dict:
    try:
        marker = json.loads((Path(out) / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) else {}


def owned_paths(out: Path) -> set[str]:
    """The names of ``out`` grpolab wrote: the manifest in the marker; for a run of a grpolab version before
    the manifest, the names of :data:`LAYOUT` it holds; for a folder that is not a run, none."""
    out = Path(out)
    if not is_run_folder(out):
        return set()
    owned = _read_marker(out).get("owned")
    if isinstance(owned, list) and all(isinstance(n, str) for n in owned):
        return {n for n in owned if n and "/" not in n and n not in (".", "..", MARKER)}
    return {n for n in LAYOUT if os.path.lexists(out / n)}


def _listing(out: Path, names) -> str:
    return ", ".join(n + ("/" if (out / n).is_dir() and not (out / n).is_symlink() else "") for n in sorted(names))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


# what PyTorch's and safetensors' writers say when a write fails (a RuntimeError / SafetensorError, without an
# errno; an OSError says it with its errno): "No space left on device (os error 28)", "PytorchStreamWriter failed
# writing file data/0: file write failed" and, torch 2.x on a full tmpfs (measured), "[enforce fail at
# inline_container.cc:672] . unexpected pos 576 vs 534" raised while handling "basic_ios::clear: iostream error"
DISK_FULL = ("No space left", "os error 28", "StorageFull")
QUOTA = ("Disk quota", "os error 122", "QuotaExceeded")
WRITE_FAILED = DISK_FULL + QUOTA + ("file write failed", "enforce fail at inline_container.cc", "iostream error")


def size_text(n: float) -> str:
    """``n`` bytes for a message: kB, MB or GB."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def _texts(e: BaseException) -> list[str]:
    """The messages of ``e`` and of the exceptions it was raised from or while handling."""
    out, seen = [], set()
    while e is not None and id(e) not in seen and len(out) < 8:
        seen.add(id(e))
        out.append(str(e))
        e = e.__cause__ or e.__context__
    return out


def write_failure(e: BaseException, path: Path, needed: int | None = None) -> str | None:
    """Why writing ``path`` failed, with the free space left there (and ``needed``, the bytes the write needs,
    when known), when ``e`` is a failed write (a full disk, a quota, an I/O error) rather than a bug; None
    otherwise."""
    text = " ".join(_texts(e))
    if isinstance(e, OSError) and e.errno is not None:
        why = e.strerror or str(e)
    elif not any(m in text for m in WRITE_FAILED):
        return None
    elif any(m in text for m in DISK_FULL):
        why = "No space left on device"
    elif any(m in text for m in QUOTA):
        why = "Disk quota exceeded"
    else:  # PyTorch's writer says only that its stream failed
        why = None
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return why or f"the write failed (PyTorch: {first})"
    if why is None:  # a full disk when the space left is less than the write needs (or under 1 MB)
        why = f"{'No space left on device' if free < max(needed or 0, 1e6) else 'the write failed'} " \
              f"(PyTorch: {first})"
    need = f"about {size_text(needed)} needed, " if needed else ""
    return f"{why} ({need}{size_text(free)} free on the file system of {where})"


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` in one step (a temporary file renamed over it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written temporary file
        raise
    os.replace(tmp, path)


def claim_run_folder(out: Path, resume: bool = False, overwrite: bool = False, log=print,
                     dry_run: bool = False, writes=LAYOUT, resume_with: str | None = None) -> None:
    """Check that a run that writes the names ``writes`` (:func:`run_paths`) may write into ``out`` (see the
    module docstring), then create and mark it, its manifest listing what it owns (``dry_run``: only check, so
    a run can refuse before it loads anything and change files only after). ``resume_with``: how a run that
    `grpolab train --resume OUT` cannot continue is continued (a Python-API run: its Python call), recorded in the
    marker (:func:`python_resume`)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out: {out} is a file, not a folder; choose another --out")
    entries = [p for p in out.iterdir() if p.name != LOCK] if out.is_dir() else []  # (the run's lock: runlock.py)
    run = bool(entries) and is_run_folder(out)
    owned = owned_paths(out) if run else set()
    foreign = [n for n in writes if os.path.lexists(out / n) and n not in owned]
    if foreign:
        why = f"not listed in its {MARKER}" if run else f"no {MARKER}: it is not a grpolab run folder"
        raise ConfigError(f"out: {out} holds {_listing(out, foreign)}, which grpolab did not write ({why}); a run "
                          f"there would replace or write into {'them' if len(foreign) > 1 else 'it'}, and "
                          f"--overwrite deletes only what grpolab wrote. Choose another --out (or move "
                          f"{'them' if len(foreign) > 1 else 'it'} out of {out}); nothing was changed")
    if entries and not run:
        if not overwrite:
            raise ConfigError(f"out: {out} already has files ({', '.join(sorted(p.name for p in entries)[:5])}"
                              f"{', ...' if len(entries) > 5 else ''}) and is not a grpolab run folder (no "
                              f"{MARKER}); choose a new folder for --out, or pass --overwrite (Python: "
                              f"Trainer(..., overwrite=True)) to write the run next to them (none of them is "
                              f"changed or deleted)")
        if dry_run:
            return
        log(f"[grpolab] --overwrite: writing a run into {out}, next to its other files (none is changed)")
    elif run and has_results(out) and not resume:
        if not overwrite:
            how = python_resume(out) or (f"`grpolab train --resume {out}` (Python: Trainer(cfg, resume=True); "
                                         f"GRPOTrainer: trainer.train(resume_from_checkpoint=True))")
            raise ConfigError(f"out: {out} already holds a run; continue it with {how}, choose another --out, or "
                              f"pass --overwrite (GRPOConfig: overwrite_output_dir=True) to delete that run and "
                              f"start again (nothing was overwritten)")
        if dry_run:
            return
        present = [n for n in owned if os.path.lexists(out / n)]
        log(f"[grpolab] --overwrite: deleting the run in {out} ({_listing(out, present)}) and starting again; "
            f"nothing else in it is touched")
        for name in owned:
            _remove(out / name)
            _remove(out / f".{name}.tmp")  # a write in progress when the run was killed (write_atomic)
        owned = set()
    if dry_run:
        return
    out.mkdir(parents=True, exist_ok=True)
    marker = _read_marker(out)
    manifest = sorted(owned | set(writes))
    if marker.get("owned") != manifest or marker.get("grpolab_run") != 2 or "cwd" not in marker \
            or marker.get("resume_with") != resume_with:
        write_atomic(out / MARKER, json.dumps({"grpolab_run": 2, "created": marker.get(
            "created", time.strftime("%Y-%m-%dT%H:%M:%S%z")), "cwd": marker.get("cwd", os.getcwd()),
            "owned": manifest, **({"resume_with": resume_with} if resume_with else {})}) + "\n")


def python_resume(out: Path) -> str | None:
    """How the run in ``out`` is continued when `grpolab train --resume OUT` cannot (a run started from the Python
    API, ``GRPOTrainer``: its Python call, recorded in the marker); None for a run the CLI resumes."""
    how = _read_marker(out).get("resume_with")
    return how if isinstance(how, str) and how else None


def run_workdir(out: Path) -> Path | None:
    """The working directory the run in ``out`` was started in (its marker's ``cwd``): what the relative paths
    of its ``config.yaml`` (``data``, ``eval_data``, ``reward``) are relative to; None when not recorded."""
    cwd = _read_marker(out).get("cwd")
    return Path(cwd) if isinstance(cwd, str) and cwd else None


def save_eval_before(out: Path, result: dict, log=print) -> None:
    """Keep the "before" evaluation in the run folder, so a resumed run's summary still has it (a file that
    cannot be written, e.g. on a full disk, is skipped with a warning)."""
    path = Path(out) / EVAL_BEFORE
    try:
        write_atomic(path, json.dumps(json_safe(result), indent=2, default=str))
    except OSError as e:
        why = write_failure(e, path)
        if why is None:
            raise
        log(f"[grpolab] warning: {path} could not be written: {why}; skipped (this run's summary has the "
            f"'before' evaluation, a resumed run's will not)")


def load_eval_before(out: Path, log=print) -> dict | None:
    path = Path(out) / EVAL_BEFORE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, OSError) as e:
        log(f"[grpolab] warning: {path} cannot be read ({e}); the summary will lack the 'before' evaluation")
        return None
