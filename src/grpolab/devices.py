"""Where the policy runs and in which precision (config keys ``device`` and ``dtype``).

* ``device``: ``auto`` picks ``cuda`` when ``torch.cuda.is_available()``, else
  the CPU. The policy, the reference model and every micro-batch live there;
  rollout batches are packed on the CPU (they are small) and moved per
  micro-batch.
* ``dtype``: the weights and the AdamW state stay float32 (master weights);
  forward passes run under ``torch.autocast`` in the chosen precision, like
  TRL's ``bf16=True``. ``auto`` is bfloat16 on a GPU that supports it; on a
  CPU it is decided from the CPU's features (:func:`cpu_kind`), never by a
  timing, so the same command picks the same precision on a machine every time:
  bfloat16 where the CPU has native bfloat16 matrix instructions (AVX512-BF16
  or AMX-BF16 on x86), else float32. On CPUs without them the half-precision
  products are emulated and measured 10-100x slower than float32
  (docs/performance.md). The environment variable ``GRPOLAB_CPU_KIND``
  (``avx2`` or ``avx512_bf16``) overrides the detected kind, e.g. to run an
  AVX2-only machine's code path on a newer CPU (``make test-avx2``).
"""
from __future__ import annotations

import contextlib
import os
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


#: ``GRPOLAB_CPU_KIND``: overrides the detected CPU kind (what ``dtype: auto`` decides from).
CPU_KIND_ENV = "GRPOLAB_CPU_KIND"
#: CPU kinds and whether they have native bfloat16 matrix instructions.
CPU_KINDS = {"avx2": False, "avx512_bf16": True, "amx_bf16": True}


def cpu_bf16_features() -> list[str]:
    """This CPU's native bfloat16 matrix features, from PyTorch's cpuinfo (``avx512_bf16``, ``amx_bf16``),
    else from the ``flags`` of /proc/cpuinfo; ``[]`` where neither is readable."""
    names = ("avx512_bf16", "amx_bf16")
    try:
        caps = torch._C._cpu._get_cpu_capability()
        if isinstance(caps, dict) and all(n in caps for n in names):
            return [n for n in names if caps[n]]
    except (AttributeError, RuntimeError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return [n for n in names if n in flags]


def cpu_kind() -> tuple[str, str]:
    """``(kind, why)``: ``avx512_bf16`` / ``amx_bf16`` where this CPU has native bfloat16 matrix
    instructions, else ``avx2`` (meaning: no native bf16, whatever its vector width); ``GRPOLAB_CPU_KIND``
    overrides the detection."""
    forced = os.environ.get(CPU_KIND_ENV, "").strip()
    if forced:
        if forced not in CPU_KINDS:
            raise ConfigError(f"{CPU_KIND_ENV}={forced!r} is not valid; valid values: {', '.join(CPU_KINDS)}")
        return forced, f"{CPU_KIND_ENV}={forced}"
    feats = cpu_bf16_features()
    if feats:
        kind = "amx_bf16" if "amx_bf16" in feats else "avx512_bf16"
        return kind, f"cpu has {' and '.join(feats)}"
    return "avx2", "cpu has no avx512_bf16 or amx_bf16"


def cpu_dtype_choice() -> tuple[torch.dtype, str]:
    """``(dtype, reason)`` for ``dtype: auto`` on the CPU, from :func:`cpu_kind` alone (no timing):
    bfloat16 where the kind has native bf16 matrix instructions, else float32."""
    kind, why = cpu_kind()
    if CPU_KINDS[kind]:
        return torch.bfloat16, f"{why} (native bf16 matrix instructions)"
    return torch.float32, f"{why} (bf16 matrix products would be emulated)"


def cpu_autocast_dtype() -> torch.dtype:
    """The precision ``dtype: auto`` runs in on the CPU (:func:`cpu_dtype_choice`)."""
    return cpu_dtype_choice()[0]


def dtype_reason(spec: str, device: torch.device, dtype: torch.dtype) -> str:
    """Why ``dtype`` (from :func:`resolve_dtype`) was chosen, for the log and ``summary.json``."""
    if spec != "auto":
        return f"dtype: {spec} set"
    if device.type == "cuda":
        return "dtype auto: " + ("the GPU supports bfloat16" if dtype == torch.bfloat16
                                 else "the GPU does not support bfloat16")
    if device.type != "cpu":
        return f"dtype auto: float32 on {device.type}"
    chosen, why = cpu_dtype_choice()
    if chosen != dtype:  # cpu_autocast_dtype replaced in-process (the test suite pins float32)
        return f"dtype auto: {str(dtype).removeprefix('torch.')} set in-process (the CPU alone would give " \
               f"{str(chosen).removeprefix('torch.')}, {why})"
    return f"dtype auto: {why}"


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


# ---------------------------------------------------------------- the CPU heap (config key cpu_heap_reuse)
HEAP_MODES = ("auto", "on", "off")
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc <malloc.h> mallopt parameters
HEAP_KEEP_BYTES = 1 << 30  # free memory the heap keeps at its top before it returns it to the OS


def _libc():
    """glibc through ctypes (its ``mallopt``), or None where there is none (macOS, musl, Windows)."""
    import ctypes
    import platform
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def reuse_freed_memory(mode: str, device: torch.device, libc=None) -> str:
    """Keep the process's freed memory for the next allocation instead of returning it to the OS; returns why.

    On the CPU torch allocates with glibc ``malloc``, which serves every block over 32 MB (a ``[512, 49152]``
    logit or softmax tensor, a weight's bfloat16 copy) with a fresh ``mmap`` and unmaps it when freed: the
    next step's same-sized tensor is faulted in again page by page (4 KB each), and the kernel zeroes every
    page. Measured on the benchmark job (2-core AVX512-BF16 CPU, bfloat16): a 3-step run spent 24 s of its 70 s
    in system time (12 s with reuse), and a ``[512, 49152]`` subtract-and-exp ran 41 ms on fresh memory against
    22 ms into reused memory (docs/performance.md, "bfloat16 on a CPU with bf16 matrix instructions").
    ``mallopt(M_MMAP_MAX, 0)`` serves every block from the heap and ``mallopt(M_TRIM_THRESHOLD, 1 GiB)`` keeps
    up to 1 GiB of freed memory there, so a step reuses the last step's pages. Peak memory is the same working
    set (measured +1%); memory freed is kept by the process rather than returned.

    ``mode`` (config ``cpu_heap_reuse``): ``auto`` = on when the policy runs on the CPU with glibc, ``on`` =
    also when it runs on a GPU (the host side), ``off`` = leave the allocator as it is. Process-wide and not
    undone (the Trainer sets it once). ``libc``: a stand-in for tests.
    """
    if mode not in HEAP_MODES:
        raise ConfigError(f"cpu_heap_reuse: {mode!r} is not valid; valid values: {', '.join(HEAP_MODES)}")
    if mode == "off":
        return "cpu_heap_reuse off: glibc's default (blocks over 32 MB mapped and unmapped per allocation)"
    if mode == "auto" and device.type != "cpu":
        return f"cpu_heap_reuse auto: off on {device.type} (the tensors that matter live on the device)"
    libc = libc if libc is not None else _libc()
    if libc is None:
        return f"cpu_heap_reuse {mode}: not glibc here; the allocator is left as it is"
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, HEAP_KEEP_BYTES)):
        return f"cpu_heap_reuse {mode}: glibc refused mallopt; the allocator is left as it is"
    return (f"cpu_heap_reuse {mode}: freed memory reused (glibc mallopt: no per-block mmap, "
            f"{HEAP_KEEP_BYTES >> 20} MB kept before trimming)")
