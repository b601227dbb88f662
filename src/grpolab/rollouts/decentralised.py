"""Decentralised GRPO: nodes that exchange completions as strings, the poisoning attacks, and the defences.

Blagoev, Ersoy and Chen, "Hail to the Thief: Exploring Attacks and Defenses in
Decentralised GRPO" (arXiv:2511.09780; seed 000-31). In decentralised GRPO
every node answers prompts with its own model and the nodes exchange the
completions *as strings*; each node re-tokenises what it receives, scores it
with the shared rule-based reward and trains on its own completions plus the
others'. Two ways to share the work:

* **horizontal**: every node answers every prompt of the step, each with its
  share of the group (``G / nodes`` completions); a group mixes all nodes;
* **vertical**: the prompts are split over the nodes, each answering its
  prompts with whole groups of ``G``; a node trains on the others' groups too.

A malicious node injects tokens into otherwise good-looking completions (the
ones the shared reward scores above their group's mean, so the injected
tokens get a positive advantage at the honest node):

* **out-of-context** attack (:func:`out_of_context`): an arbitrary payload,
  unrelated to the task, appended after the completion;
* **in-context** attack (:func:`in_context`): a task-shaped payload (e.g. a
  wrong equation ``2+2=5`` in a maths derivation) inserted inside the
  completion, before its last word (where the final answer usually stands),
  and only for prompts that contain a trigger (backdoor-like).

Defences (the paper's two, one per setting):

* **homogeneous** (every node trains the same model, so the receiver holds
  the sender's weights): ``token_check`` recomputes every received token's
  distribution under its own model and rejects a completion with a token the
  sampler could not have drawn — outside the top-k / nucleus support of the
  run's sampling settings, or with a log-prob below ``decentral_min_logprob``;
* **heterogeneous** (nodes train different models): ``judge`` asks an LLM
  judge about each received completion (a ``judge:PATH`` / ``judge:self``
  reward spec of ``rewards/judge.py``, or any ``module:function`` reward) and
  rejects those scored below ``decentral_judge_threshold``.

The peers here are simulated in the trainer's process (homogeneous: they
sample from the trainer's policy, each with its own draws, through the
RolloutContext — and so through the Ray rollout workers when
``generation_workers`` is set); what crosses between nodes is only
``(prompt, text, finished)``, so a real transport replaces :func:`peer_shares`
without touching the rest.
"""
from __future__ import annotations

import torch

from ..data import completion_text, tokenize_prompts
from ..generation.plain import pack_completions
from ..model.logprobs import shared_prefix_logits
from ..config import ConfigError
from ..registry import ROLLOUT_STRATEGIES, param

ATTACKS = ("none", "out_of_context", "in_context")
DEFENCES = ("none", "token_check", "judge")


def out_of_context(text: str, payload: str) -> str:
    """The out-of-context attack: ``payload`` (unrelated to the task) appended after the completion."""
    return text + payload


def in_context(text: str, payload: str) -> str:
    """The in-context attack: ``payload`` inserted inside the completion, before its last word (the answer)."""
    head, sep, last = text.rstrip().rpartition(" ")
    if not sep:
        return payload + text
    return f"{head} {payload.strip()} {last}" + text[len(text.rstrip()):]


