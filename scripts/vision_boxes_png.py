"""Draw held-out shape_grounding scenes with the target box (white) and a model's greedy box (yellow) as one PNG.

Usage: python scripts/vision_boxes_png.py MODEL_FOLDER OUT.png [N]  (MODEL_FOLDER: a run's final/ or the cached
tiny VLM). The pictures in docs/vision.md were made with it: the cached backbone and runs/vlm_0/final of the
measured run (`grpolab train --recipe vlm_grpo --steps 30 --seed 0 --threads 1 --out runs/vlm_0`).
"""
from __future__ import annotations

import sys

import torch
from PIL import Image, ImageDraw

from grpolab.policies.vision_language.policy import VisionLanguagePolicy
from grpolab.policies.vision_language.tasks import grounding_row, parse_box
from grpolab.policies.vision_language.scenes import shapes_scene
from grpolab.policies.vision_language.tiny import EVAL_BASE

SCALE = 6


def main(folder: str, out: str, n: int = 8) -> None:
    torch.set_num_threads(1)
    policy = VisionLanguagePolicy(model=folder, task="shape_grounding", temperature=1.0, max_completion_length=24,
                                  max_prompt_length=0)
    model = policy.load(None, [], [], log=lambda *a: None)
    rows = [grounding_row(EVAL_BASE + i)[0] for i in range(n)]
    batch = policy.sample(model, rows, list(range(n)), num_generations=1, temperature=0.0, evaluation=True)
    size = 32 * SCALE
    canvas = Image.new("RGB", (n * (size + 4) + 4, size + 8), (0, 0, 0))
    for i, (row, text) in enumerate(zip(rows, batch.columns["completion"])):
        img = Image.fromarray(shapes_scene(row["scene_seed"]).image).resize((size, size), Image.NEAREST)
        draw = ImageDraw.Draw(img)
        for box, colour in ((row["target_box"], (255, 255, 255)), (parse_box(text), (255, 230, 0))):
            if box is not None:
                x1, y1, x2, y2 = (float(v) for v in box)
                draw.rectangle([x1 * SCALE, y1 * SCALE, (x2 + 1) * SCALE - 1, (y2 + 1) * SCALE - 1], outline=colour,
                               width=2)
        canvas.paste(img, (4 + i * (size + 4), 4))
    canvas.save(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8)
