"""Whisper on audio in the speech policy (policies/speech_to_text/whisper.py, audio.py): a tiny random-weight
``WhisperForConditionalGeneration`` + ``WhisperProcessor`` built in-process and saved as a user's folder, trained
from WAV / FLAC files, arrays with a sampling rate and ``datasets.Audio()`` columns (issue 42)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from grpolab.config import ConfigError

sf = pytest.importorskip("soundfile")
QUIET = dict(log=lambda *a: None)
WORDS = "zero one two three four five six seven eight nine yes no up down go stop".split()
SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>",
           "<|startofprev|>", "<|notimestamps|>"]
REWARD = '''
def chars(prompts=None, completions=None, **kw):
    return [float(len(c) % 5) for c in completions]
'''


def tiny_tokenizer():
    """A byte-level BPE (``tokenizers``, trained on the corpus's 16 words) as a ``WhisperTokenizer`` with the
    special tokens Whisper's prompt needs, ``<|en|>`` right after ``<|startoftranscript|>`` as in Whisper."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import WhisperTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator([" " + w for w in WORDS] * 4, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split()) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = WhisperTokenizer(vocab=model["vocab"], merges=merges)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL[1:]})
    return tok


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A user's Whisper folder: d_model 32, 1 + 1 layers, 16 mel bins, a 3 s window (300 frames), ~300 tokens;
    the generation config suppresses ``<|translate|>`` / ``<|startofprev|>`` always and ``<|endoftext|>`` first."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperProcessor

    path = tmp_path_factory.mktemp("whisper") / "m"
    tok = tiny_tokenizer()
    eot, sot, _, translate, _, prev, _ = tok.convert_tokens_to_ids(SPECIAL)
    processor = WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=16, chunk_length=3),
                                 tokenizer=tok)
    cfg = WhisperConfig(vocab_size=len(tok), num_mel_bins=16, d_model=32, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        max_source_positions=150, max_target_positions=24, pad_token_id=eot, bos_token_id=eot,
                        eos_token_id=eot, decoder_start_token_id=sot, suppress_tokens=[translate, prev],
                        begin_suppress_tokens=[eot])
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(cfg).eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def tone(seconds: float, rate: int, freq: float, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(len(t)) * 0.05
    return (0.5 * np.sin(2 * math.pi * freq * t) + noise).astype(np.float32)


def clips(tmp_path) -> list[dict]:
    """Rows as ASR data is kept (``audio`` + ``transcript``, no prompt): WAV at 8 kHz, FLAC at 16 kHz, a stereo
    WAV at 22.05 kHz, paths relative to the data file."""
    sf.write(tmp_path / "a.wav", tone(0.5, 8000, 440), 8000)
    sf.write(tmp_path / "b.flac", tone(0.8, 16000, 300, 1), 16000, format="FLAC")
    stereo = np.stack([tone(0.3, 22050, 600, 2), tone(0.3, 22050, 650, 3)], axis=1)
    sf.write(tmp_path / "c.wav", stereo, 22050)
    return [{"audio": "a.wav", "transcript": "three go"}, {"audio": "b.flac", "transcript": "yes"},
            {"audio": "c.wav", "transcript": "stop"}]


def write_rows(tmp_path, rows) -> str:
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def loaded_policy(folder, rows=(), **kw):
    from grpolab.policies.speech_to_text.policy import SpeechToTextPolicy
    policy = SpeechToTextPolicy(model=str(folder), temperature=1.0, max_completion_length=6, **kw)
    return policy, policy.load(None, list(rows), [], **QUIET)


def test_resampling_gives_the_processors_rate(tmp_path):
    """ceil(n · up / down) samples, up / down = 16000 / rate in lowest terms: 4000 at 8 kHz -> 8000;
    6615 at 22.05 kHz (320 / 441) -> 4800; 1000 at 11.025 kHz (640 / 441) -> ceil(1451.25) = 1452; a 440 Hz tone
    keeps its frequency; stereo is averaged."""
    from grpolab.policies.speech_to_text.audio import audio_samples, read_audio

    sf.write(tmp_path / "t.wav", tone(0.5, 8000, 440), 8000)
    x = audio_samples(str(tmp_path / "t.wav"), 16000)
    assert len(x) == 8000 and x.dtype == np.float32
    peak = np.argmax(np.abs(np.fft.rfft(x))) * 16000 / len(x)
    assert abs(peak - 440) <= 2
    assert len(audio_samples({"array": np.zeros(6615), "sampling_rate": 22050}, 16000)) == 4800
    assert len(audio_samples({"array": [0.0] * 1000, "sampling_rate": 11025}, 16000)) == 1452
    assert len(audio_samples({"array": np.ones(320), "sampling_rate": 16000}, 16000)) == 320
    stereo = np.stack([np.full(100, 0.5), np.full(100, -0.25)], axis=1)
    sf.write(tmp_path / "s.flac", stereo, 16000, format="FLAC", subtype="PCM_24")
    mono, rate = read_audio(str(tmp_path / "s.flac"))
    assert rate == 16000 and mono.shape == (100,) and np.allclose(mono, 0.125, atol=1e-6)


def test_prefix_masks_and_logprobs_equal_a_plain_forward(folder, tmp_path):
    """The decoder prompt is the processor's (``get_decoder_prompt_ids``); behaviour log-probs (cached decoding)
    equal the training forward's and a plain ``model(input_features=processor(...), decoder_input_ids=prefix +
    completion)`` log_softmax gather with the generation config's suppress masks applied by hand."""
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from grpolab.data import load_jsonl
    from grpolab.policies.speech_to_text.audio import audio_samples

    rows = load_jsonl(write_rows(tmp_path, clips(tmp_path) + [
        {"audio": {"array": tone(0.4, 12000, 500).tolist(), "sampling_rate": 12000}, "transcript": "no"}]))
    assert rows[0]["prompt"] == "audio: a.wav" and rows[3]["prompt"] == "audio"
    policy, model = loaded_policy(folder, rows)
    proc = WhisperProcessor.from_pretrained(folder)
    sot = model.config.decoder_start_token_id
    forced = proc.get_decoder_prompt_ids(language="en", task="transcribe")
    assert policy.whisper.prefix == [sot] + [i for _, i in forced]
    assert proc.tokenizer.convert_ids_to_tokens(policy.whisper.prefix) == SPECIAL[1:3] + SPECIAL[4:5] + SPECIAL[6:]
    b = policy.sample(model, rows, [0, 1, 2, 3], num_generations=3, temperature=1.0,
                      generator=torch.Generator().manual_seed(0))
    m = b.completion_mask
    out = policy.forward(model, b, want=frozenset({"entropy"}), grad=False)
    torch.testing.assert_close(out["logprobs"] * m, b.behavior_logprobs, atol=1e-5, rtol=0)
    assert torch.isfinite(out["entropy"]).all()
    plain = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    audio = [audio_samples(r["audio"], 16000) for r in rows]
    feats = proc.feature_extractor(audio, sampling_rate=16000, return_tensors="pt")["input_features"]
    feats = feats.repeat_interleave(3, 0)
    ids = b.completion_ids
    dec = torch.cat([torch.tensor(policy.whisper.prefix).expand(len(ids), -1), ids[:, :-1]], 1)
    with torch.no_grad():
        logits = plain(input_features=feats, decoder_input_ids=dec).logits[:, 3:].clone()
    gen = plain.generation_config
    logits[..., gen.suppress_tokens] = float("-inf")
    logits[:, 0, gen.begin_suppress_tokens] = float("-inf")
    ref = torch.log_softmax(logits, -1).gather(-1, ids[..., None])[..., 0]
    torch.testing.assert_close(ref * m, b.behavior_logprobs, atol=1e-5, rtol=0)
    eot = model.config.eos_token_id
    for i in range(len(ids)):
        toks = ids[i, :int(m[i].sum())].tolist()
        assert (eot in toks) != bool(b.truncated[i]) and toks[0] != eot  # begin_suppress: never empty at once
        assert not set(toks) & set(gen.suppress_tokens)
        text = proc.tokenizer.decode([t for t in toks if t != eot], skip_special_tokens=True)
        assert b.columns["completion"][i] == text
    assert policy.describe(b, 0)["spectrogram"].startswith("data:image/png;base64,")


def test_a_whisper_folder_trains_from_the_command_line_on_wav_and_flac_and_reloads_natively(folder, tmp_path,
                                                                                           monkeypatch):
    """``grpolab train --policy speech_to_text --model FOLDER --data rows.jsonl`` (audio + transcript rows only),
    2 steps; OUT/final reloads with WhisperForConditionalGeneration (weights moved) and WhisperProcessor."""
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from grpolab.cli import main

    data = write_rows(tmp_path, clips(tmp_path))
    (tmp_path / "whisper_audio_rw.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["train", "--policy", "speech_to_text", "--model", str(folder), "--data", data,
               "--reward", "whisper_audio_rw:chars",
               "--reward", "grpolab.policies.speech_to_text.rewards:one_minus_wer",
               "--steps", "2", "--prompts_per_step", "2", "--num_generations", "3", "--max_completion_length", "5",
               "--eval_split", "0", "--learning_rate", "3e-3", "--save_steps", "100", "--tensorboard", "false",
               "--dtype", "float32", "--quiet", "--threads", "1", "--out", str(tmp_path / "run")])
    assert rc == 0
    final = tmp_path / "run" / "final"
    again = WhisperForConditionalGeneration.from_pretrained(final)
    before = WhisperForConditionalGeneration.from_pretrained(folder).state_dict()
    after = again.state_dict()
    assert [k for k in before if not torch.equal(before[k], after[k])], "no weight changed"
    proc = WhisperProcessor.from_pretrained(final)
    assert proc.feature_extractor.feature_size == 16 and len(proc.tokenizer) == again.config.vocab_size
    logged = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert logged and {"completion", "reference", "spectrogram"} <= set(logged[0])


