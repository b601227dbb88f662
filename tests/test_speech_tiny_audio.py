"""The built-in tiny speech recogniser on audio (policies/speech_to_text/tiny_audio.py, ``--model spoken_words``):
log-mel features computed from the waveform by Speech2TextFeatureExtractor, read from files, arrays and data URIs
through the speech policy's audio reader; pre-trained on the shipped espeak-ng clips; trained by the CLI and
reloaded natively (issue 42)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from grpolab.config import ConfigError

sf = pytest.importorskip("soundfile")
QUIET = dict(log=lambda *a: None)


@pytest.fixture(scope="module")
def policy_and_model():
    from grpolab.policies.speech_to_text.policy import SpeechToTextPolicy
    policy = SpeechToTextPolicy(model="spoken_words", temperature=1.0)
    return policy, policy.load(None, [], [], **QUIET)


def test_features_come_from_the_waveform_alike_from_files_arrays_and_uris(policy_and_model, tmp_path):
    """A clip as a float WAV file, an array with its rate and a FLAC data URI gives the features a separately
    built Speech2TextFeatureExtractor(40 mel bins) computes from its samples: per-utterance normalised (mean 0,
    variance 1 per bin over the clip's frames), 1 + (n - 400) // 160 frames, zero-padded to 300 with a mask;
    an 8 kHz copy is resampled to 16 kHz first (the same frame count)."""
    from transformers import Speech2TextFeatureExtractor

    from grpolab.policies.speech_to_text.audio import resample
    from grpolab.policies.speech_to_text.spoken_words import flac_data_uri, utterance

    policy, _ = policy_and_model
    text, x = utterance(2_000_003)
    sf.write(tmp_path / "u.wav", x, 16000, subtype="FLOAT")
    x8 = resample(x, 16000, 8000)
    sf.write(tmp_path / "u8.wav", x8, 8000, subtype="FLOAT")
    rows = [{"audio": str(tmp_path / "u.wav")}, {"audio": {"array": x.tolist(), "sampling_rate": 16000}},
            {"audio": flac_data_uri(x)}, {"audio": str(tmp_path / "u8.wav")}]
    feats, mask = policy.conditions(rows)
    n = 1 + (len(x) - 400) // 160
    assert feats.shape == (4, 300, 40) and mask.sum(1).tolist() == [n, n, n, 1 + (len(resample(x8, 8000, 16000)) - 400) // 160]
    ref = Speech2TextFeatureExtractor(feature_size=40, num_mel_bins=40)(x, sampling_rate=16000)["input_features"][0]
    torch.testing.assert_close(feats[0, :n], torch.as_tensor(ref), atol=1e-5, rtol=0)
    torch.testing.assert_close(feats[1], feats[0], atol=0, rtol=0)
    torch.testing.assert_close(feats[2, :n], feats[0, :n], atol=0.05, rtol=0)  # 16-bit FLAC rounding
    assert not feats[:, n:].any() and not mask[0, n:].any()
    torch.testing.assert_close(feats[0, :n].mean(0), torch.zeros(40), atol=1e-4, rtol=0)
    torch.testing.assert_close(feats[0, :n].std(0, unbiased=False), torch.ones(40), atol=1e-3, rtol=0)


def test_logprobs_equal_behaviour_and_the_shipped_model_was_pretrained_on_the_clips(policy_and_model):
    """Behaviour log-probs equal the teacher-forced forward's on audio rows; the shipped model (built by
    scripts/ship_builtin_weights.py) transcribes held-out utterances well above chance greedily (measured 1 - WER
    on these 40: see the assertion), and its folder keeps its feature extractor."""
    from grpolab.model.cache import read_meta
    from grpolab.policies.speech_to_text.policy import SpeechToTextPolicy
    from grpolab.policies.speech_to_text.tasks import one_minus_wer
    from grpolab.policies.speech_to_text.tiny_audio import speech_audio_model_path
    from grpolab.tasks import get_task

    policy, model = policy_and_model
    path = speech_audio_model_path(log=lambda m: None)
    assert (path / "preprocessor_config.json").exists() and read_meta(path)["recipe"]["kind"] == "speech2text_audio"
    task = get_task("spoken_words_audio", spoken_words_train_size=4, spoken_words_eval_size=40)
    b = policy.sample(model, task.train_rows, list(range(4)), num_generations=4, temperature=1.0,
                      generator=torch.Generator().manual_seed(0))
    out = policy.forward(model, b, grad=False)
    torch.testing.assert_close(out["logprobs"] * b.completion_mask, b.behavior_logprobs, atol=1e-5, rtol=0)
    assert "audio" in b.columns and b.row_data["features"].shape == (16, 300, 40)
    greedy = SpeechToTextPolicy(model="spoken_words", temperature=1.0, speech_eval_sampling="greedy")
    greedy.load(None, [], [], **QUIET)
    g = greedy.sample(model, task.eval_rows, list(range(40)), num_generations=1, evaluation=True)
    score = float(np.mean(one_minus_wer(None, g.columns["completion"], transcript=g.columns["transcript"])))
    assert score > 0.3, score  # chance (a random word of 16 per word): about 0.06


def test_the_cli_trains_it_on_wav_files_and_the_folder_reloads_natively(tmp_path):
    """``grpolab train --policy speech_to_text --model spoken_words --data rows.jsonl`` (audio + transcript),
    2 steps; OUT/final reloads with Speech2TextForConditionalGeneration (weights moved) and
    Speech2TextFeatureExtractor, and as ``--model OUT/final`` reads audio again."""
    from transformers import Speech2TextFeatureExtractor, Speech2TextForConditionalGeneration

    from grpolab.cli import main
    from grpolab.policies.speech_to_text.policy import SpeechToTextPolicy
    from grpolab.policies.speech_to_text.spoken_words import utterance
    from grpolab.policies.speech_to_text.tiny_audio import speech_audio_model_path

    rows = []
    for i in range(4):
        text, x = utterance(3_000_000 + i)
        sf.write(tmp_path / f"{i}.wav", x, 16000)
        rows.append({"audio": f"{i}.wav", "transcript": text})
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["train", "--policy", "speech_to_text", "--model", "spoken_words", "--data",
               str(tmp_path / "rows.jsonl"), "--reward", "grpolab.policies.speech_to_text.rewards:one_minus_wer",
               "--steps", "2", "--prompts_per_step", "2", "--num_generations", "4", "--eval_split", "0",
               "--learning_rate", "3e-3", "--save_steps", "100", "--tensorboard", "false", "--quiet",
               "--threads", "1", "--out", str(tmp_path / "run")])
    assert rc == 0
    final = tmp_path / "run" / "final"
    before = Speech2TextForConditionalGeneration.from_pretrained(speech_audio_model_path(log=None)).state_dict()
    after = Speech2TextForConditionalGeneration.from_pretrained(final).state_dict()
    assert [k for k in before if not torch.equal(before[k], after[k])], "no weight changed"
    assert Speech2TextFeatureExtractor.from_pretrained(final).num_mel_bins == 40
    again = SpeechToTextPolicy(model=str(final), temperature=1.0)
    again.load(None, [{"audio": str(tmp_path / "0.wav")}], [], **QUIET)
    assert again.audio is not None and again.conditions([{"audio": str(tmp_path / "0.wav")}])[0].shape == (1, 300, 40)


def test_errors_name_the_model_to_use_and_the_window(policy_and_model):
    from grpolab.policies.speech_to_text.policy import SpeechToTextPolicy

    policy, _ = policy_and_model
    with pytest.raises(ConfigError, match="use --model spoken_words"):
        SpeechToTextPolicy(model="spoken_digits", temperature=1.0).features({"audio": "a.wav"})
    with pytest.raises(ConfigError, match=r"train row 0: policy speech_to_text with the tiny model on audio "
                                          r"\(spoken_words\) transcribes the column 'audio'"):
        policy.check_rows([{"prompt": "p", "audio_seed": 3}], [])
    with pytest.raises(ConfigError, match=r"lasts 3\.50 s, longer than the model's 3 s window"):
        policy.check_rows([{"audio": {"array": [0.0] * 56000, "sampling_rate": 16000}}], [])


def test_speech_freeze_encoder_trains_the_decoder_only(tmp_path):
    """``speech_freeze_encoder true``: after 2 steps of asr_grpo_audio the encoder's weights are the pre-trained
    ones bit for bit and the decoder's moved (the default, false, trains both: every other test here)."""
    from transformers import Speech2TextForConditionalGeneration

    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.policies.speech_to_text.tiny_audio import speech_audio_model_path
    from grpolab.train.trainer import Trainer

    base = Speech2TextForConditionalGeneration.from_pretrained(speech_audio_model_path(log=None)).state_dict()
    cfg = Config.build({**recipe_overrides("asr_grpo_audio"), "steps": 2, "prompts_per_step": 2,
                        "num_generations": 4, "spoken_words_train_size": 4, "spoken_words_eval_size": 0,
                        "eval_before": False, "eval_after": False, "learning_rate": 1e-3, "save_steps": 100,
                        "micro_batch_size": 8, "out": str(tmp_path / "run"), "stall_steps": 0, "threads": 1,
                        "tensorboard": False, "speech_freeze_encoder": True})
    Trainer(cfg, **QUIET).train(progress=False)
    after = Speech2TextForConditionalGeneration.from_pretrained(tmp_path / "run" / "final").state_dict()
    moved = {"encoder" if ".encoder." in k else "decoder" for k in base if not torch.equal(base[k], after[k])}
    assert moved == {"decoder"}, moved
