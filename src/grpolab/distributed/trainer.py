"""The grpolab trainer on many ranks (torchrun): the single-process update, computed by N processes.

What each rank does in a step (docs/distributed.md):

1. **Prompts.** Every rank runs the prompt sampler (same state on every rank: it is seeded alike and fed
   the same gathered outcomes), so all ranks agree on the step's prompts and group ids; rank ``r`` draws
   the completions of a contiguous block of whole groups (``collective.shard_bounds``). With
   ``rollout_seeding: group`` (set for every run with more than one rank) a group's token draws come from
   a generator seeded by (seed, step, group id), so its completions do not depend on the rank drawing it.
2. **Rewards** are computed by the rank that drew the group.
3. **Gather.** The scored rows (token ids, masks, behaviour log-probs, reward matrix: small CPU tensors)
   are all-gathered in rank order, so every rank holds the single-process batch. Every batch-level
   quantity — the dynamic-sampling keep/refill decision (DAPO), batch z-scores / whitening
   (REINFORCE++-baseline), group statistics, batch stages, sampler feedback, metrics — is then computed
   by the unchanged single-process code on the same batch: nothing per component, nothing per paper.
4. **Update.** The step's micro-batches (``micro_batch_size`` rows each, as in one process) are dealt
   to the ranks in contiguous blocks; rank ``r`` runs the forward and backward of its block. The
   aggregation normalisers (``StepTotals``: sequences, tokens, rows) are those of the whole batch, so each
   rank's loss is its share of the single-process sum; DDP / FSDP2 average gradients over ranks, so each
   rank back-propagates ``world_size x`` its share and the averaged gradient is the single-process
   gradient. Ranks run the same number of micro-batches (empty ones padded with a zero-weight row), as
   DDP's and FSDP2's collectives require. Loss and token-metric sums are all-reduced before logging
   (rank 0 logs). The KL reference's log-probs are split the same way and all-gathered.

``tests/test_distributed.py`` checks the result: after 3 steps, 2 gloo ranks and one process hold the same
weights to 1e-10 (float64) for grpo, dapo, reinforce_pp_baseline and prompt_gdro.
"""
from __future__ import annotations

import contextlib
import copy

import torch

from ..batch import RolloutBatch
from ..config import Config, ConfigError
from ..train import checkpoint as ckpt
from ..train.trainer import Trainer
from . import checkpoint as dckpt
from . import collective


class LossModule(torch.nn.Module):
    """The policy and its micro-batch loss as one module, so DDP / FSDP2 see every forward of the update
    (the shared-prefix forward calls the policy's layers directly, not ``policy.forward``)."""

    def __init__(self, policy: torch.nn.Module, loss_fn):
        super().__init__()
        self.policy = policy
        self.loss_fn = loss_fn

    def forward(self, mb, totals, want: frozenset):
        loss, logp, ent, tok_metrics = self.loss_fn(mb, totals, want, model=self.policy)
        # only the loss is back-propagated; the rest leaves as plain copies (FSDP2 hooks every output tensor)
        return (loss, logp.detach().clone(), None if ent is None else ent.detach().clone(),
                {k: v.detach().clone() for k, v in tok_metrics.items()})


