"""Checkpoints: weights (safetensors), optimiser, scheduler, components, RNG, step.

Layout::

    OUT/checkpoints/step_000010/weights.safetensors   trainable parameters
    OUT/checkpoints/step_000010/state.pt              everything else (tensors and plain data only)

A checkpoint is written into ``step_N.tmp``, its files flushed to disk (fsync), and
the folder renamed when complete, so a run killed mid-save (even by ``kill -9``)
leaves the previous checkpoint intact. One that cannot be written (a full disk)
is removed and reported (:class:`~grpolab.errors.WriteError`: the folder, the cause, the free space and about
how much the checkpoint needs, also when PyTorch's writer says only ``enforce fail at inline_container.cc``);
the trainer skips it with one warning line that names the resume command and trains on.

Loading never executes code. ``state.pt`` holds only tensors, numbers, strings,
lists, tuples and dicts: everything else a component's ``state_dict`` returns is
encoded into those (:func:`encode_state`): NumPy arrays, sets and grpolab
dataclasses (e.g. a replay buffer's ``RolloutBatch``) become tagged dicts. It is
read with ``torch.load(weights_only=True)``, PyTorch's restricted unpickler, which
refuses any other global; a checkpoint that needs one (a crafted pickle) is
refused with :class:`CheckpointError`. Checkpoints of earlier grpolab versions
(NumPy RNG state and ``RolloutBatch`` pickled as objects) load through the same
restricted unpickler with exactly those classes allowed.

``--resume`` takes the newest checkpoint that loads; a corrupt one is skipped
with a warning naming it (:func:`load_latest`).
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..errors import CheckpointError, WriteError, refused_pickle
from .rundir import write_failure

FORMAT = 2  # 1: state.pt pickled NumPy arrays / RolloutBatch objects (grpolab <= 0.x); 2: encoded plain data
TAG = "__grpolab_type__"


def checkpoint_dirs(out: Path) -> list[Path]:
    root = Path(out) / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))


def latest_checkpoint(out: Path) -> Path | None:
    dirs = checkpoint_dirs(out)
    return dirs[-1] if dirs else None


def rng_state(generator: torch.Generator, device_generator: torch.Generator | None = None) -> dict:
    """Every random stream of a run: torch, Python, NumPy, the trainer's generator, the device's sampler."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
             "sampling": generator.get_state()}
    if device_generator is not None and device_generator is not generator:
        state["device_sampling"] = device_generator.get_state()
    return state


def set_rng_state(state: dict, generator: torch.Generator, device_generator: torch.Generator | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    generator.set_state(state["sampling"])
    if device_generator is not None and "device_sampling" in state:
        device_generator.set_state(state["device_sampling"])


def trainable_state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().clone() for n, p in model.named_parameters() if p.requires_grad}


