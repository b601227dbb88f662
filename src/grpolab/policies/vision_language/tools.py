"""Deterministic image tools over the ``shapes`` scenes (VisTA's tool library, in miniature).

Each tool reads only the picture (``uint8 [H, W, 3]``, :mod:`grpolab.policies.vision_language.scenes`) and returns one short line of
text; none reads the scene's metadata. The picture is split into *objects* = 4-connected components of pixels of
one palette colour (:data:`~grpolab.policies.vision_language.scenes.COLOURS`; the background and any other colour are ignored). The
scene generator keeps shapes at least one pixel apart, so each component is one shape; a component's *shape* is
read from how much of its bounding box it fills (:func:`classify`: a square fills all of it, the inscribed disc
about pi/4, the triangle about half).

The library, in the order the ``visual_tools`` prompt numbers them (1-based, :data:`TOOLS`):

1. ``count``    — ``"count: 2 shapes"``
2. ``colours``  — ``"colours: red 1, green 0, blue 1, yellow 0"`` (shapes of each colour)
3. ``largest``  — ``"largest: blue"`` (the colour of the shape with the most pixels; ``"largest: tie"`` when two
   share the largest area, ``"largest: none"`` on an empty picture)
4. ``where``    — ``"where: red left top; blue right bottom"`` (each shape's colour and the halves its pixel centre
   lies in: ``x < W/2`` is left, ``y < H/2`` is top; shapes in raster order of their first pixel)
5. ``shapes``   — ``"shapes: circle, square"`` (the distinct shapes, alphabetical; ``"shapes: none"``)

Provenance: grpolab's own — a toy tool library standing in for VisTA's (arXiv 2505.20289) chart and geometry
tools (table extraction, SVG, captioners), which need models and data; the tools here are exact functions of
the pixels so that the frozen reasoner's correctness is decidable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .scenes import COLOURS


@dataclass(frozen=True)
class Blob:
    """One 4-connected component of one palette colour."""
    colour: str
    pixels: int
    box: tuple[int, int, int, int]      # x1, y1, x2, y2 inclusive
    centre: tuple[float, float]         # mean x, mean y of its pixels
    first: tuple[int, int]              # (y, x) of its first pixel in raster order

    @property
    def fill(self) -> float:
        x1, y1, x2, y2 = self.box
        return self.pixels / float((x2 - x1 + 1) * (y2 - y1 + 1))


def classify(blob: Blob) -> str:
    """``square`` if the blob fills > 0.95 of its bounding box, ``circle`` if > 0.65, else ``triangle``."""
    f = blob.fill
    return "square" if f > 0.95 else "circle" if f > 0.65 else "triangle"


def blobs(image: np.ndarray) -> list[Blob]:
    """The picture's objects (module docstring), in raster order of their first pixel."""
    img = np.asarray(image, dtype=np.uint8)
    H, W = img.shape[:2]
    out: list[Blob] = []
    for name, rgb in COLOURS.items():
        mask = np.all(img == np.array(rgb, dtype=np.uint8), axis=-1)
        seen = np.zeros_like(mask)
        for y0, x0 in zip(*np.nonzero(mask)):
            if seen[y0, x0]:
                continue
            stack, pts = [(int(y0), int(x0))], []
            seen[y0, x0] = True
            while stack:
                y, x = stack.pop()
                pts.append((y, x))
                for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                    v, u = y + dy, x + dx
                    if 0 <= v < H and 0 <= u < W and mask[v, u] and not seen[v, u]:
                        seen[v, u] = True
                        stack.append((v, u))
            ys = np.array([p[0] for p in pts])
            xs = np.array([p[1] for p in pts])
            out.append(Blob(name, len(pts), (int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())),
                            (float(xs.mean()), float(ys.mean())), min(pts)))
    return sorted(out, key=lambda b: b.first)


def count_tool(image) -> str:
    n = len(blobs(image))
    return f"count: {n} shape{'' if n == 1 else 's'}"


def colours_tool(image) -> str:
    bs = blobs(image)
    return "colours: " + ", ".join(f"{c} {sum(b.colour == c for b in bs)}" for c in COLOURS)


def largest_tool(image) -> str:
    bs = blobs(image)
    if not bs:
        return "largest: none"
    top = max(b.pixels for b in bs)
    best = [b for b in bs if b.pixels == top]
    return "largest: tie" if len(best) > 1 else f"largest: {best[0].colour}"


def where_tool(image) -> str:
    img = np.asarray(image)
    H, W = img.shape[:2]
    bs = blobs(img)
    if not bs:
        return "where: none"
    return "where: " + "; ".join(f"{b.colour} {'left' if b.centre[0] < W / 2 else 'right'} "
                                 f"{'top' if b.centre[1] < H / 2 else 'bottom'}" for b in bs)


def shapes_tool(image) -> str:
    kinds = sorted({classify(b) for b in blobs(image)})
    return "shapes: " + (", ".join(kinds) if kinds else "none")


#: the library: (name, function), numbered 1.. in the prompt
TOOLS: list[tuple[str, Callable[[np.ndarray], str]]] = [
    ("count", count_tool), ("colours", colours_tool), ("largest", largest_tool), ("where", where_tool),
    ("shapes", shapes_tool)]
TOOL_NAMES = [n for n, _ in TOOLS]


def run_tools(image, indices) -> list[str]:
    """The outputs of the tools ``indices`` (1-based, in the given order; out-of-range ones skipped)."""
    return [TOOLS[i - 1][1](image) for i in indices if 1 <= i <= len(TOOLS)]