def test_a_datasets_audio_column_from_parquet_and_save_to_disk(folder, tmp_path, monkeypatch):
    """A ``datasets.Audio()`` column is read undecoded (its bytes as a data URI: datasets' own decoding needs
    torchcodec) and decoded by soundfile to the same samples as the file; a Parquet file trains a step."""
    datasets = pytest.importorskip("datasets")
    from grpolab.cli import main
    from grpolab.data import load_data
    from grpolab.policies.speech_to_text.audio import audio_samples

    rows = clips(tmp_path)
    ds = datasets.Dataset.from_dict({"audio": [str(tmp_path / r["audio"]) for r in rows],
                                     "transcript": [r["transcript"] for r in rows]})
    ds = ds.cast_column("audio", datasets.Audio())
    ds = ds.cast_column("audio", datasets.Audio(decode=False)).map(
        lambda r: {"audio": {"bytes": open(r["audio"]["path"], "rb").read(), "path": None}})  # embedded bytes
    ds = ds.cast_column("audio", datasets.Audio())
    ds.to_parquet(str(tmp_path / "asr.parquet"))
    ds.save_to_disk(str(tmp_path / "asr_disk"))
    for source in ("asr.parquet", "asr_disk"):
        got = load_data(tmp_path / source)
        assert got[0]["audio"].startswith("data:audio/wav;base64,") and got[1]["audio"].startswith("data:audio/flac")
        for r, own in zip(got, rows):
            np.testing.assert_array_equal(audio_samples(r["audio"], 16000), audio_samples(str(tmp_path / own["audio"]),
                                                                                          16000))
    (tmp_path / "whisper_audio_rw2.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["train", "--policy", "speech_to_text", "--model", str(folder), "--data", str(tmp_path / "asr.parquet"),
               "--reward", "whisper_audio_rw2:chars", "--steps", "1", "--prompts_per_step", "2", "--num_generations",
               "2", "--max_completion_length", "4", "--eval_split", "0", "--save_steps", "100", "--tensorboard",
               "false", "--dtype", "float32", "--quiet", "--threads", "1", "--out", str(tmp_path / "run")])
    assert rc == 0


