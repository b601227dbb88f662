"""AVATAR's stratified off-policy replay with a per-prompt reward history (batch stage ``avatar_replay``)."""
from __future__ import annotations

import copy

import torch

from ..algorithms.weightings import tas_weights
from ..batch import RolloutBatch
from ..errors import ConfigError
from ..registry import BATCH_STAGES, param
from ._checks import require_at_least

TIERS = ("easy", "medium", "hard")
STRATEGIES = ("priority", "fifo", "uniform")


def quantile(values: list[float], q: float) -> float:
    """The authors' quantile: ``sorted(values)[round(q * (n - 1))]`` (Python's round, halves to even); 0 if
    empty."""
    if not values:
        return 0.0
    v = sorted(values)
    return v[max(0, min(len(v) - 1, int(round(q * (len(v) - 1)))))]


def assign_tier(rbar: float, all_rbars: list[float]) -> str:
    """``hard`` if ``rbar <=`` the 40th percentile of every prompt's mean past reward, ``medium`` if ``<=`` the
    75th, else ``easy`` (``hard`` while no prompt has a history)."""
    if not all_rbars:
        return "hard"
    if rbar <= quantile(all_rbars, 0.40):
        return "hard"
    return "medium" if rbar <= quantile(all_rbars, 0.75) else "easy"


def tier_capacities(max_size: int, easy: float, medium: float) -> dict[str, int]:
    """Per-tier capacity: ``round(max * easy)``, ``round(max * medium)``, the rest for hard; at least 1 each."""
    e, m = int(round(max_size * easy)), int(round(max_size * medium))
    return {"easy": max(1, e), "medium": max(1, m), "hard": max(1, max_size - e - m)}


def target_counts(n: int, ratios: dict[str, float]) -> dict[str, int]:
    """How many of ``n`` draws each tier gives: ``round(n * ratio)``, then the largest count loses one while
    the total exceeds ``n``, and the tier with the largest ratio gains one while it falls short."""
    counts = {t: int(round(n * ratios[t])) for t in TIERS}
    total = sum(counts.values())
    while total > n:
        t = max(counts, key=counts.get)
        if counts[t] <= 0:
            break
        counts[t] -= 1
        total -= 1
    while total < n:
        counts[max(ratios, key=ratios.get)] += 1
        total += 1
    return counts


def replay_advantages(rewards: torch.Tensor, rbar: torch.Tensor, alpha: float) -> torch.Tensor:
    """``A = alpha * (r - rbar(x)) / (std(r) + 1e-4)``: ``std`` is the unbiased standard deviation of the replayed
    unit's rewards, 1 for a unit of one row."""
    std = rewards.std() if rewards.numel() > 1 else torch.tensor(1.0, dtype=rewards.dtype)
    return alpha * (rewards - rbar) / (std + 1e-4)


def _check(cfg) -> None:
    if cfg.avatar_replay_strategy not in STRATEGIES:
        raise ConfigError(f"avatar_replay_strategy: '{cfg.avatar_replay_strategy}' is not valid; valid values: "
                          f"{', '.join(STRATEGIES)}")
    require_at_least(cfg, 1, "avatar_replay_buffer_size", "avatar_vcrs_window", "avatar_unit_rows")
    if cfg.avatar_off_policy_batches < 0 or cfg.avatar_replay_min_size < 0:
        raise ConfigError("avatar_off_policy_batches and avatar_replay_min_size must be >= 0")
    ratios = [cfg.avatar_replay_easy_ratio, cfg.avatar_replay_medium_ratio, cfg.avatar_replay_hard_ratio]
    if min(ratios) < 0 or abs(sum(ratios) - 1.0) > 1e-6:
        raise ConfigError(f"avatar_replay_easy_ratio + medium + hard must be >= 0 each and sum to 1, got {ratios}")
    if cfg.avatar_priority_temperature <= 0:
        raise ConfigError(f"avatar_priority_temperature: must be > 0, got {cfg.avatar_priority_temperature}")


