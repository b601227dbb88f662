"""The cache of the built-in tiny image models: one folder per (name, recipe), built once, shared safely.

``cached_build(name, recipe, build_fn)`` returns ``cache_dir()/<name>-<hash12>/`` (``cache_dir()`` is
``$GRPOLAB_CACHE``, default ``~/.cache/grpolab``, as for SmolLM2 in ``model/loading.py``), where ``<hash12>`` is
the first 12 hex digits of the SHA-256 of the recipe (canonical JSON), so a recipe change builds a new folder.
The folder is built into ``<dir>.tmp`` and renamed, and ``meta.json`` is its last file: a folder with
``meta.json`` is complete. An exclusive ``fcntl`` lock on ``<dir>.lock`` makes two processes (pytest-xdist
workers) or threads build it once: the second waits on the lock, then finds the folder and loads it.

**Shipped folders.** The default recipe of each built-in tiny model is built once by the maintainers
(``scripts/ship_builtin_weights.py``) and its folder ships inside the package, ``grpolab/model/builtin/<name>-<hash12>/``
(:data:`SHIPPED`). ``cached_build`` returns that folder when its name (so its recipe hash) matches, and builds nothing:
a first run of ``--recipe vlm_grpo`` no longer pre-trains its backbone for minutes, and every machine trains from the
same weights (a build's last bits depend on the CPU kind, recorded in ``meta.json``). A recipe that differs (another
task, ``vlm_pretrain_steps``, a changed default) has another hash and is built into the cache as before.
``GRPOLAB_BUILD_BUILTINS=1`` ignores the shipped folders (to rebuild them, or to time a build).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import torch

from .loading import cache_dir

META = "meta.json"
#: The shipped folders of the built-in models' default recipes (see the module docstring).
SHIPPED = Path(__file__).parent / "builtin"

def recipe_hash(recipe: dict) -> str:
    """SHA-256 (hex) of the recipe as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def cached_path(name: str, recipe: dict) -> Path:
    """Where ``cached_build(name, recipe, ...)`` keeps its folder."""
    return cache_dir() / f"{name}-{recipe_hash(recipe)[:12]}"


def shipped_path(name: str, recipe: dict) -> Path | None:
    """The folder of ``(name, recipe)`` shipped with grpolab (:data:`SHIPPED`), or ``None`` when none matches or
    ``GRPOLAB_BUILD_BUILTINS=1``."""
    if os.environ.get("GRPOLAB_BUILD_BUILTINS") == "1":
        return None
    path = SHIPPED / cached_path(name, recipe).name
    return path if (path / META).exists() else None


def host_cpu_kind() -> str:
    """The CPU kind of this machine as detected (``GRPOLAB_CPU_KIND``, which the test suite pins, is ignored:
    the weights' last bits depend on the real CPU)."""
    from ..devices import cpu_bf16_features

    feats = cpu_bf16_features()
    return "amx_bf16" if "amx_bf16" in feats else "avx512_bf16" if feats else "avx2"


def read_meta(path: Path) -> dict:
    return json.loads((Path(path) / META).read_text())


def cached_build(name: str, recipe: dict, build_fn: Callable[[Path], dict | None], log=print,
                 message: str | None = None) -> Path:
    """The shipped folder of ``(name, recipe)`` if there is one, else its cache folder, calling
    ``build_fn(tmp_dir)`` to fill it the first time.

    ``build_fn`` writes its files into ``tmp_dir`` and returns extra ``meta.json`` fields (or ``None``);
    ``meta.json`` always has ``name``, ``recipe``, ``recipe_sha256``, ``torch``, ``diffusers`` (versions),
    ``cpu_kind`` and ``seconds`` (the build's wall-clock time). ``message`` is logged before a build.
    """
    shipped = shipped_path(name, recipe)
    if shipped is not None:
        return shipped
    target = cached_path(name, recipe)
    if (target / META).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.with_name(target.name + ".lock")
    with open(lock_path, "a") as lock:  # flock is per open file: threads exclude each other too
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file is closed
        if (target / META).exists():  # another process built it while we waited
            return target
        tmp = target.with_name(target.name + ".tmp")
        if tmp.exists():  # left by a build that was killed
            shutil.rmtree(tmp)
        tmp.mkdir()
        if message:
            log(message)
        t0 = time.perf_counter()
        extra = build_fn(tmp) or {}
        seconds = time.perf_counter() - t0
        try:
            import diffusers
            diffusers_version = diffusers.__version__
        except ImportError:  # the classifier needs no diffusers
            diffusers_version = None
        meta = {"name": name, "recipe": recipe, "recipe_sha256": recipe_hash(recipe), **extra,
                "torch": torch.__version__, "diffusers": diffusers_version, "cpu_kind": host_cpu_kind(),
                "seconds": round(seconds, 2)}
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
        if target.exists():  # a folder without meta.json: incomplete, replace it
            shutil.rmtree(target)
        tmp.rename(target)
        log(f"[grpolab] cached {name} at {target} ({seconds:.0f} s)")
    return target


@contextlib.contextmanager
def pretraining(recipe: dict):
    """The frame of every built-in tiny model's one-time pre-training: torch on ``recipe["threads"]`` threads (the
    weights do not depend on the caller's thread count) and the global RNG forked (the recipe's own generator
    draws everything; the caller's random state is left as it was); both restored on exit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe["threads"])
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)


def fit(model, n: int, recipe: dict, batch_loss, generator: torch.Generator, *, name: str, log=None) -> list[float]:
    """The pre-training loop every built-in tiny model shares: AdamW (``learning_rate``, ``weight_decay``),
    cosine decay over ``iterations`` (unless ``lr_schedule`` says otherwise), batches of ``batch_size`` rows
    drawn without replacement from a permutation of ``n`` (redrawn when it runs out), ``batch_loss(idx)`` the
    scalar loss of rows ``idx`` (its own draws come from ``generator`` too, after the batch's). Trains
    ``model`` in place and leaves it in eval mode; returns the mean loss of each tenth of the run."""
    bs, iters = recipe["batch_size"], recipe["iterations"]
    opt = torch.optim.AdamW(model.parameters(), lr=recipe["learning_rate"], weight_decay=recipe["weight_decay"])
    sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=iters)
             if recipe.get("lr_schedule", "cosine") == "cosine" else None)
    model.train()
    perm, pos, losses, chunk = torch.randperm(n, generator=generator), 0, [], []
    for it in range(iters):
        if pos + bs > n:
            perm, pos = torch.randperm(n, generator=generator), 0
        idx = perm[pos:pos + bs]
        pos += bs
        loss = batch_loss(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        chunk.append(loss.item())
        if len(chunk) == max(1, iters // 10):
            losses.append(round(sum(chunk) / len(chunk), 5))
            chunk = []
            if log is not None:
                log(f"[grpolab]   {name} iteration {it + 1}/{iters}: loss {losses[-1]:.4f}")
    model.eval()
    return losses
