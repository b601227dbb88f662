"""How each family of vision-language model takes its pictures: the processor's tensors kept per row in a
rollout batch (``row_data``), the model's keyword arguments on a batch of rows, and its position ids.

Three layouts, chosen by the folder's ``config.model_type`` (:func:`layout_for`):

* ``stacked`` (LLaVA and any other class whose processor returns one ``[3, H, W]`` tensor per picture): row data
  ``pixel_values`` [R, k, 3, H, W] (every row shows the same number k of pictures); positions count each row's
  real tokens (``cumsum(mask) - 1``).
* ``split`` (Idefics3 / SmolVLM: ``Idefics3ForConditionalGeneration``, ``SmolVLMForConditionalGeneration``): the
  processor splits each picture into tiles plus a global view and returns 5-d ``pixel_values`` [R, n, 3, H, W]
  with ``pixel_attention_mask`` [R, n, H, W]; rows with fewer tiles are zero-padded, and the model itself drops
  all-zero tiles (``modeling_idefics3.py``: ``real_images_inds``). Positions as ``stacked``.
* ``patches`` (Qwen2-VL / Qwen2.5-VL: ``Qwen2VLForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration``):
  the processor returns the flattened patches of all pictures ``pixel_values`` [Σ patches, C·T·P·P] with
  ``image_grid_thw`` [pictures, 3]. Row data: each row's patches [R, Pmax, D] and grids [R, kmax, 3], zero-padded
  (a grid row of zeros is no picture); the model gets the real patches of the rows concatenated and their grids.
  Positions are the model's 3-D mRoPE ids, ``model.get_rope_index(input_ids, mm_token_type_ids, image_grid_thw,
  attention_mask=...)`` (text tokens share one id on the three axes, pictures get (t, h, w) ids); a sampled token
  continues at the previous position + 1 on every axis, as the model's own decoding does (its
  ``rope_deltas``).

Every layout's per-token log-probs equal a plain ``model(**processor(...))`` forward on the same rows
(tests/test_vlm_models.py).

Processors: ``AutoProcessor`` of the folder. Where it cannot be built because its video processor needs
``torchvision`` (absent from the CPU wheels of torch 2.13), the processor's work for pictures is done with the
folder's tokenizer, its PIL image processor (``AutoImageProcessor``, no torchvision) and its chat template:

* Qwen2-VL / Qwen2.5-VL, :class:`PatchProcessor`: each ``<|image_pad|>`` becomes ``image_grid_thw.prod() //
  merge_size²`` copies, ``mm_token_type_ids`` marks them (as ``Qwen2VLProcessor.replace_image_token`` and
  ``ProcessorMixin.create_mm_token_type_ids`` do);
* SmolVLM2 (``SmolVLMForConditionalGeneration``), :class:`SplitProcessor`: the image processor splits each
  picture (``return_row_col_info``) and each ``<image>`` becomes ``transformers``' own
  ``get_image_prompt_string(rows, cols, image_seq_len, ...)`` (``SmolVLMProcessor.replace_image_token``): per
  tile ``<fake_token_around_image><row_i_col_j>`` + ``image_seq_len`` image tokens, then the global view;
  ``image_seq_len`` from the folder's ``processor_config.json``, else ``(image_size // patch_size)² /
  scale_factor²`` of its config (the processor's definition). ``SmolVLMProcessor`` also needs ``num2words``, for
  video prompts only.

tests/test_vlm_models.py checks both equal the native processor's ``input_ids`` and picture tensors (the native
processor built there without its video part).

Provenance: grpolab's own, written from ``transformers``' modeling and processing files of these classes.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

PATCH_TYPES = ("qwen2_vl", "qwen2_5_vl")
SPLIT_TYPES = ("idefics3", "smolvlm")


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: 0 at each row's first real token (``cumsum(mask) - 1``, 0 on pads)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def _pad_stack(parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts`` [n_i, ...] stacked as [len, max n_i, ...], zero-padded."""
    width = max(p.shape[0] for p in parts)
    out = parts[0].new_zeros((len(parts), width, *parts[0].shape[1:]))
    for i, p in enumerate(parts):
        out[i, :p.shape[0]] = p
    return out