def test_the_python_api_takes_a_loaded_whisper_and_its_processor(folder, tmp_path):
    """GRPOTrainer(model=<a loaded WhisperForConditionalGeneration>, processing_class=<its WhisperProcessor>,
    train_dataset=<a datasets.Dataset with an Audio() column> (iterated undecoded: datasets' decoding needs
    torchcodec), eval_dataset=<dicts of numpy arrays with their sampling rate>): the policy is the speech one, a
    step trains and the weights move. (Casting arrays *into* an Audio() column needs torchcodec too, to encode.)"""
    datasets = pytest.importorskip("datasets")
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from grpolab import GRPOConfig, GRPOTrainer

    model = WhisperForConditionalGeneration.from_pretrained(folder)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    rows = clips(tmp_path)
    ds = datasets.Dataset.from_dict({"audio": [str(tmp_path / r["audio"]) for r in rows] * 2,
                                     "transcript": [r["transcript"] for r in rows] * 2})
    ds = ds.cast_column("audio", datasets.Audio())
    held = [{"audio": {"array": tone(0.5, 8000, 440 + 50 * i, i), "sampling_rate": 8000}, "transcript": "one"}
            for i in range(2)]
    trainer = GRPOTrainer(model=model, processing_class=WhisperProcessor.from_pretrained(folder),
                          reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions],
                          train_dataset=ds, eval_dataset=held, args=GRPOConfig(
                              output_dir=str(tmp_path / "api"), max_steps=1, per_device_train_batch_size=4,
                              num_generations=2, max_completion_length=4, learning_rate=3e-3, report_to="none",
                              threads=1))
    assert trainer.cfg.policy == "speech_to_text" and trainer.trainer.policy.whisper is not None
    trainer.train()
    assert any(not torch.equal(start[k], v) for k, v in trainer.model.state_dict().items())


