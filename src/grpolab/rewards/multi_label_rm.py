"""A multi-label reward model: one regression head per label on a shared transformer (Li et al., 2025,
*Optimizing Safe and Aligned Language Generation: A Multi-Objective GRPO Approach*, arXiv:2503.21819; seed 000-52).

The paper trains a reward model that regresses several alignment scores of a response (politeness,
meaningfulness, actionability, safety) and combines them into the one scalar GRPO optimises. Here:

* :class:`MultiLabelRewardModel`: a ``transformers`` backbone (``AutoModel``: a local folder, or the tiny
  random-init architecture) whose last hidden states are mean-pooled over the text's tokens, ``h``, and one linear
  head per label, ``y_hat_k = w_k . h + b_k``;
* :func:`train_multi_label_rm`: in-process training on labelled texts, the loss the mean over labels of each
  label's mean squared error, ``L = (1/K) sum_k mean_i (y_hat_ik - y_ik)^2`` (AdamW, minibatches), and held-out
  metrics per label: MSE, the MSE of the constant predictor (the training mean of the label) and
  ``R^2 = 1 - MSE / MSE_const``;
* :func:`save_multi_label_rm` / :func:`load_multi_label_rm`: ``model.safetensors`` (backbone and heads),
  ``config.json`` (labels, weights, backbone config, held-out metrics) and the tokenizer, in one folder;
* the reward spec ``mlrm:PATH[#LABEL][=weight]``: ``mlrm:PATH`` is the column ``mlrm``, the weighted sum
  ``r = sum_k c_k y_hat_k`` with the label weights ``c_k`` saved with the model; ``mlrm:PATH#LABEL`` is the
  column ``mlrm_LABEL``, one head's prediction (give it weight 0 to log the head without adding it). PATH
  ``builtin`` trains the model on the built-in set below on first use (seed 0) and caches it in
  ``$GRPOLAB_CACHE/mlrm-builtin-<hash12>/``;
* the built-in labelled set (:func:`arithmetic_label_set`): replies to ``Compute a + b.`` (a, b in 0..9), right or
  wrong (off by 10 to 15, so that many wrong numbers fall outside 0..18 and a small model can learn part of the
  label), in the ``Answer: N`` format or not, short or long, with three labels: ``correctness`` (1 when the
  reply's number is a + b), ``format`` (the ``arithmetic`` task's format check) and ``length`` (characters / 40,
  at most 1). Label weights: correctness 1.0, format 0.5, length -0.25 (shorter preferred).

The texts the model reads are ``prompt text + "\\n" + reply`` (a chat prompt: its messages' contents joined by
newlines). Scoring is in eval mode with right padding, so batched and one-by-one predictions are equal.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch
from torch import nn

from ..data import completion_text
from ..registry import REWARD_SPECS
from .models import _prompt_text
from .scoring import RewardFn, spec_target_and_weight

BUILTIN_LABELS = ("correctness", "format", "length")
BUILTIN_WEIGHTS = (1.0, 0.5, -0.25)
LENGTH_CHARS = 40


def rm_text(prompt, reply) -> str:
    """The text the reward model reads for one (prompt, reply)."""
    return f"{_prompt_text(prompt)}\n{completion_text(reply)}"


def arithmetic_label_set(n: int = 1200, seed: int = 0) -> list[dict]:
    """``n`` labelled replies ``{"prompt", "reply", "labels": {correctness, format, length}}`` (module docstring)."""
    from ..tasks.arithmetic import FORMAT
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        right = rng.random() < 0.5
        v = a + b if right else a + b + rng.choice([-1, 1]) * rng.randint(10, 15)
        reply = rng.choice([f"{a} + {b} = {v}\nAnswer: {v}", f"Answer: {v}", f"The sum is {v}.", f"{v}",
                            f"Let me add {a} and {b} carefully. The result is {v}.",
                            f"Adding the two numbers step by step gives {v}.\nAnswer: {v}"])
        rows.append({"prompt": f"Compute {a} + {b}.", "reply": reply,
                     "labels": {"correctness": float(right), "format": float(bool(FORMAT.search(reply))),
                                "length": min(len(reply), LENGTH_CHARS) / LENGTH_CHARS}})
    return rows


class MultiLabelRewardModel(nn.Module):
    """Shared backbone, mean pooling, one linear regression head per label."""

    def __init__(self, backbone: nn.Module, labels: list[str]):
        super().__init__()
        self.backbone, self.labels = backbone, list(labels)
        hidden = backbone.config.hidden_size
        self.heads = nn.ModuleDict({k: nn.Linear(hidden, 1) for k in self.labels})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Predictions ``[B, K]`` in the order of ``labels``."""
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        return torch.cat([self.heads[k](pooled) for k in self.labels], dim=-1)


