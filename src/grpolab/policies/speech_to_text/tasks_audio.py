"""``spoken_words_audio``: transcribe real (synthesised) speech, 1–3 spoken words (``spoken_words.py``), with the
built-in tiny model on audio (``--model spoken_words``, ``tiny_audio.py``; recipe ``asr_grpo_audio``) or a Whisper
model (``--model FOLDER``: ``WhisperForConditionalGeneration`` + ``WhisperProcessor``).

* train rows ``{"prompt": "utterance <seed>", "audio": "data:audio/flac;base64,...", "utterance_seed": seed,
  "transcript": "three go"}``: seeds ``TRAIN_BASE + i`` for i < ``spoken_words_train_size`` (200), shuffled with
  the task's ``seed``;
* held-out rows: seeds ``EVAL_BASE + i`` for i < ``spoken_words_eval_size`` (50), in order (a fixed set).

Rewards: ``one_minus_wer`` and ``exact_match`` (weight 1 each; ``tasks.py``), accuracy ``exact_match``.
"""
from __future__ import annotations

from ...registry import TASKS, param
from ...tasks.base import Task
from .tasks import transcription_task

TRAIN_BASE = 1_000_000
EVAL_BASE = 2_000_000
TRAIN_SIZE = param(200, "spoken_words_audio: training utterances (utterance seeds TRAIN_BASE + i)")
EVAL_SIZE = param(50, "spoken_words_audio: held-out utterances (utterance seeds EVAL_BASE + i, a fixed set)")


@TASKS.register("spoken_words_audio", needs=("audio",))
def spoken_words_audio(seed: int = 0, *, spoken_words_train_size: int = TRAIN_SIZE,
                       spoken_words_eval_size: int = EVAL_SIZE) -> Task:
    """Transcribe 1–3 spoken words from audio made of espeak-ng clips (16 kHz FLAC): rewards ``one_minus_wer``
    and ``exact_match`` (weight 1 each), accuracy ``exact_match``; needs a model on audio: ``spoken_words`` or a
    Whisper folder (module docstring).

    Provenance: grpolab's own — a built-in speech task on synthesised audio (policies/speech_to_text/spoken_words.py)
    for the audio models (the built-in spoken_words, Whisper folders); the rewards reconstruct GRPO for ASR's rule-based rewards (seed 000-38).
    """
    from .spoken_words import spoken_rows

    return transcription_task("spoken_words_audio", seed, spoken_rows, (TRAIN_BASE, EVAL_BASE),
                              {"spoken_words_train_size": spoken_words_train_size,
                               "spoken_words_eval_size": spoken_words_eval_size},
                              "spoken words synthesised by espeak-ng (16 kHz audio): 1 - WER and exact match")
