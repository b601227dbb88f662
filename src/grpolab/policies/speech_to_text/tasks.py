"""``spoken_digits``: transcribe a synthetic utterance of 1–3 spoken digits and short words (speech recognition).

The corpus is ``grpolab.policies.speech_to_text.corpus``: **synthetic log-mel-like feature frames, not audio**
(real speech for a Whisper model: ``tasks_audio.py``, task ``spoken_words_audio``). A row names an utterance by its seed; the speech policy
(``policy: speech_to_text``) renders its frames and writes a transcript:

* train rows ``{"prompt": "utterance <seed>", "audio_seed": seed, "transcript": "three go"}``: seeds
  ``TRAIN_BASE + i`` for i < ``speech_train_size`` (400), shuffled with the task's ``seed``;
* held-out rows: seeds ``EVAL_BASE + i`` for i < ``speech_eval_size`` (200), in order (a fixed set, disjoint from
  the training and pre-training utterances).

Rewards (each ``f(prompts, completions, *, transcript, **columns) -> list[float]``, TRL's contract; the completion
is the transcript text; published as ``grpolab.policies.speech_to_text.rewards``):

* :func:`one_minus_wer` (weight 1): 1 − WER of the hypothesis against the reference, clipped to [0, 1];
* :func:`exact_match` (weight 1, the accuracy): 1 when the normalised hypothesis equals the normalised reference.

WER is ``jiwer.wer`` (``pip install jiwer``; word-level Levenshtein distance (S + D + I) / N over the reference's N
words), after :func:`normalize` (lower case, punctuation dropped, whitespace collapsed) on both sides.
"""
from __future__ import annotations

import random
import re

from ...data import completion_text
from ...registry import TASKS, param
from ...tasks.base import Task
from ..base import reward_column

_PUNCT = re.compile(r"[^\w\s']")


def normalize(text) -> str:
    """Lower case, punctuation other than apostrophes dropped, runs of whitespace to one space, stripped."""
    return " ".join(_PUNCT.sub(" ", str(text).lower()).split())


def _references(reward: str, transcript, n: int) -> list[str]:
    refs = reward_column(reward, "transcript", transcript, n, "the reference text, one per row", "transcripts")
    return [normalize(r) for r in refs]


def _hypotheses(completions) -> list[str]:
    """Each completion's text (a string, or chat messages as TRL gives them: ``data.completion_text``),
    normalised."""
    return [normalize(completion_text(c)) for c in completions or []]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """WER of one pair after :func:`normalize`: ``jiwer.wer`` = (S + D + I) / N; an empty reference gives 0 for
    an empty hypothesis and 1 otherwise (jiwer refuses an empty reference)."""
    import jiwer

    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return float(jiwer.wer(ref, hyp))


def one_minus_wer(prompts=None, completions=None, *, transcript=None, **kwargs) -> list[float]:
    """r_i = clip(1 − WER(ref_i, hyp_i), 0, 1), WER = (S + D + I) / N by ``jiwer.wer`` on normalised text.

    N is the number of reference words; S, D, I the substitutions, deletions and insertions of the minimum
    word-level edit. WER exceeds 1 when the hypothesis inserts more words than the reference has: the clip gives
    0 there (a hallucinated transcript earns nothing, whatever its length).

    Source: GRPO for ASR (Shivakumar et al., arXiv:2509.01939, seed 000-38) trains on "simple rule based reward
    functions" [abstract]; this 1 − WER form and its clip are [ours] (reconstructed from the abstract).
    """
    hyps = _hypotheses(completions)
    refs = _references("one_minus_wer", transcript, len(hyps))
    return [min(1.0, max(0.0, 1.0 - word_error_rate(r, h))) for r, h in zip(refs, hyps)]


def exact_match(prompts=None, completions=None, *, transcript=None, **kwargs) -> list[float]:
    """r_i = 1[normalize(hyp_i) = normalize(ref_i)] (lower case, punctuation dropped, whitespace collapsed).

    Source: GRPO for ASR (seed 000-38) [abstract: rule-based rewards]; the normalisation is [ours].
    """
    hyps = _hypotheses(completions)
    refs = _references("exact_match", transcript, len(hyps))
    return [float(h == r) for r, h in zip(refs, hyps)]


def transcription_task(name: str, seed: int, make_rows, bases: tuple[int, int], sizes: dict, description: str) -> Task:
    """A transcription task ``name``: ``make_rows(base, n)`` rows from the train and held-out ``bases`` (sizes:
    ``{train_key: n >= 1, eval_key: n >= 0}``, else a ValueError naming the keys), the training rows shuffled
    with ``seed``, the held-out ones in order (a fixed set); rewards ``one_minus_wer`` and ``exact_match``
    (weight 1 each), accuracy ``exact_match``."""
    (train_key, train_size), (eval_key, eval_size) = sizes.items()
    if int(train_size) < 1 or int(eval_size) < 0:
        raise ValueError(f"{name}: {train_key} >= 1 and {eval_key} >= 0, got {train_size} and {eval_size}")
    rows = make_rows(bases[0], int(train_size))
    random.Random(seed).shuffle(rows)
    return Task(name, rows, make_rows(bases[1], int(eval_size)),
                rewards=[("one_minus_wer", one_minus_wer, 1.0), ("exact_match", exact_match, 1.0)],
                accuracy_reward="exact_match", description=description, extra={})


TRAIN_SIZE = param(400, "spoken_digits: training utterances (audio seeds TRAIN_BASE + i)")
EVAL_SIZE = param(200, "spoken_digits: held-out utterances (audio seeds EVAL_BASE + i, a fixed set)")


@TASKS.register("spoken_digits", needs=("audio",))
def spoken_digits(seed: int = 0, *, speech_train_size: int = TRAIN_SIZE, speech_eval_size: int = EVAL_SIZE) -> Task:
    """Transcribe 1–3 spoken digits and short words from synthetic feature frames: rewards ``one_minus_wer`` and
    ``exact_match`` (weight 1 each), accuracy ``exact_match`` (module docstring: rows, rewards).

    Provenance: grpolab's own — a built-in toy speech task (synthetic features, grpolab.policies.speech_to_text.corpus) for the
    speech policy's tests and demos; the rewards reconstruct GRPO for ASR's rule-based rewards (seed 000-38).
    """
    from .corpus import EVAL_BASE, TRAIN_BASE, speech_rows

    return transcription_task("spoken_digits", seed, speech_rows, (TRAIN_BASE, EVAL_BASE),
                              {"speech_train_size": speech_train_size, "speech_eval_size": speech_eval_size},
                              "synthetic spoken digits and short words (feature frames, not audio): 1 - WER and "
                              "exact match")
