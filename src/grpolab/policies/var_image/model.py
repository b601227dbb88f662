"""A tiny next-scale (VAR) image model of the 8×8 digits: residual scalar quantisation over the scales 1×1, 2×2,
4×4, 8×8 (85 tokens) and a block-causal transformer that predicts each scale's token map in one forward
(design §5.5, ``var_image``; the setting of "VAR RL Done Right", seed 000-27).

Tokens. One shared codebook of :data:`K` = 32 *scalar* values v_0..v_31 (the [−1, 1] pixel scale). An image x
(``[1, 8, 8]``) becomes 4 token maps, coarsest first: with f_0 = 0 and, for scale k of side n_k ∈ (1, 2, 4, 8),

    r_k = avgpool_{n_k}(x − f_{k−1}),   c_k = nearest code of each element of r_k,   f_k = f_{k−1} + up(v[c_k]),

(``avgpool_n``: area averaging to n×n; ``up``: nearest-neighbour upsampling to 8×8, i.e. block replication), so
scale k's token map is the quantised residual of the image minus the upsampled sum of coarser scales, and the
decoded image is f_4 = Σ_k up(v[c_k]). Tokens are read scale by scale, each map in raster order: positions
0 (1×1), 1–4 (2×2), 5–20 (4×4), 21–84 (8×8); :func:`scale_ids` numbers them 1..4.

The codebook: Lloyd iterations in 1-D on the residual values of every scale of the 1,797 scikit-learn digits
(:data:`CODEBOOK_ITERATIONS` fixed iterations; the residuals are recomputed with the current codebook each
iteration, since they depend on it), initialised at the 32 mid-quantiles of the residuals of the unquantised
chain; a value that loses all its points keeps its place. Deterministic (no random draw).

The model (:class:`VARModel`): ``torch.nn.TransformerEncoder`` (2 pre-norm layers, width 64, 4 heads, MLP 128, no
dropout) over 86 positions: [class] + the 85 token positions. The input at a position of scale k is the
nearest-upsampled sum of the code embeddings of the scales < k (zero at scale 1) plus a learned position
embedding; a block-causal mask lets a position see the class and every position of its own and coarser scales;
a linear head gives K logits at every token position. Teacher forcing yields all 85 distributions in one
forward; sampling runs 4 forwards (scale k's inputs need scales < k only), each over all 86 positions (not yet
drawn codes are 0 and, by the mask, unseen), so sampled and recomputed log-probs come from the same computation.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ...model.cache import cached_build, cached_path, fit, pretraining
from .._image.codebook import TableCodebook

SIDES = (1, 2, 4, 8)  #: token map side of each scale, coarsest first
SCALES = len(SIDES)
OFFSETS = tuple(sum(s * s for s in SIDES[:k]) for k in range(SCALES + 1))  #: (0, 1, 5, 21, 85)
TOKENS = OFFSETS[-1]  #: tokens per image (85)
K = 32  #: codebook size (scalar residual values)
CODEBOOK_ITERATIONS = 20  #: Lloyd iterations of the scalar codebook (fixed)
NUM_CLASSES = 10
#: Pre-training iterations, tuned once for a base held-out accuracy (temperature-1 draws seeded per row, classifier
#: argmax = asked class) inside 0.3–0.85 so RL has room [measured, 20 seeded temperature-1 draws per class]: 150 →
#: 0.135, 400 → 0.215 (classes 0–4: 0.11, 5–9: 0.32; greedy 0.6; final loss 1.71): still below the target; 400 steps
#: took 83 s on one thread of a heavily loaded 2-core machine (load average 15).
PRETRAIN_ITERATIONS = 400


def scale_ids() -> torch.Tensor:
    """``[85]`` long: the scale (1 = 1×1 … 4 = 8×8) of each token position."""
    return torch.cat([torch.full((s * s,), k + 1, dtype=torch.long) for k, s in enumerate(SIDES)])


def up(x: torch.Tensor, side: int = 8) -> torch.Tensor:
    """Nearest-neighbour upsampling (block replication) of ``[N, C, n, n]`` to ``side`` × ``side``."""
    f = side // x.shape[-1]
    return x.repeat_interleave(f, dim=-2).repeat_interleave(f, dim=-1)


def nearest_code(values: torch.Tensor, book: torch.Tensor) -> torch.Tensor:
    """Index of the nearest codebook value of each element (ties: the lowest index)."""
    return (values.unsqueeze(-1) - book).abs().argmin(-1)


def residual_chain(images: torch.Tensor, book: torch.Tensor | None):
    """``(codes [N, 85] or None, residuals [N, 85])`` of images ``[N, 1, 8, 8]``: the residual r_k of every scale
    (module docstring), quantised with ``book`` (None: the unquantised chain, f_k = f_{k−1} + up(r_k))."""
    n = images.shape[0]
    f = torch.zeros_like(images)
    codes, res = [], []
    for side in SIDES:
        r = F.adaptive_avg_pool2d(images - f, side)
        res.append(r.reshape(n, -1))
        if book is None:
            f = f + up(r)
        else:
            c = nearest_code(r, book)
            codes.append(c.reshape(n, -1))
            f = f + up(book[c])
    return (torch.cat(codes, 1) if book is not None else None), torch.cat(res, 1)


class VarCodebook(TableCodebook):
    """``table``: the values v [K] (float32), in ``var_codebook.safetensors``; :meth:`encode` images
    ``[N, 1, 8, 8]`` → codes ``[N, 85]``, :meth:`decode` back."""

    file, key = "var_codebook.safetensors", "values"

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        return residual_chain(images.float(), self.table)[0]

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[N, 85]`` → images ``[N, 1, 8, 8]`` on the [−1, 1] scale: Σ_k up(v[c_k])."""
        v = self.table.to(codes.device)[codes.long()]
        n = codes.shape[0]
        out = torch.zeros(n, 1, 8, 8, dtype=v.dtype, device=codes.device)
        for k, side in enumerate(SIDES):
            out = out + up(v[:, OFFSETS[k]:OFFSETS[k + 1]].reshape(n, 1, side, side))
        return out


