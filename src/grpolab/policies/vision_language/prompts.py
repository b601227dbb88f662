"""A vision row's prompt as the processor reads it, following TRL's convention for VLM GRPO.

TRL (``trl/data_utils.py``, ``prepare_multimodal_messages``) takes a conversational ``prompt`` and the row's
``image`` / ``images``, turns every string ``content`` into typed blocks and inserts one ``{"type": "image"}``
block per picture before the first user message's text; the processor's chat template then writes the prompt and
expands each image placeholder into the model's image tokens. :func:`prompt_messages` does the same. Where TRL
refuses a plain-string prompt next to images, grpolab wraps it as one user message (it has no template applied:
the tiny tokenizer and the chat template are the processor's). A prompt whose blocks already hold image
placeholders keeps them; their number must equal the number of pictures.
"""
from __future__ import annotations

from .scenes import row_images


def prompt_messages(row: dict, n_images: int, where: str = "row") -> list[dict]:
    """The row's conversation with ``n_images`` image blocks (module docstring)."""
    prompt = row.get("prompt")
    if prompt is None:
        raise ValueError(f"{where}: the column 'prompt' is missing (a string or a list of chat messages)")
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    blocks = []
    for m in msgs:
        c = m.get("content")
        m["content"] = [{"type": "text", "text": c}] if isinstance(c, str) else [  # a Parquet / datasets struct
            {k: v for k, v in b.items() if v is not None} for b in (c or [])]      # column's "text": None dropped
        blocks += m["content"]
    present = sum(1 for b in blocks if b.get("type") == "image")
    if present:
        if present != n_images:
            raise ValueError(f"{where}: the prompt has {present} image placeholders but the row has {n_images} "
                             f"pictures")
        return msgs
    for m in msgs:
        if m.get("role") == "user":
            m["content"] = [{"type": "image"} for _ in range(n_images)] + m["content"]
            return msgs
    raise ValueError(f"{where}: the prompt has no user message to put the picture in")


def encode_prompts(processor, rows: list[dict], max_prompt_length: int = 0, *, same_count: bool = True,
                   nested: bool = False) -> dict:
    """``input_ids`` / ``attention_mask`` (left-padded), ``pixel_values`` (the processor's: [N · k, 3, H, W] for
    LLaVA), ``images_per_row`` k and ``outputs`` (every tensor the processor returned) of ``rows``, via the
    processor's chat template. ``same_count``: every row shows the same number of pictures (LLaVA stacks them);
    ``nested``: the pictures go to the processor as one list per row (Idefics3's processor wants that)."""
    from PIL import Image

    pictures = [row_images(r, f"row {i}") for i, r in enumerate(rows)]
    counts = {len(p) for p in pictures}
    if same_count and len(counts) != 1:
        raise ValueError(f"every row of a vision-language batch must show the same number of pictures; got "
                         f"{sorted(counts)}")
    k = max(counts)
    texts = [processor.apply_chat_template(prompt_messages(r, len(pictures[i]), f"row {i}"),
                                           add_generation_prompt=True, tokenize=False) for i, r in enumerate(rows)]
    processor.tokenizer.padding_side = "left"
    images = [[Image.fromarray(a) for a in p] for p in pictures]
    enc = processor(text=texts, images=images if nested else [im for p in images for im in p], return_tensors="pt",
                    padding=True)
    if max_prompt_length and enc["input_ids"].shape[1] > max_prompt_length:
        raise ValueError(f"max_prompt_length: a prompt with its image tokens is {enc['input_ids'].shape[1]} tokens, "
                         f"more than max_prompt_length {max_prompt_length} (raise it; a picture's tokens cannot be "
                         f"cut)")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
            "pixel_values": enc["pixel_values"].float(), "images_per_row": k, "texts": texts, "outputs": dict(enc)}
