"""Reward models standing beside reward functions.

:class:`RewardModelFn` wraps any local Hugging Face sequence-classification
folder (``config.json`` + weights + tokenizer; loaded with
``AutoModelForSequenceClassification``, ``num_labels=1``, offline:
``HF_HUB_OFFLINE=1`` and ``local_files_only=True``) as a reward function under
TRL's contract::

    rm = RewardModelFn("path/to/rm")
    rm(prompts=[...], completions=[...], **columns) -> list[float]   # one score per completion

The score of a completion is the model's single logit for the text
``prompt + completion``:

* chat prompts (lists of ``{"role", "content"}`` messages) go through the
  tokenizer's chat template when it has one, with the completion appended as
  an ``assistant`` message (``add_generation_prompt=False``);
* otherwise (plain-string prompts, or a tokenizer without a chat template) the
  prompt's text (message contents joined by newlines) and the completion's
  text are concatenated as they are.

Plain texts are tokenized with the tokenizer's special tokens (e.g. BOS);
templated texts without (the template writes its own). Texts are scored in chunks of ``batch_size`` with *right* padding, so every
row keeps positions ``0..n-1`` and the classifier reads the last non-pad
token: batched scores equal unbatched ones (tested). Scores are deterministic
(eval mode, no sampling). On the command line the intended spec is
``--reward rm:PATH[=weight]`` (see :func:`parse_rm_spec`).
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from ..data import completion_text  # noqa: E402
from ..registry import REWARD_SPECS  # noqa: E402
from .scoring import RewardFn, spec_target_and_weight  # noqa: E402


def _prompt_text(prompt) -> str:
    if isinstance(prompt, list):
        return "\n".join(m.get("content", "") for m in prompt if isinstance(m, dict))
    return "" if prompt is None else str(prompt)


def load_reward_model(path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` for a local sequence-classification folder (one output logit)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"reward model '{path}': expected a local Hugging Face folder with "
                                f"config.json; {path / 'config.json'} does not exist")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=dtype,
                                                                   local_files_only=True)
    except Exception as e:
        raise ValueError(f"reward model '{path}': cannot load it as a sequence classifier with one "
                         f"output (num_labels=1): {type(e).__name__}: {e}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id
    tok.padding_side = "right"
    model.to(device).eval()
    return model, tok


class RewardModelFn:
    """A sequence-classification reward model as a TRL-contract reward function."""

    def __init__(self, path, *, batch_size: int = 8, max_length: int | None = None,
                 device: str | torch.device = "cpu", name: str = "rm"):
        self.path = str(path)
        self.model, self.tok = load_reward_model(path, device=device)
        self.batch_size = int(batch_size)
        self.max_length = max_length
        self.device = torch.device(device)
        self.__name__ = name  # RewardFn / logging name

    def templated(self, prompt) -> bool:
        """Whether this prompt goes through the tokenizer's chat template."""
        return isinstance(prompt, list) and bool(getattr(self.tok, "chat_template", None))

    def text(self, prompt, completion) -> str:
        """The text the reward model scores for one (prompt, completion)."""
        comp = completion_text(completion)
        if self.templated(prompt):
            messages = list(prompt) + [{"role": "assistant", "content": comp}]
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        return _prompt_text(prompt) + comp

    @torch.no_grad()
    def score_texts(self, texts: list[str], add_special_tokens: bool = True) -> list[float]:
        """One score per text, in chunks of ``batch_size`` (right padding)."""
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tok(texts[i:i + self.batch_size], return_tensors="pt", padding=True,
                           truncation=self.max_length is not None, max_length=self.max_length,
                           add_special_tokens=add_special_tokens)
            enc = {k: v.to(self.device) for k, v in enc.items()}
            logits = self.model(**enc).logits  # [B, 1]
            out.extend(float(x) for x in logits[:, 0].float().cpu())
        return out

    def __call__(self, prompts=None, completions=None, **kwargs) -> list[float]:
        if completions is None:
            raise ValueError("reward model: no completions given")
        prompts = prompts if prompts is not None else [""] * len(completions)
        if len(prompts) != len(completions):
            raise ValueError(f"reward model: {len(prompts)} prompts for {len(completions)} completions")
        scores: list[float] = [0.0] * len(completions)
        for flag in (True, False):  # a chat template adds its own special tokens; plain text gets the tokenizer's
            idx = [i for i, p in enumerate(prompts) if self.templated(p) == flag]
            if idx:
                vals = self.score_texts([self.text(prompts[i], completions[i]) for i in idx],
                                        add_special_tokens=not flag)
                for i, v in zip(idx, vals):
                    scores[i] = v
        return scores

    def __repr__(self) -> str:
        return f"RewardModelFn({self.path!r})"


@REWARD_SPECS.register("rm:", prefix="PATH", needs=("text",))
def parse_rm_spec(spec: str, cfg=None, **kwargs):
    """``rm:PATH`` or ``rm:PATH=weight`` -> :class:`grpolab.rewards.RewardFn` named ``rm``.

    The weight is the part after the last ``=`` when it parses as a number
    (so a path may itself contain ``=``).

    Provenance: grpolab's own — a wrapper of a local sequence-classification reward model under TRL's
    reward-function contract; implements no published method.
    """

    if not spec.startswith("rm:"):
        raise ValueError(f"--reward '{spec}': a reward-model spec starts with 'rm:'")
    path, weight = spec_target_and_weight(spec, "rm:")
    if not path:
        raise ValueError(f"--reward '{spec}': expected rm:PATH or rm:PATH=weight")
    return RewardFn("rm", RewardModelFn(path, **kwargs), weight)
