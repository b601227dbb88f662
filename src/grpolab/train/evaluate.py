"""Greedy evaluation on held-out rows."""
from __future__ import annotations

import numpy as np
import torch

from ..algorithms import combine_rewards
from ..rewards import RewardFn, RewardScorer


@torch.no_grad()
def evaluate(sample, rows: list[dict], rewards: list[RewardFn], *, batch_size: int = 64,
             accuracy_reward: str | None = None, extra: dict | None = None, progress=None,
             reward_timeout: float | None = None, rollout=None, pass_k: int = 0, temperature: float = 1.0,
             seed: int = 0, render=None) -> dict:
    """Greedy completions for ``rows``; mean of each reward, total reward, accuracy.

    ``sample(rows, uids, *, num_generations, temperature, generator=None) -> RolloutBatch``: the policy's
    evaluation sampler (``functools.partial(policy.sample, module, evaluation=True)``, grpolab/policies/);
    temperature 0 is its deterministic draw (greedy for a causal LM). ``rollout(rows, uids) -> RolloutBatch``:
    how a chunk's greedy completions are made instead (the agent rollout plays one greedy episode per row); it
    may return ``(batch, parts)`` with ``parts`` a dict ``name -> RolloutBatch`` of other rows to report on their
    own (a team's rows per role, ``roles/<role>``): each part's ``<name>/reward_mean``, ``<name>/accuracy`` and
    ``<name>/completion_len`` are reported, and only ``batch`` makes the main figures. ``render(batch) ->
    [R, C, H, W] | None``: the policy's pictures of a batch's rows (``PolicyBase.render``); where it gives
    some, ``image_grid`` (:func:`image_grid`) shows the held-out pictures instead of text ``samples``.

    ``accuracy`` is the mean of the reward named ``accuracy_reward`` (for a 0/1
    reward: the share of rows answered correctly); ``len_correct`` /
    ``len_incorrect``: the mean completion length in tokens of the rows whose
    accuracy reward is 1 / below 1 (absent when there is no such row).
    ``extra`` reward functions are reported too but do not enter ``reward_mean``.

    ``pass_k > 0`` also samples ``pass_k`` completions per row at
    ``temperature`` (a generator seeded with ``seed``, so every evaluation of a
    run draws the same way) and reports ``pass@K``, the share of rows with at
    least one completion whose accuracy reward is 1, and ``sampled_accuracy``,
    the mean accuracy of those samples.
    """
    # scored under a name of their own: a training reward may have the same name (e.g. --reward ...:lenient_accuracy)
    all_fns = rewards + [RewardFn(f"eval:{k}", f, 0.0) for k, f in (extra or {}).items()]
    scorer = RewardScorer(all_fns, timeout=reward_timeout)
    matrix, lengths, samples, images, parts = _greedy_pass(sample, rows, scorer, batch_size, rollout, render,
                                                           progress)
    K = len(rewards)
    result = {"n": len(rows)}
    total = combine_rewards(matrix[:, :K], scorer.weights[:K])
    result["reward_mean"] = as_meant(torch.nanmean(total.double()))
    for k, name in enumerate(scorer.names):
        result[f"rewards/{name}/mean"] = as_meant(torch.nanmean(matrix[:, k].double()))
    if accuracy_reward is not None:
        result["accuracy"] = result[f"rewards/{accuracy_reward}/mean"]
        result.update(_lengths_by_correctness(matrix[:, scorer.names.index(accuracy_reward)], lengths))
        if pass_k > 0 and rollout is not None:
            raise ValueError("eval_pass_k: pass@K is measured with plain single-turn sampling; it is not "
                             "available with the agent rollout (set eval_pass_k: 0)")
        if pass_k > 0:
            result.update(pass_at_k(sample, rows, scorer, scorer.names.index(accuracy_reward), k=pass_k,
                                    batch_size=batch_size, temperature=temperature, seed=seed))
    for name, got in parts.items():
        result.update(_part_figures(name, got, scorer, K, accuracy_reward))
    for name in (extra or {}):
        result[name] = result.pop(f"rewards/eval:{name}/mean")
    result["samples"] = [sample_text(s) for s in samples]
    if images:
        result["image_grid"] = image_grid(images)
    return result