class Stacked:
    """LLaVA-style: one [3, H, W] tensor per picture (module docstring)."""
    name = "stacked"
    same_count = True  # every row of a run shows the same number of pictures (LLaVA stacks them)

    def row_data(self, enc: dict, rows: int, image_token_id) -> dict:
        pv = enc["pixel_values"]
        if pv.dim() != 4:
            from ...config import ConfigError
            raise ConfigError(f"model: the processor returns pixel_values of shape {tuple(pv.shape)}; this model "
                              f"class is not one policy vision_language knows (LLaVA-style [pictures, 3, H, W], "
                              f"Idefics3 / SmolVLM 5-d tiles, Qwen2-VL / Qwen2.5-VL flattened patches: "
                              f"docs/vision.md)")
        return {"pixel_values": pv.float().view(rows, -1, *pv.shape[1:])}

    def inputs(self, module, ids, am, data: dict, image_token_id) -> dict:
        return {"pixel_values": data["pixel_values"].flatten(0, 1), "position_ids": positions(am)}

    def next_positions(self, pos: torch.Tensor) -> torch.Tensor:
        """Positions of the next token from those of the last one ([R, 1] here)."""
        return pos + 1

    def last_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        return position_ids[:, -1:]

    def pictures(self, data: dict, i: int, processor) -> torch.Tensor:
        """Row ``i``'s pictures [k, 3, H, W] as the processor normalised them (the report's strip)."""
        return data["pixel_values"][i]


class Split(Stacked):
    """Idefics3 / SmolVLM: 5-d tiles with their pixel attention mask (module docstring)."""
    name = "split"
    same_count = False

    def row_data(self, enc: dict, rows: int, image_token_id) -> dict:
        out = {"pixel_values": enc["pixel_values"].float()}
        if enc.get("pixel_attention_mask") is not None:
            out["pixel_attention_mask"] = enc["pixel_attention_mask"].long()
        return out

    def inputs(self, module, ids, am, data: dict, image_token_id) -> dict:
        out = {"pixel_values": data["pixel_values"], "position_ids": positions(am)}
        if "pixel_attention_mask" in data:
            out["pixel_attention_mask"] = data["pixel_attention_mask"].bool()
        return out

    def pictures(self, data: dict, i: int, processor) -> torch.Tensor:
        pv = data["pixel_values"][i]
        return pv[pv.flatten(1).abs().sum(-1) > 0]  # the zero padding tiles dropped


