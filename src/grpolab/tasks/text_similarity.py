"""Text measures of free-form answers: words, sentence BLEU, word entropy.

Pure functions over strings, no registration. The ``fact_paraphrase`` task (its fact check) and the reward
transforms in ``grpolab/rewards/transforms.py`` (PS-GRPO's group similarity reward, 000-77; the
information-consistency rewards, 000-30) use them, so each formula lives here once (here, in the tasks layer,
because rewards import tasks and never the reverse).
"""
from __future__ import annotations

import math
import re
from collections import Counter

_WORD = re.compile(r"\w+")

BLEU_SMOOTHING = ("none", "add_one")


def words(text: str) -> list[str]:
    """Lower-cased word tokens of ``text``: maximal runs of letters, digits and ``_`` (punctuation dropped)."""
    return _WORD.findall(str(text).lower())


def _ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def sentence_bleu(hypothesis: str, reference: str, order: int = 2, smoothing: str = "none") -> float:
    """Sentence-level BLEU-N of ``hypothesis`` against one ``reference`` (Papineni et al., 2002), on :func:`words`.

    ``BLEU = BP * exp(sum_{n=1..N} (1/N) log p_n)`` with the clipped n-gram precision
    ``p_n = sum_g min(c_hyp(g), c_ref(g)) / sum_g c_hyp(g)`` and the brevity penalty
    ``BP = 1`` if ``c > r`` else ``exp(1 - r / c)`` (``c``, ``r``: hypothesis and reference word counts).
    ``smoothing: none`` gives 0 as soon as one ``p_n`` is 0 (or the hypothesis has fewer than ``n`` words);
    ``add_one`` uses ``(m_n + 1) / (l_n + 1)`` for ``n >= 2`` (Lin and Och, 2004, "BLEU+1"), ``p_1``
    unsmoothed. An empty hypothesis scores 0. Asymmetric: the hypothesis is the one being scored.
    """
    if order < 1:
        raise ValueError(f"BLEU order: expected >= 1, got {order}")
    if smoothing not in BLEU_SMOOTHING:
        raise ValueError(f"BLEU smoothing: expected one of {', '.join(BLEU_SMOOTHING)}, got '{smoothing}'")
    hyp, ref = words(hypothesis), words(reference)
    if not hyp:
        return 0.0
    log_sum = 0.0
    for n in range(1, order + 1):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        matched, total = sum((h & r).values()), sum(h.values())
        if smoothing == "add_one" and n >= 2:
            matched, total = matched + 1, total + 1
        if matched == 0 or total == 0:
            return 0.0
        log_sum += math.log(matched / total) / order
    c, r = len(hyp), len(ref)
    bp = 1.0 if c > r else math.exp(1.0 - r / c)
    return bp * math.exp(log_sum)


def word_entropy(text: str) -> float:
    """Shannon entropy (nats) of the word distribution of ``text``: ``H = -sum_v p(v) log p(v)``,
    ``p(v)`` = the share of :func:`words` that are ``v``. 0 for an empty text or one repeated word."""
    counts = Counter(words(text))
    total = sum(counts.values())
    if total == 0:
        return 0.0
    return -sum(c / total * math.log(c / total) for c in counts.values())