def _greedy_pass(sample, rows: list[dict], scorer: RewardScorer, batch_size: int, rollout, render, progress):
    """The greedy completions of ``rows`` in chunks of ``batch_size``, scored: ``(score matrix [N, K], completion
    lengths per chunk, the first chunk's first two completions, (prompt, picture) pairs where ``render`` gives
    pictures, parts)``; ``parts`` maps the name of a rollout's other rows to ``[(score matrix, completion
    lengths)]`` (:func:`evaluate`)."""
    mats, samples, lengths, images = [], [], [], []
    parts: dict[str, list] = {}
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        if rollout is not None:
            batch = rollout(chunk, list(range(i, i + len(chunk))))
            if isinstance(batch, tuple):
                batch, more = batch
                for name, part in more.items():
                    parts.setdefault(name, []).append((scorer.score_batch(part)[0], part.completion_mask.sum(-1)))
        else:
            batch = sample(chunk, list(range(i, i + len(chunk))), num_generations=1, temperature=0.0)
        m, _ = scorer.score_batch(batch)
        mats.append(m)
        lengths.append(batch.completion_mask.sum(-1))
        pictures = render(batch) if render is not None else None
        if pictures is not None:  # a policy of pictures: a grid of the held-out pictures instead of text samples
            images.extend(zip(batch.columns["prompt"], pictures))
        else:
            samples.extend(batch.columns["completion"][:2] if i == 0 else [])
        if progress is not None:
            progress(len(chunk))
    return torch.cat(mats), lengths, samples, images, parts


def _lengths_by_correctness(acc: torch.Tensor, lengths: list[torch.Tensor]) -> dict:
    """``len_correct`` / ``len_incorrect``: the mean completion length of the rows whose accuracy reward ``acc``
    is 1 / below 1, each only where there is such a row."""
    n_tok = torch.cat(lengths).float()
    out = {}
    for key, sel in (("len_correct", acc >= 1), ("len_incorrect", acc < 1)):
        if bool(sel.any()):
            out[key] = as_meant(n_tok[sel].double().mean())
    return out


def _part_figures(name: str, got: list, scorer: RewardScorer, K: int, accuracy_reward: str | None) -> dict:
    """``<name>/reward_mean``, ``<name>/accuracy`` (with an accuracy reward) and ``<name>/completion_len`` of a
    rollout's other rows ``got`` (``[(score matrix, completion lengths)]``)."""
    m = torch.cat([g[0] for g in got])
    out = {f"{name}/reward_mean": as_meant(torch.nanmean(combine_rewards(m[:, :K], scorer.weights[:K]).double()))}
    if accuracy_reward is not None:
        out[f"{name}/accuracy"] = as_meant(torch.nanmean(m[:, scorer.names.index(accuracy_reward)].double()))
    out[f"{name}/completion_len"] = as_meant(torch.cat([g[1] for g in got]).double().mean())
    return out


def image_grid(images: list, per_row: int = 10, max_rows: int = 10) -> str:
    """The held-out images as one PNG data URI: a row per condition (prompt, in first-seen order, at most
    ``max_rows``), its first ``per_row`` images left to right (the same fixed noises before and after)."""
    from ..media import grid_png, png_data_uri

    by: dict[str, list] = {}
    for prompt, img in images:
        by.setdefault(str(prompt), []).append(img)
    keys = list(by)[:max_rows]
    cols = min(per_row, max(len(by[k]) for k in keys))
    cells = [by[k][j] if j < len(by[k]) else torch.zeros_like(by[k][0]) for k in keys for j in range(cols)]
    return png_data_uri(grid_png(torch.stack(cells), rows=len(keys), cols=cols))


def sample_text(completion) -> str:
    """A completion as the text summary.json shows: the string, a chat reply's content, or (actions that are
    not text) their ``str`` cut to 200 characters."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[0], dict):
        return completion[0]["content"]
    return str(completion)[:200]


def pass_at_k(sample, rows: list[dict], scorer: RewardScorer, acc_index: int, *, k: int, batch_size: int,
              temperature: float, seed: int) -> dict:
    """``{"pass@k": share of rows with >= 1 of k sampled completions correct, "sampled_accuracy": mean}``."""
    gen = torch.Generator().manual_seed(seed)
    hits, accs = [], []
    per = max(1, batch_size // k)
    for i in range(0, len(rows), per):
        chunk = rows[i:i + per]
        batch = sample(chunk, list(range(i, i + len(chunk))), num_generations=k, temperature=temperature,
                       generator=gen)
        m, _ = scorer.score_batch(batch)
        acc = torch.nan_to_num(m[:, acc_index], nan=0.0).view(len(chunk), k)
        hits.append((acc >= 1).any(-1).float())
        accs.append(acc.mean(-1))
    return {f"pass@{k}": as_meant(torch.cat(hits).double().mean()),
            "sampled_accuracy": as_meant(torch.cat(accs).double().mean())}


def as_meant(mean: torch.Tensor) -> float:
    """A mean of float32 rewards as the number it stands for: computed in float64 (1 of 40 is 0.025), then
    read at float32's precision (rewards of 0.1, stored as float32's 0.100000001..., average to 0.1), so
    summary.json shows 0.025 rather than 0.02500000037252903."""
    return float(str(np.float32(float(mean))))
