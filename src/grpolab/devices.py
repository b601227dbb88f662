"""Where the policy runs and in which precision (config keys ``device`` and ``dtype``).

* ``device``: ``auto`` picks ``cuda`` when ``torch.cuda.is_available()``, else
  the CPU. The policy, the reference model and every micro-batch live there;
  rollout batches are packed on the CPU (they are small) and moved per
  micro-batch.
* ``dtype``: the weights and the AdamW state stay float32 (master weights);
  forward passes run under ``torch.autocast`` in the chosen precision, like
  TRL's ``bf16=True``. ``auto`` is bfloat16 on a GPU that supports it; on a
  CPU it is chosen by measurement (:func:`cpu_autocast_dtype`): bfloat16 where
  this CPU multiplies bfloat16 matrices at least 1.5x faster than float32
  (native AVX512-BF16 / AMX), else float32. On CPUs without them the
  half-precision products are emulated and measured 10-100x slower than
  float32 (docs/performance.md).
"""
from __future__ import annotations

import contextlib
import functools
import re
import time

import torch

from .errors import ConfigError

_SPEC = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_device_spec(spec: str) -> None:
    """Reject a malformed ``device`` at config time (availability is checked by :func:`resolve_device`)."""
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise ConfigError(f"device: '{spec}' is not valid; valid values: auto, cpu, cuda, cuda:N, mps")


def resolve_device(spec: str) -> torch.device:
    """The ``torch.device`` for a ``device`` setting; a clear error when it is not available here."""
    check_device_spec(spec)
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(spec)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device: '{spec}' requested but CUDA is not available (torch {torch.__version__}: "
                              f"is this the CPU build?); use --device cpu or --device auto")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device: '{spec}' requested but only {torch.cuda.device_count()} CUDA device(s) "
                              f"exist (cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("device: 'mps' requested but the MPS backend is not available; use --device cpu")
    return dev


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """The forward-pass precision for a ``dtype`` setting on ``device``."""
    if spec != "auto":
        return DTYPES[spec]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if device.type == "cpu":
        return cpu_autocast_dtype()
    return torch.float32


@functools.lru_cache(maxsize=1)
def cpu_autocast_dtype() -> torch.dtype:
    """:func:`measured_cpu_dtype`, measured once per process."""
    return measured_cpu_dtype()


def measured_cpu_dtype() -> torch.dtype:
    """bfloat16 if this CPU runs a bfloat16 matrix product at least 1.5x faster than float32, else float32.

    Measured at a small SmolLM2-like shape (128 x 576 by 576 x 576; about
    0.1 s on a CPU that emulates bfloat16).
    """
    f32 = matmul_rate(128, 576, 576, torch.float32, seconds=0.02, warmups=1)
    bf16 = matmul_rate(128, 576, 576, torch.bfloat16, seconds=0.02, warmups=1)
    return torch.bfloat16 if bf16 >= 1.5 * f32 else torch.float32


def matmul_rate(m: int, k: int, n: int, dtype=torch.float32, seconds: float = 1.0, warmups: int = 3) -> float:
    """FLOP/s of ``[m, k] @ [k, n]`` in ``dtype`` on the CPU: ``warmups`` products, then as many as fit
    in ``seconds`` (at least one)."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    for _ in range(warmups):
        a @ b
    reps, t0 = 0, time.perf_counter()
    while reps == 0 or time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2 * m * k * n * reps / (time.perf_counter() - t0)


def autocast(device: torch.device, dtype: torch.dtype):
    """``torch.autocast`` for half precision; a no-op context for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
