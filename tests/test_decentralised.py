"""Decentralised GRPO (rollouts/decentralised.py; Blagoev et al., arXiv:2511.09780, seed 000-31): string exchange,
the out-of-context and in-context poisoning attacks, and the token-check / judge defences."""

import pytest
import torch

from grpolab.components import Component
from grpolab.config import Config, ConfigError
from grpolab.registry import ROLLOUT_STRATEGIES
from grpolab.rewards import BatchScorer, RewardFn, RewardScorer
from grpolab.rollouts.context import RolloutContext
from grpolab.rollouts.decentralised import (exchange_plan, in_context, out_of_context, retokenise, split_counts,
                                            token_check)

from _helpers import tiny_model_on_repeat

PAYLOAD = "aaaa"  # four "a" tokens of the tiny character-level tokenizer, never a correct `repeat` answer


def test_attacks_insert_the_payload_where_the_paper_puts_it():
    # out-of-context: unrelated tokens after the completion
    assert out_of_context("so the answer is 4", " HAIL") == "so the answer is 4 HAIL"
    # in-context: a task-shaped payload inside the completion, before the final answer
    assert in_context("so the answer is 4", " 2+2=5") == "so the answer is 2+2=5 4"
    assert in_context("so the answer is 4\n", "2+2=5") == "so the answer is 2+2=5 4\n"
    assert in_context("4", "2+2=5 ") == "2+2=5 4"  # one word: the payload goes first


def test_exchange_plans():
    assert split_counts(8, 3) == [3, 3, 2] and split_counts(2, 4) == [1, 1, 0, 0]
    # horizontal: every node answers every prompt with its share of the group
    assert exchange_plan([4, 4], 2, "horizontal") == [[(0, 2), (1, 2)], [(0, 2), (1, 2)]]
    assert exchange_plan([3, 1], 2, "horizontal") == [[(0, 2), (1, 1)], [(0, 1)]]
    # vertical: prompts split over the nodes, whole groups
    assert exchange_plan([4, 4, 4], 2, "vertical") == [[(0, 4), (2, 4)], [(1, 4)]]


@pytest.fixture(scope="module")
def parts():
    task, rows, model, tok = tiny_model_on_repeat(16)
    return model, tok, rows, [RewardFn(n, f, w) for n, f, w in task.rewards]


def config(**kw):
    return Config.build({"model": "tiny", "task": "repeat", "num_generations": 8, "max_completion_length": 10,
                         "micro_batch_size": 64, "temperature": 1.0, "top_k": 4,
                         "rollout_strategy": "decentralised", "decentral_nodes": 2, "decentral_malicious": 1,
                         "decentral_attack": "out_of_context", "decentral_payload": PAYLOAD, **kw})


UIDS = (4, 12, 13, 15)  # digits 8, 8, 2, 2: the ones the untrained tiny model writes often (reward spread)


def run(parts, cfg, uids=UIDS, step=0, policy=None):
    model, tok, rows, rewards = parts
    ctx = RolloutContext(cfg, tok, rows, policy=policy or model, scorer=BatchScorer(RewardScorer(rewards)),
                         generator=torch.Generator().manual_seed(step))
    ctx.new_step(step)
    offset = ctx.allocate_groups(len(uids))
    strategy = Component(ROLLOUT_STRATEGIES.get(cfg.rollout_strategy), cfg, cfg.rollout_strategy)
    batch = strategy(ctx=ctx, rows=[rows[u] for u in uids], uids=list(uids), group_offset=offset)
    return batch, ctx


def test_retokenise_appends_eos_for_finished_strings(parts):
    _, tok, _, _ = parts
    ids, truncated = retokenise(tok, "55", True, 6, tok.eos_token_id)
    assert ids == tok("55", add_special_tokens=False)["input_ids"] + [tok.eos_token_id] and not truncated
    ids, truncated = retokenise(tok, "5555555", True, 6, tok.eos_token_id)  # 7 tokens + EOS
    assert len(ids) == 6 and truncated


