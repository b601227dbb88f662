"""The VLM classes users train (issue 42), as tiny random-weight instances of the real ``transformers`` classes
built here and saved with ``save_pretrained`` with their processor: Qwen2-VL and Qwen2.5-VL (flattened patches,
``image_grid_thw``, mRoPE positions), Idefics3 and SmolVLM2 (image splitting, 5-d pixel values,
``pixel_attention_mask``).
grpolab's per-token log-probs equal a plain ``model(**inputs)`` forward on the same rows with the native
processor's inputs; a folder trains 2 steps with ``--model FOLDER`` on TRL-style rows (pictures of different
sizes) and reloads with the native class with changed weights. (LLaVA: tests/test_vision.py.)"""
from __future__ import annotations

import json
import string

import numpy as np
import pytest
import torch

CHARS = list(string.printable[:95]) + ["\n"]
# a reward that differs between a random model's completions (a non-zero advantage: the weights move)
REWARD = "def varied(completions, answer, **kw):\n    return [float(sum(map(ord, c)) % 7) for c in completions]\n"


def _tokenizer(specials: list[str]):
    """A character-level tokenizer (``model.loading.char_tokenizer``, as the built-in VLM's) with the family's
    special tokens."""
    from grpolab.model.loading import char_tokenizer
    tok = char_tokenizer(["<pad>", "<eos>", "<unk>", "<bos>"] + CHARS, pad_token="<pad>", eos_token="<eos>",
                         unk_token="<unk>", bos_token="<bos>")
    tok.add_special_tokens({"additional_special_tokens": specials})
    return tok


def _template(image: str) -> str:
    return ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
            "{% for c in m['content'] %}{% if c['type'] == 'image' %}{{ '" + image + "' }}{% elif c['type'] == "
            "'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{% if not loop.last %}{{ '\\n' }}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}{{ '\\n' }}{% endif %}")


def _text_config(tok) -> dict:
    return dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)


def skip_missing_part_check(monkeypatch):
    """transformers' class check of a processor's missing part (its video processor, which needs torchvision)
    skipped for this test only."""
    from transformers import ProcessorMixin
    check = ProcessorMixin.check_argument_for_proper_class
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class",
                        lambda self, name, arg: None if arg is None else check(self, name, arg))


def native_qwen_processor(kind, tok, image_processor, template, monkeypatch):
    """The native Qwen2VLProcessor / Qwen2_5_VLProcessor without its video processor (``skip_missing_part_check``)."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor
    skip_missing_part_check(monkeypatch)
    cls = Qwen2VLProcessor if kind == "qwen2_vl" else Qwen2_5_VLProcessor
    return cls(image_processor=image_processor, tokenizer=tok, video_processor=None, chat_template=template)


def save_folder(folder, model, tok, image_processor, template: str) -> None:
    """The files of a model folder without a processor config: model, tokenizer, image processor, chat template."""
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    image_processor.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(template)


def build_qwen(kind: str, folder, monkeypatch):
    """A tiny Qwen2-VL / Qwen2.5-VL (vision: 2 blocks, patch 8, merge 2; text: 2 layers, width 64, mRoPE sections
    [2, 3, 3]) saved in ``folder`` (model, tokenizer, PIL image processor, chat template: the files a Qwen2-VL
    folder has, less the video processor); returns ``(model, native processor)``."""
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    specials = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok = _tokenizer(specials)
    template = _template("<|vision_start|><|image_pad|><|vision_end|>")
    ip = Qwen2VLImageProcessorPil(min_pixels=16 * 16, max_pixels=48 * 48, patch_size=8, merge_size=2,
                                  temporal_patch_size=2)
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    text = {**_text_config(tok), "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3],
                                                      "rope_theta": 10000.0}}
    tokens = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                  vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    if kind == "qwen2_vl":
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=8,
                      spatial_merge_size=2, temporal_patch_size=2)
        cfg, cls = Qwen2VLConfig(text_config=text, vision_config=vision, **tokens), Qwen2VLForConditionalGeneration
    else:
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=64, patch_size=8,
                      spatial_merge_size=2, temporal_patch_size=2, window_size=16, fullatt_block_indexes=[1])
        cfg, cls = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **tokens), Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(0)
    model = cls(cfg).float().eval()
    save_folder(folder, model, tok, ip, template)
    return model, native_qwen_processor(kind, tok, ip, template, monkeypatch)


def idefics3_parts(config_class, model_class, image_processor_class):
    """``(tokenizer, image processor, model)`` of the Idefics3 shape (SigLIP-style vision 2 layers at 32 px, patch
    8, pixel shuffle 2: 4 tokens per tile; Llama text 2 layers; the PIL image processor splits a picture over
    32 px into 32-px tiles plus a global view) in the given classes, the weights drawn under seed 0."""
    grid = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]
    tok = _tokenizer(["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *grid])
    ip = image_processor_class(size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=True)
    cfg = config_class(vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, image_size=32, patch_size=8),
                       text_config={**_text_config(tok), "model_type": "llama"}, scale_factor=2,
                       image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return tok, ip, model_class(cfg).float().eval()


def build_idefics3(folder, monkeypatch=None):
    """A tiny Idefics3 (``idefics3_parts``) with an ``Idefics3Processor`` (``image_seq_len`` 4) saved in
    ``folder``; returns ``(model, processor)``."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    tok, ip, model = idefics3_parts(Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessorPil)
    proc = Idefics3Processor(image_processor=ip, tokenizer=tok, image_seq_len=4, chat_template=_template("<image>"))
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return model, proc