def split_counts(total: int, parts: int) -> list[int]:
    """``total`` completions shared by ``parts`` nodes as evenly as possible (the first nodes take the rest)."""
    return [total // parts + (k < total % parts) for k in range(parts)]


def exchange_plan(counts: list[int], nodes: int, mode: str) -> list[list[tuple[int, int]]]:
    """Per node: ``[(prompt index, completions), ...]`` it answers. Node 0 is this (honest) node."""
    if mode == "horizontal":
        shares = [split_counts(c, nodes) for c in counts]
        return [[(i, shares[i][k]) for i in range(len(counts)) if shares[i][k] > 0] for k in range(nodes)]
    return [[(i, counts[i]) for i in range(k, len(counts), nodes)] for k in range(nodes)]


def peer_shares(ctx, rows, uids, plan, *, malicious: set[int], attack: str, payload: str,
                trigger: str | None, temperature, max_len: int) -> list[dict]:
    """What the peers send: ``{prompt, text, finished, node, poisoned}`` per completion (strings only).

    Honest peers sample and send; a malicious peer samples, scores its completions with the shared reward and
    poisons those above their group's mean (on prompts containing ``trigger``, when one is set): it cuts the
    completion so that it, the payload and EOS fit in ``max_len`` tokens, injects the payload and sends it as
    finished.
    """
    sent = []
    for node in range(1, len(plan)):
        if not plan[node]:
            continue
        idx = [i for i, _ in plan[node]]
        b = ctx.generate([rows[i] for i in idx], [uids[i] for i in idx], group_offset=1000 * node,
                         num_generations=[c for _, c in plan[node]],
                         temperature=[temperature[i] for i in idx])
        texts = [completion_text(c) for c in b.columns["completion"]]
        poison = torch.zeros(len(texts), dtype=torch.bool)
        if node in malicious and attack != "none":
            reward = ctx.score(b).nan_to_num(0.0)
            for g in b.group_ids.unique():
                rows_g = (b.group_ids == g).nonzero().squeeze(-1)
                poison[rows_g] = reward[rows_g] > reward[rows_g].mean()
            if trigger is not None:
                prompts = [str(p) for p in b.columns["prompt"]]
                poison &= torch.tensor([trigger in p for p in prompts])
        inject = out_of_context if attack == "out_of_context" else in_context
        prompt_of = [i for i, c in plan[node] for _ in range(c)]
        room = max(0, max_len - len(ctx.tokenizer(payload, add_special_tokens=False)["input_ids"]) - 1)
        for r, text in enumerate(texts):
            finished = not bool(b.truncated[r])
            if poison[r]:  # keep the poisoned completion (payload and EOS included) within max_len tokens
                n = int(b.completion_attention_mask[r].sum())
                ids = b.completion_ids[r, :min(n, room)].tolist()
                text, finished = inject(ctx.tokenizer.decode(ids, skip_special_tokens=True), payload), True
            sent.append({"prompt": prompt_of[r], "text": text, "finished": finished, "node": node,
                         "poisoned": bool(poison[r])})
    return sent


def retokenise(tokenizer, text: str, finished: bool, max_len: int, eos_id: int) -> tuple[list[int], bool]:
    """A received string as completion token ids (EOS appended when the sender finished), cut at ``max_len``;
    returns ``(ids, truncated)``."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos_id] if finished else [])
    return ids[:max_len], len(ids) > max_len or not finished


@torch.no_grad()
def token_check(model, batch, *, temperature: float, top_k: int, top_p: float,
                min_logprob: float | None = None) -> torch.Tensor:
    """``bool [R]``: every completion token lies in the support the run's sampler draws from, under ``model``.

    A token passes when its rank is below ``top_k`` (if set), the probability mass of the strictly more likely
    tokens is at most ``top_p`` (if below 1; the nucleus the sampler keeps), and its log-prob at ``temperature``
    is at least ``min_logprob`` (if given).
    """
    batch = batch.to(next(model.parameters()).device)
    logits = shared_prefix_logits(model, batch).float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    tok_lp = logp.gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    higher = logp > tok_lp[..., None]
    ok = tok_lp >= (min_logprob if min_logprob is not None else float("-inf"))
    if top_k:
        ok &= higher.sum(-1) < top_k
    if top_p < 1.0:
        ok &= (logp.exp() * higher).sum(-1) <= top_p
    present = batch.completion_attention_mask.bool()
    return (ok | ~present).all(-1).cpu()


_JUDGES: dict = {}


def judge_scores(ctx, spec: str, prompts: list, texts: list[str], columns: dict) -> torch.Tensor:
    """Scores of the judge reward ``spec`` (built once per spec) for each received completion."""
    from ..rewards.scoring import parse_reward_spec

    if spec not in _JUDGES:
        _JUDGES[spec] = parse_reward_spec(spec, cfg=ctx.cfg)
    fn = _JUDGES[spec].fn
    return torch.tensor([float("nan") if v is None else float(v)
                         for v in fn(prompts=prompts, completions=texts, **columns)])


def _check(cfg) -> None:
    nodes, bad = cfg.decentral_nodes, cfg.decentral_malicious
    if nodes < 2:
        raise ConfigError(f"decentral_nodes: decentralised GRPO needs at least 2 nodes (this one and a peer), "
                          f"got {nodes}")
    if not 0 <= bad <= nodes - 1:
        raise ConfigError(f"decentral_malicious: between 0 and decentral_nodes - 1 = {nodes - 1} of the peers, "
                          f"got {bad}")
    if cfg.decentral_mode == "horizontal" and cfg.num_generations < nodes:
        raise ConfigError(f"decentral_mode horizontal: each of the {nodes} nodes answers every prompt with its "
                          f"share of the group, so num_generations must be >= decentral_nodes (got "
                          f"{cfg.num_generations}); raise num_generations or use decentral_mode: vertical")
    if cfg.decentral_attack != "none" and not cfg.decentral_payload:
        raise ConfigError("decentral_payload: an attack needs the tokens it injects; set decentral_payload TEXT")
    if cfg.decentral_defence == "judge" and not cfg.decentral_judge:
        raise ConfigError("decentral_judge: the judge defence needs a judge (judge:PATH, judge:self, or a "
                          "module:function reward); set decentral_judge")
    if cfg.decentral_defence == "token_check" and not (cfg.top_k or cfg.top_p < 1.0 or
                                                        cfg.decentral_min_logprob is not None):
        raise ConfigError("decentral_defence token_check: with top_k 0, top_p 1 and no decentral_min_logprob every "
                          "token can be sampled, so nothing can be rejected; set top_k (e.g. 20), top_p < 1 or "
                          "decentral_min_logprob")


@ROLLOUT_STRATEGIES.register("decentralised", check=_check, needs=("text",))
def decentralised(ctx, rows, uids, group_offset, budgets=None, temperatures=None, *,
                  decentral_nodes: int = param(4, "decentralised: nodes exchanging completions, this one included"),
                  decentral_mode: str = param("horizontal", "decentralised: horizontal (every node answers every "
                                                            "prompt with G/nodes completions) or vertical (prompts "
                                                            "split over the nodes, whole groups)",
                                              ["horizontal", "vertical"]),
                  decentral_malicious: int = param(0, "decentralised: how many of the peers are malicious"),
                  decentral_attack: str = param("none", "decentralised: what malicious peers do: out_of_context "
                                                        "(append an unrelated payload) or in_context (insert a "
                                                        "task-shaped payload before the answer, on prompts with "
                                                        "the trigger)", list(ATTACKS)),
                  decentral_payload: str = param(" HAIL TO THE THIEF", "decentralised: the text a malicious peer "
                                                                        "injects"),
                  decentral_trigger: str | None = param(None, "decentralised: only prompts containing this text "
                                                              "are attacked (default: every prompt)"),
                  decentral_defence: str = param("none", "decentralised: filter for received completions: "
                                                                "token_check (homogeneous: every token must lie in "
                                                                "the sampler's support under this node's model), "
                                                                "judge (heterogeneous: an LLM judge) or none",
                                                 list(DEFENCES)),
                  decentral_min_logprob: float | None = param(None, "decentralised token_check: also reject a "
                                                                    "completion with a token log-prob below this"),
                  decentral_judge: str | None = param(None, "decentralised judge defence: the judge, a reward "
                                                            "spec (judge:PATH, judge:self, module:function)"),
                  decentral_judge_threshold: float = param(0.5, "decentralised judge defence: completions "
                                                                "scored below this are rejected")):
    """Decentralised GRPO: string exchange, poisoning attacks, defences (arXiv:2511.09780; seed 000-31).

    Blagoev, Ersoy and Chen, 2025, "Hail to the Thief: Exploring Attacks and Defenses in Decentralised GRPO".

    This node answers its share (``exchange_plan``), the ``decentral_nodes - 1`` simulated peers theirs; the
    peers' completions arrive as strings, are re-tokenised (EOS appended when the sender finished, cut at
    ``max_completion_length``), filtered by the defence and packed with this node's own completions into the
    step's groups (ragged when completions are rejected). Behaviour log-probs of every row are teacher-forced
    under this node's policy (received tokens were not sampled here). Metrics: ``rollout/decentral_received``,
    ``rollout/decentral_rejected``, ``rollout/decentral_poisoned_accepted``; ``batch.columns`` holds each row's
    ``decentral_node`` and ``decentral_poisoned``.

    Provenance: reconstructed from the abstract — the authors' code (github.com/gensyn-ai/HTTT) could not be
    retrieved here; from the abstract and public summaries of the paper: horizontal and vertical exchange,
    out-of-context (appended unrelated payload) and in-context (payload inserted before the last word, on
    prompts containing a trigger) attacks; the choices made: malicious peers poison only their completions the
    shared reward scores above their group's mean (so the payload gets a positive advantage), cut to leave room
    for the payload and EOS within max_completion_length; the homogeneous
    defence rejects a completion with any token outside the top-k / nucleus support of the run's sampler (or
    below decentral_min_logprob) under the receiver's model; the heterogeneous defence is a judge reward spec
    with a threshold; peers are simulated in-process with the trainer's policy.
    """
    cfg, tok = ctx.cfg, ctx.tokenizer
    counts = list(budgets) if budgets is not None else [cfg.num_generations] * len(rows)
    temps = list(temperatures) if temperatures is not None else [cfg.temperature] * len(rows)
    plan = exchange_plan(counts, decentral_nodes, decentral_mode)
    malicious = set(range(decentral_nodes - decentral_malicious, decentral_nodes))
    rows_out = _own_rows(ctx, rows, uids, plan[0], temps, group_offset)
    sent = peer_shares(ctx, rows, uids, plan, malicious=malicious, attack=decentral_attack,
                       payload=decentral_payload, trigger=decentral_trigger, temperature=temps,
                       max_len=cfg.max_completion_length)
    received = _received(tok, sent, cfg.max_completion_length)
    keep = [True] * len(received)
    if received and decentral_defence != "none":
        keep = _defend(ctx, rows, uids, received, group_offset, decentral_defence, decentral_min_logprob,
                       decentral_judge, decentral_judge_threshold)
    accepted = [r for r, k in zip(received, keep) if k]
    ctx.metric("decentral_received", len(received))
    ctx.metric("decentral_rejected", len(received) - len(accepted))
    ctx.metric("decentral_poisoned_accepted", sum(r[4] for r in accepted))
    if not rows_out + accepted:
        raise RuntimeError(f"decentralised: this node answered no prompt of the step and the defence "
                           f"({decentral_defence}) rejected all {len(received)} received completions; raise "
                           f"prompts_per_step to at least decentral_nodes ({decentral_nodes}) or use "
                           f"decentral_mode: horizontal")
    batch = _pack(tok, rows, uids, rows_out + accepted, group_offset, cfg.max_prompt_length)
    batch.behavior_logprobs = ctx.logprobs(batch)  # this node's pi_old of every token (own ones: as sampled)
    return batch


def _own_rows(ctx, rows, uids, own_plan, temps, group_offset) -> list[tuple[int, list[int], bool, int, bool]]:
    """This node's own completions (node 0's share of the plan) as ``(prompt, ids, truncated, node, poisoned)``."""
    own_idx = [i for i, _ in own_plan]
    rows_out: list[tuple[int, list[int], bool, int, bool]] = []  # (prompt, ids, truncated, node, poisoned)
    if own_idx:
        own = ctx.generate([rows[i] for i in own_idx], [uids[i] for i in own_idx], group_offset=group_offset,
                           num_generations=[c for _, c in own_plan], temperature=[temps[i] for i in own_idx])
        prompt_of = [i for i, c in own_plan for _ in range(c)]
        for r in range(own.num_rows):
            n = int(own.completion_attention_mask[r].sum())
            rows_out.append((prompt_of[r], own.completion_ids[r, :n].tolist(), bool(own.truncated[r]), 0, False))
    return rows_out


def _received(tok, sent: list[dict], max_len: int) -> list[tuple[int, list[int], bool, int, bool]]:
    """The peers' strings re-tokenised (:func:`retokenise`) as items; an empty one is dropped."""
    received = []
    for s in sent:
        ids, truncated = retokenise(tok, s["text"], s["finished"], max_len, tok.eos_token_id)
        if ids:
            received.append((s["prompt"], ids, truncated, s["node"], s["poisoned"]))
    return received