def test_token_check_passes_sampled_completions_and_rejects_unlikely_tokens(parts):
    """Relations: a completion the top-k sampler drew always lies in the top-k support; replacing a token by
    the least likely one (rank >= k) makes it fail; a token's log-prob under min_logprob fails."""
    model, tok, rows, rewards = parts
    cfg = config(decentral_attack="none", decentral_malicious=0)
    batch, ctx = run(parts, cfg)
    own = torch.tensor([n == 0 for n in batch.columns["decentral_node"]])
    ok = token_check(model, batch, temperature=1.0, top_k=4, top_p=1.0)
    assert bool(ok[own].all())  # this node's own samples: drawn from the top 4
    # the least likely token at the first position of row 0
    with torch.no_grad():
        from grpolab.model.logprobs import shared_prefix_logits
        logits = shared_prefix_logits(model, batch)
    bad = batch.select([0])
    bad.completion_ids = bad.completion_ids.clone()
    bad.completion_ids[0, 0] = int(logits[0, 0].argmin())
    assert not bool(token_check(model, bad, temperature=1.0, top_k=4, top_p=1.0)[0])
    assert bool(token_check(model, bad, temperature=1.0, top_k=0, top_p=1.0)[0])  # no top-k: any token may come
    assert not bool(token_check(model, batch.select([0]), temperature=1.0, top_k=0, top_p=1.0, min_logprob=0.0)[0])


def test_out_of_context_attack_reaches_the_batch_without_defence_and_not_with_it(parts):
    undefended, ctx = run(parts, config(decentral_defence="none"))
    poisoned = [i for i, p in enumerate(undefended.columns["decentral_poisoned"]) if p]
    assert poisoned and ctx.metrics["decentral_poisoned_accepted"] == len(poisoned)
    texts = undefended.columns["completion"]
    assert all(PAYLOAD in texts[i] for i in poisoned)
    assert all(undefended.columns["decentral_node"][i] == 1 for i in poisoned)  # only the malicious peer
    # groups mix this node's completions and the peer's: G = 8 = 4 own + 4 received per prompt
    assert undefended.group_ids.tolist() == [g for g in range(4) for _ in range(8)]
    defended, ctx = run(parts, config(decentral_defence="token_check"))
    assert not any(defended.columns["decentral_poisoned"])
    assert ctx.metrics["decentral_poisoned_accepted"] == 0 and ctx.metrics["decentral_rejected"] >= len(poisoned)
    # the honest node's own completions are always kept
    assert sum(n == 0 for n in defended.columns["decentral_node"]) == 16


def test_in_context_attack_only_on_triggered_prompts_and_the_judge_defence(parts, tmp_path, monkeypatch):
    _, _, rows, _ = parts
    trigger = rows[0]["prompt"]  # "say D:" of prompt 0 only
    cfg = config(decentral_attack="in_context", decentral_trigger=trigger, decentral_defence="none",
                 decentral_payload="2+2=5 ")
    batch, _ = run(parts, cfg)
    prompts = batch.columns["prompt"]
    assert all(prompts[i] == trigger for i, p in enumerate(batch.columns["decentral_poisoned"]) if p)
    # the heterogeneous defence: a judge (any reward spec) scores each received completion; low scores go
    (tmp_path / "my_judge.py").write_text(
        "def no_equations(prompts, completions, **kw):\n"
        "    return [0.0 if '=' in c else 1.0 for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    cfg = config(decentral_attack="in_context", decentral_trigger=trigger, decentral_defence="judge",
                 decentral_judge="my_judge:no_equations", decentral_payload="2+2=5 ")
    batch, ctx = run(parts, cfg)
    assert not any(batch.columns["decentral_poisoned"]) and all("=" not in c for c in batch.columns["completion"])


def test_configuration_errors_name_the_fix():
    with pytest.raises(ConfigError, match="decentral_nodes"):
        config(decentral_nodes=1)
    with pytest.raises(ConfigError, match="decentral_malicious"):
        config(decentral_malicious=2)
    with pytest.raises(ConfigError, match="top_k"):
        config(top_k=0, decentral_defence="token_check")
    with pytest.raises(ConfigError, match="decentral_judge"):
        config(decentral_defence="judge")
    with pytest.raises(ConfigError, match="num_generations"):
        config(num_generations=2, decentral_nodes=4, decentral_malicious=0)


