"""The built-in tiny masked diffusion LM: a character-level ``BertForMaskedLM`` pre-trained in-process by LLaDA's
SFT loss on the ``repeat`` task's prompts with answers of random length (the digit 1-4 times), cached like the tiny
image models (``model/cache.py``).

Why this task: the ``arithmetic`` task's sums are out of reach of a one-minute pre-training [measured: 300
iterations, 48 s on one loaded thread: 2.5 % held-out greedy accuracy]. On ``repeat`` the pre-trained model answers
in the right form, but its answers are as often short as long (each length 1-4 a quarter of the training answers),
so the reward (the share of the first 4 characters that are the digit) has room to rise and varies within a group:
RL has to move the model towards the long answers that the data held but did not prefer."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..base import timed_pretraining

SPECIALS = ["<pad>", "<mask>", "<eos>", "<unk>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
#: Completion length, blocks and denoising steps of the built-in model (2 blocks of 4, 2 tokens per step).
GEN_LENGTH, BLOCK_LENGTH, STEPS = 8, 4, 4
#: Pre-training iterations, tuned once for a base held-out greedy ``match`` inside 0.3-0.7 [measured, the repeat
#: task's 40 held-out rows: 0.4375 greedy; 8 s on one thread of a loaded 2-core machine; final loss about 0.27].
PRETRAIN_ITERATIONS = 200


def build_tokenizer():
    """A character-level ``PreTrainedTokenizerFast``: ``<pad>`` 0, ``<mask>`` 1, ``<eos>`` 2, ``<unk>`` 3, then
    newline and the 95 printable ASCII characters (one token each; 100 in all). Fixed, not trained on data."""
    from ...model.loading import char_tokenizer

    return char_tokenizer(SPECIALS + CHARS, pad_token="<pad>", mask_token="<mask>", eos_token="<eos>",
                          unk_token="<unk>")


def bert_config(vocab_size: int = len(SPECIALS) + len(CHARS), hidden: int = 64, layers: int = 2) -> dict:
    """The tiny ``BertConfig``: hidden 64, 2 layers, 4 heads, MLP 2x, 256 positions, no dropout (the estimators'
    forwards are deterministic given the masks)."""
    return dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                intermediate_size=2 * hidden, max_position_embeddings=256, type_vocab_size=1,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)


def prompt_text(prompt) -> str:
    """The text the model reads: a string prompt as is; a chat (list of messages) as its last user message
    [ours: the tiny model has no chat template; the arithmetic task's system line is the same on every row]."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    return users[-1] if users else str(prompt[-1]["content"])


def encode_prompts(tok, prompts: list, max_len: int | None = None):
    """Left-padded ``(ids [N, P], attention [N, P])`` of the prompts' texts."""
    enc = [tok(prompt_text(p), add_special_tokens=False)["input_ids"] for p in prompts]
    P = max_len or max(len(e) for e in enc)
    ids = torch.zeros(len(enc), P, dtype=torch.long)
    attn = torch.zeros(len(enc), P, dtype=torch.long)
    for i, e in enumerate(enc):
        e = e[-P:]
        ids[i, P - len(e):] = torch.tensor(e, dtype=torch.long)
        attn[i, P - len(e):] = 1
    return ids, attn


def encode_answers(tok, texts: list[str], L: int) -> torch.Tensor:
    """Completions of exactly L tokens: the text, then ``<eos>`` to the end (LLaDA's SFT pads answers with EOS)."""
    out = torch.full((len(texts), L), tok.eos_token_id, dtype=torch.long)
    for i, t in enumerate(texts):
        e = tok(t, add_special_tokens=False)["input_ids"][:L - 1]
        out[i, :len(e)] = torch.tensor(e, dtype=torch.long)
    return out


def pretrain_recipe() -> dict:
    """Everything that determines the pre-trained weights (hashed into the cache folder's name)."""
    return {"kind": "masked_dlm", "version": 1, "bert": bert_config(), "tokenizer": "chars-v1",
            "gen_length": GEN_LENGTH, "iterations": PRETRAIN_ITERATIONS, "batch_size": 128, "optimizer": "AdamW",
            "learning_rate": 3e-3, "weight_decay": 0.0, "lr_schedule": "cosine",
            "loss": "LLaDA SFT: t~U(0,1), completion tokens masked w.p. (1-1e-3)t+1e-3, CE/p summed, / L",
            "data": "'say D:' -> D x k + eos (the repeat task's prompt), D uniform in 0..9, k uniform in 1..4, "
                    "drawn with seed 0", "rows": 200, "seed": 0, "dtype": "float32", "threads": 1}


def position_ids(attn: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only (left padding does not shift them)."""
    return (attn.long().cumsum(-1) - 1).clamp_min(0)


def pretrain(recipe: dict | None = None, log=None):
    """``(model, tokenizer, loss_curve)``; not cached (see :func:`dlm_model_path`)."""
    from transformers import BertConfig, BertForMaskedLM

    from ...model.cache import fit, pretraining
    recipe = recipe or pretrain_recipe()
    tok = build_tokenizer()
    draw = torch.Generator().manual_seed(recipe["seed"])
    digits = [str(d) for d in torch.randint(0, 10, (recipe["rows"],), generator=draw).tolist()]
    k = torch.randint(1, 5, (len(digits),), generator=draw).tolist()
    prompt, pattn = encode_prompts(tok, [f"say {d}:" for d in digits])  # the repeat task's prompt (tasks/repeat.py)
    L = recipe["gen_length"]
    answers = encode_answers(tok, [d * n for d, n in zip(digits, k)], L)
    ids = torch.cat([prompt, answers], 1)
    attn = torch.cat([pattn, torch.ones_like(answers)], 1)
    pos = position_ids(attn)
    P = prompt.shape[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe["seed"])
        model = BertForMaskedLM(BertConfig(**recipe["bert"])).float()
    mask_id = tok.mask_token_id
    g = torch.Generator().manual_seed(recipe["seed"])

    def loss(idx):
        x = ids[idx].clone()
        t = torch.rand(len(idx), generator=g)
        p = (1 - 1e-3) * t + 1e-3
        m = torch.rand(len(idx), L, generator=g) < p[:, None]
        x[:, P:][m] = mask_id
        logits = model(input_ids=x, attention_mask=attn[idx], position_ids=pos[idx]).logits[:, P:]
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[idx, P:].reshape(-1),
                                               reduction="none").view(len(idx), L)
        return ((ce * m) / p[:, None]).sum() / (len(idx) * L)

    with pretraining(recipe):
        losses = fit(model, len(ids), recipe, loss, g, name="masked_dlm", log=log)
    return model, tok, losses


def dlm_model_path(log=print) -> Path:
    """Folder with the pre-trained tiny masked diffusion LM, built on first use (``save_pretrained`` of the
    model and the tokenizer, ``dllm.json``, ``meta.json``)."""
    from ...model.cache import cached_build, cached_path

    recipe = pretrain_recipe()

    def build(tmp: Path) -> dict:
        (model, tok, _), meta = timed_pretraining(recipe["seed"], pretrain, recipe)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / "dllm.json").write_text(json.dumps({"gen_length": GEN_LENGTH, "block_length": BLOCK_LENGTH,
                                                   "steps": STEPS}, indent=2) + "\n")
        return meta

    message = (f"[grpolab] pre-training the tiny masked diffusion LM (BertForMaskedLM, 2 layers, width 64, "
               f"characters) on the repeat task's answers ({recipe['iterations']} steps, one time, about "
               f"30-60 s) and caching it in {cached_path('repeat-dlm', recipe)}")
    return cached_build("repeat-dlm", recipe, build, log=log, message=message)
