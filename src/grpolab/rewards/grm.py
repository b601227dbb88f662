"""A trained pointwise generative reward model (GRM) as a reward: ``--reward grm:PATH[=weight]``.

``PATH`` is a local Hugging Face causal-LM folder, e.g. ``OUT/final`` of a run of recipe ``irpo_grm`` (task
``irpo_prefs``: the GRM trained with GRPO under a Bradley-Terry model, IRPO, seed 000-21). For each
(prompt, completion) of the policy the GRM reads the judging prompt it was trained on
(:func:`grpolab.tasks.irpo_prefs.judge_prompt` with the row's question — the data column
``grm_question_column``, default ``question``, else the prompt's text — and the completion's text), writes one
judgement greedily (at most ``grm_max_new_tokens`` tokens, deterministic), and the reward is the score that ends
it (:func:`grpolab.tasks.irpo_prefs.parse_judge_score`, an integer 0..10); a judgement without a parseable score
is unscorable (None -> NaN, counted in the reward's NaN share, never a silent 0). One GRM call per completion:
O(n) for n completions (pointwise), where a pairwise GRM needs O(n^2).

Use it as the reward column ``grm`` of a policy run, alone or through the ``irpo_bradley_terry`` transform
(``irpo_reward_column: grm``, recipe ``irpo_policy``). The model is loaded on the first call.
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from ..data import completion_text, tokenize_prompts  # noqa: E402
from ..errors import ConfigError  # noqa: E402
from ..registry import REWARD_SPECS, declared_params, param  # noqa: E402
from ..tasks.irpo_prefs import judge_prompt, parse_judge_score  # noqa: E402
from .models import _prompt_text  # noqa: E402
from .scoring import scorer_spec  # noqa: E402


class GenerativeRewardModel:
    """A causal-LM judge that writes a judgement ending in ``Score: N`` per completion (module docstring)."""

    def __init__(self, path: str, *,
                 grm_max_new_tokens: int = param(32, 'grm: tokens the generative reward model may write per '
                                                     'judgement'),
                 grm_batch_size: int = param(8, 'grm: judgements generated per batch'),
                 grm_question_column: str = param('question', 'grm: data column with the question the policy '
                                                              'answered (else the prompt text)'),
                 grm_max_prompt_length: int = param(1024, 'grm: longest judging prompt in tokens'),
                 cfg=None, name: str = "grm"):
        if not (Path(path) / "config.json").exists():
            raise ConfigError(f"grm model '{path}' is missing: expected a local Hugging Face causal-LM folder "
                              f"with config.json (e.g. OUT/final of a run of recipe irpo_grm); train one first "
                              f"(grpolab train --recipe irpo_grm) or give --reward grm:PATH")
        self.path = str(path)
        self.max_new_tokens, self.batch_size = int(grm_max_new_tokens), int(grm_batch_size)
        self.question_column, self.max_prompt_length = grm_question_column, int(grm_max_prompt_length)
        self.model = self.tok = None
        self.__name__ = name

    def load(self) -> None:
        if self.model is not None:
            return
        from ..model.loading import load_policy
        model, tok = load_policy(self.path, log=lambda *a: None)
        tok.padding_side = "left"
        self.model, self.tok = model.eval().requires_grad_(False), tok

    @torch.no_grad()
    def judgements(self, prompts: list) -> list[str]:
        """One greedy judgement per judging prompt, in chunks of ``grm_batch_size``."""
        self.load()
        out: list[str] = []
        for i in range(0, len(prompts), self.batch_size):
            ids, mask = tokenize_prompts(self.tok, prompts[i:i + self.batch_size], self.max_prompt_length)
            gen = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                      max_new_tokens=self.max_new_tokens, pad_token_id=self.tok.pad_token_id)
            out += self.tok.batch_decode(gen[:, ids.shape[1]:], skip_special_tokens=True)
        return out

    def __call__(self, prompts=None, completions=None, **columns) -> list:
        if completions is None:
            raise ValueError("grm: no completions given")
        prompts = prompts if prompts is not None else [""] * len(completions)
        questions = columns.get(self.question_column) or [_prompt_text(p) for p in prompts]
        judged = self.judgements([judge_prompt(str(q), completion_text(c)) for q, c in zip(questions, completions)])
        self.last_judgements = judged
        return [parse_judge_score(j) for j in judged]

    def __repr__(self) -> str:
        return f"GenerativeRewardModel({self.path!r})"


def parse_grm_spec(spec: str, cfg=None, **opts):
    """``grm:PATH[=weight]`` -> :class:`grpolab.rewards.RewardFn` named ``grm`` (module docstring).

    The weight is the part after the last ``=`` when it parses as a finite number.

    Provenance: reconstructed from the abstract — IRPO (Song et al., 2026, arXiv:2601.00677, seed 000-21): the
    trained pointwise GRM scores each candidate once during the policy's RL; greedy judgements and an
    unparseable judgement = unscorable are grpolab's choices.
    """
    return scorer_spec(spec, "grm", GenerativeRewardModel, "grm:PATH or grm:PATH=weight (a finite number)", cfg,
                       opts)


parse_grm_spec.__grpolab_params__ = declared_params(GenerativeRewardModel)
REWARD_SPECS.register("grm:", prefix="PATH", needs=("text",))(parse_grm_spec)
