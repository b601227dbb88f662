"""Speech-recognition rewards: the rewards of the ``spoken_digits`` task, for any policy whose completions are
transcripts (text).

* ``one_minus_wer``: clip(1 − WER, 0, 1), WER by ``jiwer.wer`` after normalisation (lower case, punctuation
  dropped, whitespace collapsed);
* ``exact_match``: 1.0 when the normalised transcript equals the normalised reference.

The data needs a ``transcript`` column (the reference). Use them on your own data with ``--reward
grpolab.policies.speech_to_text.rewards:one_minus_wer``. They are defined, with their formulas and sources, in
``grpolab/policies/speech_to_text/tasks.py`` beside the task (this package imports ``tasks``, so ``tasks`` may not import
``rewards``: tests/test_architecture.py).
"""
from __future__ import annotations

from .tasks import exact_match, normalize, one_minus_wer, word_error_rate

__all__ = ["one_minus_wer", "exact_match", "normalize", "word_error_rate"]