@BATCH_STAGES.register("avatar_replay", check=_check)
class AvatarReplay:
    """AVATAR off-policy replay: stratified buffer, per-prompt reward history (VCRS), recomputed advantages.

    AVATAR (Audio-Video Agent for Alignment and Reasoning, 2025, arXiv:2508.03100), seed 000-104. A *unit* is
    ``avatar_unit_rows`` consecutive rows of the step's batch (the authors' unit is one per-device mini-batch;
    their launcher's has one row). Each step:

    1. **Mix.** Once the buffer holds ``>= avatar_replay_min_size`` units (and ``avatar_off_policy_batches > 0``),
       ``k = min(avatar_off_policy_batches, N)`` of the step's ``N`` units — at most ``N -
       avatar_on_policy_batches`` — are drawn from the buffer and *replace* ``k`` on-policy units chosen uniformly
       without replacement. Draws per tier: :func:`target_counts` of ``k`` by the tier ratios; within a tier
       ``priority`` (with replacement, weights ``exp((s - min s) / avatar_priority_temperature)`` over the
       scores ``s``), ``fifo`` (the oldest) or ``uniform`` (without replacement); short tiers are made up by
       uniform draws over the whole buffer. A replayed unit keeps its tokens, rewards and behaviour log-probs
       (the ratio ``pi_theta / pi_behaviour`` corrects for staleness) and gets a fresh group id and new
       advantages (the VCRS fix for all-equal groups)::

           A_i = alpha_off * (r_i - rbar(x_i)) / (std(r_unit) + 1e-4)

       ``rbar(x)`` = mean of prompt x's last ``avatar_vcrs_window`` rewards (0 without a history; the history
       before this step's rewards), ``std`` unbiased over the unit's rewards, 1 for a one-row unit
       (:func:`replay_advantages`). With weighting ``avatar_tas`` selected, the replayed advantages get its TAS
       token weights too (the authors weight every mini-batch's loss).
    2. **Remember.** Every on-policy unit (replaced ones too), in order: its rows' rewards enter their prompts'
       histories; its tier is :func:`assign_tier` of the mean ``rbar`` of its rows' prompts against all
       prompts' ``rbar``; its score is ``w_r * mean(A) - w_kl * mean_rows(mean_t(log pi_behaviour - log
       pi_ref))`` (``A`` the estimator's per-row advantage, TAS weights divided out; the KL term only when
       ``beta > 0``, from one extra no-grad reference forward of the step's rows); a unit scoring below
       ``avatar_store_score_threshold`` (when set) is not stored; the others enter their tier's FIFO (capacity
       :func:`tier_capacities` of ``avatar_replay_buffer_size``).

    Buffer, histories and the generator are in ``state_dict`` (exact resume).

    Choices (documented): prompts are keyed by ``prompt_uid`` (the authors key by the JSON of the messages);
    the authors' optional hinting (a hint message for prompts with a zero-reward streak) is not here; the
    rows of a step are a grpolab batch rather than a generation round of ``steps_per_generation`` optimiser
    steps, so ``avatar_off_policy_batches`` / ``avatar_on_policy_batches`` count units of one step.

    Provenance: authors' code — https://github.com/yogkul2000/AVATAR,
    ms-swift/swift/rlhf_trainers/grpo_tas_trainer.py (StratifiedReplayBuffer; GRPOTASTrainer._mix_with_replay,
    _add_to_replay_buffer, _apply_vcrs_to_replay_batch, _assign_tier, _quantile, _score_replay_batch); defaults
    from ms-swift/swift/rlhf_trainers/args_mixin.py (buffer 10000, tiers 0.25 / 0.35 / 0.40, window 20,
    priority sampling at temperature 1 with weights 1 and 0.1, 4 off- and 4 on-policy units, alpha 1; minimum
    size 128, the launcher uses 10). Known differences: hinting left out; units of rows of one step.
    Test: tests/test_vision_tools_avatar.py::test_tiers_quantiles_and_targets_by_hand,
    tests/test_vision_tools_avatar.py::test_replayed_advantages_from_history_by_hand,
    tests/test_vision_tools_avatar.py::test_buffer_mixing_replaces_units.
    """

    def __init__(self, *,
                 avatar_off_policy_batches: int = param(4, "AVATAR replay: units replayed per step in place of "
                                                        "on-policy ones (the authors' tas_off_policy_batches)"),
                 avatar_on_policy_batches: int | None = param(4, "AVATAR replay: on-policy units kept at least "
                                                              "(null = no floor)"),
                 avatar_off_policy_alpha: float = param(1.0, "AVATAR replay: alpha_off, scale of replayed "
                                                        "advantages"),
                 avatar_replay_buffer_size: int = param(10000, "AVATAR replay: buffer capacity in units (split "
                                                        "over the tiers by their ratios)"),
                 avatar_replay_min_size: int = param(128, "AVATAR replay: replay only once the buffer holds this "
                                                     "many units (the authors' launcher: 10)"),
                 avatar_replay_easy_ratio: float = param(0.25, "AVATAR replay: easy tier's share of capacity "
                                                         "and draws"),
                 avatar_replay_medium_ratio: float = param(0.35, "AVATAR replay: medium tier's share"),
                 avatar_replay_hard_ratio: float = param(0.40, "AVATAR replay: hard tier's share"),
                 avatar_replay_strategy: str = param("priority", "AVATAR replay: draws within a tier",
                                                     list(STRATEGIES)),
                 avatar_priority_reward_weight: float = param(1.0, "AVATAR replay: w_r, score weight of the mean "
                                                              "advantage"),
                 avatar_priority_kl_weight: float = param(0.1, "AVATAR replay: w_kl, score weight of the mean "
                                                          "KL(behaviour || reference)"),
                 avatar_priority_temperature: float = param(1.0, "AVATAR replay: temperature of priority draws"),
                 avatar_store_score_threshold: float | None = param(None, "AVATAR replay: store only units "
                                                                    "scoring at least this (null = all)"),
                 avatar_vcrs_window: int = param(20, "AVATAR replay: rewards kept per prompt for rbar(x)"),
                 avatar_unit_rows: int = param(1, "AVATAR replay: rows per unit (the authors' per-device "
                                               "mini-batch: 1)"),
                 seed: int = 0):
        self.off = int(avatar_off_policy_batches)
        self.on = None if avatar_on_policy_batches is None else int(avatar_on_policy_batches)
        self.alpha = float(avatar_off_policy_alpha)
        self.min_size = int(avatar_replay_min_size)
        self.ratios = {"easy": float(avatar_replay_easy_ratio), "medium": float(avatar_replay_medium_ratio),
                       "hard": float(avatar_replay_hard_ratio)}
        self.capacity = tier_capacities(int(avatar_replay_buffer_size), self.ratios["easy"], self.ratios["medium"])
        self.strategy = avatar_replay_strategy
        self.w_r, self.w_kl = float(avatar_priority_reward_weight), float(avatar_priority_kl_weight)
        self.temperature = max(1e-6, float(avatar_priority_temperature))
        self.threshold = avatar_store_score_threshold
        self.window = int(avatar_vcrs_window)
        self.unit_rows = int(avatar_unit_rows)
        self.generator = torch.Generator().manual_seed(int(seed) + 10400)
        self.tiers: dict[str, list[dict]] = {t: [] for t in TIERS}   # FIFO each, oldest first
        self.history: dict[int, list[float]] = {}                    # prompt uid -> last rewards
        self.last: dict[str, float] = {}

    # ------------------------------------------------------------------ history
    def rbar(self, uid: int) -> float:
        h = self.history.get(int(uid))
        return float(sum(h) / len(h)) if h else 0.0

    def record(self, uid: int, reward: float) -> None:
        h = self.history.setdefault(int(uid), [])
        h.append(float(reward))
        del h[:max(0, len(h) - self.window)]

    def __len__(self) -> int:
        return sum(len(v) for v in self.tiers.values())

    # ------------------------------------------------------------------ sampling
    def _from_tier(self, tier: str, n: int) -> list[dict]:
        entries = self.tiers[tier]
        n = min(n, len(entries))
        if n <= 0:
            return []
        if self.strategy == "fifo":
            return entries[:n]
        if self.strategy == "uniform":
            return [entries[i] for i in torch.randperm(len(entries), generator=self.generator)[:n].tolist()]
        s = torch.tensor([e["score"] for e in entries], dtype=torch.float64)
        w = torch.exp((s - s.min()) / self.temperature)
        return [entries[i] for i in torch.multinomial(w, n, replacement=True, generator=self.generator).tolist()]

    def sample(self, n: int) -> list[dict]:
        """``n`` buffered units (fewer if the buffer is smaller), tier by tier (class docstring)."""
        n = min(n, len(self))
        if n <= 0:
            return []
        out: list[dict] = []
        for tier, k in target_counts(n, self.ratios).items():
            out += self._from_tier(tier, k)
        if len(out) < n:
            every = [e for t in TIERS for e in self.tiers[t]]
            pick = torch.randperm(len(every), generator=self.generator)[:min(n - len(out), len(every))].tolist()
            out += [every[i] for i in pick]
        return out

    # ------------------------------------------------------------------ the step
    @staticmethod
    def _tas_lambda(ctx) -> float:
        cfg = getattr(ctx, "cfg", None)
        if cfg is not None and "avatar_tas" in list(getattr(cfg, "advantage_weightings", None) or []):
            return float(getattr(cfg, "avatar_tas_lambda", 0.3))
        return 0.0

    def _units(self, n_rows: int) -> list[list[int]]:
        return [list(range(i, min(i + self.unit_rows, n_rows))) for i in range(0, n_rows, self.unit_rows)]

    def replayed(self, entry: dict, ctx, lam: float) -> RolloutBatch:
        """A buffered unit with a fresh group id and advantages recomputed from the current histories."""
        b = copy.deepcopy(entry["batch"])
        r = b.scalar_rewards.to(torch.float32)
        rbar = torch.tensor([self.rbar(u) for u in b.prompt_uids.tolist()], dtype=torch.float32)
        adv = replay_advantages(torch.nan_to_num(r, nan=0.0), rbar, self.alpha)
        mask = b.completion_mask
        b.advantages = (adv[:, None] * tas_weights(mask, lam) * mask).to(mask.dtype)
        b.group_ids = torch.full_like(b.group_ids, ctx.allocate_groups(1))
        b.ref_logprobs = None
        return b

    def score(self, unit: RolloutBatch, kl_rows: torch.Tensor | None, lam: float) -> float:
        mask = unit.completion_mask.to(torch.float32)
        w = tas_weights(unit.completion_mask, lam) * mask
        adv = (unit.advantages.to(torch.float32) * mask).sum(-1) / w.sum(-1).clamp(min=1e-12)
        kl = float(kl_rows.mean()) if kl_rows is not None else 0.0
        return self.w_r * float(adv.mean()) - self.w_kl * kl

    def _kl_rows(self, batch: RolloutBatch, ctx) -> torch.Tensor | None:
        """Per-row mean of ``log pi_behaviour - log pi_ref`` over the loss tokens (``beta > 0`` only, as the
        authors' reference log-probs exist only then)."""
        cfg = getattr(ctx, "cfg", None)
        if cfg is None or getattr(cfg, "beta", 0.0) <= 0 or self.w_kl == 0:
            return None
        with ctx.reference_policy() as ref:
            ref_lp = ctx.logprobs(batch, model=ref)
        m = batch.completion_mask.to(torch.float32)
        return ((batch.behavior_logprobs - ref_lp) * m).sum(-1) / m.sum(-1).clamp(min=1.0)

    def remember(self, batch: RolloutBatch, ctx, lam: float) -> None:
        kl = self._kl_rows(batch, ctx)
        for rows in self._units(batch.num_rows):
            unit = batch.select(rows).trim()
            uids = unit.prompt_uids.tolist()
            for u, r in zip(uids, unit.scalar_rewards.tolist()):
                if r == r:  # NaN (unscorable) rewards stay out of the history
                    self.record(u, r)
            mean_rbar = sum(self.rbar(u) for u in uids) / max(1, len(uids))
            tier = assign_tier(mean_rbar, [self.rbar(k) for k in self.history])
            s = self.score(unit, None if kl is None else kl[rows], lam)
            if self.threshold is not None and s < float(self.threshold):
                continue
            unit.ref_logprobs = None
            self.tiers[tier].append({"batch": unit, "score": s, "rbar": mean_rbar})
            del self.tiers[tier][:max(0, len(self.tiers[tier]) - self.capacity[tier])]

    def __call__(self, batch, ctx, step=0):
        lam = self._tas_lambda(ctx)
        units = self._units(batch.num_rows)
        out_units: list[RolloutBatch] = [batch.select(rows) for rows in units]
        used = 0
        if self.off > 0 and len(self) >= self.min_size:
            k = min(self.off, len(units))
            if self.on is not None:
                k = min(k, len(units) - min(self.on, len(units)))
            entries = self.sample(k) if k > 0 else []
            if entries:
                where = torch.randperm(len(units), generator=self.generator)[:len(entries)].tolist()
                for i, e in zip(where, entries):
                    out_units[i] = self.replayed(e, ctx, lam)
                used = len(entries)
        self.remember(batch, ctx, lam)
        self.last = {"replayed_units": float(used), "buffer_units": float(len(self))}
        if hasattr(ctx, "metric"):
            ctx.metric("avatar_replayed_units", used)
            ctx.metric("avatar_buffer_units", len(self))
        if not used:
            return batch
        return RolloutBatch.concat(out_units, pad_id=ctx.pad_id)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "tiers": copy.deepcopy(self.tiers),
                "history": {int(k): list(v) for k, v in self.history.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.tiers = {t: list(copy.deepcopy(state["tiers"][t])) for t in TIERS}
        self.history = {int(k): [float(x) for x in v] for k, v in state["history"].items()}
