"""What the policy losses share: per-row values broadcast to tokens, masked row and segment means, the pair
matrix and group centring of the group-coupled objectives, the anchor policy of GVPO / CoPG, and the config
checks registered with the losses (``POLICY_LOSSES.register(..., check=...)``)."""
from __future__ import annotations

import torch

from ...errors import ConfigError


def per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[R]`` per-row values broadcast to ``like``'s ``[R, T]``; ``[R, T]`` passes through."""
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages


# ------------------------------------------------------------------ config checks (registered with each component)
def _positive(*keys: str):
    """A config check: each of ``keys`` must be > 0."""
    def check(cfg) -> None:
        for key in keys:
            if getattr(cfg, key) <= 0:
                raise ConfigError(f"{key}: must be > 0, got {getattr(cfg, key)}")
    return check


def _whole_groups(cfg) -> None:
    """Objectives that compare the completions of a prompt need >= 2 of them, all in one micro-batch."""
    if cfg.num_generations < 2:
        raise ConfigError(f"policy_loss '{cfg.policy_loss}' compares completions of a prompt: "
                          f"num_generations must be >= 2, got {cfg.num_generations}")
    if cfg.micro_batch_size % cfg.num_generations:
        raise ConfigError(f"policy_loss '{cfg.policy_loss}' needs whole groups in each micro-batch: "
                          f"micro_batch_size ({cfg.micro_batch_size}) must be a multiple of num_generations "
                          f"({cfg.num_generations})")


def _anchored(key: str, extra=None):
    """GVPO / CoPG: a 'reference' anchor needs a reference model (beta > 0); whole groups per micro-batch."""
    def check(cfg) -> None:
        _whole_groups(cfg)
        if getattr(cfg, key) == "reference" and cfg.beta <= 0:
            raise ConfigError(f"{key}: 'reference' needs a reference model: set beta > 0 or use 'behavior'")
        if extra is not None:
            extra(cfg)
    return check


def _both(*checks):
    def check(cfg) -> None:
        for c in checks:
            c(cfg)
    return check


# ----------------------------------------------------------------------------- helpers

def _row_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over tokens per row, ``[R, T] -> [R]`` (0 for rows with no tokens)."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _row_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum(-1)


def _segment_mean(values: torch.Tensor, mask: torch.Tensor, segments: torch.Tensor):
    """Masked mean of ``values`` over each (row, segment) unit, put back on every token.

    Returns ``(mean [R, T], unit_size [R, T], units_per_row [R])``. Differentiable.
    """
    R, T = values.shape
    seg = segments.long()
    _, local = torch.unique(seg, return_inverse=True)
    n_seg = int(local.max()) + 1 if local.numel() else 1
    key = (torch.arange(R, device=values.device)[:, None] * n_seg + local).reshape(-1)
    m = mask.reshape(-1).to(values.dtype)
    total = torch.zeros(R * n_seg, dtype=values.dtype, device=values.device).index_add(0, key, values.reshape(-1) * m)
    count = torch.zeros(R * n_seg, dtype=values.dtype, device=values.device).index_add(0, key, m)
    mean = (total / count.clamp(min=1))[key].reshape(R, T)
    units = (count.reshape(R, n_seg) > 0).sum(-1)
    return mean, count[key].reshape(R, T), units


def _pair_matrix(group_ids: torch.Tensor, name: str) -> torch.Tensor:
    """``same[i, j]`` = rows i != j share a group. Raises if a row has no partner.

    Pairwise / group-coupled objectives need whole groups in each micro-batch
    (``micro_batch_size`` a multiple of ``num_generations``; see
    the check registered with the loss).
    """
    same = group_ids[:, None] == group_ids[None, :]
    same.fill_diagonal_(False)
    if bool((same.sum(-1) == 0).any()):
        raise ValueError(f"{name}: a group in this micro-batch has a single row; this objective compares the rows "
                         f"of a group, so every group needs >= 2 rows in the same micro-batch (make "
                         f"micro_batch_size a multiple of num_generations)")
    return same


def _group_center(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``v_i - mean_{j in g(i)} v_j`` (differentiable; every row counts)."""
    same = (group_ids[:, None] == group_ids[None, :]).to(values.dtype)
    return values - (same @ values) / same.sum(-1)


def _pair_rows(pair_loss: torch.Tensor, same: torch.Tensor) -> torch.Tensor:
    """Row loss ``L_i = mean_{j != i in g} l_ij``; then ``(1/n) sum_i L_i`` = mean over ordered pairs."""
    w = same.to(pair_loss.dtype)
    return (pair_loss * w).sum(-1) / w.sum(-1)


def _anchor(anchor: str, old_logprobs, ref_logprobs, name: str):
    if anchor == "behavior":
        return old_logprobs
    if ref_logprobs is None:
        raise ValueError(f"{name}: anchor 'reference' needs reference log-probs; set beta > 0 (or use the "
                         f"'behavior' anchor)")
    return ref_logprobs
