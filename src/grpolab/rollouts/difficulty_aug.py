"""DeepVideo-R1's difficulty-aware data augmentation, for text prompts (seed 000-04)."""
from __future__ import annotations

from collections import deque

import torch

from ..batch import RolloutBatch
from ..data import completion_text
from ..errors import ConfigError
from ..registry import POLICIES, ROLLOUT_STRATEGIES, param
from .guidance import require_column, solution_prefix, with_hint

#: the words inserted by the difficulty-increasing perturbation (no digits: the problem itself is never changed)
NOISE_WORDS = ("~", "#", "...", "|", "um", "uh", "hmm", "so", "well")
CUE_HEADER = "Hint (the beginning of a worked solution):"


def _check(cfg) -> None:
    if cfg.dva_window < 1:
        raise ConfigError(f"dva_window: must be >= 1 (samples in the reward history), got {cfg.dva_window}")
    if not cfg.dva_reward_scale > 0:
        raise ConfigError(f"dva_reward_scale: must be > 0, got {cfg.dva_reward_scale}")
    for key in ("dva_max_cue", "dva_max_noise"):
        if not 0.0 <= getattr(cfg, key) <= 1.0:
            raise ConfigError(f"{key}: must be in [0, 1], got {getattr(cfg, key)}")
    if cfg.dva_cue_samples < 1:
        raise ConfigError(f"dva_cue_samples: must be >= 1, got {cfg.dva_cue_samples}")
    if cfg.dva_perturb == "frames" and "vision" not in getattr(POLICIES.get(cfg.policy), "capabilities", ()):
        raise ConfigError(f"dva_perturb: frames adds Gaussian noise to a row's pictures and needs a policy with "
                          f"capability vision (policy vision_language); policy {cfg.policy!r} has none: use "
                          f"dva_perturb: text")


def _columns(cfg) -> list[str]:
    return ["solution"] if cfg.dva_cue_source == "solution" else [cfg.dva_answer_column]


def difficulty(history_mean: float, group_mean: float) -> float:
    """DeepVideo-R1's relative difficulty ``Delta R(x) = mean reward of the history - mean reward of x's group``
    (> 0: harder than what the model has recently met; < 0: easier)."""
    return float(history_mean) - float(group_mean)


def perturb_text(text: str, probability: float, generator: torch.Generator) -> str:
    """``text`` with a noise word (:data:`NOISE_WORDS`) inserted after each whitespace-separated word with
    probability ``probability``; every original character is kept, in order (the answer stays determined)."""
    words = text.split(" ")
    draws = torch.rand(len(words), generator=generator).tolist()
    picks = torch.randint(len(NOISE_WORDS), (len(words),), generator=generator).tolist()
    out = []
    for w, u, k in zip(words, draws, picks):
        out.append(w)
        if u < probability and w.strip():
            out.append(NOISE_WORDS[k])
    return " ".join(out)


def _map_prompt(row: dict, fn) -> dict:
    """A copy of ``row`` whose prompt (a string, or a chat's last user message) is ``fn(text)``."""
    prompt = row["prompt"]
    out = dict(row)
    if isinstance(prompt, str):
        out["prompt"] = fn(prompt)
        return out
    users = [i for i, m in enumerate(prompt) if m.get("role") == "user"]
    if not users:
        raise ValueError("difficulty_aug: the chat prompt has no user message to perturb")
    new = [dict(m) for m in prompt]
    new[users[-1]]["content"] = fn(new[users[-1]]["content"])
    out["prompt"] = new
    return out


def _group_rows(batch: RolloutBatch, gid: int) -> list[int]:
    return (batch.group_ids == gid).nonzero().squeeze(-1).tolist()


