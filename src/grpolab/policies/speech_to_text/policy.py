"""A speech recogniser: an audio-conditioned encoder-decoder (``transformers`` ``Speech2TextForConditionalGeneration``)
that writes a transcript; one step of the ``[rows, steps]`` layout is one transcript token (a word)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ...config import ConfigError
from ...generation.sampling import completion_counts, decode_tokens, per_row, row_temperatures, seeded_draws
from ...registry import POLICIES, param
from .audio import check_audio_row
from ..base import (PolicyBase, check_own_sampler, fanned_columns, group_identity, held_out_seed, repeat_rows,
                    save_pretrained_folder, saved_folder)

BUILT_IN = ("spoken_digits", "tiny")
AUDIO_BUILT_IN = ("spoken_words", "tiny_audio")  #: the built-in tiny model on audio (tiny_audio.py)
WHISPER = "WhisperForConditionalGeneration"


def check_speech(cfg) -> None:
    """The text machinery that continues a causal LM's prompt cannot drive an encoder-decoder over audio: a text
    generation engine, rollout strategies other than ``plain``, and ``top_k`` / ``top_p`` (the speech sampler
    draws from the full softmax at the run's temperature)."""
    check_own_sampler(cfg, "transcribes audio")


@POLICIES.register("speech_to_text", check=check_speech)
class SpeechToTextPolicy(PolicyBase):
    """A speech-to-text encoder-decoder: the encoder reads an utterance's feature frames, the decoder writes its
    transcript word by word (``transformers`` ``Speech2TextForConditionalGeneration``).

    Conditions: a row names an utterance of the synthetic corpus by ``audio_seed`` (``policies/speech_to_text/corpus.py``:
    log-mel-like feature frames, **not audio**; the ``spoken_digits`` task), or carries its own ``features``
    ([frames ≤ 56, 24] floats). The frames, zero-padded to 56, travel in ``row_data["features"]`` [R, 56, 24]
    with ``row_data["feature_mask"]`` [R, 56]. The prompt is the decoder's start token ``<s>``.

    Acting: decoding one token at a time from ``<s>`` (the full decoder re-run per step: at most 5 steps), each
    token drawn from softmax(logits / τ) at the run's ``temperature`` (no top-k / top-p: :func:`check_speech`)
    from the run's generator; behaviour log-prob log softmax(logits / τ)[o_t]. The completion is the tokens up to
    and including the first ``</s>`` (``completion_mask`` 1 there, 0 after); no ``</s>`` within 5 tokens =
    ``truncated``. ``columns["completion"]`` is the transcript: the words before ``</s>`` (special tokens other
    than ``</s>`` are dropped from the text but keep their log-probs). Held-out evaluation (``evaluation``;
    ``speech_eval_sampling``): ``greedy`` (default, argmax, as for text) or ``seeded`` (draws at the run's
    temperature by inverse CDF from uniforms of a generator seeded with the row's ``audio_seed``, else
    ``base.held_out_seed``'s: the same draws
    before and after training, whatever the batch; it measures the sampling distribution RL trains).

    ``forward``: the encoder on the row's frames, the decoder teacher-forced on ``<s>`` + the completion, log
    softmax(logits / τ) at each completion token: equal to the behaviour log-probs (the test:
    tests/test_speech.py::test_recomputed_logprobs_equal_behaviour); ``entropy`` of that softmax per token.

    Model ``spoken_words`` / ``tiny_audio``: the same architecture (three stride-2 convolutions) over 40 log-mel
    filterbank features computed from each row's ``audio`` (``audio.py``'s reader, resampled to 16 kHz; a clip of
    at most 3 s) by ``transformers``' ``Speech2TextFeatureExtractor`` built from a config (utterance mean and
    variance normalisation), zero-padded to 300 frames with a mask; pre-trained in-process on the shipped espeak-ng
    clips (``tiny_audio.py``; task ``spoken_words_audio``, recipe ``asr_grpo_audio``). Its folder keeps the
    extractor's ``preprocessor_config.json``; a folder saved with one reads audio.

    Model ``spoken_digits`` / ``tiny`` (the default): d_model 64, 2 encoder + 2 decoder layers, a word
    vocabulary (``<pad>``, ``<s>``, ``</s>`` and the corpus's 16 words), pre-trained in-process on first use by
    teacher forcing on 3,000 synthetic utterances (``policies/speech_to_text/tiny.py``: 120 AdamW steps, about 10 s on one thread,
    cached in ``$GRPOLAB_CACHE/speech-s2t-<hash>``). Base held-out greedy word accuracy (mean 1 − WER) 0.525 on
    200 held-out utterances [measured]: RL has room. A folder saved by :meth:`save` (``save_pretrained`` +
    ``vocab.json``) loads as well.

    Model: a ``WhisperForConditionalGeneration`` folder with its ``WhisperProcessor`` (or the Python API's loaded
    pair, :meth:`use_loaded`): rows carry ``audio`` (WAV / FLAC paths, ``{"array", "sampling_rate"}``,
    ``datasets.Audio()`` values; ``audio.py``), resampled to the processor's rate and turned into log-mel features;
    the decoder starts from Whisper's forced prefix ``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>``
    (``speech_language``), a completion runs to ``<|endoftext|>`` or ``max_completion_length`` tokens, the
    generation config's suppress masks shape the softmax in sampling and ``forward`` alike (``whisper.py``,
    tests/test_whisper_audio.py, docs/speech.md).

    Capabilities: ``tokens`` (token entropies, lengths in tokens, every token-level loss, KL and aggregation
    component) and ``audio`` (the speech tasks); not ``text``: no chat template to continue (a Whisper model's
    tokenizer only decodes its transcripts), so text tasks, hints, tools and agent episodes are refused at
    start-up.

    Provenance: grpolab's own — a tiny stand-in for the LLM-based recogniser of GRPO for ASR (Shivakumar et al.,
    arXiv:2509.01939, seed 000-38; no public code found): an attention encoder-decoder instead of a speech
    encoder feeding a decoder-only LLM.
    """

    step = "transcript token (a word)"
    capabilities = frozenset({"tokens", "audio"})
    description = ("a speech recogniser (Speech2Text encoder-decoder over feature frames or audio, or Whisper); one "
                   "step = a transcript token")
    default_model = "spoken_digits"
    default_task = "spoken_digits"
    float32_only = True  # a tiny model: float32 costs nothing and gives the same numbers on every CPU kind

    def __init__(self, *, model: str, temperature: float, max_completion_length: int = 20,
                 speech_language: str = param("en", "speech_to_text: the language token of a Whisper model's decoder "
                                              "prompt (<|startoftranscript|><|en|><|transcribe|><|notimestamps|>); "
                                              "English-only (.en) models take none"),
                 speech_eval_sampling: str = param("seeded", "speech_to_text: held-out evaluation decoding: 'greedy' "
                                                   "= argmax; 'seeded' = draws at the run's temperature from "
                                                   "each row's own seed (audio_seed), the same draws before and "
                                                   "after training", ["greedy", "seeded"]),
                 speech_freeze_encoder: bool = param(False, "speech_to_text: train the decoder only (the encoder's "
                                                     "weights frozen: requires_grad False, left out of the "
                                                     "optimiser); docs/speech.md, why greedy falls on audio")):
        if speech_eval_sampling not in ("greedy", "seeded"):
            raise ConfigError(f"speech_eval_sampling: 'greedy' or 'seeded', got {speech_eval_sampling!r}")
        self.model_name, self.temperature, self.eval_sampling = model, float(temperature), speech_eval_sampling
        self.freeze_encoder = bool(speech_freeze_encoder)
        self.vocab: dict = {}
        self.max_completion_length, self.language = int(max_completion_length), str(speech_language)
        self.whisper = None  # a WhisperLayout (whisper.py) once a Whisper model is loaded
        self.audio = None  # the tiny model on audio: its Speech2TextFeatureExtractor (tiny_audio.py)
        from .whisper import folder_model_type  # a Whisper folder runs in the run's dtype (bf16 on a GPU); the
        self.float32_only = folder_model_type(Path(model))[0] != "whisper"  # tiny model in float32 on every CPU

    @property
    def pad_id(self) -> int:
        return self.vocab.get("pad", 0)

    # ---------------------------------------------------------------- loading
    def load(self, cfg, rows, eval_rows, *, extra_texts=(), log=print):
        """``model``: ``spoken_digits`` / ``tiny`` (the built-in model, pre-trained on first use and cached), a
        folder written by :meth:`save`, or a ``WhisperForConditionalGeneration`` folder with its processor."""
        from transformers import Speech2TextForConditionalGeneration

        from .tiny import speech_model_path
        from .tiny_audio import speech_audio_model_path
        from .whisper import folder_model_type, load_whisper

        if self.model_name not in BUILT_IN + AUDIO_BUILT_IN:
            kind, arch = folder_model_type(Path(self.model_name))
            if kind == "whisper" and arch in ([], [WHISPER]):
                module, processor = load_whisper(Path(self.model_name))
                self.use_loaded(module, processor)
                self.check_rows(rows, eval_rows)
                return self._frozen(module)
            if kind and kind != "speech_to_text" or arch and arch != ["Speech2TextForConditionalGeneration"]:
                raise ConfigError(f"model: {self.model_name} holds a {', '.join(arch) or kind}; policy "
                                  f"speech_to_text loads {WHISPER} folders (with their WhisperProcessor), the "
                                  f"built-ins 'spoken_digits' / 'spoken_words', or a Speech2Text folder it saved itself "
                                  f"(config.json + vocab.json). Save a Whisper model with model.save_pretrained(folder) and "
                                  f"processor.save_pretrained(folder)")
        if self.model_name in BUILT_IN:
            path = speech_model_path(log=log)
        elif self.model_name in AUDIO_BUILT_IN:
            path = speech_audio_model_path(log=log)
        else:
            path = saved_folder(self.model_name, "speech_to_text", ("config.json", "vocab.json"),
                                "'spoken_digits' / 'spoken_words' (the built-in tiny models) or a folder it saved "
                                "(config.json + safetensors, vocab.json)")
        self.vocab = json.loads((Path(path) / "vocab.json").read_text())
        if (Path(path) / "preprocessor_config.json").exists():  # the tiny model on audio: its feature extractor
            from transformers import Speech2TextFeatureExtractor
            self.audio = Speech2TextFeatureExtractor.from_pretrained(path)
        self.check_rows(rows, eval_rows)
        return self._frozen(Speech2TextForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval())

    def _frozen(self, module):
        """``module`` with its encoder's parameters frozen when ``speech_freeze_encoder`` (the trainer's optimiser
        takes only parameters that require grad)."""
        if self.freeze_encoder:
            module.get_encoder().requires_grad_(False)
        return module

    def use_loaded(self, module, processor) -> None:
        """Act with a loaded ``WhisperForConditionalGeneration`` and its ``WhisperProcessor`` (a folder's, or the
        Python API's pair): its decoder prefix, masks and feature extractor (``whisper.py``)."""
        from .whisper import WhisperLayout
        self.whisper = WhisperLayout(module, processor, language=self.language, max_tokens=self.max_completion_length)
        module.config.use_cache = True

    def check_rows(self, rows, eval_rows) -> None:
        """Each of the first 1,000 train and held-out rows has a condition the loaded model reads."""
        for where, part in (("train", rows), ("held-out", eval_rows)):
            for i, row in enumerate(part[:1000]):
                if self.whisper is not None:
                    self.whisper.check_row(row, f"{where} row {i}")
                elif self.audio is not None:
                    from .tiny_audio import WINDOW_SECONDS
                    check_audio_row(row, f"{where} row {i}", int(self.audio.sampling_rate), WINDOW_SECONDS,
                                    "the tiny model on audio (spoken_words)")
                else:
                    self.features(row, f"{where} row {i}")

    def save(self, module, path) -> None:
        """``save_pretrained`` (config.json + model.safetensors) and the vocabulary (Whisper: its processor):
        ``--model PATH`` loads it."""
        if self.whisper is not None:
            save_pretrained_folder(module, path, self.whisper.processor)
            return
        path = save_pretrained_folder(module, path)
        (path / "vocab.json").write_text(json.dumps(self.vocab, indent=2) + "\n")
        if self.audio is not None:
            self.audio.save_pretrained(path)

    # ---------------------------------------------------------------- conditions
    @staticmethod
    def features(row: dict, where: str = "row") -> torch.Tensor:
        """The utterance's frames ``[n, 24]``: the row's ``features``, else the corpus's ``audio_seed``."""
        from .corpus import FEATURE_DIM, MAX_FRAMES, utterance

        if row.get("features") is not None:
            x = torch.as_tensor(row["features"], dtype=torch.float32)
            if x.dim() != 2 or x.shape[1] != FEATURE_DIM or not 1 <= x.shape[0] <= MAX_FRAMES:
                raise ConfigError(f"{where}: 'features' must be [frames <= {MAX_FRAMES}, {FEATURE_DIM}] floats, got "
                                  f"shape {tuple(x.shape)}")
            return x
        if row.get("audio") is not None:
            raise ConfigError(f"{where}: the row has 'audio'; the built-in model spoken_digits reads the synthetic "
                              f"corpus's feature frames, not audio: use --model spoken_words (the built-in tiny "
                              f"model on audio) or a Whisper folder (WhisperForConditionalGeneration + "
                              f"WhisperProcessor, docs/speech.md)")
        if row.get("audio_seed") is None:
            raise ConfigError(f"{where}: policy speech_to_text transcribes an utterance: the column 'audio_seed' "
                              f"(an utterance of the synthetic corpus, task spoken_digits) or the column 'features' "
                              f"([frames, {FEATURE_DIM}] floats) is missing; the row has {sorted(row)}")
        return torch.from_numpy(utterance(int(row["audio_seed"]))[1])

    def conditions(self, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(features [N, 56, 24], mask [N, 56])`` of the rows, zero-padded; with the tiny model on audio
        ``(log-mel features [N, 300, 40], mask [N, 300])`` of the rows' ``audio`` (``tiny_audio.py``)."""
        if self.audio is not None:
            from .audio import audio_samples
            from .tiny_audio import MAX_FRAMES, WINDOW_SECONDS, audio_features
            rate = int(self.audio.sampling_rate)
            clips = [audio_samples(r.get("audio"), rate, f"row {i}", WINDOW_SECONDS) for i, r in enumerate(rows)]
            return audio_features(self.audio, clips, MAX_FRAMES)
        from .corpus import FEATURE_DIM, MAX_FRAMES
        feats = torch.zeros(len(rows), MAX_FRAMES, FEATURE_DIM)
        mask = torch.zeros(len(rows), MAX_FRAMES, dtype=torch.long)
        for i, r in enumerate(rows):
            x = self.features(r)
            feats[i, :len(x)], mask[i, :len(x)] = x, 1
        return feats, mask

    def text(self, ids: list[int]) -> str:
        if self.whisper is not None:
            return self.whisper.text(ids)
        from .tiny import decode_tokens
        return decode_tokens(ids, self.vocab)

    # ---------------------------------------------------------------- acting
    @torch.no_grad()
    def sample(self, module, rows, uids, *, group_offset=0, num_generations, temperature=None, generator=None,
               evaluation=False):
        """Up to 5 tokens per action, drawn at the run's temperature from ``generator`` (greedy when
        ``evaluation``)."""
        from transformers.modeling_outputs import BaseModelOutput

        from ...batch import RolloutBatch
        from .tiny import MAX_TOKENS

        if self.whisper is not None:
            return self._sample_whisper(module, rows, uids, group_offset=group_offset, counts=num_generations,
                                        temperature=temperature, generator=generator, evaluation=evaluation)
        if not self.vocab:
            raise RuntimeError("policy speech_to_text: load() the model before sampling (it reads the vocabulary)")
        counts = completion_counts(num_generations, len(rows))
        R = sum(counts)
        device = next(module.parameters()).device
        feats, mask = self.conditions(rows)
        enc = module.get_encoder()(input_features=feats.to(device), attention_mask=mask.to(device)).last_hidden_state
        enc = BaseModelOutput(last_hidden_state=repeat_rows(enc, counts))
        mask_r = repeat_rows(mask, counts).to(device)
        temps = row_temperatures(temperature if temperature is not None else self.temperature, counts)
        greedy, uniforms = torch.full((R,), True) if evaluation else temps <= 0, None
        if evaluation and self.eval_sampling == "seeded":  # each row's uniforms from its own seed: its draws do not
            seeds = [held_out_seed(r, u, "utterance_seed" if "utterance_seed" in r else "audio_seed")  # depend on
                     for r, u in zip(rows, uids)]  # the batch around it
            temps, greedy, uniforms = seeded_draws(seeds, counts, MAX_TOKENS, self.temperature)
        ids = torch.full((R, 1), self.vocab["bos"], dtype=torch.long, device=device)

        def next_logits(fed):
            nonlocal ids
            if fed is not None:
                ids = torch.cat([ids, fed[:, None].to(device)], dim=1)
            return module(encoder_outputs=enc, attention_mask=mask_r, decoder_input_ids=ids).logits[:, -1].float().cpu()

        out, lps, cmask, done = decode_tokens(next_logits, R, MAX_TOKENS, eos=self.vocab["eos"], pad=self.vocab["pad"],
                                              temps=temps, greedy=greedy, temperature=self.temperature,
                                              generator=generator, uniforms=uniforms)
        columns = fanned_columns(rows, counts)
        columns.pop("features", None)
        if not all(isinstance(a, str) for a in columns.get("audio", [])):
            columns.pop("audio", None)  # arrays stay out of the reward columns (files and URIs are small)
        columns["prompt"] = per_row([str(r.get("prompt", "")) for r in rows], counts)
        columns["completion"] = [self.text(o) for o in out.tolist()]
        return RolloutBatch(
            prompt_ids=torch.full((R, 1), self.vocab["bos"], dtype=torch.long),
            prompt_mask=torch.ones(R, 1, dtype=torch.long), completion_ids=out, completion_mask=cmask,
            behavior_logprobs=lps * cmask, completion_attention_mask=cmask.long(), truncated=~done,
            columns=columns, **group_identity(counts, uids, group_offset),
            row_data={"features": repeat_rows(feats, counts), "feature_mask": repeat_rows(mask, counts)})

    @torch.no_grad()
    def _sample_whisper(self, module, rows, uids, *, group_offset, counts, temperature, generator, evaluation):
        """:meth:`sample` with a Whisper model: up to ``max_completion_length`` tokens after the forced prefix,
        with a KV cache (``whisper.py``)."""
        from ...batch import RolloutBatch

        w = self.whisper
        counts = completion_counts(counts, len(rows))
        R, T = sum(counts), w.max_tokens
        data = w.conditions(rows)
        index = repeat_rows(torch.arange(len(rows)), counts)
        temps = row_temperatures(temperature if temperature is not None else self.temperature, counts)
        greedy, uniforms = torch.full((R,), True) if evaluation else temps <= 0, None
        if evaluation and self.eval_sampling == "seeded":
            seeds = [held_out_seed(r, u, "utterance_seed" if "utterance_seed" in r else "audio_seed")
                     for r, u in zip(rows, uids)]
            temps, greedy, uniforms = seeded_draws(seeds, counts, T, self.temperature)
        out, lps, cmask, done = decode_tokens(w.stepper(module, data["input_features"], index), R, T, eos=w.eos,
                                              pad=w.pad, temps=temps, greedy=greedy,
                                              temperature=max(self.temperature, 1e-6), generator=generator,
                                              uniforms=uniforms)
        columns = fanned_columns(rows, counts)
        if not all(isinstance(a, str) for a in columns.get("audio", [])):
            columns.pop("audio", None)  # arrays stay out of the reward columns (files and URIs are small)
        columns["prompt"] = per_row([str(r.get("prompt", "")) for r in rows], counts)
        columns["completion"] = [self.text(o[m > 0].tolist()) for o, m in zip(out, cmask)]
        R1 = torch.ones(R, 1, dtype=torch.long)
        return RolloutBatch(
            prompt_ids=torch.tensor([w.prefix] * R, dtype=torch.long), prompt_mask=R1.expand(R, len(w.prefix)),
            completion_ids=out, completion_mask=cmask, behavior_logprobs=lps * cmask,
            completion_attention_mask=cmask.long(), truncated=~done, columns=columns,
            **group_identity(counts, uids, group_offset), row_data={k: v[index] for k, v in data.items()})

    def offers(self) -> frozenset[str]:
        """``entropy`` / ``entropy_grad`` (of softmax(logits / τ) per token) and ``token_logprobs`` (the
        log-probs again, for a loss that asks the frozen reference for them)."""
        return frozenset({"entropy", "entropy_grad", "token_logprobs"})

    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """``logprobs`` [R, T] of ``mb``'s tokens: the decoder teacher-forced on ``<s>`` + the completion."""
        from .tiny import decoder_inputs

        device = next(module.parameters()).device
        ids = mb.completion_ids.to(device)
        with torch.set_grad_enabled(grad):
            if self.whisper is not None:
                logits = self.whisper.logits(module, mb.row_data["input_features"], ids)
                logp_all = torch.log_softmax(logits / max(self.temperature, 1e-6), -1)
            else:
                logits = module(input_features=mb.row_data["features"].to(device),
                                attention_mask=mb.row_data["feature_mask"].to(device),
                                decoder_input_ids=decoder_inputs(ids, self.vocab["bos"])).logits.float()
                logp_all = torch.log_softmax(logits / self.temperature, -1)
            out = {"logprobs": logp_all.gather(-1, ids[..., None])[..., 0]}
            if want & {"entropy", "entropy_grad"}:
                finite = logp_all.masked_fill(torch.isinf(logp_all), 0.0)  # suppressed tokens: 0 · log 0 = 0
                ent = -(logp_all.exp() * finite).sum(-1)
                out["entropy"], out["entropy_grad"] = ent.detach(), ent
        if "token_logprobs" in want:
            out["token_logprobs"] = out["logprobs"]
        return out

    def describe(self, batch, i: int) -> dict:
        """The utterance, the transcript written, the reference (``transcript``) when the data has one, and the
        utterance's feature frames as a spectrogram picture (``spectrogram``, a PNG data URI: frames left to
        right, feature dimensions bottom to top, min-max scaled, 3x3 pixels per value) in the completions log. Not
        ``image``: the report shows an ``image`` instead of the text, and here the text is the action. There is
        no audio to play (the corpus is feature frames, not audio)."""
        ref = batch.columns.get("transcript")
        if self.whisper is not None:  # the clip's log-mel frames [mels, n] as [n, mels], 1 px per value
            n = int(batch.row_data["feature_frames"][i])
            x = batch.row_data["input_features"][i][:, :n].T
            picture = spectrogram_data_uri(x, torch.ones(len(x)), scale=1)
        else:
            picture = spectrogram_data_uri(batch.row_data["features"][i], batch.row_data["feature_mask"][i])
        return {"prompt": str(batch.columns["prompt"][i]), "completion": str(batch.columns["completion"][i]),
                **({"reference": str(ref[i])} if ref is not None else {}), "spectrogram": picture}


def spectrogram_data_uri(features: torch.Tensor, mask: torch.Tensor, scale: int = 3) -> str:
    """Frames ``[T, D]`` (the real ones: ``mask``) as a grey PNG data URI ``[D·scale, T·scale]``, min-max scaled
    (the range includes 0), dimension 0 at the bottom (``images.render``'s PNG writer)."""
    from ...media import grid_png, png_data_uri

    x = features[mask.bool()].detach().float().cpu().T.flip(0)  # [D, T]
    lo = min(float(x.min()), 0.0) if x.numel() else 0.0
    hi = max(float(x.max()), 0.0) if x.numel() else 0.0
    x01 = (x - lo) / (hi - lo if hi > lo else 1.0)
    return png_data_uri(grid_png(x01[None], 1, 1, scale=scale, pad=0))