def fit_var_codebook(k: int = K, iterations: int = CODEBOOK_ITERATIONS) -> tuple[VarCodebook, float]:
    """``(codebook, round-trip MSE per pixel on [−1, 1] over all digits)`` (module docstring)."""
    from .._image.digits import load_digits_tensor

    images, _ = load_digits_tensor()
    _, res = residual_chain(images, None)
    flat = res.reshape(-1)
    book = torch.quantile(flat, (torch.arange(k, dtype=torch.float32) + 0.5) / k)
    for _ in range(iterations):
        _, res = residual_chain(images, book)
        flat = res.reshape(-1)
        assign = nearest_code(flat, book)
        sums = torch.zeros(k).index_add_(0, assign, flat)
        counts = torch.zeros(k).index_add_(0, assign, torch.ones_like(flat))
        book = torch.where(counts > 0, sums / counts.clamp(min=1), book)
    cb = VarCodebook(book.sort().values)  # ascending: code order follows value order
    mse = float((cb.decode(cb.encode(images)) - images).pow(2).mean())
    return cb, mse


# ---------------------------------------------------------------------------------------------------- model

def block_causal_mask() -> torch.Tensor:
    """``[86, 86]`` bool, True = may NOT attend: position 0 is the class (sees itself); a token of scale k sees the
    class and every token of scales ≤ k."""
    level = torch.cat([torch.zeros(1, dtype=torch.long), scale_ids()])
    return level[None, :] > level[:, None]


