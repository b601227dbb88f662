"""Judge-LM rewards: a local causal LM answers a yes/no question about each completion.

``--reward judge:PATH[=weight]`` loads a local Hugging Face causal-LM folder;
``judge:self`` is a frozen copy of the run's *initial* policy (the config's
``model``, loaded again; for ``--model tiny`` the same tokenizer and seed as
the trainer's, so the same weights); ``judge:tiny`` is a small random-init
model (for tests). The reward of a completion is::

    P(yes) = exp(l_yes) / (exp(l_yes) + exp(l_no))

where ``l_yes``, ``l_no`` are the judge's next-token logits of the first token
of ``judge_yes`` / ``judge_no`` after the judge text — the probability of
"yes" renormalised over the two answers, in [0, 1] (the usual way LLM judges
are turned into scalar scores, e.g. the yes-token probability used by
generative verifiers; the renormalisation removes the mass the judge puts on
other tokens). The judge text is:

* chat prompts with a tokenizer chat template: the prompt messages, the
  completion as an ``assistant`` message and ``judge_question`` as a ``user``
  message, rendered with ``add_generation_prompt=True``;
* otherwise: prompt text, newline, completion text, newline, question, newline.

Texts are scored in chunks of ``judge_batch_size`` with *right* padding and the
logits read at each row's last real token, so batched scores equal one-by-one
scores (tested); texts longer than ``judge_max_length`` tokens keep their last
tokens. Deterministic: eval mode, no sampling. The judge model is loaded on
the first call.
"""
from __future__ import annotations

import math
import os
import string
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from ..data import completion_text  # noqa: E402
from ..registry import REWARD_SPECS, declared_params  # noqa: E402
from .models import _prompt_text  # noqa: E402
from .scoring import scorer_spec  # noqa: E402
from ..registry import param


def tiny_judge(seed: int = 0):
    """A small random-init causal LM whose character tokenizer covers printable ASCII."""
    from ..model.loading import build_tiny
    return build_tiny([string.printable, "yes no"], seed=seed)


def _self_texts(cfg) -> list[str]:
    """The texts the trainer trains the tiny tokenizer on (so ``judge:self`` rebuilds the same model)."""
    from ..data import load_user_data, model_texts
    from ..tasks import get_task
    if cfg.data:
        train, held, _ = load_user_data(cfg)  # as the trainer: its rows, then its evaluation rows
        return model_texts(list(train) + list(held)[:cfg.eval_problems])
    task = get_task(cfg.task, cfg=cfg)
    return model_texts(task.train_rows + task.eval_rows)