class Patches(Stacked):
    """Qwen2-VL / Qwen2.5-VL: flattened patches, ``image_grid_thw``, 3-D mRoPE positions (module docstring)."""
    name = "patches"
    same_count = False

    def row_data(self, enc: dict, rows: int, image_token_id) -> dict:
        grid, pv = enc["image_grid_thw"].long(), enc["pixel_values"].float()
        per_image = grid.prod(-1)
        ids = enc["input_ids"]
        # the pictures of each row, in order: a row holds as many as its prompt has vision-start runs of image tokens
        counts = [_image_runs(ids[i], image_token_id) for i in range(rows)]
        if sum(counts) != len(grid):
            raise ValueError(f"the processor returned {len(grid)} image grids for {sum(counts)} pictures in the "
                             f"prompts")
        starts = torch.cumsum(torch.tensor([0] + counts), 0).tolist()
        offsets = torch.cumsum(torch.cat([per_image.new_zeros(1), per_image]), 0).tolist()
        patches = [pv[offsets[starts[i]]:offsets[starts[i + 1]]] for i in range(rows)]
        grids = [grid[starts[i]:starts[i + 1]] for i in range(rows)]
        return {"pixel_values": _pad_stack(patches), "image_grid_thw": _pad_stack(grids)}

    def inputs(self, module, ids, am, data: dict, image_token_id) -> dict:
        grid = data["image_grid_thw"]
        n = grid.prod(-1).sum(-1)  # real patches per row
        pv = torch.cat([data["pixel_values"][i, :int(n[i])] for i in range(len(n))])
        grid = grid[grid.prod(-1) > 0]
        mm = (ids == image_token_id).int()
        pos, _ = _model(module).get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=grid, attention_mask=am)
        return {"pixel_values": pv.to(data["pixel_values"].dtype), "image_grid_thw": grid, "position_ids": pos}

    def last_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        return position_ids[..., -1:]  # [3, R, 1]

    def pictures(self, data: dict, i: int, processor) -> torch.Tensor:
        """The first frame of each of row ``i``'s pictures, its patches put back in place (the inverse of the
        image processor's flattening: [gt·gh·gw, C·T·P·P] in (gt, gh/m, gw/m, m, m) order); only the first one
        when their sizes differ."""
        ip = processor.image_processor
        m, P, T = int(ip.merge_size), int(ip.patch_size), int(ip.temporal_patch_size)
        out, start = [], 0
        for t, h, w in data["image_grid_thw"][i].tolist():
            if t * h * w == 0:
                continue
            x = data["pixel_values"][i, start:start + t * h * w]
            start += t * h * w
            x = x.reshape(t, h // m, w // m, m, m, -1, T, P, P).permute(0, 6, 5, 1, 3, 7, 2, 4, 8)
            out.append(x.reshape(t * T, -1, h * P, w * P)[0])
        same = [p for p in out if p.shape == out[0].shape]
        return torch.stack(same)


def _model(module):
    """The inner model holding ``get_rope_index`` (``Qwen2VLForConditionalGeneration.model``)."""
    return module.model if hasattr(module.model, "get_rope_index") else module


def _image_runs(ids: torch.Tensor, image_token_id) -> int:
    """How many separate runs of image tokens ``ids`` holds (one per picture)."""
    m = (ids == image_token_id).long()
    return int(((m[1:] - m[:-1]) == 1).sum() + m[0])


LAYOUTS = {"stacked": Stacked(), "split": Split(), "patches": Patches()}


#: classes whose forward needs more than pictures and positions; refused rather than run wrongly
UNSUPPORTED = {"gemma3": "Gemma 3 attends bidirectionally within each picture's tokens through token_type_ids, "
                         "which this policy does not pass"}


def layout_for(config) -> Stacked:
    """The layout of a model config (by ``model_type``; every other class is ``stacked``); a class of
    :data:`UNSUPPORTED` is a ConfigError saying why."""
    kind = getattr(config, "model_type", "")
    if kind in UNSUPPORTED:
        from ...config import ConfigError
        raise ConfigError(f"model: model_type {kind!r} is not supported by policy vision_language: "
                          f"{UNSUPPORTED[kind]}; supported: LLaVA-style, Idefics3 / SmolVLM, Qwen2-VL / Qwen2.5-VL "
                          f"(docs/vision.md)")
    if kind in PATCH_TYPES:
        return LAYOUTS["patches"]
    if kind in SPLIT_TYPES:
        return LAYOUTS["split"]
    return LAYOUTS["stacked"]


# ------------------------------------------------------------------ processors
def load_processor(path: Path):
    """``AutoProcessor`` of ``path``; a Qwen2-VL / Qwen2.5-VL folder whose processor needs torchvision (its video
    processor) gets :class:`PatchProcessor` instead, a SmolVLM2 folder (torchvision, or num2words for its video
    prompts) :class:`SplitProcessor`; another processor that cannot be built is a ConfigError
    saying why."""
    from transformers import AutoProcessor

    from ...config import ConfigError
    try:
        return AutoProcessor.from_pretrained(path)
    except ImportError as e:
        kind, why = _model_type(path), str(e).lower()
        if kind in PATCH_TYPES and "torchvision" in why:
            return PatchProcessor.from_folder(path)
        if kind == "smolvlm" and ("torchvision" in why or "num2words" in why):
            return SplitProcessor.from_folder(path)
        raise ConfigError(f"model: the processor of {path} (model_type {kind!r}) cannot be built here: "
                          f"{' '.join(str(e).split())[:300]} (install what it names)") from None


def _model_type(path: Path) -> str:
    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type", "")
    except (OSError, ValueError):
        return ""


class FolderProcessor:
    """A folder's processor for pictures without its video part (module docstring): the tokenizer, the PIL image
    processor and the chat template; ``apply_chat_template`` and ``save_pretrained`` (tokenizer, image processor,
    chat template and the folder's other processor files as they were). Subclasses write ``__call__``."""

    FILES = ("processor_config.json", "video_preprocessor_config.json", "chat_template.json", "chat_template.jinja")
    DEFAULT_IMAGE_TOKEN = "<image>"

    def __init__(self, tokenizer, image_processor, chat_template: str | None, source: Path | None = None):
        self.tokenizer, self.image_processor, self.chat_template = tokenizer, image_processor, chat_template
        self.image_token = getattr(tokenizer, "image_token", None) or self.DEFAULT_IMAGE_TOKEN
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.source = source

    @classmethod
    def from_folder(cls, path: Path):
        from transformers import AutoImageProcessor, AutoTokenizer
        path = Path(path)
        template = None
        if (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()
        elif (path / "chat_template.json").exists():
            template = json.loads((path / "chat_template.json").read_text()).get("chat_template")
        tok = AutoTokenizer.from_pretrained(path)
        return cls(tok, AutoImageProcessor.from_pretrained(path), template or tok.chat_template, path)

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, **kwargs)

    def save_pretrained(self, path) -> None:
        path = Path(path)
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)
        for name in self.FILES:
            if self.source is not None and (self.source / name).exists() and not (path / name).exists():
                shutil.copy(self.source / name, path / name)
        if self.chat_template and not any((path / n).exists() for n in ("chat_template.jinja", "chat_template.json")):
            (path / "chat_template.jinja").write_text(self.chat_template)


