"""The built-in tiny speech recogniser on audio (``--model spoken_words``, alias ``tiny_audio``): the tiny
``Speech2TextForConditionalGeneration`` of ``tiny.py`` (d_model 64, 2 + 2 layers, the same word vocabulary) reading
log-mel filterbank features computed from the waveform, pre-trained in-process on the espeak-ng clips
(``spoken_words.py``) and cached like the other built-ins (shipped in ``grpolab/model/builtin/speech-s2t-audio-*``).

**Features.** ``transformers``' ``Speech2TextFeatureExtractor`` built from a config (no download, no
``torchaudio``: its NumPy path, ``audio_utils.spectrogram`` with a Povey window and a Kaldi mel filter bank):
:data:`MEL_BINS` log-mel filterbank energies per 25 ms frame, 10 ms hop, at 16 kHz; then utterance-level
cepstral mean and variance normalisation over the clip's frames (``do_ceptral_normalize``). A clip is read by the
speech policy's audio reader (``audio.py``: WAV / FLAC paths, ``data:audio`` URIs, ``{"array", "sampling_rate"}``,
``datasets.Audio()`` values), resampled to 16 kHz, and must last at most :data:`WINDOW_SECONDS` (the frames are
zero-padded to :data:`MAX_FRAMES` with an attention mask, so a clip's features do not depend on the batch around
it). The folder saves the extractor's ``preprocessor_config.json`` beside ``config.json`` and ``vocab.json``: a
folder saved by the policy reloads with the same features.

**Pre-training.** Teacher-forced cross-entropy (as ``tiny.py``) on :data:`PRETRAIN_UTTERANCES` utterances of the
``spoken_words_audio`` corpus with seeds 0 … (disjoint from the task's train rows ``1,000,000 + i`` and held-out
rows ``2,000,000 + i``; every utterance is made of the same 64 clips, so held-out utterances differ from the
pre-training ones in their word sequences, clip choices, gains, silences and noise, not in their voices).

Provenance: grpolab's own — a toy recogniser for the speech policy's tests and demos; implements no published
method.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .tiny import cached_recogniser, speech2text_config, teacher_forced_fit, vocabulary

RATE = 16000
MEL_BINS = 40
WINDOW_SECONDS = 3.0
#: frames of a WINDOW_SECONDS clip (1 + (48000 − 400) // 160 = 298), rounded up
MAX_FRAMES = 300
#: Teacher-forcing iterations, chosen so that the held-out greedy word accuracy leaves RL room (measured in
#: docs/speech.md, "The built-in model on audio").
PRETRAIN_ITERATIONS = 500
PRETRAIN_UTTERANCES = 2000


def feature_extractor_config() -> dict:
    """The ``Speech2TextFeatureExtractor`` of the model (module docstring)."""
    return dict(feature_size=MEL_BINS, num_mel_bins=MEL_BINS, sampling_rate=RATE, padding_value=0.0,
                do_ceptral_normalize=True, normalize_means=True, normalize_vars=True, return_attention_mask=True)


def feature_extractor():
    from transformers import Speech2TextFeatureExtractor
    return Speech2TextFeatureExtractor(**feature_extractor_config())


def audio_features(extractor, clips: list[np.ndarray], frames: int = MAX_FRAMES) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features [N, frames, mels] float32, mask [N, frames] int64)`` of mono clips at the extractor's rate,
    zero-padded on the right (a clip longer than ``frames`` frames is the caller's error, checked before)."""
    out = extractor(clips, sampling_rate=extractor.sampling_rate, padding="max_length", max_length=frames,
                    truncation=True, return_attention_mask=True, return_tensors="pt")
    return out["input_features"].float(), out["attention_mask"].long()


def pretrain_recipe() -> dict:
    """Everything that determines the pre-trained weights (hashed into the cache folder's name)."""
    from .spoken_words import corpus_recipe

    vocab = vocabulary()
    s2t = {**speech2text_config(vocab), "input_feat_per_channel": MEL_BINS, "max_source_positions": MAX_FRAMES,
           "num_conv_layers": 3, "conv_kernel_sizes": [5, 5, 5]}
    return {"kind": "speech2text_audio", "version": 1, "corpus": corpus_recipe(), "vocab": vocab,
            "features": {"class": "Speech2TextFeatureExtractor", **feature_extractor_config(),
                         "max_frames": MAX_FRAMES, "window_seconds": WINDOW_SECONDS},
            "speech2text": s2t, "iterations": PRETRAIN_ITERATIONS, "batch_size": 64,
            "utterances": PRETRAIN_UTTERANCES, "optimizer": "AdamW", "learning_rate": 3e-3, "weight_decay": 0.0,
            "lr_schedule": "cosine", "loss": "teacher-forced cross-entropy on the word tokens and </s>",
            "data": f"spoken_words utterances, seeds 0..{PRETRAIN_UTTERANCES - 1}", "seed": 0, "dtype": "float32",
            "threads": 1}


def pretraining_data(recipe: dict) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``(features, mask, transcripts)`` of the pre-training utterances."""
    from .spoken_words import utterance

    texts, clips = zip(*(utterance(s) for s in range(recipe["utterances"])))
    feats, mask = audio_features(feature_extractor(), list(clips), recipe["features"]["max_frames"])
    return feats, mask, list(texts)


def pretrain(recipe: dict | None = None, log=None):
    """``(model, loss_curve)``: the tiny Speech2Text trained by teacher-forced cross-entropy on the clips' features
    (not cached). Each batch is cut to its longest clip's frames (the encoder's outputs at a clip's frames do not
    depend on the zero padding after them)."""
    recipe = recipe or pretrain_recipe()
    feats, mask, texts = pretraining_data(recipe)
    return teacher_forced_fit(recipe, feats, mask, texts, "speech-audio", log=log, cut_frames=True)


def speech_audio_model_path(log=print) -> Path:
    """Folder with the pre-trained tiny audio recogniser, built on first use: ``config.json`` +
    ``model.safetensors`` (``save_pretrained``), ``preprocessor_config.json`` (the feature extractor),
    ``vocab.json``, ``meta.json``."""
    recipe = pretrain_recipe()
    return cached_recogniser("speech-s2t-audio", recipe, pretrain,
                             f"the tiny audio speech recogniser (Speech2Text, 2+2 layers, width 64, {MEL_BINS} "
                             f"log-mel bins from the waveform; teacher forcing on {recipe['utterances']} utterances "
                             f"of the shipped espeak-ng clips, {recipe['iterations']} steps, one time, about 30-60 s)",
                             log=log, save_more=lambda tmp: feature_extractor().save_pretrained(tmp))