class VARModel(nn.Module):
    """[class] + 85 token positions → K logits per token position (module docstring)."""

    def __init__(self, codes: int = K, width: int = 64, layers: int = 2, heads: int = 4, classes: int = NUM_CLASSES):
        super().__init__()
        self.config = {"codes": codes, "width": width, "layers": layers, "heads": heads, "classes": classes}
        self.class_emb = nn.Embedding(classes, width)
        self.code_emb = nn.Embedding(codes, width)
        self.pos_emb = nn.Parameter(torch.randn(1 + TOKENS, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, codes)
        self.register_buffer("mask", block_causal_mask(), persistent=False)

    def inputs(self, codes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``[R, 86, W]``: class embedding, then at scale k's positions Σ_{j<k} up(E[c_j]) (+ positions)."""
        R = codes.shape[0]
        e = self.code_emb(codes.long())  # [R, 85, W]
        W = e.shape[-1]
        acc = torch.zeros(R, W, 8, 8, dtype=e.dtype, device=e.device)
        parts = [self.class_emb(labels.long())[:, None]]
        for k, side in enumerate(SIDES):
            step = 8 // side
            parts.append(acc[:, :, ::step, ::step].reshape(R, W, side * side).transpose(1, 2))
            emb = e[:, OFFSETS[k]:OFFSETS[k + 1]].transpose(1, 2).reshape(R, W, side, side)
            acc = acc + up(emb)
        return torch.cat(parts, 1) + self.pos_emb

    def forward(self, codes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Logits ``[R, 85, K]`` of every token given the coarser scales of ``codes`` (teacher forcing)."""
        h = self.encoder(self.inputs(codes, labels), mask=self.mask)
        return self.head(self.norm(h[:, 1:]))


def var_recipe() -> dict:
    """Everything that determines the codebook and the pre-trained weights (hashed into the cache folder's name)."""
    return {"kind": "var", "version": 1, "sides": list(SIDES), "k": K, "codebook_iterations": CODEBOOK_ITERATIONS,
            "codebook_init": "mid-quantiles of the unquantised residual chain", "model": {"width": 64, "layers": 2,
            "heads": 4, "mlp": 128, "norm_first": True}, "iterations": PRETRAIN_ITERATIONS, "batch_size": 64,
            "optimizer": "AdamW", "learning_rate": 3e-3, "weight_decay": 0.0, "lr_schedule": "cosine",
            "loss": "cross-entropy on all 85 tokens (teacher forcing)",
            "data": "sklearn.datasets.load_digits, all 1797, pixel/8-1", "seed": 0, "dtype": "float32", "threads": 1}


def build_var_model(recipe: dict, seed: int = 0) -> VARModel:
    m = recipe["model"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return VARModel(recipe["k"], m["width"], m["layers"], m["heads"]).float()


def pretrain_var(recipe: dict | None = None, log=None):
    """``(model, codebook, loss_curve, codebook_mse)``, not cached (see :func:`var_model_path`)."""
    from .._image.digits import load_digits_tensor

    recipe = recipe or var_recipe()
    book, mse = fit_var_codebook(recipe["k"], recipe["codebook_iterations"])
    images, labels = load_digits_tensor()
    codes = book.encode(images)
    model = build_var_model(recipe, seed=recipe["seed"])
    g = torch.Generator().manual_seed(recipe["seed"])

    def batch_loss(idx):
        logits = model(codes[idx], labels[idx])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), codes[idx].reshape(-1))

    with pretraining(recipe):
        losses = fit(model, len(codes), recipe, batch_loss, g, name="var", log=log)
    return model, book, losses, mse


def save_var(model: VARModel, book: VarCodebook, path) -> None:
    """``config.json`` + ``model.safetensors`` + ``var_codebook.safetensors`` into folder ``path``."""
    from safetensors.torch import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"kind": "var_image", **model.config}, indent=2) + "\n")
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    book.save(path)


def load_var(path) -> tuple[VARModel, VarCodebook]:
    from safetensors.torch import load_file
    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    model = VARModel(cfg["codes"], cfg["width"], cfg["layers"], cfg["heads"], cfg["classes"])
    model.load_state_dict(load_file(str(path / "model.safetensors")))
    return model.float().eval(), VarCodebook.load(path)


def var_model_path(log=print) -> Path:
    """Folder with the pre-trained tiny VAR digits model (built on first use, cached): ``config.json``,
    ``model.safetensors``, ``var_codebook.safetensors``, ``meta.json``."""
    recipe = var_recipe()

    def build(tmp: Path) -> dict:
        t0 = time.perf_counter()
        model, book, losses, mse = pretrain_var(recipe)
        seconds = time.perf_counter() - t0
        save_var(model, book, tmp)
        return {"seed": recipe["seed"], "parameters": sum(p.numel() for p in model.parameters()),
                "loss_curve": losses, "codebook_round_trip_mse": round(mse, 6), "train_seconds": round(seconds, 2)}

    message = (f"[grpolab] pre-training the tiny next-scale (VAR) digits model (transformer, 2 layers, width 64, "
               f"scales 1/2/4/8 over a 32-value residual codebook; {recipe['iterations']} steps, one time, about "
               f"10-30 s) and caching it in {cached_path('digits-var', recipe)}")
    return cached_build("digits-var", recipe, build, log=log, message=message)
