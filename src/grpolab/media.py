"""PNG rendering of image batches: grids for evaluation (``image_grid`` in summary.json and the report) and small
thumbnails as data URIs for the completions log and the HTML report.

Convention: every function here takes float images ``[B, C, H, W]`` (or one ``[C, H, W]``) **in [0, 1]**, C = 1
(grey) or 3 (RGB), as ``row_data["images"]`` holds them. The digits models work in [−1, 1]: map with
:func:`from_signed` (``(x + 1) / 2``) first. Values outside [0, 1] are clipped.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import torch


def from_signed(images: torch.Tensor) -> torch.Tensor:
    """[−1, 1] → [0, 1]."""
    return (images + 1) / 2


def to_uint8(images) -> np.ndarray:
    """Images ``[B, C, H, W]`` (or ``[C, H, W]``) in [0, 1] → uint8 ``[B, H, W, C]`` (``[H, W, C]``),
    ``round(255·x)`` after clipping."""
    x = torch.as_tensor(images).detach().to("cpu", torch.float32)
    if x.dim() not in (3, 4) or x.shape[-3] not in (1, 3):
        raise ValueError(f"expected images [B, 1|3, H, W] or [1|3, H, W], got shape {tuple(x.shape)}")
    x = (x.clamp(0, 1) * 255).round().to(torch.uint8)
    return x.movedim(-3, -1).numpy()


def _pil(array: np.ndarray):
    from PIL import Image

    return Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)  # uint8: mode L or RGB


def grid_png(images, rows: int, cols: int, scale: int = 4, pad: int = 1) -> bytes:
    """A ``rows × cols`` grid (row-major; missing cells stay black) of images in [0, 1], each upscaled
    ``scale``× by nearest neighbour, ``pad`` black pixels between cells (and around), as PNG bytes. The
    PNG is ``cols·(W·scale + pad) + pad`` wide and ``rows·(H·scale + pad) + pad`` high."""
    arr = to_uint8(images)
    if arr.ndim == 3:
        arr = arr[None]
    if len(arr) > rows * cols:
        raise ValueError(f"{len(arr)} images do not fit a {rows}x{cols} grid")
    _, h, w, c = arr.shape
    ch, cw = h * scale, w * scale
    canvas = np.zeros((rows * (ch + pad) + pad, cols * (cw + pad) + pad, c), dtype=np.uint8)
    for i, img in enumerate(arr):
        r, k = divmod(i, cols)
        y, x = pad + r * (ch + pad), pad + k * (cw + pad)
        canvas[y:y + ch, x:x + cw] = img.repeat(scale, axis=0).repeat(scale, axis=1)
    return _png(canvas)


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    _pil(array).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def png_data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def thumbnail_data_uri(image, size: int = 32) -> str:
    """One image ``[C, H, W]`` in [0, 1] as a ``size × size`` PNG data URI (nearest-neighbour resize)."""
    from PIL import Image

    arr = to_uint8(image)
    if arr.ndim == 4:
        if len(arr) != 1:
            raise ValueError(f"thumbnail_data_uri takes one image, got {len(arr)}")
        arr = arr[0]
    img = _pil(arr).resize((size, size), Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return png_data_uri(buf.getvalue())


def to_data_uri(image) -> str:
    """A picture (anything :func:`to_array` reads) as a PNG data URI: how the Python API carries a PIL image in a
    row through grpolab's JSONL data checks."""
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(to_array(image)).save(buf, format="PNG")
    return png_data_uri(buf.getvalue())


def to_array(image, where: str = "row") -> np.ndarray:
    """uint8 [H, W, 3] from a PIL image, an array / nested list (uint8, or floats in [0, 1]), a file path or a
    ``data:image/...;base64,`` URI."""
    if isinstance(image, str):
        from PIL import Image
        try:
            if image.startswith("data:image/"):
                with Image.open(io.BytesIO(base64.b64decode(image.split(",", 1)[1]))) as im:
                    return np.asarray(im.convert("RGB"), dtype=np.uint8)
            with Image.open(image) as im:
                return np.asarray(im.convert("RGB"), dtype=np.uint8)
        except (OSError, ValueError, IndexError) as e:
            raise ValueError(f"{where}: 'image' {image[:60]!r} could not be read as a picture ({e})") from None
    if hasattr(image, "convert"):  # PIL
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
    a = np.asarray(image)
    if a.ndim != 3 or a.shape[2] != 3:
        raise ValueError(f"{where}: 'image' must be a PIL image, a file path or an [H, W, 3] array; got shape "
                         f"{a.shape}")
    if a.dtype != np.uint8:
        a = np.clip(np.round(a.astype(np.float64) * (255.0 if a.max() <= 1.0 else 1.0)), 0, 255).astype(np.uint8)
    return a
