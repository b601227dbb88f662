"""PTA-GRPO plan-then-reason rollout (seed 000-108): several reasonings sampled under each sampled plan."""
from __future__ import annotations

from ..data import tokenize_prompts
from ..errors import ConfigError
from ..generation.turns import Episode, pack_episodes
from ..registry import ROLLOUT_STRATEGIES, param
from ..rewards.agentic import PLAN_TAG


def _check(cfg) -> None:
    m = cfg.pta_plans_per_prompt
    if m < 1 or cfg.num_generations % m:
        raise ConfigError(f"pta_plans: num_generations ({cfg.num_generations}) must be a multiple of "
                          f"pta_plans_per_prompt ({m}): each plan gets num_generations / pta_plans_per_prompt "
                          f"reasonings")
    if cfg.pta_plan_max_tokens < 1:
        raise ConfigError(f"pta_plans: pta_plan_max_tokens must be >= 1, got {cfg.pta_plan_max_tokens}")


@ROLLOUT_STRATEGIES.register("pta_plans", check=_check, needs=("text",))
def pta_plans(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
              pta_plans_per_prompt: int = param(2, 'PTA-GRPO: plans sampled per prompt; each is continued by '
                                                'num_generations / this many reasonings'),
              pta_plan_max_tokens: int = param(48, 'PTA-GRPO: most tokens of a plan (it ends at </TAG>); '
                                               'the reasoning gets what is left of max_completion_length'),
              pta_plan_tag: str = PLAN_TAG):
    """PTA-GRPO plan-then-reason sampling (Plan Then Action, arXiv:2510.01833, 2025; seed 000-108).

    For each prompt, ``M = pta_plans_per_prompt`` plans are sampled (generation stops at ``</plan>`` or after
    ``pta_plan_max_tokens`` tokens), then ``N = num_generations / M`` reasonings are sampled after each plan
    (the rest of ``max_completion_length``; none when the plan used it all). The group of a prompt is its ``M * N`` rows, each row = its plan's
    tokens (turn 1) + its reasoning (turn 2), all sampled and trained; a plan that ended the reply (EOS) gets
    no reasoning. So every plan has ``N`` reasonings, and the ``pta_plan`` reward — the share of right answers
    among the replies with the same plan — is each plan's success rate over its own ``N`` reasonings, a
    Monte-Carlo estimate of ``P(correct | question, plan)``. ``M = num_generations`` is one reasoning per plan
    (the plain rollout's grouping).

    Provenance: reconstructed from the abstract — the guidance-aware RL stage optimises the answer and the
    quality of the plan; sampling several reasonings per plan to measure that quality is grpolab's reading (the
    paper's equations were not available), as are the plan budget and the stop at ``</plan>``.
    """
    cfg, tok = ctx.cfg, ctx.tokenizer
    if budgets is not None and any(b != cfg.num_generations for b in budgets):
        raise ConfigError("pta_plans: per-prompt budgets are not supported (every prompt gets num_generations)")
    M = pta_plans_per_prompt
    N = cfg.num_generations // M
    ids, mask = tokenize_prompts(tok, [r["prompt"] for r in rows], cfg.max_prompt_length)
    prompts = [ids[i][mask[i].bool()].tolist() for i in range(len(rows))]
    temps = [temperatures[i] if temperatures else cfg.temperature for i in range(len(rows))]
    plan_src = [i for i in range(len(rows)) for _ in range(M)]
    plans = ctx.continue_([prompts[i] for i in plan_src],
                          max_new_tokens=min(pta_plan_max_tokens, cfg.max_completion_length),
                          temperature=[temps[i] for i in plan_src], stop_strings=[f"</{pta_plan_tag}>"])
    ctxs, limits, ctemps, owner = [], [], [], []
    for k, i in enumerate(plan_src):
        ended = plans.finish_reasons[k] in ("eos", "stop_token")
        left = 0 if ended else max(0, cfg.max_completion_length - len(plans.ids[k]))
        for _ in range(N):
            ctxs.append(prompts[i] + list(plans.ids[k]))
            limits.append(left)
            ctemps.append(temps[i])
            owner.append(k)
    conts = ctx.continue_(ctxs, max_new_tokens=limits, temperature=ctemps)
    episodes, ep_rows, ep_uids, groups = [], [], [], []
    for j, k in enumerate(owner):
        i = plan_src[k]
        e = Episode(list(prompts[i]))
        e.add_model_turn(plans.ids[k], plans.logprobs[k], finish_reason=plans.finish_reasons[k],
                         engine=plans.from_engine)
        if limits[j] > 0:
            e.add_model_turn(conts.ids[j], conts.logprobs[j], finish_reason=conts.finish_reasons[j],
                             engine=conts.from_engine)
        episodes.append(e), ep_rows.append(rows[i]), ep_uids.append(uids[i]), groups.append(group_offset + i)
    batch = pack_episodes(tok, episodes, ep_rows, ep_uids, groups, logprobs_fn=ctx.logprobs, is_cap=cfg.vllm_is_cap)
    ctx.metric("pta_plans_ended_early", sum(1 for x in limits if x == 0) / max(1, len(limits)))
    return batch
