"""Reading a row's audio: WAV / FLAC files, arrays with a sampling rate, ``datasets.Audio()`` values; mono float32
at the processor's sampling rate.

A row's ``audio`` is one of (the forms ``grpolab.data.audio_value`` hands on from every loader):

* a **file path** (WAV, FLAC, or any format libsndfile reads: OGG, AIFF, ...; MP3 where the bundled libsndfile
  has it), absolute or relative to the data file's folder;
* a ``data:audio/...;base64,`` URI (the encoded bytes of a ``datasets.Audio()`` value, read undecoded);
* ``{"array": [...], "sampling_rate": Hz}`` (what ``datasets`` gives a decoded ``Audio()`` column, and what a
  user builds by hand); ``{"bytes": ..., "path": ...}`` (an undecoded ``Audio()`` value) is read as its bytes,
  else its path.

Files and bytes are decoded by ``soundfile`` (libsndfile, bundled in its wheel): ``datasets``' own audio
decoding (``Audio(decode=True)``, ``ds[0]["audio"]``) needs ``torchcodec`` and FFmpeg, which grpolab does not
install; grpolab reads every ``Audio()`` column undecoded and decodes here. Several channels are averaged to one
(as ``datasets.Audio(mono=True)``). A sampling rate other than the processor's is resampled by
``scipy.signal.resample_poly(x, up, down)`` with ``up / down = target / rate`` in lowest terms (a polyphase FIR
with a Kaiser window, scipy's default): the output has ``ceil(n · up / down)`` samples.

Provenance: grpolab's own (the ``datasets.Audio`` value layout is datasets'; resampling is scipy's).
"""
from __future__ import annotations

import base64
import io
import math
from pathlib import Path

import numpy as np

from ...config import ConfigError

FIX = ("give a WAV/FLAC path (absolute or relative to the data file), a data:audio/... URI, or "
       "{\"array\": [...], \"sampling_rate\": Hz}")


def _soundfile():
    try:
        import soundfile
    except ImportError:
        raise ConfigError("audio: reading audio files needs the 'soundfile' package: pip install 'grpolab[speech]' "
                          "(or pip install soundfile)") from None
    return soundfile


def sampling_rate_of(value, where: str) -> int:
    """A positive whole number of Hz, else a ConfigError naming the field and the fix."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
        and math.isfinite(float(value)) and float(value) > 0 and float(value) == int(value)
    if not ok:
        raise ConfigError(f"{where}: 'audio'.sampling_rate must be a positive whole number of Hz (e.g. 16000), got "
                          f"{value!r}; give each array as {{\"array\": [...], \"sampling_rate\": 16000}}")
    return int(value)


def _source(value, where: str):
    """``(a file path or a BytesIO, a label)`` of an encoded audio value; arrays are not handled here."""
    if isinstance(value, dict):
        if value.get("bytes"):
            return io.BytesIO(bytes(value["bytes"])), "the value's bytes"
        value = value.get("path")
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: 'audio' must be a file path, a data:audio URI or an array with its "
                          f"sampling_rate, got {type(value).__name__}; {FIX}")
    if value.startswith("data:"):
        head, _, data = value.partition(",")
        if ";base64" not in head:
            raise ConfigError(f"{where}: 'audio' data URI must be base64 (data:audio/wav;base64,...)")
        return io.BytesIO(base64.b64decode(data)), "the data URI"
    if not Path(value).is_file():
        raise ConfigError(f"{where}: 'audio' file {value} does not exist; {FIX}")
    return value, value


def read_audio(value, where: str = "row") -> tuple[np.ndarray, int]:
    """``(samples [n] float32 mono, sampling rate)`` of one ``audio`` value (module docstring)."""
    if isinstance(value, dict) and "array" in value:
        sr = sampling_rate_of(value.get("sampling_rate"), where)
        x = np.asarray(value["array"], dtype=np.float32)
        if x.ndim == 2:  # [channels, n] as datasets gives several channels
            x = x.mean(axis=0 if x.shape[0] < x.shape[1] else 1)
        if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
            raise ConfigError(f"{where}: 'audio'.array must be a non-empty 1-d list of finite samples, got shape "
                              f"{x.shape}")
        return x, sr
    src, label = _source(value, where)
    sf = _soundfile()
    try:
        x, sr = sf.read(src, dtype="float32", always_2d=True)
    except (RuntimeError, sf.LibsndfileError) as e:  # libsndfile: not a sound file, unknown format
        raise ConfigError(f"{where}: 'audio' {label} could not be read as audio ({e}); {FIX}") from None
    if x.shape[0] == 0:
        raise ConfigError(f"{where}: 'audio' {label} has no samples")
    return x.mean(axis=1), int(sr)


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``x`` at ``rate`` Hz as ``target`` Hz: ``scipy.signal.resample_poly`` (``ceil(n · up / down)`` samples)."""
    if rate == target:
        return x.astype(np.float32, copy=False)
    from scipy.signal import resample_poly
    g = math.gcd(int(rate), int(target))
    return resample_poly(x, target // g, rate // g).astype(np.float32)


def audio_samples(value, target: int, where: str = "row", max_seconds: float | None = None) -> np.ndarray:
    """The value's mono samples at ``target`` Hz; longer than ``max_seconds`` (the model's window) is an error."""
    x, sr = read_audio(value, where)
    x = resample(x, sr, target)
    if max_seconds is not None and len(x) > max_seconds * target + 0.5:
        raise ConfigError(f"{where}: 'audio' lasts {len(x) / target:.2f} s, longer than the model's "
                          f"{max_seconds:g} s window (the feature extractor's chunk_length); cut it into clips of "
                          f"at most {max_seconds:g} s (long-form transcription is not supported)")
    return x



def check_audio_row(row: dict, where: str, rate: int, seconds: float, model: str) -> None:
    """The row's ``audio`` is there, readable and at most ``seconds`` long (files: their header only); else a
    ConfigError naming the row, ``model`` and the fix."""
    value = row.get("audio")
    if value is None:
        raise ConfigError(f"{where}: policy speech_to_text with {model} transcribes the column 'audio' (a "
                          f"WAV/FLAC path, {{\"array\": [...], \"sampling_rate\": Hz}} or a datasets Audio value); "
                          f"the row has {sorted(row)}")
    if isinstance(value, str) and not value.startswith("data:") and Path(value).is_file():
        sf = _soundfile()
        try:
            info = sf.info(value)
        except (RuntimeError, sf.LibsndfileError) as e:
            raise ConfigError(f"{where}: 'audio' {value} could not be read as audio ({e})") from None
        if info.frames / info.samplerate > seconds + 1e-6:
            raise ConfigError(f"{where}: 'audio' {value} lasts {info.frames / info.samplerate:.2f} s, longer "
                              f"than the model's {seconds:g} s window; cut it into shorter clips")
        return
    audio_samples(value, rate, where, seconds)
