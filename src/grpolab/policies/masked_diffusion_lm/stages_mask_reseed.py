"""d1's inner iterations for masked diffusion LMs: a new mask seed per pass (update strategy)."""
from __future__ import annotations

import torch

from ...errors import ConfigError
from ...registry import POLICIES, UPDATE_STRATEGIES, param
from ...stages._checks import require_at_least


def derived_seeds(seeds: torch.Tensor, k: int) -> torch.Tensor:
    """Pass ``k``'s mask seed of each row: the row's own seed for k = 0, else (seed · 1000003 + 7919 k) mod
    (2³¹ − 1) (a function of the sampled seed, so a resumed run redraws the same masks)."""
    if k == 0:
        return seeds
    return (seeds.long() * 1000003 + 7919 * k) % (2 ** 31 - 1)


def _check(cfg) -> None:
    if not getattr(POLICIES.get(cfg.policy), "uses_mask_seeds", False):
        raise ConfigError(f"update_strategy: mask_reseed redraws the mask seeds of a masked diffusion LM's log-prob "
                          f"estimator; policy {cfg.policy} has none (use policy masked_diffusion_lm)")
    require_at_least(cfg, 1, "mask_reseed_iterations")
    if cfg.num_iterations != 1:
        raise ConfigError(f"num_iterations: mask_reseed makes the inner passes itself (mask_reseed_iterations); set "
                          f"num_iterations: 1, got {cfg.num_iterations}")


@UPDATE_STRATEGIES.register("mask_reseed", check=_check, needs=("tokens",))
class MaskReseed:
    """d1's μ inner iterations, each with its own mask seed (diffu-GRPO's ``mask_seeds``).

    For passes k = 0 .. μ−1 (μ = ``mask_reseed_iterations``) the rows' mask seeds are
    :func:`derived_seeds` (k = 0: the sampled ones). Before any optimiser step, under the rollout weights θ_old,
    the old log-probs of every pass are computed with that pass's seeds (pass 0: the batch's behaviour
    log-probs), and, when the run has a reference (β > 0), the reference log-probs likewise (pass 0: the
    trainer's). Then pass k runs one standard update (``num_iterations`` must be 1) with the batch's
    ``mask_seed``, ``behavior_logprobs`` and ``ref_logprobs`` set to pass k's; the batch is restored after. So
    old, reference and current log-probs of one pass share one mask, and the masks differ between passes.

    Paper: Zhao et al., "d1: Scaling Reasoning in Diffusion Large Language Models via Reinforcement Learning",
    arXiv:2504.12216.

    Provenance: authors' code — https://github.com/dllm-reasoning/d1, diffu-grpo/diffu_grpo_trainer.py
    (``_generate_and_score_completions`` draws ``mask_seeds``, one per iteration, and computes
    ``old_per_token_logps`` and ``ref_per_token_logps`` for each before training; ``compute_loss`` uses
    ``mask_seeds[this_itr_idx]``); a pass's seed is per row (derived from the row's sampled seed) where d1 draws
    one per iteration for the batch from [0, 2¹²) and reseeds the global RNG.
    Test: tests/test_dllm.py::test_mask_reseed_passes_use_their_own_seeds.
    """

    def __init__(self, *, mask_reseed_iterations: int = param(
            4, "mask_reseed: inner passes over the batch, each with new mask seeds (d1's num_iterations, 12 in "
               "their train.yaml); set num_iterations: 1")):
        self.iterations = int(mask_reseed_iterations)

    def __call__(self, update, batch, ctx):
        seeds0 = batch.row_data["mask_seed"]
        old0, ref0 = batch.behavior_logprobs, batch.ref_logprobs
        passes = []
        with torch.no_grad():
            for k in range(self.iterations):
                batch.row_data["mask_seed"] = derived_seeds(seeds0, k)
                old = old0 if k == 0 else ctx.logprobs(batch) * batch.completion_mask
                ref = ref0
                if k > 0 and ref0 is not None:
                    with ctx.reference_policy() as model:
                        ref = ctx.logprobs(batch, model=model)
                passes.append((batch.row_data["mask_seed"], old, ref))
        out, skipped = {}, 0
        try:
            for seeds, old, ref in passes:
                batch.row_data["mask_seed"], batch.behavior_logprobs, batch.ref_logprobs = seeds, old, ref
                out = update(batch)
                skipped += out["skipped"]
        finally:
            batch.row_data["mask_seed"], batch.behavior_logprobs, batch.ref_logprobs = seeds0, old0, ref0
        return {**out, "skipped": skipped}
