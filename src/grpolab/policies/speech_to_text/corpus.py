"""A synthetic speech corpus: spoken digits and short words as sequences of log-mel-like feature frames.

**These are synthetic acoustic features, not audio.** No waveform is ever made: when this corpus was written,
Debian's ``espeak-ng`` was not installed on the project's machines (real speech synthesised by it since: the
``spoken_words_audio`` task, ``spoken_words.py``; this corpus is kept unchanged), so each word is rendered as frames of
a :data:`FEATURE_DIM`-dimensional vector, the shape of the log-mel frames a speech-to-text encoder reads
(``Speech2TextForConditionalGeneration`` takes ``input_features [B, frames, dim]``). What makes it speech-like:

* a **phone inventory**: :data:`NUM_PHONES` fixed mean vectors (standard normal, drawn once from
  :data:`CORPUS_SEED`); every word of :data:`WORDS` is a fixed sequence of :data:`PHONES_PER_WORD` phones from it,
  drawn once as well (words share phones, so some are confusable, as "four" and "five" are);
* **per-utterance variation**: 1–:data:`MAX_WORDS` words drawn uniformly from the vocabulary; each phone lasts
  ``round(BASE_FRAMES · speed)`` frames (≥ 1), the speaking rate ``speed`` drawn per word from
  U[:data:`SPEED_RANGE`]; a speaker offset (one N(0, :data:`SPEAKER_STD`²) vector per utterance, added to
  every frame); silence (the zero vector) of 1–3 frames before, between and after words; Gaussian frame noise
  N(0, :data:`NOISE_STD`²); then a 3-tap moving average along time (coarticulation: neighbouring frames blend);
* utterances are padded with zeros to :data:`MAX_FRAMES` frames (``feature_mask`` says which are real).

An utterance is a pure function of its integer ``audio_seed`` (``numpy.random.default_rng([CORPUS_VERSION,
audio_seed])``): its transcript and its frames come back the same on any machine (NumPy's PCG64 and its normal /
uniform / integer draws are platform-independent). The seed ranges are disjoint per split: pre-training
utterances ``0 …``, RL training rows ``TRAIN_BASE + i``, held-out rows ``EVAL_BASE + i``.

Provenance: grpolab's own — a toy corpus for the speech policy's tests and demos; implements no published method.
"""
from __future__ import annotations

import numpy as np

CORPUS_VERSION = 1
CORPUS_SEED = 2026
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
         "yes", "no", "up", "down", "go", "stop")
FEATURE_DIM = 24
NUM_PHONES = 20
PHONES_PER_WORD = 3
BASE_FRAMES = 3
SPEED_RANGE = (0.7, 1.4)
SPEAKER_STD = 0.5
NOISE_STD = 1.0
MAX_WORDS = 3
#: the longest utterance: 3 words × 3 phones × round(3 · 1.4) = 4 frames + 4 silences of ≤ 3 frames = 48 (+ margin)
MAX_FRAMES = 56
TRAIN_BASE = 1_000_000
EVAL_BASE = 2_000_000


def corpus_recipe() -> dict:
    """Everything that determines the corpus (hashed into the speech model's cache name)."""
    return {"version": CORPUS_VERSION, "seed": CORPUS_SEED, "words": list(WORDS), "dim": FEATURE_DIM,
            "phones": NUM_PHONES, "phones_per_word": PHONES_PER_WORD, "base_frames": BASE_FRAMES,
            "speed": list(SPEED_RANGE), "speaker_std": SPEAKER_STD, "noise_std": NOISE_STD,
            "max_words": MAX_WORDS, "max_frames": MAX_FRAMES}


def _inventory() -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """``(phone means [NUM_PHONES, FEATURE_DIM], one phone sequence per word)``, fixed by :data:`CORPUS_SEED`;
    no two words share their whole sequence."""
    rng = np.random.default_rng([CORPUS_VERSION, CORPUS_SEED])
    phones = rng.standard_normal((NUM_PHONES, FEATURE_DIM))
    prons: list[tuple[int, ...]] = []
    while len(prons) < len(WORDS):
        p = tuple(int(x) for x in rng.integers(0, NUM_PHONES, PHONES_PER_WORD))
        if p not in prons:
            prons.append(p)
    return phones, prons


_PHONES, _PRONUNCIATIONS = _inventory()


def pronunciation(word: str) -> tuple[int, ...]:
    """The phone indices of ``word`` (one of :data:`WORDS`)."""
    return _PRONUNCIATIONS[WORDS.index(word)]


def utterance(audio_seed: int) -> tuple[str, np.ndarray]:
    """``(transcript, frames [n, FEATURE_DIM] float32)`` of utterance ``audio_seed`` (n ≤ :data:`MAX_FRAMES`)."""
    rng = np.random.default_rng([CORPUS_VERSION, int(audio_seed)])
    n_words = int(rng.integers(1, MAX_WORDS + 1))
    words = [WORDS[int(i)] for i in rng.integers(0, len(WORDS), n_words)]
    speaker = rng.standard_normal(FEATURE_DIM) * SPEAKER_STD
    means = [np.zeros((int(rng.integers(1, 4)), FEATURE_DIM))]
    for w in words:
        speed = rng.uniform(*SPEED_RANGE)
        for p in pronunciation(w):
            means.append(np.repeat(_PHONES[p][None], max(1, round(BASE_FRAMES * speed)), axis=0))
        means.append(np.zeros((int(rng.integers(1, 4)), FEATURE_DIM)))
    x = np.concatenate(means) + speaker
    x = x + rng.standard_normal(x.shape) * NOISE_STD
    padded = np.concatenate([x[:1], x, x[-1:]])
    x = (padded[:-2] + padded[1:-1] + padded[2:]) / 3.0
    return " ".join(words), x[:MAX_FRAMES].astype(np.float32)


def batch_features(seeds) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(features [N, MAX_FRAMES, FEATURE_DIM], mask [N, MAX_FRAMES] int64, transcripts)`` of utterances
    ``seeds``, zero-padded on the right."""
    feats = np.zeros((len(seeds), MAX_FRAMES, FEATURE_DIM), dtype=np.float32)
    mask = np.zeros((len(seeds), MAX_FRAMES), dtype=np.int64)
    texts = []
    for i, s in enumerate(seeds):
        text, x = utterance(s)
        feats[i, :len(x)], mask[i, :len(x)] = x, 1
        texts.append(text)
    return feats, mask, texts


def speech_rows(base: int, n: int) -> list[dict]:
    """``n`` rows ``{"prompt": "utterance <seed>", "audio_seed": seed, "transcript": text}``, seeds base … base+n−1."""
    rows = []
    for i in range(n):
        text, _ = utterance(base + i)
        rows.append({"prompt": f"utterance {base + i}", "audio_seed": base + i, "transcript": text})
    return rows