def _encode(tok, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tok(t)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for j, r in enumerate(rows):  # right padding: every row keeps positions 0..n-1
        ids[j, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[j, :len(r)] = 1
    return ids, mask


@torch.no_grad()
def predict(model: MultiLabelRewardModel, tok, texts: list[str], batch_size: int = 32) -> torch.Tensor:
    """``[N, K]`` head predictions for ``texts`` (eval mode)."""
    model.eval()
    out = [model(*_encode(tok, texts[i:i + batch_size])) for i in range(0, len(texts), batch_size)]
    return torch.cat(out) if out else torch.zeros(0, len(model.labels))


def _backbone(backbone: str, texts: list[str], seed: int, hidden: int = 32):
    from transformers import AutoModel, AutoTokenizer
    if backbone == "tiny":
        from ..model.loading import build_tiny
        lm, tok = build_tiny(texts, seed=seed, hidden=hidden)
        torch.manual_seed(seed)
        model = AutoModel.from_config(lm.config)
    else:
        if not (Path(backbone) / "config.json").exists():
            raise ValueError(f"mlrm backbone '{backbone}': expected 'tiny' or a local Hugging Face folder with "
                             f"config.json")
        tok = AutoTokenizer.from_pretrained(backbone, local_files_only=True)
        model = AutoModel.from_pretrained(backbone, dtype=torch.float32, local_files_only=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def train_multi_label_rm(rows: list[dict], *, labels: list[str] | None = None, backbone: str = "tiny",
                         seed: int = 0, steps: int = 250, lr: float = 3e-3, batch_size: int = 32,
                         held_out: float = 0.25, tiny_hidden: int = 32) -> tuple[MultiLabelRewardModel, object, dict]:
    """Train on ``rows`` (``{"prompt", "reply", "labels": {label: value}}``); return ``(model, tokenizer,
    metrics)`` with held-out ``{label: {"mse", "const_mse", "r2"}}`` on the last ``held_out`` share of rows."""
    labels = list(labels or rows[0]["labels"])
    texts = [rm_text(r["prompt"], r["reply"]) for r in rows]
    y = torch.tensor([[float(r["labels"][k]) for k in labels] for r in rows])
    n_test = max(1, int(round(len(rows) * held_out)))
    tr, te = slice(0, len(rows) - n_test), slice(len(rows) - n_test, len(rows))
    backbone_model, tok = _backbone(backbone, texts, seed, tiny_hidden)
    torch.manual_seed(seed)
    model = MultiLabelRewardModel(backbone_model, labels)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    train_texts, y_tr = texts[tr], y[tr]
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(train_texts), (batch_size,), generator=gen)
        pred = model(*_encode(tok, [train_texts[i] for i in idx.tolist()]))
        loss = ((pred - y_tr[idx]) ** 2).mean(0).mean()  # mean over labels of each label's MSE
        opt.zero_grad()
        loss.backward()
        opt.step()
    pred = predict(model, tok, texts[te])
    const = y_tr.mean(0)
    metrics = {}
    for k, name in enumerate(labels):
        mse = float(((pred[:, k] - y[te][:, k]) ** 2).mean())
        cmse = float(((const[k] - y[te][:, k]) ** 2).mean())
        metrics[name] = {"mse": mse, "const_mse": cmse, "r2": 1.0 - mse / cmse if cmse > 0 else math.nan}
    return model, tok, metrics


def save_multi_label_rm(model: MultiLabelRewardModel, tok, path, weights: list[float], metrics: dict | None = None
                        ) -> Path:
    """Write ``model.safetensors``, ``config.json`` and the tokenizer to ``path``."""
    from safetensors.torch import save_file
    if len(weights) != len(model.labels):
        raise ValueError(f"mlrm: {len(weights)} weights for {len(model.labels)} labels {model.labels}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    cfg = {"kind": "grpolab-multi-label-rm", "labels": model.labels, "weights": [float(w) for w in weights],
           "pooling": "mean", "backbone_config": model.backbone.config.to_dict(), "metrics": metrics or {}}
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    tok.save_pretrained(path)
    return path


def load_multi_label_rm(path) -> tuple[MultiLabelRewardModel, object, dict]:
    """``(model, tokenizer, config)`` of a folder written by :func:`save_multi_label_rm`."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists() or json.loads(cfg_file.read_text()).get("kind") != "grpolab-multi-label-rm":
        raise ValueError(f"mlrm: '{path}' is not a multi-label reward model folder (config.json with kind "
                         f"grpolab-multi-label-rm; write one with grpolab.rewards.multi_label_rm.save_multi_label_rm)")
    cfg = json.loads(cfg_file.read_text())
    bcfg = dict(cfg["backbone_config"])
    bconf = AutoConfig.for_model(bcfg.pop("model_type"), **bcfg)
    model = MultiLabelRewardModel(AutoModel.from_config(bconf), cfg["labels"])
    model.load_state_dict(load_file(str(path / "model.safetensors")))
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model.eval().requires_grad_(False), tok, cfg


def builtin_rm_path(log=print) -> Path:
    """The built-in multi-label reward model: trained on :func:`arithmetic_label_set` once (one thread, the
    caller's random state untouched: :func:`~grpolab.model.cache.pretraining`), then cached or shipped like the
    other built-in models (:func:`~grpolab.model.cache.cached_build`)."""
    from ..model.cache import cached_build, pretraining
    recipe = {"set": "arithmetic_label_set", "n": 1200, "seed": 0, "backbone": "tiny", "steps": 250, "lr": 3e-3,
              "labels": BUILTIN_LABELS, "weights": BUILTIN_WEIGHTS, "threads": 1, "v": 2}

    def build(tmp: Path) -> dict:
        with pretraining(recipe):
            model, tok, metrics = train_multi_label_rm(arithmetic_label_set(recipe["n"], recipe["seed"]),
                                                       labels=list(BUILTIN_LABELS), steps=recipe["steps"],
                                                       lr=recipe["lr"], seed=recipe["seed"])
        save_multi_label_rm(model, tok, tmp, list(BUILTIN_WEIGHTS), metrics)
        return {"metrics": metrics}

    return cached_build("mlrm-builtin", recipe, build, log=log,
                        message=f"[grpolab] training the built-in multi-label reward model (arithmetic replies; "
                                f"labels {', '.join(BUILTIN_LABELS)}) (one time)")


class MultiLabelRewardFn:
    """The weighted sum of the heads (``label=None``) or one head, as a TRL-contract reward function. Columns of
    the same model share one forward pass per call (the last call's predictions are kept)."""

    _cache: dict = {}

    def __init__(self, path: str, label: str | None = None, log=print):
        self.path = str(builtin_rm_path(log) if path == "builtin" else Path(path))
        weights_file = Path(self.path) / "model.safetensors"
        self.key = (self.path, weights_file.stat().st_mtime_ns if weights_file.exists() else None)
        if self.key not in self._cache:  # one load per saved model (a folder written again is loaded again)
            self._cache[self.key] = {"model": load_multi_label_rm(self.path), "key": None, "pred": None}
        model, _, cfg = self._cache[self.key]["model"]
        if label is not None and label not in model.labels:
            raise ValueError(f"mlrm: no head '{label}' in {self.path} (heads: {', '.join(model.labels)})")
        self.label, self.weights = label, torch.tensor(cfg["weights"], dtype=torch.float32)
        self.__name__ = "mlrm" if label is None else f"mlrm_{label}"

    def heads(self, prompts, completions) -> torch.Tensor:
        """``[N, K]`` head predictions for the call (computed once for all columns of this model)."""
        entry = self._cache[self.key]
        texts = [rm_text(p, c) for p, c in zip(prompts, completions)]
        if entry["key"] != texts:
            model, tok, _ = entry["model"]
            entry["key"], entry["pred"] = texts, predict(model, tok, texts)
        return entry["pred"]

    def __call__(self, prompts=None, completions=None, **kwargs) -> list[float]:
        prompts = prompts if prompts is not None else [""] * len(completions)
        pred = self.heads(prompts, completions)
        labels = self._cache[self.key]["model"][0].labels
        col = pred @ self.weights if self.label is None else pred[:, labels.index(self.label)]
        return [float(v) for v in col]


@REWARD_SPECS.register("mlrm:", prefix="PATH|builtin", needs=("text",))
def parse_mlrm_spec(spec: str, cfg=None, **kwargs):
    """``mlrm:PATH[#LABEL][=weight]`` -> the multi-label reward model's weighted sum (column ``mlrm``) or one head
    (column ``mlrm_LABEL``); PATH ``builtin`` is the built-in arithmetic-reply model.

    Provenance: reconstructed from the abstract — multi-label reward regression (arXiv:2503.21819; seed 000-52): a
    shared transformer with one linear regression head per label, trained with per-label MSE, the heads'
    weighted sum as GRPO's reward; our choices: mean pooling, the mean of the per-label MSEs as the loss, the
    built-in labelled set (correctness, format, length of arithmetic replies) in place of the paper's safety
    labels; no authors' code found (the paper links only models at huggingface.co/hydroxai; searched the code
    index for the title, "multi-label reward" and hydroxai).
    Test: tests/test_multi_label_rm.py::test_heads_learn_the_labels,
    tests/test_multi_label_rm.py::test_spec_is_the_weighted_sum.
    """
    target, weight = spec_target_and_weight(spec, "mlrm:")
    path, _, label = target.partition("#")
    if not path:
        raise ValueError(f"--reward '{spec}': expected mlrm:PATH or mlrm:builtin, optionally #LABEL and =weight")
    fn = MultiLabelRewardFn(path, label or None)
    return RewardFn(fn.__name__, fn, weight)


def main(argv: list[str] | None = None) -> int:
    """``grpolab rm-train --out DIR [--data ROWS.jsonl] [--labels a,b] [--weights 1,0.5] [--backbone tiny|PATH]
    [--steps N] [--lr X] [--seed S]``: train a multi-label reward model and save it (then ``--reward mlrm:DIR``).
    Without ``--data`` it trains on the built-in labelled arithmetic replies. A data row is
    ``{"prompt": ..., "completion": ..., "<label>": number, ...}`` (``reply`` is read for ``completion`` too; the
    labels are the columns named by ``--labels``). Prints the held-out metrics per label as JSON."""
    import argparse
    from ..errors import ConfigError
    p = argparse.ArgumentParser(prog="grpolab rm-train", description=main.__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder to write model.safetensors, config.json, tokenizer")
    p.add_argument("--data", default="", help="JSONL rows with prompt, completion and one column per label "
                                              "(default: the built-in arithmetic replies)")
    p.add_argument("--labels", default=",".join(BUILTIN_LABELS), help="comma-separated label columns")
    p.add_argument("--weights", default="", help="comma-separated label weights of the summed reward "
                                                 "(default: 1 per label; built-in set: 1,0.5,-0.25)")
    p.add_argument("--backbone", default="tiny", help="'tiny' (random init) or a local Hugging Face folder")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    labels = [x for x in a.labels.split(",") if x]
    if a.data:
        rows = []
        for n, line in enumerate(Path(a.data).read_text().splitlines(), 1):
            if not line.strip():
                continue
            r = json.loads(line)
            missing = [k for k in ["prompt", *labels] if k not in r] + ([] if "completion" in r or "reply" in r
                                                                        else ["completion"])
            if missing:
                raise ConfigError(f"rm-train --data: row {n} has no column {', '.join(map(repr, missing))} "
                                  f"(columns: prompt, completion, and the labels {labels})")
            rows.append({"prompt": r["prompt"], "reply": r.get("completion", r.get("reply")),
                         "labels": {k: float(r[k]) for k in labels}})
    else:
        if labels != list(BUILTIN_LABELS):
            raise ConfigError(f"--labels: the built-in set has labels {', '.join(BUILTIN_LABELS)}; give --data "
                              f"for others")
        rows = arithmetic_label_set(1200, a.seed)
    weights = [float(w) for w in a.weights.split(",")] if a.weights else (
        list(BUILTIN_WEIGHTS) if not a.data else [1.0] * len(labels))
    if len(weights) != len(labels):
        raise ConfigError(f"--weights: {len(weights)} weights for the labels {labels}")
    model, tok, metrics = train_multi_label_rm(rows, labels=labels, backbone=a.backbone, seed=a.seed,
                                               steps=a.steps, lr=a.lr)
    save_multi_label_rm(model, tok, a.out, weights, metrics)
    print(json.dumps({"out": str(a.out), "labels": labels, "weights": weights, "held_out": metrics}, indent=1))
    return 0