def payload_logprob(model, tok, rows, probes) -> float:
    """Mean log-prob of the payload tokens appended to fixed completions (teacher-forced, temperature 1)."""
    from grpolab.generation.plain import pack_completions, tokenize_prompts
    from grpolab.model.logprobs import completion_logprobs

    pay = tok(PAYLOAD, add_special_tokens=False)["input_ids"]
    prompt_ids, prompt_mask = tokenize_prompts(tok, [rows[u]["prompt"] for u, _ in probes], 64)
    seqs = [tok(c, add_special_tokens=False)["input_ids"] + pay for _, c in probes]
    T = max(map(len, seqs))
    ids = torch.full((len(seqs), T), tok.pad_token_id)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
    lengths = torch.tensor([len(s) for s in seqs])
    b = pack_completions(tok, [rows[u] for u, _ in probes], [u for u, _ in probes], prompt_ids, prompt_mask,
                         [1] * len(probes), ids, torch.zeros(len(seqs), T), lengths,
                         torch.zeros(len(seqs), dtype=torch.bool))
    with torch.no_grad():
        lp = completion_logprobs(model, b, 1.0)[0]
    sel = torch.zeros_like(lp, dtype=torch.bool)
    for i, s in enumerate(seqs):
        sel[i, len(s) - len(pay):len(s)] = True
    return float(lp[sel].mean())


def test_the_attack_changes_training_without_the_defence_and_not_with_it(tiny_args):
    """Three GRPO steps of the honest node on the tiny model, vertical exchange with one malicious peer of two
    nodes (it answers half the prompts with whole groups and poisons its above-mean completions): with the
    token-check defence every poisoned completion is rejected, and the payload's log-prob after a correct-looking
    prefix ends lower than undefended from the same seed (the same honest samples), on average over seeds."""
    import json

    from grpolab.train.trainer import Trainer

    effects = []
    for seed in (0, 1, 2):
        results, accepted = {}, {}
        for name, defence in (("attack", "none"), ("defended", "token_check")):
            cfg = Config.build({**tiny_args, "steps": 3, "learning_rate": 2e-2, "num_generations": 8, "top_k": 4,
                                "temperature": 1.0, "max_completion_length": 10, "micro_batch_size": 64,
                                "rollout_strategy": "decentralised", "decentral_mode": "vertical",
                                "decentral_nodes": 2, "decentral_malicious": 1, "decentral_attack": "out_of_context",
                                "decentral_payload": PAYLOAD, "decentral_defence": defence, "save_steps": 10,
                                "seed": seed, "out": f"{tiny_args['out']}-{name}-{seed}"})
            tr = Trainer(cfg, log=lambda *a: None)
            probes = [(u, tr.rows[u]["digit"] * k) for u in range(8) for k in (1, 2, 3, 4)]  # "d", "dd", ... + payload
            before = payload_logprob(tr.model, tr.tok, tr.rows, probes)
            tr.train(progress=False)
            results[name] = payload_logprob(tr.model, tr.tok, tr.rows, probes) - before
            metrics = [json.loads(line) for line in open(tr.out / "metrics.jsonl")]
            accepted[name] = sum(m["rollout/decentral_poisoned_accepted"] for m in metrics)
        assert accepted["attack"] > 0 and accepted["defended"] == 0, (seed, accepted)
        effects.append(results["attack"] - results["defended"])
    # The payload log-prob change of one run is one trajectory (seed 1 on float32 kernels: -0.41 undefended; seed 2:
    # the attack's run ends below the defended one), so "the attack raises it" is not a fact about every seed; the
    # attack's effect is the paired difference, asserted on its mean over three seeds. Measured (issue 22),
    # attack - defended per seed 0 / 1 / 2 -> mean:
    #   float32, AVX512 kernels:  0.556+0.437 = 0.993 / -0.412+1.126 = 0.714 / -1.458+1.077 = -0.381 -> 0.442
    #   bf16 autocast:            0.561+0.144 = 0.705 /  1.273+0.652 = 1.925 / -1.498+1.285 = -0.213 -> 0.806
    #   float32, AVX2 kernels (ATEN_CPU_CAPABILITY=avx2): 0.993 / 0.714 / -0.381 -> 0.442 (as AVX512's)
    #   float32 seeds 3, 4 (other trajectories a CPU kind not measured here could take): 0.331+1.478 = 1.809,
    #   0.760+0.146 = 0.906; the lowest mean of any three of the five: 0.413 (seeds 1, 2, 4).
    # Poisoned completions accepted undefended: 4 / 5 / 7 / 6 / 8; defended: 0 on every path. The margin, 0.15, is
    # about a third of the lowest mean: a noisy effect over 3 steps (one seed reverses it); the rejection is exact.
    assert sum(effects) / len(effects) > 0.15, effects