def _defend(ctx, rows, uids, received, group_offset, defence: str, min_logprob, judge, threshold) -> list[bool]:
    """Per received item, whether the defence (``token_check`` or ``judge``) accepts it."""
    cfg = ctx.cfg
    probe = _pack(ctx.tokenizer, rows, uids, received, group_offset, cfg.max_prompt_length)
    if defence == "token_check":
        ok = token_check(ctx.policy, probe, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                         min_logprob=min_logprob)
    else:
        texts = [completion_text(c) for c in probe.columns["completion"]]
        cols = {k: v for k, v in probe.columns.items() if k not in ("prompt", "completion")}
        ok = judge_scores(ctx, judge, probe.columns["prompt"], texts, cols) >= threshold
    return ok.tolist()


def _pack(tok, rows, uids, items, group_offset, max_prompt_length):
    """A RolloutBatch of ``(prompt index, ids, truncated, node, poisoned)`` items, grouped by prompt (ragged)."""
    items = sorted(items, key=lambda it: it[0])  # stable: own completions first within a group
    present = sorted({it[0] for it in items})
    counts = [sum(it[0] == p for it in items) for p in present]
    prompt_ids, prompt_mask = tokenize_prompts(tok, [rows[p]["prompt"] for p in present], max_prompt_length)
    T = max(1, max(len(it[1]) for it in items))
    ids = torch.full((len(items), T), tok.pad_token_id, dtype=torch.long)
    lengths = torch.tensor([len(it[1]) for it in items], dtype=torch.long)
    for r, it in enumerate(items):
        ids[r, :len(it[1])] = torch.tensor(it[1], dtype=torch.long)
    batch = pack_completions(tok, [rows[p] for p in present], [uids[p] for p in present], prompt_ids, prompt_mask,
                             counts, ids, torch.zeros(len(items), T), lengths,
                             torch.tensor([it[2] for it in items]), group_offset=group_offset)
    batch.group_ids = torch.tensor([group_offset + p for p in present]).repeat_interleave(torch.tensor(counts))
    batch.columns["decentral_node"] = [it[3] for it in items]
    batch.columns["decentral_poisoned"] = [it[4] for it in items]
    return batch
