"""The built-in tiny vision-language model: ``transformers``' LLaVA (``LlavaForConditionalGeneration``: a CLIP vision
tower, a 2-layer projector and a Llama decoder) from a tiny config, with a ``LlavaProcessor`` (CLIP image processor
+ a character-level tokenizer + a chat template), pre-trained in-process on the run's task and cached.

**Pre-training sources.** ``--model tiny`` pre-trains on the run's *task*: each vision task registers
``register_pretraining(task, examples)`` where ``examples(seed) -> (row, target)`` gives a data row (the same
columns as the task's rows: ``prompt``, ``scene_kind`` / ``scene_seed`` or ``image``) and the completion to imitate
(e.g. ``"<answer>[3,4,12,15]</answer>"``). Pre-training uses seeds ``0 … PRETRAIN_EXAMPLES - 1``; a task's RL rows
use seeds from ``TRAIN_BASE`` and its held-out rows from ``EVAL_BASE`` (disjoint). The loss is the cross-entropy
of the target tokens and the end-of-sequence token given the prompt and the picture(s) (LLaVA's SFT loss), AdamW
at a constant learning rate. Every task but :data:`BACKBONE_TASK` (``shape_grounding``) starts from that task's
pre-trained model (the "vision backbone", 1,000 steps: it has learnt to see colours, shapes and positions; from
random weights a 300-step model ignores the picture — the loss with the true, shuffled or blank pictures was the
same [measured]); a smoke run's ``vlm_pretrain_steps`` starts from random weights. The cache folder
(``$GRPOLAB_CACHE/vlm-<task>-<hash>``) is a Hugging Face model folder (``save_pretrained`` of the model and the
processor): ``--model`` that folder loads it like any VLM folder.

**Tokenizer.** One token per printable ASCII character plus the special tokens ``<pad>``, ``<eos>``, ``<unk>``,
``<bos>``, the image placeholder ``<image>`` (expanded by the processor into one token per image patch) and
:data:`TAG_TOKENS` (``<think>``, ``</think>``, ``<answer>`` …: one token each, so the formats the papers use cost
a few tokens). The chat template writes each message's text (image blocks as ``<image>``), a newline between
messages and one after the last when a generation prompt is asked for.

Provenance: grpolab's own — a tiny stand-in for the VLMs the papers train (Qwen2.5-VL and others), built from
``transformers``' LLaVA classes so that the same code path loads a real LLaVA-family folder.
"""
from __future__ import annotations

import string
from pathlib import Path
from typing import Callable

import torch

from ..base import timed_pretraining

IMAGE_TOKEN = "<image>"
SPECIALS = ["<pad>", "<eos>", "<unk>", "<bos>"]
#: tags the papers' output formats use; one token each in the tiny tokenizer (any other text is characters)
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>", "<bbox>", "</bbox>", "<points>", "</points>",
              "<labels>", "</labels>", "<score>", "</score>", "<critique>", "</critique>", "<suggestion>",
              "</suggestion>", "<tool>", "</tool>"]
IMAGE_SIZE, PATCH = 32, 8
PRETRAIN_EXAMPLES = 4000
PRETRAIN_ITERATIONS = 300
#: the task whose pre-trained model every other task's pre-training starts from (the "vision backbone": it has
#: learnt to see colours, shapes and positions); its own pre-training starts from random weights
BACKBONE_TASK = "shape_grounding"
TRAIN_BASE = 1_000_000
EVAL_BASE = 2_000_000

CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}{{ '<image>' }}{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{% if not loop.last %}{{ '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n' }}{% endif %}")

PRETRAINING: dict[str, Callable[[int], tuple[dict, str]]] = {}
PRETRAIN_SETTINGS: dict[str, dict] = {}


def register_pretraining(task: str, examples: Callable[[int], tuple[dict, str]], /, **settings) -> None:
    """Make ``--model tiny`` pre-trainable for ``task``: ``examples(seed) -> (row, target completion)``.
    ``settings`` override the pre-training recipe's ``iterations``, ``examples``, ``batch_size``,
    ``learning_rate`` for this task (tuned so the held-out reward leaves RL room)."""
    PRETRAINING[task] = examples
    PRETRAIN_SETTINGS[task] = dict(settings)


def build_processor():
    """The tiny ``LlavaProcessor``: CLIP image processor at 32 × 32 (patch 8: 16 image tokens per picture) and
    the character tokenizer."""
    from transformers import CLIPImageProcessor, LlavaProcessor

    from ...model.loading import char_tokenizer

    chars = list(string.printable[:95]) + ["\n"]  # digits, letters, punctuation, space, newline
    tok = char_tokenizer(SPECIALS + chars, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", bos_token="<bos>")
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN] + TAG_TOKENS})
    tok.padding_side = "left"
    ip = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                            do_resize=True, do_center_crop=True)
    return LlavaProcessor(image_processor=ip, tokenizer=tok, patch_size=PATCH, vision_feature_select_strategy="default",
                          num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE, image_token=IMAGE_TOKEN)


def llava_config(tok, hidden: int = 64, layers: int = 2) -> dict:
    """The tiny LLaVA: CLIP ViT (32 px, patch 8, width 64, 2 layers, 4 heads), Llama decoder (width 64, 2 layers,
    4 heads, 2 KV heads, 512 positions, tied embeddings); the CLS token is dropped ("default" strategy)."""
    vision = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                  image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=hidden)
    text = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                tie_word_embeddings=True)
    return {"vision": vision, "text": text, "image_token_index": tok.convert_tokens_to_ids(IMAGE_TOKEN)}


