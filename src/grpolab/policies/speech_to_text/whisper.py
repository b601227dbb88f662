"""Whisper in the speech policy: a ``WhisperForConditionalGeneration`` folder with its ``WhisperProcessor``.

What differs from the built-in Speech2Text (``tiny.py``), as ``transformers``' Whisper generation defines it
(``models/whisper/generation_whisper.py``, transformers 5.25):

* **conditions**: each row's ``audio`` (``audio.py``: files, arrays, ``datasets.Audio()`` values) as mono samples
  at the feature extractor's ``sampling_rate``, turned into log-mel ``input_features`` [mels, frames] by the
  processor's ``WhisperFeatureExtractor`` (padded with silence to its ``chunk_length`` seconds: the frames the
  encoder requires, ``2 · max_source_positions``). A clip longer than that window is refused (long-form
  transcription is not supported). Whisper's encoder takes no attention mask.
* **the decoder prompt**: the forced prefix of ``_retrieve_init_tokens`` for one language, the ``transcribe``
  task and no timestamps: ``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`` (the language is
  ``speech_language``; what ``WhisperProcessor.get_decoder_prompt_ids(language, task="transcribe")`` forces
  after ``decoder_start_token_id``); an English-only model (``generation_config.is_multilingual`` False, the
  ``.en`` checkpoints) gets ``<|startoftranscript|><|notimestamps|>``, as ``generate`` refuses a language there.
* **the completion**: the tokens after the prefix up to and including ``<|endoftext|>`` (the config's
  ``eos_token_id``), at most ``max_completion_length`` (none = truncated); its text is
  ``tokenizer.decode(ids, skip_special_tokens=True)``, what reward functions see.
* **the distribution**: the generation config's logits processors that shape Whisper's own sampling:
  ``suppress_tokens`` get probability 0 at every step and ``begin_suppress_tokens`` at the first completion token
  (``SuppressTokensLogitsProcessor`` / ``SuppressTokensAtBeginLogitsProcessor``, ``begin_index`` = the prefix's
  length); then softmax(logits / τ). Sampling and the training forward use the same masks, so their log-probs
  agree (tests/test_whisper_audio.py checks them against a plain ``model(input_features=...,
  decoder_input_ids=...)`` with the same masks).

Decoding: the encoder and the prefix run once per row; each action continues its own copy of the row's
``EncoderDecoderCache`` (``reorder_cache``) one token at a time through the shared token loop
(``generation.sampling.decode_tokens``).

Provenance: grpolab's own, written from ``transformers``' Whisper modeling, generation, tokenizer and processor
files.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ...config import ConfigError
from .audio import audio_samples, check_audio_row

CLASS = "WhisperForConditionalGeneration"


def folder_model_type(path: Path) -> tuple[str, list]:
    """``(model_type, architectures)`` of a folder's ``config.json`` (empty when it has none)."""
    import json
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return "", []
    return str(cfg.get("model_type", "")), list(cfg.get("architectures") or [])


def decoder_prefix(tokenizer, generation_config, language: str) -> list[int]:
    """The forced decoder prompt (module docstring) as token ids."""
    def tid(token: str) -> int:
        i = tokenizer.convert_tokens_to_ids(token)
        if i is None or i == tokenizer.unk_token_id and token != tokenizer.unk_token:
            raise ConfigError(f"model: the folder's WhisperTokenizer has no {token} token (Whisper's decoder "
                              f"prompt needs <|startoftranscript|>, <|{language}|>, <|transcribe|>, "
                              f"<|notimestamps|>); speech_language names the language (e.g. en, de)")
        return int(i)

    start = getattr(generation_config, "decoder_start_token_id", None)
    prefix = [int(start) if start is not None else tid("<|startoftranscript|>")]
    if getattr(generation_config, "is_multilingual", True) is not False:
        prefix += [tid(f"<|{language}|>"), tid("<|transcribe|>")]
    return prefix + [tid("<|notimestamps|>")]


def load_whisper(path: Path, dtype=torch.float32):
    """``(model, processor)`` of a Whisper folder; a missing or foreign processor is a ConfigError."""
    from transformers import WhisperForConditionalGeneration, WhisperProcessor
    try:
        processor = WhisperProcessor.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(f"model: {path} has no WhisperProcessor ({type(e).__name__}: {str(e)[:200]}); save the "
                          f"processor beside the model (WhisperProcessor.save_pretrained(folder): the tokenizer "
                          f"files and preprocessor_config.json)") from None
    return WhisperForConditionalGeneration.from_pretrained(path, dtype=dtype).eval(), processor


