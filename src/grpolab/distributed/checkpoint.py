"""Checkpoints that move between world sizes: ``torch.distributed.checkpoint`` (DCP).

A checkpoint folder ``OUT/checkpoints/step_N`` of a distributed run holds

* ``dcp/``: the model and optimiser state as DCP writes it (each rank its shards, rank 0 the
  ``.metadata``), keyed by parameter name (``torch.distributed.checkpoint.state_dict``), so a run saved
  by 2 ranks loads into 1 or 4 (DCP reshards on load) and into DDP or FSDP2;
* ``state.pt``: everything else, identical on every rank (scheduler, prompt sampler, stateful
  components, RNG states, step), in the single-process format (grpolab.train.checkpoint:
  tensors and plain data, read with ``torch.load(weights_only=True)``).

Every rank writes into ``step_N.tmp``; after all ranks are done rank 0 fsyncs ``state.pt`` and renames
the folder, so a rank killed mid-save (even by ``kill -9``) leaves only a ``.tmp`` folder, which loading
ignores: the previous checkpoint stays the newest complete one. The single-process format
(``weights.safetensors`` + ``state.pt``) stays loadable by grpolab.train.checkpoint.
"""
from __future__ import annotations

import contextlib
import shutil
import warnings
from pathlib import Path

import torch

from ..errors import CheckpointError, WriteError
from ..train import checkpoint as ckpt
from ..train.rundir import write_failure
from . import collective

DCP_DIR = "dcp"


def is_dcp(path: Path) -> bool:
    """A checkpoint folder written by :func:`save` (its model and optimiser are a DCP folder)."""
    return (Path(path) / DCP_DIR).is_dir()


def run_uses_dcp(out: Path) -> bool:
    """The newest checkpoint of run folder ``out`` is a DCP one (resume it with the distributed trainer)."""
    last = ckpt.latest_checkpoint(out)
    return last is not None and is_dcp(last)


@contextlib.contextmanager
def one_process_quiet():
    """Without a process group DCP warns that it assumes one process: that is the intent here."""
    with warnings.catch_warnings():
        if not collective.initialized():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save(out: Path, step: int, module: torch.nn.Module, optimizer, state: dict, keep: int) -> Path:
    """Collective: every rank calls it. Model + optimiser through DCP, ``state`` (identical on all ranks)
    written by rank 0; the folder appears complete or not at all. A part that cannot be written (a full disk)
    on any rank removes ``step_N.tmp`` and raises :class:`~grpolab.errors.WriteError` on every rank (the same
    sentence as the single-process writer's: train/checkpoint.py); the checkpoints before it are untouched."""
    import torch.distributed.checkpoint as dcp  # 2 s of imports: only runs that save or load DCP pay them
    from torch.distributed.checkpoint.state_dict import get_state_dict

    root = Path(out) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp"
    encoded = {"format": ckpt.FORMAT, "state": ckpt.encode_state(state)}
    failed = None
    if collective.rank() == 0:
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            (tmp / DCP_DIR).mkdir(parents=True)
        except Exception as e:
            failed = e
    _all_written(failed, out, final, encoded)
    model_sd, optim_sd = get_state_dict(module, optimizer)
    try:
        with one_process_quiet():
            dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp / DCP_DIR),
                     no_dist=not collective.initialized())
    except Exception as e:
        failed = e
    _all_written(failed, out, final, encoded)  # every rank's shards are written
    if collective.rank() == 0:
        try:
            torch.save(encoded, tmp / "state.pt")
            for f in sorted((tmp / DCP_DIR).iterdir()) + [tmp / "state.pt"]:
                ckpt.fsync(f)
            ckpt.fsync(tmp / DCP_DIR)
            ckpt.fsync(tmp)
            ckpt.publish(tmp, final, root)
        except Exception as e:
            failed = e
    _all_written(failed, out, final, encoded)
    if collective.rank() == 0:
        for old in ckpt.checkpoint_dirs(out)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    collective.barrier()
    return final


def _all_written(failed: Exception | None, out: Path, final: Path, encoded: dict) -> None:
    """Collective: raise on every rank when the write of any rank failed (``failed``: this rank's error), after
    rank 0 removed ``step_N.tmp``: a :class:`~grpolab.errors.WriteError` naming the folder, the cause and the
    space when every failure was a failed write (a full disk), else this rank's own error (or one naming the
    rank that failed)."""
    tmp = final.with_name(final.name + ".tmp")
    full = None if failed is None else write_failure(failed, tmp, needed=ckpt.checkpoint_bytes(out, {}, encoded))
    why = full or (None if failed is None else f"{type(failed).__name__}: {str(failed)[:300]}")
    whys = collective.all_gather_objects((why, full is not None))
    if not any(w for w, _ in whys):
        return
    if collective.rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    if all(is_full for w, is_full in whys if w):
        first = next(w for w, _ in whys if w)
        raise WriteError(f"checkpoint {final.name} could not be written to {final.parent}: {first}") from None
    if failed is not None and full is None:
        raise failed
    rank = next(r for r, (w, is_full) in enumerate(whys) if w and not is_full)
    raise RuntimeError(f"checkpoint {final.name}: rank {rank} could not write its part: {whys[rank][0]}")


def load(path: Path, module: torch.nn.Module, optimizer) -> dict:
    """Collective: load the DCP model and optimiser of checkpoint folder ``path`` into ``module`` /
    ``optimizer`` (any world size, DDP or FSDP2) and return its ``state.pt`` (safe load)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    state = ckpt.read_state(path)  # first: a refused state.pt leaves the model untouched
    if not (Path(path) / DCP_DIR / ".metadata").is_file():
        raise CheckpointError(f"{Path(path) / DCP_DIR}: no .metadata (an incomplete DCP checkpoint)")
    model_sd, optim_sd = get_state_dict(module, optimizer)
    sd = {"model": model_sd, "optimizer": optim_sd}
    try:
        with one_process_quiet():
            dcp.load(sd, checkpoint_id=str(Path(path) / DCP_DIR), no_dist=not collective.initialized())
    except Exception as e:  # missing or truncated shard files
        raise CheckpointError(f"{Path(path) / DCP_DIR}: cannot be read ({type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''})") from None
    set_state_dict(module, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
    return state


def load_latest(out: Path, module: torch.nn.Module, optimizer, log=print) -> tuple[Path | None, dict | None]:
    """The newest DCP checkpoint of ``out`` that loads, with grpolab.train.checkpoint.load_latest's rules: a
    corrupt one is skipped with a warning, an unsafe one stops the resume."""
    return ckpt.load_latest(out, module, log=log, load=lambda d: load(d, module, optimizer))
