"""AR3PO's rollout (000-70): staged sampling that stops a prompt once it is solved, and reuse of a stored
correct response for a prompt still unsolved. Its prompt sampler is ``prompts/budgets.py::AR3POSampler``."""
from __future__ import annotations

import torch

from ..batch import INJECTED, RolloutBatch
from ..data import tokenize_prompts
from ..generation.plain import pack_completions
from ..generation.sampling import per_prompt
from ..registry import ROLLOUT_STRATEGIES
from ..registry import param
from ..prompts.budgets import AR3PO_MAX_STAGES, AR3PO_STAGE_SIZE


@ROLLOUT_STRATEGIES.register("ar3po", needs=("text",))
class AR3PORollout:
    """AR3PO rollout: staged generation, then reuse of a stored correct response.

    Zhang et al. 2025, arXiv:2509.25808, seed 000-70.

    * **Adaptive rollout.** Stage 1 samples ``ar3po_stage_size`` responses for
      every prompt and scores them (``ctx.score``). A prompt with a correct
      response (scalar reward ``>= success_threshold``) stops; the others
      get another stage, up to ``ar3po_max_stages`` stages or the prompt's
      budget (``budgets`` from a sampler such as ``ar3po``: the cap on its
      responses). Groups are therefore ragged: easy prompts end with one
      stage's responses, hard ones with more.
    * **Response reuse.** The latest correct *sampled* response of every
      prompt is stored (token ids). A prompt whose responses are still all
      wrong after the last stage gets its stored response appended to its
      group (when ``ar3po_reuse`` and one exists), so the group has a
      non-zero advantage. The reused row is off-policy: its tokens are marked
      ``INJECTED`` and its behaviour log-probs are teacher-forced under the
      behaviour policy (``ctx.logprobs``), so the importance ratio starts at 1;
      it is trained on (mask 1) like a sampled row, as in the paper.

    The strategy scores every part itself, so ``batch.rewards`` is set and the
    trainer does not rescore. Rows are returned ordered by group. Stateful: the
    response store is checkpointed. Choices: one stored response per prompt
    (the latest); a reused response is re-scored with the reward functions
    rather than trusted (rewards are deterministic for verifiable tasks).

    Provenance: reconstructed from the abstract — staged generation until a correct response and reuse of the
    latest stored correct response for all-wrong prompts, teacher-forced as INJECTED; one stored response per
    prompt and re-scoring are grpolab's choices.
    """

    def __init__(self, *, ar3po_stage_size: int = AR3PO_STAGE_SIZE, ar3po_max_stages: int = AR3PO_MAX_STAGES,
                 ar3po_reuse: bool = param(True, 'AR3PO: add a stored earlier correct response to an all-wrong group'),
                 success_threshold: float = 1.0):
        if ar3po_stage_size < 1 or ar3po_max_stages < 1:
            raise ValueError("need ar3po_stage_size >= 1 and ar3po_max_stages >= 1")
        self.stage, self.stages, self.reuse = int(ar3po_stage_size), int(ar3po_max_stages), bool(ar3po_reuse)
        self.threshold = float(success_threshold)
        self.store: dict[int, dict] = {}   # prompt uid -> {"tokens": [...], "truncated": bool}
        self.reused = 0                    # reused responses so far (a metric)

    def __call__(self, ctx, rows, uids, group_offset, budgets=None, temperatures=None):
        n = len(rows)
        caps = [int(c) for c in budgets] if budgets is not None else [self.stage * self.stages] * n
        temps = per_prompt(temperatures, n, "temperatures") if temperatures is not None else None
        got, solved, parts = [0] * n, [False] * n, []
        for _ in range(self.stages):
            active = [i for i in range(n) if not solved[i] and got[i] < caps[i]]
            if not active:
                break
            counts = [min(self.stage, caps[i] - got[i]) for i in active]
            part = ctx.generate([rows[i] for i in active], [uids[i] for i in active], group_offset=group_offset,
                                num_generations=counts,
                                temperature=None if temps is None else [temps[i] for i in active])
            part.group_ids = torch.tensor([group_offset + i for i in active]).repeat_interleave(torch.tensor(counts))
            ok = ctx.score(part) >= self.threshold
            start = 0
            for i, c in zip(active, counts):
                hit = ok[start:start + c].nonzero().flatten()
                if len(hit):
                    solved[i] = True
                    j = start + int(hit[0])
                    length = int(part.completion_attention_mask[j].sum())
                    self.store[int(uids[i])] = {"tokens": part.completion_ids[j, :length].tolist(),
                                                "truncated": bool(part.truncated[j])}
                got[i] += c
                start += c
            parts.append(part)
        if self.reuse:
            want = [i for i in range(n) if not solved[i] and int(uids[i]) in self.store]
            if want:
                parts.append(self._reused(ctx, [rows[i] for i in want], [uids[i] for i in want],
                                          [group_offset + i for i in want]))
                self.reused += len(want)
        batch = RolloutBatch.concat(parts, pad_id=ctx.tokenizer.pad_token_id)
        order = sorted(range(batch.num_rows), key=lambda r: (int(batch.group_ids[r]), r))
        return batch.select(order)

    def _reused(self, ctx, rows, uids, group_ids) -> RolloutBatch:
        """One row per prompt holding its stored correct response (INJECTED, teacher-forced log-probs)."""
        stored = [self.store[int(u)] for u in uids]
        T = max(len(s["tokens"]) for s in stored)
        ids = torch.full((len(rows), T), ctx.tokenizer.pad_token_id, dtype=torch.long)
        for r, s in enumerate(stored):
            ids[r, :len(s["tokens"])] = torch.tensor(s["tokens"], dtype=torch.long)
        lengths = torch.tensor([len(s["tokens"]) for s in stored])
        prompt_ids, prompt_mask = tokenize_prompts(ctx.tokenizer, [r["prompt"] for r in rows],
                                                   ctx.cfg.max_prompt_length)
        part = pack_completions(ctx.tokenizer, rows, uids, prompt_ids, prompt_mask, [1] * len(rows), ids,
                                torch.zeros(ids.shape), lengths,
                                torch.tensor([s["truncated"] for s in stored]))
        part.group_ids = torch.tensor(group_ids, dtype=torch.long)
        part.token_origin = torch.where(part.completion_attention_mask.bool(), INJECTED, 0).to(torch.int8)
        part.behavior_logprobs = ctx.logprobs(part)
        ctx.score(part)
        return part

    def state_dict(self) -> dict:
        return {"store": {int(k): dict(v) for k, v in self.store.items()}, "reused": self.reused}

    def load_state_dict(self, state: dict) -> None:
        self.store = {int(k): dict(v) for k, v in state["store"].items()}
        self.reused = int(state["reused"])


# ----------------------------------------------------------------------------- GAIN-RL (004-08)