def build_smolvlm(folder, monkeypatch):
    """A tiny SmolVLM2 (``SmolVLMForConditionalGeneration``: the Idefics3 sizes above) saved in ``folder`` as a
    SmolVLM2 folder holds it, less the video processor (it needs torchvision): model, tokenizer, the PIL
    ``SmolVLMImageProcessorPil`` (image splitting), ``processor_config.json`` (``image_seq_len`` 4) and the chat
    template. Returns ``(model, native processor)``: ``SmolVLMProcessor`` built without its video processor (the
    class check of the missing part skipped) and with ``num2words``, which it needs for video prompts only, stubbed
    for this test."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMProcessor
    from transformers.models.smolvlm import processing_smolvlm
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
    tok, ip, model = idefics3_parts(SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMImageProcessorPil)
    template = _template("<image>")
    save_folder(folder, model, tok, ip, template)
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "SmolVLMProcessor",
                                                              "image_seq_len": 4}))
    skip_missing_part_check(monkeypatch)
    if processing_smolvlm.num2words is None:
        monkeypatch.setattr(processing_smolvlm, "num2words", str)
    return model, SmolVLMProcessor(image_processor=ip, tokenizer=tok, video_processor=None, image_seq_len=4,
                                   chat_template=template)


FAMILIES = ["qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm"]
SPLIT = ("idefics3", "smolvlm")


def build(kind, folder, monkeypatch):
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "smolvlm":
        return build_smolvlm(folder, monkeypatch)
    return build_idefics3(folder) if kind == "idefics3" else build_qwen(kind, folder, monkeypatch)


def _has_torchvision() -> bool:
    import importlib.util
    return importlib.util.find_spec("torchvision") is not None


def _rows():
    """TRL-style rows with pictures of two sizes (different patch counts / tile counts per row)."""
    rows = []
    for i, (h, w) in enumerate([(32, 32), (40, 56), (16, 64), (20, 100)]):
        a = np.random.default_rng(i).integers(0, 255, (h, w, 3), dtype=np.uint8)
        rows.append({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"n{i}?"}]}],
                     "image": a.tolist(), "answer": str(i)})
    return rows


def _policy(folder):
    from grpolab.policies.vision_language.policy import VisionLanguagePolicy
    policy = VisionLanguagePolicy(model=str(folder), task="user", temperature=1.0, max_completion_length=6,
                                  max_prompt_length=0)
    return policy, policy.load(None, _rows(), [], log=lambda *a: None)


@pytest.mark.parametrize("kind", FAMILIES)
def test_logprobs_equal_a_plain_forward_with_the_native_processor(kind, tmp_path, monkeypatch):
    """Sampled completions of 4 rows (pictures of different sizes, left-padded prompts): grpolab's recomputed
    log-probs equal (i) the sampler's behaviour log-probs (KV cache, its positions) and (ii) log_softmax of a plain
    ``model(**inputs)`` forward, inputs = the native processor's on the same texts and pictures with the
    completions appended (the model computes its own positions: mRoPE by get_rope_index for Qwen)."""
    from PIL import Image

    from grpolab.policies.vision_language.prompts import prompt_messages
    native_model, native = build(kind, tmp_path / "m", monkeypatch)
    policy, module = _policy(tmp_path / "m")
    rows = _rows()
    batch = policy.sample(module, rows, list(range(4)), num_generations=1, generator=torch.Generator().manual_seed(0))
    out = policy.forward(module, batch, grad=False)["logprobs"]
    mask = batch.completion_mask
    assert torch.allclose(out * mask, batch.behavior_logprobs * mask, atol=1e-5)

    # (SmolVLMProcessor.apply_chat_template reads its video processor's frame settings: the template is rendered
    # by its tokenizer, which is what the processor does with them for pictures)
    render = (native.apply_chat_template if kind != "smolvlm" else
              lambda m, **kw: native.tokenizer.apply_chat_template(m, chat_template=native.chat_template, **kw))
    texts = [render(prompt_messages(r, 1), add_generation_prompt=True, tokenize=False) for r in rows]
    images = [Image.fromarray(np.asarray(r["image"], dtype=np.uint8)) for r in rows]
    native.tokenizer.padding_side = "left"
    inputs = native(text=texts, images=[[im] for im in images] if kind in SPLIT else images,
                    return_tensors="pt", padding=True)
    assert torch.equal(inputs["input_ids"], batch.prompt_ids)  # grpolab's prompts are the native processor's
    if kind in SPLIT:  # and its tiles, zero-padded to the batch's most
        assert torch.equal(batch.row_data["pixel_values"], inputs["pixel_values"].float())
        assert torch.equal(batch.row_data["pixel_attention_mask"].bool(), inputs["pixel_attention_mask"].bool())
        assert len({int(m.flatten(1).any(-1).sum()) for m in inputs["pixel_attention_mask"]}) > 1  # tile counts
    if kind == "smolvlm":  # built without the native processor (its video part needs torchvision)
        from grpolab.policies.vision_language.layouts import SplitProcessor
        assert isinstance(policy.processor, SplitProcessor) or _has_torchvision()
    comp = batch.completion_ids
    full = dict(inputs)
    full["input_ids"] = torch.cat([inputs["input_ids"], comp], 1)
    full["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(comp)], 1)
    if "mm_token_type_ids" in full:
        full["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(comp).int()], 1)
    with torch.no_grad():
        logits = native_model(**full).logits[:, inputs["input_ids"].shape[1] - 1:-1].float()
    logits[..., module.config.image_token_id] = float("-inf")  # grpolab's support excludes the image token
    ref = torch.log_softmax(logits, -1).gather(-1, comp[..., None])[..., 0]
    assert torch.allclose(out * mask, ref * mask, atol=1e-5), (out - ref).abs().max()
    if kind not in SPLIT:  # the native processor's patches and grids are what grpolab keeps per row
        kept = batch.row_data["image_grid_thw"]
        assert torch.equal(kept[kept.prod(-1) > 0], inputs["image_grid_thw"])
    assert policy.describe(batch, 1)["picture"].startswith("data:image/png;base64,")
    # two batches of different patch / tile counts concatenate (RolloutBatch.concat zero-pads row_data) and
    # forward as they did apart
    from grpolab.batch import RolloutBatch
    parts = [policy.sample(module, rows[i:i + 2], [i, i + 1], num_generations=1,
                           generator=torch.Generator().manual_seed(i)) for i in (0, 2)]
    assert any(parts[0].row_data[k].shape != parts[1].row_data[k].shape for k in parts[0].row_data)
    both = RolloutBatch.concat(parts, pad_id=policy.pad_id)
    got = policy.forward(module, both, grad=False)["logprobs"] * both.completion_mask
    for j, part in enumerate(parts):
        alone = policy.forward(module, part, grad=False)["logprobs"] * part.completion_mask
        T = alone.shape[1]
        assert torch.allclose(got[2 * j:2 * j + 2, :T], alone, atol=1e-5)


@pytest.mark.parametrize("kind", FAMILIES)
def test_a_folder_trains_two_steps_from_the_command_line_and_reloads_natively(kind, tmp_path, monkeypatch):
    """``grpolab train --policy vision_language --model FOLDER --data rows.jsonl`` (pictures of different sizes:
    batches of different patch / tile counts), 2 steps; OUT/final reloads with the native class and its weights
    moved."""
    from transformers import AutoModelForImageTextToText

    from grpolab.cli import main
    model, _ = build(kind, tmp_path / "m", monkeypatch)
    monkeypatch.undo()  # the run itself builds its processor without help
    rows = _rows()
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "vlm_models_rw.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = main(["train", "--policy", "vision_language", "--model", str(tmp_path / "m"), "--data",
               str(tmp_path / "rows.jsonl"), "--reward", "vlm_models_rw:varied", "--steps", "2", "--prompts_per_step", "2",
               "--num_generations", "2", "--max_completion_length", "4", "--eval_split", "0", "--learning_rate",
               "1e-3", "--save_steps", "100", "--tensorboard", "false", "--quiet", "--threads", "1",
               "--out", str(tmp_path / "run")])
    assert rc == 0
    final = tmp_path / "run" / "final"
    again = AutoModelForImageTextToText.from_pretrained(final, dtype=torch.float32)
    assert type(again) is type(model)
    before, after = model.state_dict(), again.state_dict()
    moved = [k for k in before if k in after and not torch.equal(before[k], after[k])]
    assert moved, "no weight changed"
    if kind != "idefics3":
        assert (final / "preprocessor_config.json").exists() and (final / "chat_template.jinja").exists()
    if kind in SPLIT:
        assert (final / "processor_config.json").exists()
    if kind == "smolvlm":  # the saved processor builds again, with the folder's image_seq_len
        from grpolab.policies.vision_language.layouts import load_processor
        assert load_processor(final).image_seq_len == 4 or _has_torchvision()


def test_a_loaded_qwen2_vl_with_its_processor_trains_through_the_python_api(tmp_path, monkeypatch):
    """GRPOTrainer(model=<a loaded Qwen2VLForConditionalGeneration>, processing_class=<its processor>) takes the
    model's picture layout (patches, mRoPE) as a folder does: a step trains and the weights move."""
    from grpolab import GRPOConfig, GRPOTrainer
    from grpolab.policies.vision_language.layouts import load_processor
    model, _ = build("qwen2_vl", tmp_path / "m", monkeypatch)
    monkeypatch.undo()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(model=model, processing_class=load_processor(tmp_path / "m"),
                          reward_funcs=lambda completions, **kw: [float(sum(map(ord, c)) % 7) for c in completions],
                          train_dataset=_rows(), args=GRPOConfig(
                              output_dir=str(tmp_path / "api"), max_steps=1, per_device_train_batch_size=4,
                              num_generations=2, max_completion_length=4, learning_rate=1e-3, report_to="none",
                              threads=1))
    assert trainer.trainer.policy.layout.name == "patches"
    trainer.train()
    assert any(not torch.equal(start[k], v) for k, v in trainer.model.state_dict().items())


def test_gemma3_is_refused_saying_why(tmp_path):
    from grpolab.config import ConfigError
    from grpolab.policies.vision_language.policy import VisionLanguagePolicy
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3"}))
    policy = VisionLanguagePolicy(model=str(tmp_path), task="user", temperature=1.0, max_completion_length=4,
                                  max_prompt_length=0)
    with pytest.raises(ConfigError, match="token_type_ids.*supported: LLaVA"):
        policy.load(None, _rows(), [], log=lambda *a: None)
