"""The built-in tiny speech recogniser: a ``transformers`` ``Speech2TextForConditionalGeneration`` (encoder-decoder,
d_model 64, 2 + 2 layers) over a word vocabulary, pre-trained in-process on the synthetic corpus and cached.

Vocabulary (``vocab.json``): ``<pad>`` 0, ``<s>`` 1 (the decoder's start token), ``</s>`` 2 (end of transcript),
then the words of :data:`~grpolab.policies.speech_to_text.corpus.WORDS` (3 … 18). A transcript of n words is n tokens + ``</s>``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..base import timed_pretraining
from .corpus import FEATURE_DIM, MAX_FRAMES, MAX_WORDS, WORDS, batch_features, corpus_recipe

PAD, BOS, EOS = 0, 1, 2
#: Teacher-forcing iterations, tuned once so that the held-out greedy word accuracy (mean per-utterance 1 − WER)
#: leaves RL room [measured, 200 held-out utterances, greedy, one thread: the spoken_digits held-out
#: evaluation with speech_eval_sampling greedy, PRETRAIN_ITERATIONS edited]: 100 → 0.458, 120 → 0.525,
#: 150 → 0.626, 200 → 0.738 (each about 7-12 s on one thread of the loaded 2-core machine).
PRETRAIN_ITERATIONS = 120
PRETRAIN_UTTERANCES = 3000
MAX_TOKENS = MAX_WORDS + 2  # up to one word more than the corpus ever says, then </s> (else: truncated)


def vocabulary() -> dict:
    """``{"tokens": [...], "pad": 0, "bos": 1, "eos": 2}``: token id i is ``tokens[i]``."""
    return {"tokens": ["<pad>", "<s>", "</s>", *WORDS], "pad": PAD, "bos": BOS, "eos": EOS}


def speech2text_config(vocab: dict, d_model: int = 64, layers: int = 2) -> dict:
    """The ``Speech2TextConfig`` of the tiny model: d_model 64, 2 encoder + 2 decoder layers, 4 heads, FFN 128,
    no dropout, two stride-2 convolutions over the :data:`FEATURE_DIM`-dim frames (56 frames → 14 positions)."""
    return dict(vocab_size=len(vocab["tokens"]), d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model,
                decoder_ffn_dim=2 * d_model, input_feat_per_channel=FEATURE_DIM, input_channels=1,
                num_conv_layers=2, conv_kernel_sizes=[5, 5], conv_channels=d_model,
                max_source_positions=MAX_FRAMES, max_target_positions=16, dropout=0.0, attention_dropout=0.0,
                activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0, scale_embedding=True,
                pad_token_id=vocab["pad"], bos_token_id=vocab["bos"], eos_token_id=vocab["eos"],
                decoder_start_token_id=vocab["bos"], tie_word_embeddings=True, use_cache=False)


def pretrain_recipe() -> dict:
    """Everything that determines the pre-trained weights (hashed into the cache folder's name)."""
    vocab = vocabulary()
    return {"kind": "speech2text", "version": 1, "corpus": corpus_recipe(), "vocab": vocab,
            "speech2text": speech2text_config(vocab), "iterations": PRETRAIN_ITERATIONS, "batch_size": 64,
            "utterances": PRETRAIN_UTTERANCES, "optimizer": "AdamW", "learning_rate": 3e-3, "weight_decay": 0.0,
            "lr_schedule": "cosine", "loss": "teacher-forced cross-entropy on the word tokens and </s>",
            "data": f"synthetic corpus, audio seeds 0..{PRETRAIN_UTTERANCES - 1}", "seed": 0, "dtype": "float32",
            "threads": 1}


def build_model(recipe: dict, seed: int = 0):
    """A freshly initialised ``Speech2TextForConditionalGeneration`` of the recipe (init drawn under ``seed``)."""
    from transformers import Speech2TextConfig, Speech2TextForConditionalGeneration
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Speech2TextForConditionalGeneration(Speech2TextConfig(**recipe["speech2text"])).float()


def encode_transcripts(texts: list[str], vocab: dict, width: int = MAX_TOKENS) -> torch.Tensor:
    """Word ids + ``</s>``, right-padded with ``<pad>`` to ``width``: ``[N, width]``."""
    index = {w: i for i, w in enumerate(vocab["tokens"])}
    out = torch.full((len(texts), width), vocab["pad"], dtype=torch.long)
    for i, t in enumerate(texts):
        ids = [index[w] for w in t.split()][:width - 1] + [vocab["eos"]]
        out[i, :len(ids)] = torch.tensor(ids)
    return out


def decoder_inputs(targets: torch.Tensor, bos: int) -> torch.Tensor:
    """``[bos, y_1, …, y_{T−1}]``: the teacher-forced decoder input of targets ``[N, T]``."""
    return torch.cat([torch.full_like(targets[:, :1], bos), targets[:, :-1]], dim=1)


def teacher_forced_fit(recipe: dict, feats: torch.Tensor, mask: torch.Tensor, texts: list[str], name: str,
                       log=None, cut_frames: bool = False):
    """``(model, loss_curve)``: a fresh model of ``recipe`` (:func:`build_model`) trained by teacher-forced
    cross-entropy on the features ``feats`` / ``mask`` of the transcripts ``texts`` (``fit``, named ``name``);
    with ``cut_frames`` each batch is cut to its longest clip's frames (the encoder's outputs at a clip's frames
    do not depend on the zero padding after them)."""
    from ...model.cache import fit, pretraining

    vocab = recipe["vocab"]
    targets = encode_transcripts(texts, vocab)
    dec_in = decoder_inputs(targets, vocab["bos"])
    labels = targets.masked_fill(targets == vocab["pad"], -100)
    model = build_model(recipe, seed=recipe["seed"])
    g = torch.Generator().manual_seed(recipe["seed"])

    def batch_loss(idx):
        width = int(mask[idx].sum(1).max()) if cut_frames else None
        return model(input_features=feats[idx, :width], attention_mask=mask[idx, :width],
                     decoder_input_ids=dec_in[idx], labels=labels[idx]).loss

    with pretraining(recipe):
        losses = fit(model, len(texts), recipe, batch_loss, g, name=name, log=log)
    return model, losses


def pretrain(recipe: dict | None = None, log=None):
    """``(model, loss_curve)``: the tiny Speech2Text trained by teacher-forced cross-entropy (not cached)."""
    recipe = recipe or pretrain_recipe()
    feats, mask, texts = batch_features(range(recipe["utterances"]))
    return teacher_forced_fit(recipe, torch.from_numpy(feats), torch.from_numpy(mask), texts, "speech", log=log)


def cached_recogniser(name: str, recipe: dict, pretrain, what: str, log=print, save_more=None) -> Path:
    """The cache folder ``name`` of a built-in recogniser pre-trained by ``pretrain(recipe)`` on first use:
    ``config.json`` + ``model.safetensors`` (``save_pretrained``), what ``save_more(folder)`` writes, ``vocab.json``,
    ``meta.json``; the log says "pre-training ``what`` and caching it in" the folder."""
    from ...model.cache import cached_build, cached_path

    def build(tmp: Path) -> dict:
        (model, _), meta = timed_pretraining(recipe["seed"], pretrain, recipe)
        model.save_pretrained(tmp, safe_serialization=True)
        if save_more is not None:
            save_more(tmp)
        (tmp / "vocab.json").write_text(json.dumps(recipe["vocab"], indent=2) + "\n")
        return meta

    message = f"[grpolab] pre-training {what} and caching it in {cached_path(name, recipe)}"
    return cached_build(name, recipe, build, log=log, message=message)


def speech_model_path(log=print) -> Path:
    """Folder with the pre-trained tiny speech recogniser, built on first use: ``config.json`` +
    ``model.safetensors`` (``save_pretrained``), ``vocab.json``, ``meta.json``."""
    recipe = pretrain_recipe()
    return cached_recogniser("speech-s2t", recipe, pretrain,
                             f"the tiny speech recogniser (Speech2Text, 2+2 layers, width 64, word vocabulary of "
                             f"{len(WORDS)}; teacher forcing on {recipe['utterances']} synthetic utterances, "
                             f"{recipe['iterations']} steps, one time, about 10-40 s)", log=log)


@torch.no_grad()
def greedy_decode(model, feats, mask, vocab: dict, steps: int = MAX_TOKENS) -> torch.Tensor:
    enc = model.get_encoder()(input_features=feats, attention_mask=mask)
    ids = torch.full((len(feats), 1), vocab["bos"], dtype=torch.long)
    for _ in range(steps):
        logits = model(encoder_outputs=enc, attention_mask=mask,
                       decoder_input_ids=ids).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[:, 1:]


def decode_tokens(ids: list[int], vocab: dict) -> str:
    """The transcript of token ids: the words before the first ``</s>`` (special tokens dropped)."""
    words = []
    for t in ids:
        if t == vocab["eos"]:
            break
        if t > vocab["eos"]:
            words.append(vocab["tokens"][t])
    return " ".join(words)