class WhisperLayout:
    """Whisper's conditions, prefix, masks and text for :class:`~.policy.SpeechToTextPolicy` (module
    docstring). Built from a loaded model and its processor (a folder's, or the Python API's pair)."""

    name = "whisper"

    def __init__(self, module, processor, *, language: str, max_tokens: int):
        if type(module).__name__ != CLASS or type(processor).__name__ != "WhisperProcessor":
            raise ConfigError(f"model: policy speech_to_text takes a {CLASS} with its WhisperProcessor, got "
                              f"{type(module).__name__} and {type(processor).__name__}")
        self.processor, self.tokenizer = processor, processor.tokenizer
        fe = processor.feature_extractor
        self.rate, self.seconds, self.hop = int(fe.sampling_rate), float(fe.chunk_length), int(fe.hop_length)
        gen = module.generation_config
        self.prefix = decoder_prefix(self.tokenizer, gen, language)
        self.eos = int(module.config.eos_token_id)
        self.pad = int(module.config.pad_token_id if module.config.pad_token_id is not None else self.eos)
        self.suppress = [int(t) for t in (getattr(gen, "suppress_tokens", None) or [])]
        self.begin_suppress = [int(t) for t in (getattr(gen, "begin_suppress_tokens", None) or [])]
        room = int(module.config.max_target_positions) - len(self.prefix)
        if max_tokens > room:
            raise ConfigError(f"max_completion_length: {max_tokens} tokens after Whisper's {len(self.prefix)}-token "
                              f"prefix exceed the model's max_target_positions "
                              f"{module.config.max_target_positions}; set max_completion_length <= {room}")
        self.max_tokens = int(max_tokens)
        frames = int(module.config.max_source_positions) * 2  # the encoder's two convolutions, the second stride 2
        if fe.nb_max_frames != frames or fe.feature_size != module.config.num_mel_bins:
            raise ConfigError(f"model: the processor's feature extractor gives [{fe.feature_size} mels, "
                              f"{fe.nb_max_frames} frames] and the model reads [{module.config.num_mel_bins}, "
                              f"{frames}]; save the model's own processor in the folder")

    # ------------------------------------------------------------ conditions
    def check_row(self, row: dict, where: str) -> None:
        """The row's audio is there, readable and within the window (files: their header only)."""
        check_audio_row(row, where, self.rate, self.seconds, "a Whisper model")

    def conditions(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        """``input_features`` [N, mels, frames] (the feature extractor's) and ``feature_frames`` [N] (frames
        that hold the clip, for the spectrogram picture)."""
        clips = [audio_samples(r.get("audio"), self.rate, f"row {i}", self.seconds) for i, r in enumerate(rows)]
        feats = self.processor.feature_extractor(clips, sampling_rate=self.rate, return_tensors="pt")
        x = feats["input_features"].float()
        n = torch.tensor([min(x.shape[-1], -(-len(c) // self.hop)) for c in clips], dtype=torch.long)
        return {"input_features": x, "feature_frames": n}

    # ------------------------------------------------------------ the distribution
    def masked(self, logits: torch.Tensor, first: bool | torch.Tensor) -> torch.Tensor:
        """float32 logits with ``suppress_tokens`` at -inf, and ``begin_suppress_tokens`` where ``first`` (a
        bool, or a bool tensor broadcast over the positions: [T, 1])."""
        logits = logits.float().clone()
        if self.suppress:
            logits[..., self.suppress] = float("-inf")
        if self.begin_suppress:
            part = logits[..., self.begin_suppress]
            if isinstance(first, torch.Tensor):
                logits[..., self.begin_suppress] = torch.where(first.to(logits.device), float("-inf"), part)
            elif first:
                logits[..., self.begin_suppress] = float("-inf")
        return logits

    def decoder_inputs(self, ids: torch.Tensor) -> torch.Tensor:
        """``prefix + ids[:, :-1]``: the teacher-forced decoder input of completions ``ids`` [R, T]."""
        prefix = torch.tensor(self.prefix, dtype=torch.long, device=ids.device).expand(len(ids), -1)
        return torch.cat([prefix, ids[:, :-1]], dim=1)

    def logits(self, module, feats: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Masked logits [R, T, V] of completions ``ids`` [R, T] teacher-forced after the prefix."""
        dtype = next(module.parameters()).dtype
        out = module(input_features=feats.to(ids.device, dtype), decoder_input_ids=self.decoder_inputs(ids),
                     use_cache=False).logits[:, len(self.prefix) - 1:]
        first = torch.arange(out.shape[1], device=out.device)[:, None] == 0
        return self.masked(out, first)

    def stepper(self, module, feats: torch.Tensor, index: torch.Tensor):
        """``next_logits(fed)`` for ``decode_tokens``: the encoder and the prefix once per row, each action
        (row ``index[i]``) continuing its copy of the row's cache."""
        from transformers.modeling_outputs import BaseModelOutput

        device, dtype = next(module.parameters()).device, next(module.parameters()).dtype
        enc = module.get_encoder()(input_features=feats.to(device, dtype)).last_hidden_state
        prefix = torch.tensor([self.prefix] * len(feats), dtype=torch.long, device=device)
        o = module(encoder_outputs=BaseModelOutput(last_hidden_state=enc), decoder_input_ids=prefix, use_cache=True)
        past, idx = o.past_key_values, index.to(device)
        past.reorder_cache(idx)
        enc_r = BaseModelOutput(last_hidden_state=enc[idx])
        first = self.masked(o.logits[:, -1], True).cpu()[index]
        import inspect  # transformers 5.25 names the cache argument ``cache`` (``past_key_values`` deprecated)
        ckw = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"

        def next_logits(fed):
            nonlocal past
            if fed is None:
                return first
            o = module(encoder_outputs=enc_r, decoder_input_ids=fed[:, None].to(device), use_cache=True,
                       **{ckw: past})
            past = o.past_key_values
            return self.masked(o.logits[:, -1], False).cpu()
        return next_logits

    def text(self, ids: list[int]) -> str:
        """The transcript of completion ids: the tokens before the first ``<|endoftext|>``, special tokens
        dropped (``tokenizer.decode(..., skip_special_tokens=True)``)."""
        if self.eos in ids:
            ids = ids[:ids.index(self.eos)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)