class JudgeReward:
    """A causal LM judge as a TRL-contract reward function (see the module docstring)."""

    def __init__(self, path: str, *,
                 judge_question: str = param('Is the answer above correct? Answer yes or no.', 'judge: the yes/no '
                                             'question asked after the prompt and completion'),
                 judge_yes: str = param('yes', 'judge: the word whose first token means yes'),
                 judge_no: str = param('no', 'judge: the word whose first token means no'),
                 judge_batch_size: int = param(8, 'judge: texts per forward pass'),
                 judge_max_length: int = param(1024, 'judge: texts are cut to their last this many tokens'),
                 cfg=None, name: str = "judge"):
        if path == "self" and cfg is None:
            raise ValueError("--reward judge:self needs the run's config (the policy to copy); "
                             "grpolab train passes it")
        if path not in ("self", "tiny") and not (Path(path) / "config.json").exists():
            raise FileNotFoundError(f"judge model '{path}': expected 'self', 'tiny' or a local Hugging Face "
                                    f"causal-LM folder with config.json")
        self.path, self.cfg = path, cfg
        self.question, self.yes, self.no = judge_question, judge_yes, judge_no
        self.batch_size, self.max_length = int(judge_batch_size), int(judge_max_length)
        self.model = self.tok = None
        self.__name__ = name

    def load(self) -> None:
        if self.model is not None:
            return
        if self.path == "tiny":
            model, tok = tiny_judge()
        elif self.path == "self":
            from ..model.loading import load_policy
            cfg = self.cfg
            texts = _self_texts(cfg) if cfg.model == "tiny" else None
            model, tok = load_policy(cfg.model, task_texts=texts, tiny_arch=cfg.tiny_arch, seed=cfg.seed,
                                     log=lambda *a: None)
        else:
            from transformers import AutoModelForCausalLM, AutoTokenizer
            tok = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32, local_files_only=True)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "right"
        self.model, self.tok = model.eval().requires_grad_(False), tok
        ids = [self._first_id(w) for w in (self.yes, self.no)]
        if ids[0] == ids[1]:
            raise ValueError(f"judge: '{self.yes}' and '{self.no}' start with the same token; "
                             f"choose judge_yes / judge_no that differ in their first token")
        self.yes_id, self.no_id = ids

    def _first_id(self, word: str) -> int:
        ids = self.tok(word, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"judge: '{word}' tokenizes to nothing")
        return ids[0]

    def text(self, prompt, completion) -> tuple[str, bool]:
        """The judge text for one (prompt, completion) and whether it went through the chat template."""
        comp = completion_text(completion)
        if isinstance(prompt, list) and getattr(self.tok, "chat_template", None):
            messages = list(prompt) + [{"role": "assistant", "content": comp},
                                       {"role": "user", "content": self.question}]
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), True
        return f"{_prompt_text(prompt)}\n{comp}\n{self.question}\n", False

    @torch.no_grad()
    def p_yes(self, texts: list[str], add_special_tokens: bool = True) -> list[float]:
        """P(yes) renormalised over yes/no for each text, in chunks of ``judge_batch_size``."""
        self.load()
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            rows = [self.tok(t, add_special_tokens=add_special_tokens)["input_ids"][-self.max_length:]
                    for t in texts[i:i + self.batch_size]]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), self.tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, r in enumerate(rows):
                ids[j, :len(r)] = torch.tensor(r, dtype=torch.long)
                mask[j, :len(r)] = 1
            logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
            last = logits[torch.arange(len(rows)), mask.sum(-1) - 1]
            pair = torch.stack([last[:, self.yes_id], last[:, self.no_id]], dim=-1)
            out.extend(float(p) for p in torch.softmax(pair, dim=-1)[:, 0])
        return out

    def __call__(self, prompts=None, completions=None, **kwargs) -> list[float]:
        if completions is None:
            raise ValueError("judge: no completions given")
        prompts = prompts if prompts is not None else [""] * len(completions)
        self.load()
        scores = [math.nan] * len(completions)
        built = [self.text(p, c) for p, c in zip(prompts, completions)]
        for templated in (True, False):  # a chat template writes its own special tokens
            idx = [i for i, (_, t) in enumerate(built) if t == templated]
            if idx:
                for i, v in zip(idx, self.p_yes([built[i][0] for i in idx], add_special_tokens=not templated)):
                    scores[i] = v
        return scores

    def __repr__(self) -> str:
        return f"JudgeReward({self.path!r})"


def parse_judge_spec(spec: str, cfg=None, **opts):
    """``judge:PATH[=weight]`` -> :class:`grpolab.rewards.RewardFn` named ``judge``.

    The weight is the part after the last ``=`` when it parses as a number.
    ``opts``: the ``judge_*`` parameters (``parse_reward_spec`` passes this run's values).

    Provenance: grpolab's own — an LLM-as-judge reward interface (the yes-token probability renormalised over
    yes/no); implements no published method.
    """
    return scorer_spec(spec, "judge", JudgeReward, "judge:PATH, judge:self or judge:tiny (optionally =weight)", cfg,
                       opts)


parse_judge_spec.__grpolab_params__ = declared_params(JudgeReward)  # its options are the judge's
REWARD_SPECS.register("judge:", prefix="PATH|self|tiny", needs=("text",))(parse_judge_spec)