def build_model(config: dict, seed: int = 0):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration
    cfg = LlavaConfig(vision_config=CLIPVisionConfig(**config["vision"]), text_config=LlamaConfig(**config["text"]),
                      image_token_index=config["image_token_index"], vision_feature_select_strategy="default",
                      vision_feature_layer=-1, projector_hidden_act="gelu", tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlavaForConditionalGeneration(cfg).float()


def pretrain_recipe(task: str, iterations: int = 0) -> dict:
    """Everything that determines the pre-trained weights of ``task``'s tiny VLM (hashed into the cache name);
    ``iterations`` > 0 replaces the task's tuned count (``vlm_pretrain_steps``: quick smoke runs)."""
    from .scenes import SCENES_VERSION
    tok = build_processor().tokenizer
    settings = {"iterations": PRETRAIN_ITERATIONS, "examples": PRETRAIN_EXAMPLES, "batch_size": 64,
                "learning_rate": 1e-3, "lr_schedule": "constant", **PRETRAIN_SETTINGS.get(task, {})}
    init_from = settings.pop("init_from", None if task == BACKBONE_TASK else BACKBONE_TASK)
    if int(iterations) > 0:  # a smoke run's model: a few steps from random weights, no backbone, and only the
        settings["iterations"], init_from = int(iterations), None  # examples its steps can draw (rendering 4,000
        settings["examples"] = min(settings["examples"], int(iterations) * settings["batch_size"])  # cost 5-30 s)
    if init_from is not None:
        from ...model.cache import recipe_hash
        settings["init_from"] = {"task": init_from, "recipe_sha256": recipe_hash(pretrain_recipe(init_from))}
    return {"kind": "llava", "version": 1, "task": task, "scenes": SCENES_VERSION, "llava": llava_config(tok),
            "tags": TAG_TOKENS, **settings, "optimizer": "AdamW", "weight_decay": 0.0,
            "loss": "cross-entropy of the target tokens and <eos> given prompt and pictures", "seed": 0,
            "dtype": "float32", "threads": 1}


def sft_tensors(processor, examples: list[tuple[dict, str]]) -> dict:
    """Input ids (prompt + target + ``<eos>``, left-padded), attention mask, labels (-100 off the target) and
    ``pixel_values`` of the examples."""
    from .prompts import encode_prompts
    rows = [r for r, _ in examples]
    enc = encode_prompts(processor, rows)
    tok = processor.tokenizer
    targets = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for _, t in examples]
    width = max(map(len, targets))
    tgt = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    tmask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, t in enumerate(targets):
        tgt[i, :len(t)], tmask[i, :len(t)] = torch.tensor(t), 1
    ids = torch.cat([enc["input_ids"], tgt], 1)
    am = torch.cat([enc["attention_mask"], tmask], 1)
    labels = torch.cat([torch.full_like(enc["input_ids"], -100), tgt.masked_fill(tmask == 0, -100)], 1)
    return {"input_ids": ids, "attention_mask": am, "labels": labels, "pixel_values": enc["pixel_values"],
            "images_per_row": enc["images_per_row"]}


def pretrain(task: str, recipe: dict | None = None, log=None):
    """``(model, processor, loss_curve)``: the tiny VLM trained on ``task``'s pre-training examples."""
    from ...model.cache import fit, pretraining

    if task not in PRETRAINING:
        raise ValueError(f"model 'tiny' (the built-in tiny VLM) is pre-trained on the run's task, and task "
                         f"{task!r} registers no pre-training examples; tasks that do: {sorted(PRETRAINING)} "
                         f"(or pass --model with a VLM folder)")
    recipe = recipe or pretrain_recipe(task)
    processor = build_processor()
    examples = [PRETRAINING[task](i) for i in range(recipe["examples"])]
    data = sft_tensors(processor, examples)
    k = data["images_per_row"]
    pv = data["pixel_values"].view(len(examples), k, *data["pixel_values"].shape[1:])
    if recipe.get("init_from"):  # start from the backbone task's pre-trained model
        from transformers import LlavaForConditionalGeneration
        model = LlavaForConditionalGeneration.from_pretrained(vlm_model_path(recipe["init_from"]["task"], log=log),
                                                              dtype=torch.float32)
    else:
        model = build_model(recipe["llava"], seed=recipe["seed"])
    g = torch.Generator().manual_seed(recipe["seed"])

    def loss(idx):
        am = data["attention_mask"][idx]
        return model(input_ids=data["input_ids"][idx], attention_mask=am, position_ids=positions(am),
                     pixel_values=pv[idx].flatten(0, 1), labels=data["labels"][idx]).loss

    with pretraining(recipe):
        losses = fit(model, len(examples), recipe, loss, g, name=f"vlm-{task}", log=log)
    return model, processor, losses


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: 0 at each row's first real token (``cumsum(mask) - 1``, 0 on pads)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def vlm_model_path(task: str, iterations: int = 0, log=print) -> Path:
    """Folder with ``task``'s pre-trained tiny VLM (built on first use): a Hugging Face folder (model +
    processor) plus ``meta.json``."""
    from ...model.cache import cached_build, cached_path

    if task not in PRETRAINING:
        pretrain(task)  # raises the error naming the tasks that can
    recipe = pretrain_recipe(task, iterations)

    def build(tmp: Path) -> dict:
        (model, processor, _), meta = timed_pretraining(recipe["seed"], pretrain, task, recipe)
        model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        return meta

    message = (f"[grpolab] pre-training the tiny vision-language model (LLaVA: CLIP 2 layers + Llama 2 layers, "
               f"width 64) on task {task!r} ({recipe['examples']} synthetic examples, {recipe['iterations']} "
               f"steps, one time, about 20-60 s) and caching it in {cached_path(f'vlm-{task}', recipe)}")
    return cached_build(f"vlm-{task}", recipe, build, log=log, message=message)
