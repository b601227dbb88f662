"""Real speech for the ``spoken_words_audio`` task: utterances of 1–3 words concatenated from clips synthesised
once by ``espeak-ng`` and shipped with grpolab (``clips/``, ``scripts/make_speech_clips.py``).

The clips: each of the 16 words of :data:`~.corpus.WORDS` (``zero`` … ``nine``, ``yes``, ``no``, ``up``,
``down``, ``go``, ``stop``) in 2 voices (espeak-ng's ``en-us`` and ``en-gb+f3``) at 150 and 200 words per minute:
64 FLAC files, 16 kHz mono, 0.2–0.5 s each, about 0.5 MB (``clips/clips.json`` lists them).

An utterance is a pure function of its integer ``utterance_seed`` (``numpy.random.default_rng([VERSION, seed])``):
1–3 words drawn uniformly, each one of its 4 clips drawn uniformly and scaled by a gain from U[0.5, 1]; silence of
U[0.05, 0.2] s before, between and after the words; Gaussian noise of standard deviation 0.003 over the whole.
Its audio is a 16-bit FLAC ``data:audio/flac;base64,`` URI (the speech policy's ``audio`` column reads it like a
file), its ``transcript`` the words.

Provenance: grpolab's own — a toy corpus of synthesised speech for the speech policy's Whisper path and docs;
implements no published method.
"""
from __future__ import annotations

import base64
import functools
import io
import json
from pathlib import Path

import numpy as np

VERSION = 1
CLIPS = Path(__file__).resolve().parent / "clips"
RATE = 16000
MAX_WORDS = 3
GAIN = (0.5, 1.0)
SILENCE_S = (0.05, 0.2)
NOISE_STD = 0.003


@functools.lru_cache(maxsize=1)
def clips() -> dict[str, list[np.ndarray]]:
    """``{word: [samples float32 at 16 kHz, ...]}`` of the shipped clips, in ``clips.json``'s order."""
    import soundfile as sf

    listing = json.loads((CLIPS / "clips.json").read_text())
    out: dict[str, list[np.ndarray]] = {}
    for c in listing["clips"]:
        x, sr = sf.read(CLIPS / c["file"], dtype="float32")
        if sr != RATE:
            raise ValueError(f"{CLIPS / c['file']}: {sr} Hz, expected {RATE}")
        out.setdefault(c["word"], []).append(x)
    return out


def corpus_recipe() -> dict:
    """Everything that determines the utterances (hashed into the built-in audio model's cache name): the
    constants above and the SHA-256 of ``clips.json`` and of every clip's bytes."""
    import hashlib

    h = hashlib.sha256((CLIPS / "clips.json").read_bytes())
    for c in json.loads((CLIPS / "clips.json").read_text())["clips"]:
        h.update((CLIPS / c["file"]).read_bytes())
    return {"version": VERSION, "rate": RATE, "max_words": MAX_WORDS, "gain": list(GAIN),
            "silence_s": list(SILENCE_S), "noise_std": NOISE_STD, "clips_sha256": h.hexdigest()}


def utterance(seed: int) -> tuple[str, np.ndarray]:
    """``(transcript, samples float32 at 16 kHz)`` of utterance ``seed`` (module docstring)."""
    bank = clips()
    words_all = sorted(bank, key=list(bank).index)
    rng = np.random.default_rng([VERSION, int(seed)])
    words = [words_all[int(i)] for i in rng.integers(0, len(words_all), int(rng.integers(1, MAX_WORDS + 1)))]
    parts = [np.zeros(int(rng.uniform(*SILENCE_S) * RATE), dtype=np.float32)]
    for w in words:
        variants = bank[w]
        parts.append(variants[int(rng.integers(0, len(variants)))] * np.float32(rng.uniform(*GAIN)))
        parts.append(np.zeros(int(rng.uniform(*SILENCE_S) * RATE), dtype=np.float32))
    x = np.concatenate(parts)
    x = x + rng.standard_normal(len(x)).astype(np.float32) * np.float32(NOISE_STD)
    return " ".join(words), np.clip(x, -1.0, 1.0).astype(np.float32)


def flac_data_uri(x: np.ndarray, rate: int = RATE) -> str:
    """``x`` as a 16-bit FLAC ``data:audio/flac;base64,`` URI."""
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, x, rate, format="FLAC", subtype="PCM_16")
    return "data:audio/flac;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def spoken_rows(base: int, n: int) -> list[dict]:
    """``n`` rows ``{"prompt": "utterance <seed>", "audio": <FLAC data URI>, "utterance_seed": seed,
    "transcript": text}``, seeds base … base+n−1."""
    rows = []
    for i in range(n):
        text, x = utterance(base + i)
        rows.append({"prompt": f"utterance {base + i}", "audio": flac_data_uri(x), "utterance_seed": base + i,
                     "transcript": text})
    return rows
