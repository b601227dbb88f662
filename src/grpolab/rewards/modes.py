"""Thinking-mode rewards: the Thinkless mode-aware outcome reward (seed 004-12)."""
from __future__ import annotations

import math

import torch

from ..data import completion_text
from .shaping import correct_rows
from ..registry import REWARD_TRANSFORMS
from ..registry import param
from .shaping import CORRECT_REWARD, CORRECT_THRESHOLD

THINKLESS_SHORT_TOKEN = param('<short>', 'Thinkless: control token of the short mode')
THINKLESS_THINK_TOKEN = param('<think>', 'Thinkless: control token of the thinking mode')


def control_mode(text: str, short_token: str = "<short>", think_token: str = "<think>") -> str | None:
    """``"short"`` / ``"think"`` when the completion starts with that control token, else ``None``."""
    t = text.lstrip()
    if t.startswith(short_token):
        return "short"
    if t.startswith(think_token):
        return "think"
    return None


@REWARD_TRANSFORMS.register("thinkless_mode_reward")
def thinkless_mode_reward(rewards: torch.Tensor, reward_matrix: torch.Tensor, reward_names: list[str], batch, *,
                          thinkless_gamma: float = param(0.1, 'Thinkless reward: a correct <think> answer earns 1 - '
                                                         'gamma, a correct <short> one 1, a wrong one -1'),
                          thinkless_short_token: str = THINKLESS_SHORT_TOKEN,
                          thinkless_think_token: str = THINKLESS_THINK_TOKEN,
                          shaping_correct_reward: str = CORRECT_REWARD,
                          shaping_correct_threshold: float = CORRECT_THRESHOLD) -> torch.Tensor:
    """Thinkless reward (Fang, Ma and Wang, 2025, arXiv:2505.13379; seed 004-12)::

        r = 1          if the completion starts with <short> and is correct
          = 1 - gamma  if it starts with <think> and is correct
          = -1         if it is wrong

    so that, at equal correctness, the short mode is preferred. It *replaces*
    the combined reward (as in the paper, where it is the only reward). A
    completion without a control token counts as ``<think>`` (no brevity
    bonus). "Correct" is the reward column ``shaping_correct_reward`` >=
    ``shaping_correct_threshold``; rows whose correctness is unscorable stay NaN.
    The control tokens are added to the vocabulary by ``grpolab sft
    --sft_mode thinkless`` as atomic added tokens that decoding keeps, so the
    mode is read from the completion text. The paper's gamma was not
    available to us; 0.1 is grpolab's default (``thinkless_gamma``).

    Provenance: paper equations — Thinkless (Fang, Ma and Wang, 2025, arXiv:2505.13379), the mode-dependent
    reward 1 / 1 - gamma / -1 (equation number not recorded); gamma = 0.1 is grpolab's default (the paper's
    value was not available).
    """
    correct = correct_rows(reward_matrix, reward_names, shaping_correct_reward, shaping_correct_threshold)
    acc = reward_matrix[:, reward_names.index(shaping_correct_reward)]
    out = torch.empty_like(rewards)
    for i, c in enumerate(batch.columns["completion"]):
        if math.isnan(float(acc[i])):
            out[i] = float("nan")
        elif not correct[i]:
            out[i] = -1.0
        else:
            mode = control_mode(completion_text(c), thinkless_short_token, thinkless_think_token)
            out[i] = 1.0 if mode == "short" else 1.0 - thinkless_gamma
    return out
