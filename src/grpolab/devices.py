"""Where the policy runs and in which precision (config keys ``device`` and ``dtype``).

* ``device``: ``auto`` picks ``cuda`` when ``torch.cuda.is_available()``, else
  the CPU. The policy, the reference model and every micro-batch live there;
  rollout batches are packed on the CPU (they are small) and moved per
  micro-batch.
* ``dtype``: the weights and the AdamW state stay float32 (master weights);
  forward passes run under ``torch.autocast`` in the chosen precision, like
  TRL's ``bf16=True``. ``auto`` is bfloat16 on a GPU that supports it and
  float32 elsewhere: on a CPU without AVX512-BF16 / AMX, half-precision matrix
  products are emulated and measured 10-50x slower than float32 (docs/performance.md).
"""
from __future__ import annotations

import contextlib
import re

import torch

from .config import ConfigError

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
    return torch.float32


def autocast(device: torch.device, dtype: torch.dtype):
    """``torch.autocast`` for half precision; a no-op context for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