class PatchProcessor(FolderProcessor):
    """Qwen2-VL / Qwen2.5-VL's processor without its video part (module docstring): ``__call__(text=, images=)``
    returning ``input_ids``, ``attention_mask``, ``mm_token_type_ids``, ``pixel_values``, ``image_grid_thw``."""

    DEFAULT_IMAGE_TOKEN = "<|image_pad|>"

    def __call__(self, text, images=None, return_tensors="pt", padding=True, **kwargs):
        merge = int(getattr(self.image_processor, "merge_size", 2))
        texts = [text] if isinstance(text, str) else list(text)
        out = {}
        if images:
            out = dict(self.image_processor(images=images, return_tensors="pt"))
            counts = iter((out["image_grid_thw"].prod(-1) // merge ** 2).tolist())
            hold = "<|grpolab_placeholder|>"
            texts = [t.replace(self.image_token, hold) for t in texts]
            for i, t in enumerate(texts):
                while hold in t:
                    t = t.replace(hold, self.image_token * int(next(counts)), 1)
                texts[i] = t
        enc = self.tokenizer(texts, return_tensors=return_tensors, padding=padding, add_special_tokens=False)
        out.update(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                   mm_token_type_ids=(enc["input_ids"] == self.image_token_id).int())
        return out


class SplitProcessor(FolderProcessor):
    """SmolVLM2's processor (``SmolVLMProcessor``) without its video part (module docstring):
    ``__call__(text=, images=[[pictures of row 0], ...])`` returning ``input_ids``, ``attention_mask``,
    ``pixel_values`` [rows, tiles, 3, H, W] and ``pixel_attention_mask``, the picture placeholders expanded by
    ``transformers``' ``get_image_prompt_string`` as the native processor does."""

    def __init__(self, tokenizer, image_processor, chat_template: str | None, source: Path | None = None,
                 image_seq_len: int | None = None):
        super().__init__(tokenizer, image_processor, chat_template, source)
        self.fake_image_token = getattr(tokenizer, "fake_image_token", None) or "<fake_token_around_image>"
        self.global_image_token = getattr(tokenizer, "global_image_token", None) or "<global-img>"
        self.image_seq_len = image_seq_len if image_seq_len is not None else _image_seq_len(source)

    def __call__(self, text, images=None, return_tensors="pt", padding=True, **kwargs):
        from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string
        texts = [text] if isinstance(text, str) else list(text)
        out = {}
        if images:
            nested = [list(p) if isinstance(p, (list, tuple)) else [p] for p in images]
            found = [t.count(self.image_token) for t in texts]
            if found != [len(p) for p in nested]:
                raise ValueError(f"the prompts hold {found} {self.image_token} placeholders per row for "
                                 f"{[len(p) for p in nested]} pictures")
            out = dict(self.image_processor(images=nested, return_tensors="pt", return_row_col_info=True))
            rows, cols = out.pop("rows"), out.pop("cols")
            for i, t in enumerate(texts):
                parts = t.split(self.image_token)
                texts[i] = parts[0] + "".join(
                    get_image_prompt_string(rows[i][j], cols[i][j], self.image_seq_len,
                                            fake_token_around_image=self.fake_image_token,
                                            image_token=self.image_token,
                                            global_image_token=self.global_image_token) + rest
                    for j, rest in enumerate(parts[1:]))
        enc = self.tokenizer(texts, return_tensors=return_tensors, padding=padding)
        out.update(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
        return out


def _image_seq_len(path: Path | None) -> int:
    """Image tokens per tile of a SmolVLM folder: ``processor_config.json``'s ``image_seq_len``, else the
    processor's definition from the model config, ``(image_size // patch_size)² / scale_factor²``."""
    if path is not None and (Path(path) / "processor_config.json").exists():
        value = json.loads((Path(path) / "processor_config.json").read_text()).get("image_seq_len")
        if value is not None:
            return int(value)
    if path is not None and (Path(path) / "config.json").exists():
        cfg = json.loads((Path(path) / "config.json").read_text())
        vision = cfg.get("vision_config", {})
        if "image_size" in vision and "patch_size" in vision:
            return int((vision["image_size"] // vision["patch_size"]) ** 2 / cfg.get("scale_factor", 2) ** 2)
    from ...config import ConfigError
    raise ConfigError(f"model: {path} says neither image_seq_len (processor_config.json) nor its vision tower's "
                      f"image_size / patch_size (config.json): the number of image tokens per tile is unknown")
