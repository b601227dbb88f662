"""Synthetic scenes for the vision-language policy: coloured shapes on a small canvas, drawn with NumPy.

A scene is a pure function of its integer seed (``numpy.random.default_rng([SCENES_VERSION, kind_id, seed])``,
PCG64: the same pixels on any machine). Nothing is downloaded. The canvas is :data:`SIZE` × :data:`SIZE` RGB
(uint8), background :data:`BACKGROUND`; coordinates are pixels, ``x`` to the right and ``y`` down, from 0 to
``SIZE - 1``; a box ``[x1, y1, x2, y2]`` includes both corners (:func:`box_mask`).

Kinds of scene (``SCENE_KINDS``; a data row names one by ``scene_kind`` and ``scene_seed``, and
:func:`row_images` renders it; other modules add kinds with :func:`register_scene`):

* ``shapes`` (:func:`shapes_scene`): 1–3 non-overlapping shapes (square, circle, triangle) of distinct
  (colour, shape) pairs, 7–13 px wide, in 4 colours; one of them is the target the question names.

A data row may instead carry its own picture, as TRL's VLM datasets do: ``image`` (a PIL image, an ``[H, W, 3]``
uint8 array or nested list, a file path or a PNG/JPEG data URI) or ``images`` (a list of them).

Provenance: grpolab's own — toy scenes for the vision-language policy's tests and demos; no published method.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from ...media import to_array  # picture conversion lives in media.py

SCENES_VERSION = 1
SIZE = 32
BACKGROUND = (24, 24, 24)
COLOURS = {"red": (230, 40, 40), "green": (40, 200, 60), "blue": (50, 90, 240), "yellow": (240, 220, 40)}
SHAPES = ("square", "circle", "triangle")
MIN_SIDE, MAX_SIDE = 7, 13


@dataclass
class SceneObject:
    shape: str
    colour: str
    box: list[int]          # [x1, y1, x2, y2], inclusive
    mask: np.ndarray        # bool [SIZE, SIZE]

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclass
class Scene:
    image: np.ndarray                     # uint8 [SIZE, SIZE, 3]
    objects: list[SceneObject]
    target: int = 0                       # index into objects
    extra: dict = field(default_factory=dict)


SCENE_KINDS: dict[str, Callable[[int], object]] = {}


def register_scene(kind: str, render: Callable[[int], object]) -> None:
    """Add a kind of scene: ``render(seed)`` returns an object with ``.image`` (uint8 [H, W, 3]) or ``.frames``
    (a list of them)."""
    SCENE_KINDS[kind] = render


def box_mask(box, size: int = SIZE) -> np.ndarray:
    """bool [size, size]: the pixels with x1 <= x <= x2 and y1 <= y <= y2 (corners clipped to the canvas; an
    inverted box is empty)."""
    x1, y1, x2, y2 = (int(round(float(v))) for v in box)
    m = np.zeros((size, size), dtype=bool)
    x1, y1 = max(x1, 0), max(y1, 0)
    x2, y2 = min(x2, size - 1), min(y2, size - 1)
    if x2 >= x1 and y2 >= y1:
        m[y1:y2 + 1, x1:x2 + 1] = True
    return m


def shape_mask(shape: str, box: list[int], size: int = SIZE) -> np.ndarray:
    """The pixels of ``shape`` drawn in ``box``: the whole box (square), the inscribed disc (circle), or the
    isosceles triangle with its apex at the top middle and its base on the box's bottom row (triangle)."""
    x1, y1, x2, y2 = box
    ys, xs = np.mgrid[0:size, 0:size]
    inside = (xs >= x1) & (xs <= x2) & (ys >= y1) & (ys <= y2)
    if shape == "square":
        return inside
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    if shape == "circle":
        r = (x2 - x1 + 1) / 2
        return inside & ((xs - cx) ** 2 + (ys - cy) ** 2 <= r * r)
    if shape == "triangle":
        h = max(y2 - y1, 1)
        half = (x2 - x1 + 1) / 2 * (ys - y1 + 0.5) / (h + 0.5)   # half-width grows linearly down the box
        return inside & (np.abs(xs - cx) <= half)
    raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")


def _overlaps(box, boxes, gap: int = 1) -> bool:
    return any(not (box[2] + gap < b[0] or b[2] + gap < box[0] or box[3] + gap < b[1] or b[3] + gap < box[1])
               for b in boxes)


