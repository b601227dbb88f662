"""Per-prompt statistic trackers of the diffusion GRPO methods (Flow-GRPO, DDPO).

Advantage estimators that normalise a reward by the statistics of the rows of the same *prompt* rather than
of the same group, with the **population** standard deviation (``np.std``) of the authors' trackers. A prompt
is its text (``batch.columns["prompt"]``), as both codes key their trackers by the decoded prompt, or with
``per_prompt_key: prompt_uid`` its dataset index (``prompt_uids``); they differ when the data repeats a prompt
(the digits task: 200 rows, 10 texts). ``per_prompt_zscore`` is stateless (Flow-GRPO clears its tracker every step);
``per_prompt_tracker`` keeps a buffer of past rewards per prompt across steps (DDPO) and is checkpointed.
NaN rewards are unscorable rows: left out of every statistic and of the buffers, advantage 0.
"""
from __future__ import annotations

import math
from collections import deque

import torch

from ..errors import ConfigError
from ..registry import param
from .advantages import ADVANTAGES

# --------------------------------------------------------------------------- helpers


def population_stats(values: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and **population** std (``np.std``, ddof 0) of the non-NaN values sharing the row's key.

    Returns ``(mean, std)``, each ``[R]`` float64; NaN for a key with no scored value.
    """
    uniq, inv = torch.unique(keys, return_inverse=True)
    valid = ~torch.isnan(values)
    v = torch.where(valid, values, 0.0).double()
    zeros = torch.zeros(uniq.numel(), dtype=torch.float64, device=values.device)
    count = zeros.clone().index_add_(0, inv, valid.double())
    mean = zeros.clone().index_add_(0, inv, v) / count.clamp(min=1)
    dev = torch.where(valid, v - mean[inv], 0.0)
    var = zeros.clone().index_add_(0, inv, dev * dev) / count.clamp(min=1)
    nan = torch.full_like(mean, float("nan"))
    return torch.where(count > 0, mean, nan)[inv], torch.where(count > 0, var.sqrt(), nan)[inv]


PER_PROMPT_KEY = param('prompt', "per_prompt_zscore / per_prompt_tracker: what makes rows the same prompt: the "
                       "prompt text (batch column 'prompt', as Flow-GRPO and DDPO key by the decoded prompt) or the "
                       "dataset index (prompt_uids; differs when the data repeats a prompt)", ['prompt', 'prompt_uid'])


def prompt_keys(per_prompt_key: str, prompt_uids: torch.Tensor, batch=None) -> list:
    """One key per row: the prompt text (``batch.columns["prompt"]``, as a string) or the prompt uid."""
    if per_prompt_key == "prompt_uid":
        return [int(u) for u in prompt_uids.tolist()]
    if per_prompt_key != "prompt":
        raise ValueError(f"per_prompt_key: '{per_prompt_key}' is not valid; valid values: prompt, prompt_uid")
    col = None if batch is None else getattr(batch, "columns", {}).get("prompt")
    if col is None or len(col) != len(prompt_uids):
        raise ValueError("per_prompt_key prompt: the batch has no 'prompt' column (one prompt per row) to key the "
                         "per-prompt statistics by; set per_prompt_key: prompt_uid to key by the dataset index")
    return [str(p) for p in col]


def _key_ids(keys: list) -> torch.Tensor:
    """Row keys as integer ids (first appearance order)."""
    ids: dict = {}
    return torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long)


def _population(values: list[float]) -> tuple[float, float]:
    """Mean and population std of a non-empty list (``np.mean``, ``np.std``)."""
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in values) / len(values))


# --------------------------------------------------------------------------- Flow-GRPO


@ADVANTAGES.register("per_prompt_zscore", min_group_size=2)
def per_prompt_zscore(rewards: torch.Tensor, prompt_uids: torch.Tensor, batch=None, *,
                      advantage_epsilon: float = 1e-4, per_prompt_key: str = PER_PROMPT_KEY,
                      per_prompt_global_std: bool = param(True, 'per_prompt_zscore: divide by the population std '
                                                          "of all the step's rewards instead of the prompt's own "
                                                          "(Flow-GRPO's sample.global_std, True in its configs)")
                      ) -> torch.Tensor:
    """Flow-GRPO per-prompt z-score (Liu et al., 2025, *Flow-GRPO: Training Flow Matching Models via Online RL*,
    arXiv:2505.05470).

    ``A_i = (r_i - mean_p(r)) / (std(r) + epsilon)``

    ``mean_p`` is the mean over the step's rows with the same prompt (its text, or with ``per_prompt_key:
    prompt_uid`` its dataset index); ``std`` is the
    **population** std (``np.std``, ddof 0), of the same rows, or with ``per_prompt_global_std`` (the
    default, as every Flow-GRPO config) of all the step's rewards; ``epsilon`` is ``advantage_epsilon``
    (1e-4, the code's constant). A tie group gets A = 0 exactly; a prompt with one row gets 0.

    Provenance: authors' code — https://github.com/yifan123/flow_grpo, flow_grpo/stat_tracking.py
    (PerPromptStatTracker.update, ``type='grpo'``; commit ac4c86e); matches: mean over the prompt's rewards,
    ``np.std(...) + 1e-4`` of the prompt's rewards or, with ``global_std``, of all the step's rewards,
    advantages computed in float64; defaults from config/base.py and config/grpo.py (``sample.global_std =
    True``), and scripts/train_sd3.py calls ``stat_tracker.clear()`` after every step, so the tracker holds only
    the current step (no state here); keyed by the prompt text as the code's decoded prompts (the default
    ``per_prompt_key``). Known differences: an unscorable (NaN) reward is left out of the statistics with
    advantage 0, where the code would spread the NaN.
    Test: tests/test_image_algorithms.py::test_per_prompt_zscore_hand_computed_from_flow_grpo,
    tests/test_image_algorithms.py::test_per_prompt_zscore_population_std_on_a_tie_group,
    tests/test_image_algorithms.py::test_per_prompt_zscore_global_std.
    """
    r = rewards.double()
    keys = _key_ids(prompt_keys(per_prompt_key, prompt_uids, batch)).to(rewards.device)
    mean, std = population_stats(r, keys)
    if per_prompt_global_std:
        scored = r[~torch.isnan(r)]
        glob = _population(scored.tolist())[1] if scored.numel() else float("nan")
        std = torch.full_like(std, glob)
    adv = (r - mean) / (std + advantage_epsilon)
    return torch.nan_to_num(adv, nan=0.0).to(rewards.dtype)


# --------------------------------------------------------------------------- DDPO


def _check_tracker(cfg) -> None:
    if cfg.tracker_buffer_size < 1:
        raise ConfigError(f"tracker_buffer_size: must be >= 1, got {cfg.tracker_buffer_size}")
    if cfg.tracker_min_count < 1:
        raise ConfigError(f"tracker_min_count: must be >= 1, got {cfg.tracker_min_count}")
    if cfg.tracker_min_count > cfg.tracker_buffer_size:
        raise ConfigError(f"tracker_min_count ({cfg.tracker_min_count}) > tracker_buffer_size "
                          f"({cfg.tracker_buffer_size}): a prompt's buffer never holds min_count rewards, so its own "
                          f"statistics would never be used; lower tracker_min_count or raise tracker_buffer_size")
    if not cfg.tracker_epsilon > 0:
        raise ConfigError(f"tracker_epsilon: must be > 0, got {cfg.tracker_epsilon}")


@ADVANTAGES.register("per_prompt_tracker", check=_check_tracker)
class PerPromptTracker:
    """DDPO per-prompt stat tracking (Black et al., 2023, *Training Diffusion Models with Reinforcement
    Learning*, arXiv:2305.13301).

    Per prompt ``p`` (its text, or with ``per_prompt_key: prompt_uid`` its dataset index) a buffer ``B_p`` of
    its last ``tracker_buffer_size`` (16) rewards, kept across steps. Each step, for every prompt of the batch
    in turn: its rewards (batch order) are first appended to ``B_p`` (the oldest fall out), then::

        |B_p| <  tracker_min_count (16):  A_i = (r_i - mean(r_batch)) / (std(r_batch) + eps)
        |B_p| >= tracker_min_count:       A_i = (r_i - mean(B_p))     / (std(B_p)     + eps)

    with population stds (``np.std``) and ``eps = tracker_epsilon`` (1e-6). ``r_batch`` is every reward of
    the step. The buffers are checkpointed (``state_dict``), so a resumed run continues them exactly.

    Provenance: authors' code — https://github.com/kvablack/ddpo-pytorch, ddpo_pytorch/stat_tracking.py
    (PerPromptStatTracker.update; commit 1958463); matches: ``deque(maxlen=buffer_size)`` extended before the
    count test, batch ``np.mean``/``np.std(rewards) + 1e-6`` below ``min_count``, the buffer's above it;
    buffer_size 16, min_count 16 from config/base.py (``per_prompt_stat_tracking``), used once per epoch by
    scripts/train.py, keyed by the decoded prompt text (the default ``per_prompt_key``). Known differences: DDPO
    computes in the rewards' dtype (float32 there), here in float64; unscorable (NaN) rewards
    are left out of the buffers and the batch statistics and get advantage 0; DDPO's tracker is not saved
    in its checkpoints, this one is.
    Test: tests/test_image_algorithms.py::test_per_prompt_tracker_hand_computed_from_ddpo,
    tests/test_image_algorithms.py::test_per_prompt_tracker_state_round_trip.
    """

    def __init__(self, *,
                 tracker_buffer_size: int = param(16, 'per_prompt_tracker: rewards kept per prompt across steps '
                                                  "(DDPO's per_prompt_stat_tracking.buffer_size)"),
                 tracker_min_count: int = param(16, "per_prompt_tracker: below this many buffered rewards a "
                                                "prompt uses the batch's mean and std (DDPO's min_count)")):
        if tracker_buffer_size < 1 or tracker_min_count < 1:
            raise ValueError(f"tracker_buffer_size and tracker_min_count: must be >= 1, got {tracker_buffer_size}, "
                             f"{tracker_min_count}")
        self.buffer_size, self.min_count = int(tracker_buffer_size), int(tracker_min_count)
        self.buffers: dict[str | int, deque] = {}

    def __call__(self, rewards: torch.Tensor, prompt_uids: torch.Tensor, batch=None, *,
                 tracker_epsilon: float = param(1e-6, "per_prompt_tracker: added to the std (DDPO's 1e-6)"),
                 per_prompt_key: str = PER_PROMPT_KEY) -> torch.Tensor:
        r = rewards.double().tolist()
        uids = prompt_keys(per_prompt_key, prompt_uids, batch)
        scored = [x for x in r if not math.isnan(x)]
        adv = [0.0] * len(r)
        if not scored:
            return torch.zeros_like(rewards)
        batch_mean, batch_std = _population(scored)
        for uid in dict.fromkeys(uids):  # each prompt once; every prompt's buffer is its own
            rows = [i for i, u in enumerate(uids) if u == uid and not math.isnan(r[i])]
            if not rows:
                continue
            buf = self.buffers.setdefault(uid, deque(maxlen=self.buffer_size))
            buf.extend(r[i] for i in rows)
            mean, std = (batch_mean, batch_std) if len(buf) < self.min_count else _population(list(buf))
            for i in rows:
                adv[i] = (r[i] - mean) / (std + tracker_epsilon)
        return torch.tensor(adv, dtype=torch.float64).to(device=rewards.device, dtype=rewards.dtype)

    def state_dict(self) -> dict:
        """``{"buffers": [[key, [rewards, oldest first]], ...]}``: a list of pairs, so a JSON round trip keeps
        text keys text and uid keys integers."""
        return {"buffers": [[k, [float(x) for x in v]] for k, v in self.buffers.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.buffers = {k: deque((float(x) for x in v), maxlen=self.buffer_size) for k, v in state["buffers"]}
