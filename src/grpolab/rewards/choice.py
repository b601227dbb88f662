"""TW-GRPO's multi-choice soft reward as the ``--reward tw_mc_soft`` spec (user data with an ``answer`` column of
option letters). The scores, the format check and the question-answer inversion live with the built-in
``multichoice`` task (``grpolab/tasks/multichoice.py``), which uses them directly.
"""
from __future__ import annotations

from ..data import completion_text
from ..registry import param
from ..tasks.multichoice import soft_choice_score
from .agentic import _spec, data_column


class TWSoftChoiceReward:
    """TW-GRPO multi-choice soft reward (Dang et al., 2025, "Focused Thinking with Token Weighting ...",
    arXiv:2505.24718, seed 000-95)::

        P = letters in the reply's <answer>..</answer> (split on ",", spaces removed), K = the key's letters
        r = |P| / |K|  if P is a subset of K,  else 0

    so a reply that picks 1 of the 2 right options scores 0.5, all of them 1, and any wrong pick 0. The key is
    the row's ``tw_answer_column`` (letters, e.g. ``"A,C"``).

    Provenance: authors' code — https://github.com/longmalongma/TW-GRPO, src/open_r1/grpo.py (accuracy_reward);
    the same subset-ratio score on the same parsing (first <answer> tag, else the whole reply; spaces removed;
    comma split; letters compared as written). The authors first try a math_verify symbolic match and give 1.0
    when it succeeds; grpolab omits that pass, which for letter answers only repeats the set equality that
    already scores 1.0. Test: tests/test_tw_multichoice.py::test_soft_score_matches_authors_rule.
    """

    def __init__(self, *, tw_answer_column: str = param('answer', 'tw_mc_soft: data column with the answer key '
                                                        '(option letters separated by commas)')):
        self.column = tw_answer_column
        self.__name__ = "tw_mc_soft"

    def __call__(self, prompts=None, completions=None, **columns) -> list[float]:
        keys = data_column(columns, self.column, "tw_mc_soft", "tw_answer_column")
        return [soft_choice_score(completion_text(c), k) for c, k in zip(completions, keys)]


_spec("tw_mc_soft", TWSoftChoiceReward)