class DistributedTrainer(Trainer):
    """:class:`~grpolab.train.trainer.Trainer` on the ranks of a torch.distributed process group (one rank:
    no process group, the same code and the DCP checkpoint format)."""

    def __init__(self, cfg: Config, resume: bool = False, log=None, overwrite: bool = False):
        self.rank, self.world_size = collective.init_from_env(cfg.device)
        if self.world_size > 1 and cfg.rollout_seeding != "group":
            cfg.rollout_seeding = "group"
            if self.rank == 0:
                (log or _stderr)("[grpolab] rollout_seeding: group (each group's token draws seeded by seed, step "
                                 "and group id, so they do not depend on the rank that draws them; a single "
                                 "process reproduces this run with --rollout_seeding group)")
        cfg.check_distributed()  # what FSDP2 cannot train (Config.build refuses it already; a Config set by hand)
        if self.rank != 0:
            log = _silent
        super().__init__(cfg, resume=resume, log=log, overwrite=overwrite)
        collective.barrier()  # rank 0 has claimed the run folder

    # ------------------------------------------------------------- training module
    def wrap_for_training(self) -> torch.nn.Module:
        """``LossModule(policy)``; with several ranks under DDP, or sharded by FSDP2 (a sharded copy: the
        full policy stays for generation, evaluation and the reference, refreshed after every update)."""
        strategy = self.cfg.distributed_strategy
        if strategy == "fsdp2":
            from torch.distributed.fsdp import fully_shard
            module = LossModule(copy.deepcopy(self.model), self._micro_batch_loss)
            if collective.initialized():
                fully_shard(module)
            return module
        module = LossModule(self.model, self._micro_batch_loss)
        if collective.initialized() and self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel
            ids = [torch.cuda.current_device() if self.device.index is None else self.device.index] \
                if self.device.type == "cuda" else None
            return DistributedDataParallel(module, device_ids=ids)
        return module

    @property
    def sharded(self) -> bool:
        return self.cfg.distributed_strategy == "fsdp2"

    def micro_batch_loss(self, mb, totals, want: frozenset):
        return self.train_module(mb, totals, want)

    def pass_precision(self):
        """FSDP2: per-micro-batch casts (a pass-wide cast cache would keep every unsharded weight's copy alive
        between forwards, the memory sharding saves); DDP: one cast per pass like one process."""
        return contextlib.nullcontext() if self.sharded else super().pass_precision()

    def grad_sync(self, last: bool):
        """DDP: no all-reduce before the last micro-batch (``no_sync``); FSDP2: no reduce-scatter before it."""
        if self.world_size == 1 or last:
            if self.sharded and self.world_size > 1:
                self.train_module.set_requires_gradient_sync(True)
            return contextlib.nullcontext()
        if self.sharded:
            self.train_module.set_requires_gradient_sync(False)
            return contextlib.nullcontext()
        return self.train_module.no_sync()

    def train_micro_batches(self, batch: RolloutBatch, mbs: list) -> list:
        """This rank's contiguous block of the step's micro-batches — the very micro-batches one process would
        run, so each forward and backward is the single-process one bit for bit (transformers computes the
        attention softmax in float32, so another split of the rows would differ in the last bits) — padded to
        the largest count over the ranks with zero-weight micro-batches (one row, loss mask 0): every rank
        must run every collective."""
        if self.world_size == 1:
            return mbs
        lo, hi = collective.shard_bounds(len(mbs), self.rank, self.world_size)
        mine = list(mbs[lo:hi])
        n = collective.all_reduce_max(len(mine))
        while len(mine) < n:
            empty = mbs[0].select([0])
            empty.completion_mask = torch.zeros_like(empty.completion_mask)
            mine.append(empty)
        return mine

    def reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        return collective.all_reduce_sums(sums)

    def after_update(self) -> None:
        """FSDP2: copy the updated shards into the full policy (generation, evaluation, checkpoints' peers)."""
        if self.sharded and collective.initialized():
            self._sync_full_policy()

    def _sync_full_policy(self) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(self.train_module, options=StateDictOptions(full_state_dict=True,
                                                                                broadcast_from_rank0=False))
        prefix = "policy."
        self.model.load_state_dict({k[len(prefix):]: v for k, v in full.items()}, strict=True)

    # ------------------------------------------------------------------ rollouts
    def run_strategy(self, idx: list[int], offset: int, budgets, temps):
        """This rank's block of the prompts, drawn and scored here; the scored batches of all ranks gathered
        in rank order (the single-process batch)."""
        if self.world_size == 1:
            return super().run_strategy(idx, offset, budgets, temps)
        lo, hi = collective.shard_bounds(len(idx), self.rank, self.world_size)
        part, errors = None, 0
        if hi > lo:
            part = self.strategy(ctx=self.ctx, rows=[self.rows[i] for i in idx[lo:hi]], uids=idx[lo:hi],
                                 group_offset=offset + lo, budgets=None if budgets is None else budgets[lo:hi],
                                 temperatures=None if temps is None else temps[lo:hi], step=self.step)
            if part.rewards is None:
                errors = self.scorer.score(part)
        errors += self.ctx.reward_errors
        drew = (self.generator.get_state(), self.sample_generator.get_state()) if hi > lo else None
        parts = collective.all_gather_objects((part, errors, drew))
        self.ctx.reward_errors = sum(e for _, e, _ in parts)
        # the run's generators as one process leaves them (rollout_seeding group: as the last group's draws left
        # them), on every rank: what draws from them next (denoising_steps' random steps) draws alike everywhere
        drew = [d for _, _, d in parts if d is not None]
        if drew:
            self.generator.set_state(drew[-1][0])
            self.sample_generator.set_state(drew[-1][1])
        batches = [b for b, _, _ in parts if b is not None]
        seen: set[int] = set()
        for b in batches:  # a strategy that allocates group ids itself would give two ranks' groups one id
            ids = set(torch.unique(b.group_ids).tolist())
            if ids & seen:
                raise ConfigError(f"rollout_strategy: '{self.cfg.rollout_strategy}' gave groups of different "
                                  f"ranks the same group id (it allocates group ids of its own); it cannot run "
                                  f"on several ranks: train it in one process")
            seen |= ids
        return RolloutBatch.concat(batches, pad_id=self.policy.pad_id)

    def reference_logprobs(self, batch: RolloutBatch) -> None:
        """The KL reference's log-probs, split like the update: rank ``r`` runs its block of the micro-batches
        one process would run (the same rows, the same shapes), and the blocks are all-gathered."""
        if self.cfg.beta <= 0 or self.world_size == 1:
            return super().reference_logprobs(batch)
        cfg = self.cfg
        sizes = [mb.num_rows for mb in batch.micro_batches(cfg.micro_batch_size, trim=False,
                                                            max_tokens=cfg.micro_batch_tokens)]
        lo, hi = collective.shard_bounds(len(sizes), self.rank, self.world_size)
        a, b = sum(sizes[:lo]), sum(sizes[:hi])
        part = None
        if b > a:
            with self.reference_policy() as ref:
                part = self.ctx.logprobs(batch.select(list(range(a, b))), model=ref)
        batch.ref_logprobs = torch.cat([p for p in collective.all_gather_objects(part) if p is not None])

    # --------------------------------------------------------------- checkpoints
    def _state(self) -> dict:
        state = super()._state()
        state.pop("optimizer")  # in the DCP folder
        return state

    def write_checkpoint(self):
        return dckpt.save(self.out, self.step, self.train_module, self.optimizer, self._state(),
                          self.cfg.save_total_limit)

    def resume(self) -> None:
        """The newest checkpoint: a DCP one (any world size), or the single-process format (DDP)."""
        last = ckpt.latest_checkpoint(self.out)
        if last is not None and not dckpt.is_dcp(last):
            if self.sharded:
                raise ConfigError(f"--resume {self.out}: its checkpoints are in the single-process format; resume "
                                  f"it with distributed_strategy ddp (or one process)")
            return super().resume()
        last, state = dckpt.load_latest(self.out, self.train_module, self.optimizer, log=self.log)
        if last is None:
            self.log(f"[grpolab] no checkpoint in {self.out}/checkpoints; starting from step 0")
            return
        if self.sharded and collective.initialized():
            self._sync_full_policy()
        self.load_run_state(state)
        self.log(f"[grpolab] resumed from {last} at step {self.step} ({self.world_size} rank"
                 f"{'s' if self.world_size > 1 else ''})")


def _stderr(*a) -> None:
    import sys
    print(*a, file=sys.stderr, flush=True)


def _silent(*a) -> None:
    pass