def test_clear_errors_name_the_field_and_the_fix(folder, tmp_path):
    """A missing file, a bad sampling rate, a clip longer than the window, an unreadable file and a folder of an
    unsupported class each give a ConfigError saying what to give instead."""
    from grpolab.policies.speech_to_text.audio import audio_samples
    from grpolab.policies.speech_to_text.policy import SpeechToTextPolicy

    with pytest.raises(ConfigError, match=r"train row 0: 'audio' file nowhere\.wav does not exist; give a WAV/FLAC"):
        loaded_policy(folder, [{"prompt": "p", "audio": "nowhere.wav", "transcript": "x"}])
    for rate in (0, -8000, 16000.5, "16k", None):
        with pytest.raises(ConfigError, match=r"'audio'\.sampling_rate must be a positive whole number of Hz"):
            audio_samples({"array": [0.0] * 10, "sampling_rate": rate}, 16000)
    with pytest.raises(ConfigError, match=r"lasts 4\.00 s, longer than the model's 3 s window"):
        loaded_policy(folder, [{"prompt": "p", "audio": {"array": [0.0] * 64000, "sampling_rate": 16000}}])
    (tmp_path / "bad.wav").write_bytes(b"not a sound file at all")
    with pytest.raises(ConfigError, match="could not be read as audio"):
        audio_samples(str(tmp_path / "bad.wav"), 16000)
    with pytest.raises(ConfigError, match="column 'audio'"):
        loaded_policy(folder, [{"prompt": "p", "transcript": "x"}])
    (tmp_path / "w2v").mkdir()
    (tmp_path / "w2v" / "config.json").write_text(json.dumps({"model_type": "wav2vec2",
                                                              "architectures": ["Wav2Vec2ForCTC"]}))
    with pytest.raises(ConfigError, match=r"holds a Wav2Vec2ForCTC; policy speech_to_text loads "
                                          r"WhisperForConditionalGeneration folders"):
        SpeechToTextPolicy(model=str(tmp_path / "w2v"), temperature=1.0).load(None, [], [], **QUIET)
    with pytest.raises(ConfigError, match="reads the synthetic corpus's feature frames, not audio"):
        SpeechToTextPolicy(model="spoken_digits", temperature=1.0).features({"audio": "a.wav"})


def test_spoken_words_audio_is_real_speech_that_a_whisper_folder_trains_on(folder, tmp_path):
    """The task's rows are FLAC data URIs of espeak-ng clips (shipped in the package) at 16 kHz, a pure function of
    their seed; a Whisper folder trains a step on them; the built-in frame model refuses audio rows."""
    from grpolab.cli import main
    from grpolab.policies.speech_to_text.audio import read_audio
    from grpolab.policies.speech_to_text.spoken_words import clips as shipped
    from grpolab.tasks import get_task

    bank = shipped()
    assert sorted(bank) == sorted(WORDS) and all(len(v) == 4 for v in bank.values())
    task = get_task("spoken_words_audio", spoken_words_train_size=6, spoken_words_eval_size=2)
    again = get_task("spoken_words_audio", spoken_words_train_size=6, spoken_words_eval_size=2)
    assert task.train_rows == again.train_rows
    row = task.eval_rows[0]
    x, rate = read_audio(row["audio"])
    assert rate == 16000 and 0.2 < len(x) / rate < 3.0 and set(row["transcript"].split()) <= set(WORDS)
    rc = main(["train", "--policy", "speech_to_text", "--model", str(folder), "--task", "spoken_words_audio",
               "--spoken_words_train_size", "4", "--spoken_words_eval_size", "2", "--steps", "1",
               "--prompts_per_step", "2", "--num_generations", "2", "--max_completion_length", "4",
               "--save_steps", "100", "--tensorboard", "false", "--dtype", "float32", "--quiet", "--threads", "1",
               "--out", str(tmp_path / "run")])
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0.0 <= summary["after"]["rewards/one_minus_wer/mean"] <= 1.0