def place_objects(rng: np.random.Generator, n: int, size: int = SIZE, pairs=None) -> list[SceneObject]:
    """``n`` non-overlapping shapes with distinct (colour, shape) pairs (rejection sampling, deterministic in
    ``rng``)."""
    pairs = pairs or [(c, s) for c in COLOURS for s in SHAPES]
    chosen = rng.choice(len(pairs), size=n, replace=False)
    objects: list[SceneObject] = []
    for k in chosen:
        colour, shape = pairs[int(k)]
        for _ in range(200):
            side = int(rng.integers(MIN_SIDE, MAX_SIDE + 1))
            x1, y1 = (int(v) for v in rng.integers(0, size - side + 1, size=2))
            box = [x1, y1, x1 + side - 1, y1 + side - 1]
            if not _overlaps(box, [o.box for o in objects]):
                break
        else:  # pragma: no cover - the canvas always has room for 3 shapes of <= 13 px
            raise RuntimeError("could not place the shapes")
        objects.append(SceneObject(shape, colour, box, shape_mask(shape, box, size)))
    return objects


def paint(objects: list[SceneObject], size: int = SIZE, background=BACKGROUND) -> np.ndarray:
    img = np.empty((size, size, 3), dtype=np.uint8)
    img[:] = background
    for o in objects:
        img[o.mask] = COLOURS[o.colour]
    return img


def shapes_scene(seed: int) -> Scene:
    """1–3 shapes; the target is one of them, uniformly. Pure function of ``seed``."""
    rng = np.random.default_rng([SCENES_VERSION, 1, int(seed)])
    n = int(rng.integers(1, 4))
    objects = place_objects(rng, n)
    return Scene(paint(objects), objects, target=int(rng.integers(0, n)))


register_scene("shapes", shapes_scene)


def row_images(row: dict, where: str = "row") -> list[np.ndarray]:
    """The pictures a row shows the policy, in order (uint8 [H, W, 3] each): its ``images`` list, else its
    ``image``, else the built-in scene ``scene_kind`` / ``scene_seed`` (a scene's ``frames`` for a clip); with a
    ``frame_noise_std`` column (> 0), every picture degraded by :func:`noisy_frames`."""
    frames = _row_pictures(row, where)
    std = row.get("frame_noise_std")
    return noisy_frames(frames, float(std), int(row.get("frame_noise_seed") or 0)) if std else frames


def noisy_frames(frames: list[np.ndarray], std: float, seed: int) -> list[np.ndarray]:
    """Frame-level Gaussian noise (DeepVideo-R1's difficulty-increasing augmentation, seed 000-04): each pixel value
    plus ``N(0, (255 std)^2)``, rounded and clipped to 0..255; draws from ``numpy.random.default_rng(seed)``, frame
    after frame (the same pixels on any machine)."""
    rng = np.random.default_rng(seed)
    return [np.clip(np.rint(f.astype(np.float64) + rng.normal(0.0, 255.0 * std, f.shape)), 0, 255).astype(np.uint8)
            for f in frames]


def _row_pictures(row: dict, where: str) -> list[np.ndarray]:
    if row.get("images") is not None:
        imgs = list(row["images"])
        if not imgs:
            raise ValueError(f"{where}: 'images' is an empty list")
        return [to_array(im, f"{where} images[{i}]") for i, im in enumerate(imgs)]
    if row.get("image") is not None:
        return [to_array(row["image"], where)]
    kind = row.get("scene_kind")
    if kind is None or row.get("scene_seed") is None:
        raise ValueError(f"{where}: a vision-language policy needs a picture: the column 'image' (a PIL image, an "
                         f"[H, W, 3] array or a file path), 'images' (a list of them), or a built-in scene "
                         f"('scene_kind' one of {sorted(SCENE_KINDS)} and 'scene_seed'); the row has {sorted(row)}")
    if kind not in SCENE_KINDS:
        raise ValueError(f"{where}: scene_kind {kind!r} is not a built-in scene; choose one of {sorted(SCENE_KINDS)}")
    scene = SCENE_KINDS[kind](int(row["scene_seed"]))
    frames = getattr(scene, "frames", None)
    return [np.asarray(f, dtype=np.uint8) for f in frames] if frames is not None else [scene.image]


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """|a ∩ b| / |a ∪ b| of two boolean masks; 0 when both are empty."""
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 0.0