@ROLLOUT_STRATEGIES.register("difficulty_aug", check=_check, columns=_columns, needs=("text",))
class DifficultyAwareAugmentation:
    """DeepVideo-R1's difficulty-aware data augmentation (Park et al., 2025, "DeepVideo-R1: Video Reinforcement
    Fine-Tuning via Difficulty-aware Regressive GRPO", arXiv:2506.07464, Sec. 3.3, Eq. (9); seed 000-04), for
    text prompts.

    Each prompt ``x`` is first sampled and scored as usual. Its difficulty is measured against a reward history
    ``B_W``, the mean rewards of the last ``W = dva_window`` samples (prompts) seen before this step:

        ``Delta R(x) = mean_{x' in B_W} R(x') - (1/G) sum_i R(x, y_i)``           (Eq. 9, relative difficulty)

    and the sample is moved toward a solvable difficulty with a strength that grows with ``|Delta R|``,
    ``level = min(1, |Delta R| / dva_reward_scale)``:

    * **difficulty-decreasing** (``Delta R > 0``, hard): a reasoning cue is added to the prompt. As the paper:
      the prompt is shown with its ground-truth answer (``dva_answer_template`` filled from the row's
      ``dva_answer_column``), ``dva_cue_samples`` completions are sampled and scored, the best-rewarded one
      (the first on ties) is ``y_gt``, and the first ``round(dva_max_cue * level * |y_gt|)`` characters of it
      become the cue (``dva_cue_source: model``). ``dva_cue_source: solution`` takes the same prefix of the
      row's worked ``solution`` instead (the task's answer key; no extra generation). The cue is appended
      under :data:`CUE_HEADER` (``with_hint``);
    * **difficulty-increasing** (``Delta R < 0``, easy): the input is perturbed with a strength
      ``dva_max_noise * level``. ``dva_perturb: frames`` (a policy with pictures: ``vision_language``, e.g. the
      ``motion_clips`` task's 3-frame clips) is the paper's frame-level Gaussian noise: the policy's
      ``perturb_inputs`` renders every frame with pixel noise of std ``255 * strength``. ``dva_perturb: text``
      is the counterpart for text prompts: after each word a noise word is inserted with probability
      ``strength`` (:func:`perturb_text`; no character of the problem is removed or changed).

    An augmented prompt is sampled again (same number of completions and temperature) and its group replaces
    the plain group in the batch (same group id and prompt uid); the loss trains on the augmented prompt, as
    the paper trains on the augmented sample. ``Delta R = 0``, an empty cue, or an empty history (the first
    step) leaves the plain group. The history receives the plain groups' mean rewards after the step's
    difficulties are measured (NaN rewards are left out). Columns ``dva_augment`` (+1 cue, -1 noise, 0 plain)
    and ``dva_level``; metrics ``rollout/dva_frac_easier`` (share of prompts given a cue),
    ``rollout/dva_frac_harder``, ``rollout/dva_difficulty`` (mean ``Delta R``). State (history, generator) is
    checkpointed.

    Provenance: paper equations — DeepVideo-R1 (arXiv:2506.07464), Sec. 3.3 and Eq. (9) (difficulty relative
    to a reward history of the most recent W = 100 samples, App. C.1; cues for hard samples extracted from the
    best response generated with the ground-truth answer in the prompt, guidance scaled by the difficulty;
    noise for easy samples scaled by the difficulty). The authors' repository (github.com/mlvlab/DeepVideoR1)
    is linked from the paper but no snapshot of it could be had here, and the paper's Eq. (9) and the
    scaling rule are not in the stored text, so: the linear level ``min(1, |Delta R| / scale)``, the cue as a
    character prefix of the best response (fraction ``dva_max_cue * level``), re-sampling the augmented
    prompt within the same step, the noise std ``dva_max_noise * level`` (in units of the pixel range), and
    word-level noise insertion as the text analogue of video noise are grpolab's choices.
    Test: tests/test_difficulty_aug.py.
    """

    samples_rows = True  # samples only whole (augmented) data rows through ctx.generate: pictures are kept

    def __init__(self, *,
                 dva_window: int = param(100, 'difficulty_aug: reward history size W (samples = prompts), the '
                                         "paper's 100"),
                 dva_reward_scale: float = param(1.0, 'difficulty_aug: |Delta R| at which the augmentation reaches '
                                                 'full strength (the reward range of a 0/1 reward)'),
                 dva_max_cue: float = param(0.5, 'difficulty_aug: share of the cue trace shown at full strength'),
                 dva_max_noise: float = param(0.5, 'difficulty_aug: perturbation strength at full strength: the '
                                              'per-word noise probability (dva_perturb text) or the pixel noise '
                                              'std in units of the 0..255 range (frames)'),
                 dva_perturb: str = param('text', "difficulty_aug: how an easy prompt is made harder: 'text' = "
                                          "noise words in the prompt; 'frames' = Gaussian noise on the row's "
                                          "pictures (the paper's; a policy with capability vision)",
                                          ['text', 'frames']),
                 dva_cue_source: str = param('model', "difficulty_aug: 'model' = cue from the policy's best "
                                             "response to the prompt shown with its answer (the paper's); "
                                             "'solution' = the row's worked solution", ['model', 'solution']),
                 dva_cue_samples: int = param(4, 'difficulty_aug: responses sampled with the answer shown, to '
                                              'pick the cue from (dva_cue_source model)'),
                 dva_answer_column: str = param('answer', 'difficulty_aug: data column with the ground-truth '
                                                'answer (dva_cue_source model)'),
                 dva_answer_template: str = param('The correct final answer is {answer}. Explain how to get it.',
                                                  'difficulty_aug: text added to the prompt when the cue trace '
                                                  'is generated ({answer} is filled)'),
                 seed: int = 0):
        self.window = int(dva_window)
        self.scale = float(dva_reward_scale)
        self.max_cue, self.max_noise, self.perturb = float(dva_max_cue), float(dva_max_noise), dva_perturb
        self.cue_source, self.cue_samples = dva_cue_source, int(dva_cue_samples)
        self.answer_column, self.answer_template = dva_answer_column, dva_answer_template
        self.history: deque = deque(maxlen=self.window)
        self.generator = torch.Generator().manual_seed(int(seed) + 400)

    def level(self, delta: float) -> float:
        return min(1.0, abs(delta) / self.scale)

    def cues(self, ctx, rows: list[dict], uids: list[int], fractions: list[float], temperatures) -> list[str]:
        """The reasoning cue of each hard row: a prefix (``fraction`` of its characters) of the best response
        sampled with the answer shown (``model``), or of the row's solution (``solution``)."""
        if self.cue_source == "solution":
            return [solution_prefix(str(require_column(r, "solution", "difficulty_aug")), f)
                    for r, f in zip(rows, fractions)]
        shown = [with_hint(r, self.answer_template.format(
            answer=require_column(r, self.answer_column, "difficulty_aug"))) for r in rows]
        offset = ctx.allocate_groups(len(rows))
        batch = ctx.generate(shown, uids, group_offset=offset, num_generations=self.cue_samples,
                             temperature=temperatures)
        scalar = torch.nan_to_num(ctx.score(batch).to(torch.float64), nan=float("-inf"))
        out = []
        for j, f in enumerate(fractions):
            members = _group_rows(batch, offset + j)
            best = members[int(torch.argmax(scalar[members]))]  # argmax: the first of equal maxima
            text = completion_text(batch.columns["completion"][best])
            out.append(text[:round(len(text) * f)])
        return out

    def __call__(self, ctx, rows, uids, group_offset, budgets=None, temperatures=None):
        plain = ctx.generate(rows, uids, group_offset=group_offset, num_generations=budgets,
                             temperature=temperatures)
        scalar = ctx.score(plain).to(torch.float64)
        members = [_group_rows(plain, group_offset + i) for i in range(len(rows))]
        means = [float(torch.nanmean(scalar[m])) if m else float("nan") for m in members]
        ref = sum(self.history) / len(self.history) if self.history else None
        deltas = [0.0 if ref is None or m != m else difficulty(ref, m) for m in means]
        self.history.extend(m for m in means if m == m)
        hard = [i for i, d in enumerate(deltas) if d > 0]
        easy = [i for i, d in enumerate(deltas) if d < 0]
        aug_rows: dict[int, dict] = {}
        kind = [0] * len(rows)
        if hard:
            temps = [temperatures[i] for i in hard] if temperatures is not None else None
            cues = self.cues(ctx, [rows[i] for i in hard], [uids[i] for i in hard],
                             [self.max_cue * self.level(deltas[i]) for i in hard], temps)
            for i, cue in zip(hard, cues):
                if cue.strip():
                    aug_rows[i], kind[i] = with_hint(rows[i], f"{CUE_HEADER}\n{cue}"), 1
        for i in easy:
            p = self.max_noise * self.level(deltas[i])
            if p > 0 and self.perturb == "frames":
                aug_rows[i], kind[i] = ctx.actions.perturb_inputs(rows[i], p, self.generator), -1
            elif p > 0:
                aug_rows[i], kind[i] = _map_prompt(rows[i], lambda t, p=p: perturb_text(t, p, self.generator)), -1
        pieces = []
        if aug_rows:
            order = sorted(aug_rows)
            offset = ctx.allocate_groups(len(order))
            aug = ctx.generate([aug_rows[i] for i in order], [uids[i] for i in order], group_offset=offset,
                               num_generations=[int(budgets[i]) for i in order] if budgets is not None else None,
                               temperature=[temperatures[i] for i in order] if temperatures is not None else None)
            ctx.score(aug)
            for j, i in enumerate(order):
                sub = aug.select(_group_rows(aug, offset + j))
                sub.group_ids = torch.full_like(sub.group_ids, group_offset + i)
                pieces.append((i, sub))
        for i in range(len(rows)):
            if i not in aug_rows and members[i]:
                pieces.append((i, plain.select(members[i])))
        pieces.sort(key=lambda p: p[0])
        keys = list(dict.fromkeys(k for _, sub in pieces for k in sub.columns))  # an augmented row may add columns
        for _, sub in pieces:
            sub.columns = {k: sub.columns.get(k, [None] * sub.num_rows) for k in keys}
        for i, sub in pieces:
            sub.columns["dva_augment"] = [kind[i]] * sub.num_rows
            sub.columns["dva_level"] = [self.level(deltas[i]) if kind[i] else 0.0] * sub.num_rows
        out = RolloutBatch.concat([s for _, s in pieces], pad_id=ctx.tokenizer.pad_token_id)
        n = max(len(rows), 1)
        ctx.metric("dva_frac_easier", sum(k == 1 for k in kind) / n)
        ctx.metric("dva_frac_harder", sum(k == -1 for k in kind) / n)
        ctx.metric("dva_difficulty", sum(deltas) / n)
        return out

    def state_dict(self) -> dict:
        return {"history": list(self.history), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.history = deque((float(v) for v in state["history"]), maxlen=self.window)
        self.generator.set_state(state["generator"])


def model_texts(cfg, environment, rows: list[dict]) -> list[str]:
    """Text the strategy shows besides the data (a tiny model sizes its vocabulary from it): the cue header, the
    answer template and the noise words."""
    return [CUE_HEADER, cfg.dva_answer_template, " ".join(NOISE_WORDS)]


DifficultyAwareAugmentation.model_texts = staticmethod(model_texts)