# ------------------------------------------------------------------ encoding
def encode_state(obj, path: str = "state"):
    """``obj`` as tensors and plain data only (what ``torch.load(weights_only=True)`` reads back).

    NumPy arrays, NumPy scalars, sets and dataclasses defined in grpolab become
    tagged dicts; any other object raises ``TypeError`` naming where it is.
    """
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.Tensor)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise TypeError(f"{path}: a NumPy array of dtype {obj.dtype} cannot be checkpointed safely")
        wide = obj.astype(np.float64 if obj.dtype.kind == "f" else np.int64 if obj.dtype.kind in "iu" else bool)
        return {TAG: "ndarray", "dtype": obj.dtype.str, "data": torch.from_numpy(np.ascontiguousarray(wide))}
    if isinstance(obj, (set, frozenset)):
        return {TAG: "set", "items": [encode_state(v, f"{path}[]") for v in obj]}
    if isinstance(obj, tuple):
        return tuple(encode_state(v, f"{path}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, list):
        return [encode_state(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        for k in obj:
            if not isinstance(k, (str, int, float, bool, tuple)) and k is not None:
                raise TypeError(f"{path}: dict key {k!r} of type {type(k).__name__} cannot be checkpointed")
        return {k: encode_state(v, f"{path}[{k!r}]") for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type) and type(obj).__module__.startswith("grpolab."):
        cls = type(obj)
        return {TAG: "dataclass", "class": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: encode_state(getattr(obj, f.name), f"{path}.{f.name}")
                           for f in dataclasses.fields(obj)}}
    raise TypeError(f"{path}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be checkpointed safely; "
                    f"a component's state_dict must return tensors, numbers, strings, lists, tuples, dicts, "
                    f"sets, NumPy arrays or grpolab dataclasses")


#: modules whose dataclasses moved (issue 40's one package per policy kind, 2026-12-07): a checkpoint written
#: before the move names the old module, and resuming it rebuilds the class from its new home
MOVED_MODULES = {
    "grpolab.control.theory": "grpolab.experiments.theory",
    "grpolab.control.vgc": "grpolab.experiments.vgc",
    "grpolab.control.envs": "grpolab.policies._control.envs",
    "grpolab.vision.tools": "grpolab.policies.vision_language.tools",
    "grpolab.vision.clips": "grpolab.policies.vision_language.clips",
    "grpolab.vision.gui": "grpolab.policies.vision_language.gui",
    "grpolab.vision.scenes": "grpolab.policies.vision_language.scenes",
}


def decode_state(obj):
    """Inverse of :func:`encode_state`; only dataclasses defined in grpolab modules are rebuilt."""
    if isinstance(obj, tuple):
        return tuple(decode_state(v) for v in obj)
    if isinstance(obj, list):
        return [decode_state(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    kind = obj.get(TAG)
    if kind is None:
        return {k: decode_state(v) for k, v in obj.items()}
    if kind == "ndarray":
        return obj["data"].numpy().astype(np.dtype(obj["dtype"]))
    if kind == "set":
        return {decode_state(v) for v in obj["items"]}
    if kind == "dataclass":
        module, _, qualname = str(obj["class"]).partition(":")
        if not module.startswith("grpolab.") or "." in qualname:
            raise CheckpointError(f"checkpoint names class {obj['class']!r}; only grpolab dataclasses are rebuilt")
        module = MOVED_MODULES.get(module, module)
        cls = getattr(importlib.import_module(module), qualname, None)
        if cls is None or not dataclasses.is_dataclass(cls):
            raise CheckpointError(f"checkpoint names class {obj['class']!r}, which is not a grpolab dataclass")
        inst = object.__new__(cls)
        for k, v in obj["fields"].items():
            object.__setattr__(inst, k, decode_state(v))
        for f in dataclasses.fields(cls):  # a field added after the checkpoint was written: its default
            if f.name not in obj["fields"]:
                if f.default is not dataclasses.MISSING:
                    object.__setattr__(inst, f.name, f.default)
                elif f.default_factory is not dataclasses.MISSING:
                    object.__setattr__(inst, f.name, f.default_factory())
        return inst
    raise CheckpointError(f"checkpoint holds an unknown tagged value {kind!r}")


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: Path, final: Path, root: Path) -> None:
    """``tmp`` (written and synced) becomes ``final`` in one rename; the folder entry is synced too."""
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    fsync(root)


def save_checkpoint(out: Path, step: int, model, state: dict, keep: int) -> Path:
    """Write ``OUT/checkpoints/step_N`` (module docstring), then delete all but the newest ``keep``.

    A checkpoint that cannot be written (a full disk, a quota, an I/O error) leaves no ``step_N.tmp`` behind
    and raises :class:`~grpolab.errors.WriteError` naming the folder, the cause and the free space; the
    checkpoints before it are untouched. A state that cannot be checkpointed raises ``TypeError`` before
    anything is written."""
    root = Path(out) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    encoded = {"format": FORMAT, "state": encode_state(state)}
    weights = trainable_state(model)
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        save_file(weights, str(tmp / "weights.safetensors"))
        torch.save(encoded, tmp / "state.pt")
        for f in ("weights.safetensors", "state.pt"):
            fsync(tmp / f)
        fsync(tmp)
        publish(tmp, final, root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        why = write_failure(e, tmp, needed=checkpoint_bytes(out, weights, encoded)) if isinstance(e, Exception) \
            else None
        if why is None:
            raise
        raise WriteError(f"checkpoint {final.name} could not be written to {root}: {why}") from None
    for old in checkpoint_dirs(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def checkpoint_bytes(out: Path, weights: dict, encoded: dict) -> int:
    """About what a checkpoint of this run takes on disk: the newest one's size, else its tensors' bytes."""
    last = latest_checkpoint(out)
    files = [f for f in last.rglob("*") if f.is_file()] if last is not None else []
    return sum(f.stat().st_size for f in files) if files else _tensor_bytes(weights) + _tensor_bytes(encoded)


def _legacy_globals() -> list:
    """The classes a format-1 state.pt pickled: NumPy's RNG state array and the replay buffer's batches."""
    from ..batch import RolloutBatch

    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32)), RolloutBatch]


def read_state(path: Path) -> dict:
    """``state.pt`` of a checkpoint folder through PyTorch's restricted unpickler; never runs code."""
    file = Path(path) / "state.pt"
    try:
        with torch.serialization.safe_globals(_legacy_globals()):
            raw = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise refused_pickle(file, e, "Checkpoints are read as tensors and plain data only; use a run folder "
                                      "written by grpolab that you trust, or start a new run") from None
    except Exception as e:  # truncated / corrupt file
        raise CheckpointError(f"{file}: cannot be read ({type(e).__name__}: {str(e)[:300]})") from None
    if isinstance(raw, dict) and raw.get("format") == FORMAT:
        return decode_state(raw["state"])
    if isinstance(raw, dict) and "optimizer" in raw and "step" in raw:  # format 1: the state dict itself
        return raw
    raise CheckpointError(f"{file}: not a grpolab checkpoint state (format {raw.get('format') if isinstance(raw, dict) else '?'})")


def load_checkpoint(path: Path, model) -> dict:
    """Load the weights of the checkpoint folder ``path`` into ``model``; return its state (safe load)."""
    state = read_state(path)  # first: a refused state.pt leaves the model untouched
    try:
        weights = load_file(str(Path(path) / "weights.safetensors"))
    except Exception as e:
        raise CheckpointError(f"{Path(path) / 'weights.safetensors'}: cannot be read "
                              f"({type(e).__name__}: {str(e)[:300]})") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected:
        raise RuntimeError(f"checkpoint {path} has weights the model does not: {unexpected[:5]}")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    absent = trainable - set(weights)
    if absent:
        raise RuntimeError(f"checkpoint {path} lacks trainable weights: {sorted(absent)[:5]}")
    return state


def load_latest(out: Path, model, log=print, load=None) -> tuple[Path | None, dict | None]:
    """The newest checkpoint of ``out`` that loads: ``(folder, state)``, or ``(None, None)`` when there is none.

    A corrupt checkpoint is skipped with a warning naming it, and the one before it
    is tried. A checkpoint refused as unsafe stops the resume (``CheckpointError``):
    silently training on from an older step would hide that someone tampered with
    the run folder. ``load(folder) -> state`` reads one checkpoint (default:
    :func:`load_checkpoint` into ``model``; the distributed trainer passes its DCP reader).
    """
    load = load or (lambda d: load_checkpoint(d, model))
    dirs = checkpoint_dirs(out)
    for i, d in enumerate(reversed(dirs)):
        try:
            return d, load(d)
        except CheckpointError as e:
            if "refused to load" in str(e):
                raise
            older = dirs[-2 - i] if i + 1 < len(dirs) else None
            if older is None:
                raise CheckpointError(f"{e}; no older checkpoint in {Path(out) / 'checkpoints'} to fall back "
                                      f"to. Start a new run (another --out)") from None
            log(f"[grpolab] warning: checkpoint {d} is corrupt ({e}); falling back to {older}")
    return None, None
