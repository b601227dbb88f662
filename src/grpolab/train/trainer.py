"""The GRPO trainer: one step reads like the pipeline.

    prompts = sampler.next(k)                      # PromptSampler
    batch   = rollout(policy, prompts, G)          # RolloutBatch with behaviour log-probs
    batch.rewards = scorer(batch)                  # [rows, K], NaN = unscorable
    batch.advantages = advantage(rewards, groups)  # group statistics
    update(batch)                                  # mu passes: log-probs, loss, aggregation, step
    sampler.feedback(batch)                        # per-prompt outcomes
"""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import random
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..algorithms import (ADVANTAGES, AGGREGATIONS, POLICY_LOSSES, REGULARIZERS, WEIGHTINGS, aggregate_loss,
                          mask_truncated, step_totals, zero_variance_groups_count)
from ..algorithms.kl import kl_penalty
from ..batch import ENVIRONMENT, INJECTED
from ..components import Component
from ..config import Config
from ..errors import ConfigError, WriteError, stand_in_policy, warn_line
from ..data import columns_of, load_user_data, subset, to_json
from ..generation.engines import build_engine
from ..generation.fast_decode import COMPILE
from ..generation.vllm_engine import trainer_behavior
from ..devices import (DTYPES as DTYPE_NAMES, autocast, dtype_reason, resolve_device, resolve_dtype,
                       reuse_freed_memory)
from ..rewards import BatchScorer, RewardFn, RewardScorer, check_signature, parse_reward_spec
from ..rewards.transforms import REWARD_TRANSFORMS
from ..rollouts.context import RolloutContext
from ..rollouts.strategies import ROLLOUT_STRATEGIES
from ..prompts import SAMPLERS
from ..stages import BATCH_STAGES, COLLECTORS, UPDATE_STRATEGIES
from ..policies import POLICIES
from ..tasks import get_task
from . import checkpoint as ckpt
from . import checks
from .evaluate import evaluate
from .metrics import CompletionsLog, DiscardLog, MetricsLog, completions_table, plot_rewards, progress_fields
from .trackers import tracker_names
from .budget import Budget
from .interrupt import catch_lost_interrupts
from .runlock import RunLock
from .rundir import claim_run_folder, load_eval_before, run_paths, save_eval_before, write_atomic, write_failure


def run_writes(cfg: Config) -> list[str]:
    """The names the run writes in its folder (its manifest, train/rundir.py): the run's and its trackers', and
    those its selected components declare in a ``run_paths`` attribute (e.g. training_free's experience library)."""
    return run_paths(tracker_names(cfg.report_to, cfg.tensorboard)) + [
        p for _, obj in cfg.selected() for p in getattr(obj, "run_paths", ())]


def rollout_columns(cfg: Config) -> set[str]:
    """Columns the run's rollout strategy adds to every batch (``columns`` attribute, e.g. the agent rollout's
    ``episode``): reward functions may ask for them."""
    return set(getattr(ROLLOUT_STRATEGIES.get(cfg.rollout_strategy), "columns", ()))


def setup_data(cfg: Config):
    """Train rows, eval rows, reward functions, accuracy reward name, extra eval rewards."""
    if cfg.data:
        rows, held, info = load_user_data(cfg)
        rewards = [parse_reward_spec(s, cfg=cfg) for s in cfg.reward]
        for r in rewards:
            check_signature(r, columns_of(rows) | rollout_columns(cfg), source=f"--data {cfg.data}")
            if cfg.eval_data and held:
                check_signature(r, columns_of(held) | rollout_columns(cfg), source=f"--eval_data {cfg.eval_data}")
        eval_rows = subset(held, list(range(min(len(held), cfg.eval_problems))))
        eval_rows.info = info  # stated in the log and summary.json (Trainer.data_info)
        return rows, eval_rows, rewards, None, {}
    task = get_task(cfg.task, cfg=cfg)
    rewards = [RewardFn(n, f, w) for n, f, w in task.rewards]
    for spec in cfg.reward:  # extra user rewards on a built-in task
        r = parse_reward_spec(spec, cfg=cfg)
        check_signature(r, columns_of(task.train_rows) | rollout_columns(cfg), source=f"task {cfg.task}")
        rewards.append(r)
    return task.train_rows, task.eval_rows[:cfg.eval_problems], rewards, task.accuracy_reward, task.extra


# Method settings that name a *reward column* and default to the built-in tasks' correctness reward
# `accuracy`, and settings that name a *data column* the method cannot run without (docs/data.md).
ACCURACY_NAMED = {"shaping_correct_reward": "the reward whose value marks a correct completion",
                  "dynamic_sampling_metric": "the reward whose spread decides which groups dynamic sampling keeps"}
REWARD_COLUMNS = {"irpo_reward_column": "IRPO's pointwise reward-model scores (e.g. --reward rm:PATH)"}
DATA_COLUMNS = {"paraphrase_set_column": "the paraphrase set each row belongs to",
                "egrpo_entity_column": "E-GRPO's gold entities (a list of strings)",
                "pm4grpo_teacher_column": "PM4GRPO's teacher trace (the worked solution)"}


def check_method_needs(cfg: Config, rewards: list, rows: list, log) -> None:
    """On --data, before any work: a method setting that names the built-in tasks' `accuracy` reward means the
    run's reward function when there is exactly one (said in the log); otherwise a reward or data column the
    method needs and the data lacks is a ConfigError naming it and the fix."""
    names = [r.name for r in rewards]
    for key, what in ACCURACY_NAMED.items():
        value = getattr(cfg, key, None)
        if value is None or value in names or (key == "dynamic_sampling_metric" and
                                                (value == "reward" or not cfg.dynamic_sampling)):
            continue
        if value == "accuracy" and len(names) == 1:
            setattr(cfg, key, names[0])
            log(f"[grpolab] {key}: 'accuracy' is the built-in tasks' reward; this run's one reward function "
                f"'{names[0]}' takes its place ({what})")
            continue
        raise ConfigError(f"{key}: '{value}' is none of this run's reward columns ({', '.join(names)}); the method "
                          f"needs {what}: set --{key} NAME (one of them)")
    for key, what in REWARD_COLUMNS.items():
        value = getattr(cfg, key, None)
        if value is not None and value not in names:
            raise ConfigError(f"{key}: the method needs the reward column '{value}' ({what}); this run's reward "
                              f"columns are {', '.join(names)}: add that reward or set --{key} NAME")
    cols = columns_of(rows)
    for key, what in DATA_COLUMNS.items():
        value = getattr(cfg, key, None)
        if value is not None and value not in cols:
            raise ConfigError(f"{key}: the method needs the data column '{value}' ({what}) in every row of "
                              f"{cfg.data}, which has columns {', '.join(sorted(cols)) or 'none'}: add it, or map "
                              f"one with --column_map OLD:{value}")


def data_statement(info: dict) -> str:
    """The log line that says where evaluation rows come from."""
    if "eval_split" in info:
        if not info["rows"]:
            why = "eval_split 0" if not info["eval_split"] else \
                f"eval_split {info['eval_split']} of {info['train_rows']} rows rounds to 0; give --eval_data FILE"
            return f"eval: none ({why}); training on all {info['train_rows']} rows of {info['train_source']}"
        return (f"eval: {info['rows']} rows held out from {info['train_source']}, seed {info['seed']}; "
                f"training on {info['train_rows']}")
    return f"eval: {info['rows']} rows of {info['source']}; training on {info['train_rows']} rows of " \
           f"{info['train_source']}"


def build_sampler(cfg: Config, rows: list[dict]):
    """The configured prompt sampler, built as ``cls(num_rows=..., seed=..., [rows=...], **its parameters)``.

    Every sampler provides ``next(k) -> list[int]``, ``feedback(**outcomes)`` and
    ``state_dict`` / ``load_state_dict``.
    """
    cls = SAMPLERS.get(cfg.prompt_sampler)
    fixed = {"num_rows": len(rows), "seed": cfg.seed}
    if "rows" in inspect.signature(cls.__init__).parameters:
        fixed["rows"] = rows
    return Component(cls, cfg, cfg.prompt_sampler, **fixed).fn


class Trainer:
    # this process's rank and the number of ranks; grpolab.distributed.DistributedTrainer sets them (only rank
    # 0 writes the run folder)
    rank = 0
    world_size = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def __init__(self, cfg: Config, resume: bool = False, log=None, overwrite: bool = False):
        self.cfg = cfg
        self.log = log or warn_line  # stderr, on a line of its own while a progress bar is drawn
        self.out = Path(cfg.out)
        # one training process per run folder, rank 0's for a multi-rank run (train/runlock.py)
        self.run_lock = RunLock(self.out, active=self.is_main, resume=self.resume_command)
        if self.is_main:
            checks.check_out(self.out)
            self.run_lock.check()  # another process trains there: refused first, naming it
            claim_run_folder(self.out, resume=resume, overwrite=overwrite, dry_run=True,  # refuse before any work
                             writes=run_writes(cfg))
            self.run_lock.acquire(self.log)  # from here until the run ends no other process trains in OUT
        try:
            if cfg.threads:
                torch.set_num_threads(cfg.threads)
            torch.manual_seed(cfg.seed)
            random.seed(cfg.seed)
            np.random.seed(cfg.seed)
            self._setup_data_and_rewards(cfg)
            self._prepare_model(cfg)
            self._setup_optimizer(cfg)
            self._wire_pipeline(cfg)
            self._open_run(resume, overwrite)
        except BaseException:
            self.run_lock.release()
            raise

    # how a run `grpolab train --resume` cannot continue is continued (the Python API: its Python call); None: the CLI
    resume_from_python: str | None = None

    @property
    def resume_command(self) -> str:
        """How the user continues this run (in messages, in the lock's record)."""
        return self.resume_from_python or f"`grpolab train --resume {self.out}`"

    def _setup_data_and_rewards(self, cfg: Config) -> None:
        """Training and held-out rows, the environment, the reward functions (weighted, checked)."""
        self.rows, self.eval_rows, rewards, self.accuracy_reward, self.eval_extra = self.setup_data(cfg)
        self.eval_extra = dict(self.eval_extra)  # a task's environment is no eval reward (grpolab.agents)
        self.environment = getattr(self, "user_environment", None) or self.eval_extra.pop("environment", None)
        self.eval_extra.pop("environment", None)
        self.data_info = getattr(self.eval_rows, "info", None) or getattr(self, "data_info", None) or {
            "source": f"task {cfg.task} (its own held-out set)", "rows": len(self.eval_rows),
            "train_source": f"task {cfg.task}", "train_rows": len(self.rows)}
        self.log(f"[grpolab] {data_statement(self.data_info)}")
        if cfg.reward_weights is not None:
            if len(cfg.reward_weights) != len(rewards):
                raise ConfigError(f"reward_weights: {len(cfg.reward_weights)} weights for {len(rewards)} "
                                  f"reward functions ({', '.join(r.name for r in rewards)})")
            for r, w in zip(rewards, cfg.reward_weights):
                r.weight = float(w)
        checks.check_reward_weights(rewards)
        extra_rewards = getattr(ROLLOUT_STRATEGIES.get(cfg.rollout_strategy), "extra_rewards", None)
        rewards = rewards + [RewardFn(n, f, w) for n, f, w in (extra_rewards(cfg) if extra_rewards else [])]
        if cfg.data:
            check_method_needs(cfg, rewards, self.rows, self.log)
        checks.check_columns(cfg, self.rows)
        self.rewards = rewards

    def _prepare_model(self, cfg: Config) -> None:
        """Device and precision, the policy and tokenizer, the frozen reference, LoRA, checkpointing."""
        # the kind of policy (grpolab/policies/: the causal LM by default): per-step log-probs, LoRA, ...
        self.policy = Component(POLICIES.get(cfg.policy), cfg, cfg.policy).fn
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        self.dtype_reason = dtype_reason(cfg.dtype, self.device, self.dtype)  # logged below, in summary.json
        self.heap_reason = reuse_freed_memory(cfg.cpu_heap_reuse, self.device)  # in summary.json
        if self.policy.float32_only and self.dtype != torch.float32:  # e.g. the image policies' SDE log-probs
            self.dtype, self.dtype_reason = torch.float32, (f"policy {cfg.policy} computes in float32 whatever "
                                                            f"the dtype key ({cfg.dtype})")
        if cfg.behavior_logprobs == "trainer" and "text" not in self.policy.capabilities:
            raise ConfigError(f"behavior_logprobs: 'trainer' recomputes a text policy's log-probs with its training "
                              f"forward; policy {cfg.policy!r} is not one (use behavior_logprobs: sampler)")
        self.model, self.tok = self.load_policy(cfg)
        self.policy.tokenizer = self.tok
        if "text" in self.policy.capabilities:  # prompts fit max_prompt_length, prompt + completion the context
            checks.check_lengths(cfg, self.tok, self.model, self.rows, self.eval_rows, self.environment)
        self.model.to(self.device)
        self.log(f"[grpolab] device {self.device}, forward precision {str(self.dtype).replace('torch.', '')} "
                 f"({self.dtype_reason})")
        self.ref_model = None  # frozen initial weights: the KL term, or a component's reference samples (AAPO)
        self.needs_reference = cfg.beta > 0 or any(getattr(obj, "needs_reference_model", False)
                                                   for _, obj in cfg.selected())
        if self.needs_reference and not cfg.use_lora:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        named = checks.strategy_hook(cfg, "lora_adapters")  # LoRA adapters a rollout needs (a team: one per role)
        if named is not None and cfg.use_lora:
            self.policy.adapters = named(cfg)
        own = checks.strategy_hook(cfg, "role_models")  # roles with a model of their own (role_adapters separate)
        if own is not None:
            self.policy.role_models = own(cfg)
        self.model = self.policy.prepare(self.model)  # LoRA adapters, activation checkpointing

    def _setup_optimizer(self, cfg: Config) -> None:
        """The training module (DDP / FSDP2 wrap it), AdamW over its trainable parameters, the LR schedule."""
        self.train_module = self.wrap_for_training()  # what the update's forward runs through (DDP / FSDP2)
        params = [p for p in self.train_module.parameters() if p.requires_grad]
        # the fused AdamW kernel: the same update in one pass per tensor (measured on SmolLM2-135M, 2 CPU
        # cores: 0.12 s per step against 0.68 s for the default per-tensor loop); not for sharded (DTensor) ones
        fused = self.device.type in ("cpu", "cuda") and all(p.dtype in (torch.float32, torch.float64)
                                                            and not hasattr(p, "device_mesh") for p in params)
        self.optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                           weight_decay=cfg.weight_decay, fused=fused or None)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self.optimizer_updates = 0  # optimiser steps taken by this process: the LR schedule follows them
        self.optimizer.register_step_post_hook(self._count_update)

    def _count_update(self, optimizer, args, kwargs) -> None:
        self.optimizer_updates += 1

    def _wire_pipeline(self, cfg: Config) -> None:
        """The prompt sampler, random streams, the selected components, the scorer, the generation engine and
        the rollout context."""
        self.sampler = build_sampler(cfg, self.rows)
        self.generator = torch.Generator().manual_seed(cfg.seed + 1)
        # token draws happen where the logits are: on an accelerator, from a generator on that device
        self.sample_generator = (self.generator if self.device.type == "cpu"
                                 else torch.Generator(self.device).manual_seed(cfg.seed + 1))

        self.advantage = Component(ADVANTAGES.get(cfg.advantage), cfg, cfg.advantage)
        self.weightings = [Component(WEIGHTINGS.get(n), cfg, n) for n in cfg.advantage_weightings]
        self.policy_loss = Component(POLICY_LOSSES.get(cfg.policy_loss), cfg, cfg.policy_loss)
        self.regularizers = [Component(REGULARIZERS.get(n), cfg, n) for n in cfg.regularizers]
        self.aggregate = AGGREGATIONS.get(cfg.loss_aggregation)
        self.reward_transforms = [Component(REWARD_TRANSFORMS.get(n), cfg, n) for n in cfg.reward_transforms]
        self.strategy = Component(ROLLOUT_STRATEGIES.get(cfg.rollout_strategy), cfg, cfg.rollout_strategy)
        self.stages = [Component(BATCH_STAGES.get(n), cfg, n) for n in cfg.batch_stages]
        self.update_strategy = Component(UPDATE_STRATEGIES.get(cfg.update_strategy), cfg, cfg.update_strategy)
        # what the loss components take from the policy's forward besides log-probs (the entropy is a metric)
        asked = {p.name for c in [self.policy_loss] + self.regularizers for p in c.params} | {"entropy"}
        self.loss_wants = frozenset(asked & self.policy.offers())
        # what they ask of the frozen reference's forward, as ref_<name> (e.g. Flow-GRPO's KL: ref_step_mean)
        self.ref_wants = frozenset(n[4:] for n in asked if n.startswith("ref_") and n[4:] in self.policy.offers())
        self.scorer = BatchScorer(RewardScorer(self.rewards, log=self.log, timeout=cfg.reward_timeout),
                                  self.reward_transforms)
        # the switched-on collector (grpolab/stages/collectors.py; the two refuse each other): DAPO dynamic
        # sampling, or one generation call for steps_per_generation steps; None: one rollout round per step
        self.collector = None
        if cfg.dynamic_sampling:
            self.collector = Component(COLLECTORS.get("dynamic_sampling"), cfg, "dynamic_sampling",
                                       reward_names=list(self.scorer.names), accuracy_reward=self.accuracy_reward)
        elif cfg.steps_per_generation > 1:
            self.collector = Component(COLLECTORS.get("steps_per_generation"), cfg, "steps_per_generation")
        self.components = {f"advantage/{c.name}": c for c in [self.advantage] + self.weightings}
        self.components.update({f"loss/{c.name}": c for c in [self.policy_loss] + self.regularizers})
        self.components.update({f"reward/{c.name}": c for c in self.reward_transforms})
        self.components[f"rollout/{self.strategy.name}"] = self.strategy
        self.components.update({f"stage/{c.name}": c for c in self.stages})
        self.components[f"update/{self.update_strategy.name}"] = self.update_strategy
        if self.collector is not None:
            self.components[f"collector/{self.collector.name}"] = self.collector
        # vLLM, vLLM servers or Ray actors (grpolab/generation/engines.py; None: the trainer samples)
        self.engine = build_engine(cfg, self.model, self.tok, log=self.log, rank=self.rank, world_size=self.world_size)
        self.ctx = RolloutContext(cfg, self.tok, self.rows, policy=self.behavior_policy, scorer=self.scorer,
                                  generator=self.generator, sampling_generator=self.sample_generator,
                                  engine=self.engine, log=self.log,
                                  reference=self.reference_policy if self.needs_reference else None,
                                  actions=self.policy)
        self.ctx.environment = self.environment
        self.ctx.components = self.components  # e.g. spo_prioritized reads the advantage's value tracker
        if hasattr(self.sampler, "attach"):  # samplers that read the model (e.g. hidden states)
            self.sampler.attach(self.ctx)

    def _open_run(self, resume: bool, overwrite: bool) -> None:
        """Step counters and budgets, the run folder (claimed, or resumed from its newest checkpoint), its logs."""
        cfg = self.cfg
        self.behavior_model = None  # stale policy snapshot (off_policy_refresh_steps > 1)
        self.prompts_ahead = None  # async_rollouts: the next step's prompts, drawn while this step trains
        self.step = 0
        self.skipped_steps = 0
        # generated tokens / completions / seconds so far (summed over the ranks), and the limits
        self.budget = Budget(cfg, reduce=self.reduce_sums)
        if self.is_main:
            claim_run_folder(self.out, resume=resume, overwrite=overwrite, log=self.log,  # never lose a user's files
                             writes=run_writes(cfg), resume_with=self.resume_from_python)
        if resume:
            self.resume()
        # the engine loaded the initial weights from disk (a server may hold an earlier run's: needs_sync)
        self._engine_stale = resume or getattr(self.engine, "needs_sync", False)
        if self.is_main:
            cfg.save(self.out / "config.yaml")
            self.metrics = MetricsLog(self.out, tracker_names(cfg.report_to, cfg.tensorboard), resume_step=self.step,
                                      log=self.log, config=cfg.to_dict())
            self.completions = CompletionsLog(self.out, cfg.log_completions_steps, cfg.log_completions_groups,
                                              seed=cfg.seed, resume_step=self.step, log=self.log)
        else:
            self.metrics = self.completions = DiscardLog()
        self.scored_batch = None  # the last step's groups as generated, scored, with advantages
        self.stall = checks.StallGuard(cfg.stall_steps, log=self.log)

    def resume(self) -> None:
        """Load the newest checkpoint of ``out`` that loads (weights, optimiser, scheduler, sampler, components,
        RNG, step)."""
        last, state = ckpt.load_latest(self.out, self.model, log=self.log)
        if last is None:
            self.log(f"[grpolab] no checkpoint in {self.out}/checkpoints; starting from step 0")
            return
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_run_state(state)
        self.log(f"[grpolab] resumed from {last} at step {self.step}")

    def load_run_state(self, state: dict) -> None:
        """Everything of a checkpoint's state but the weights and the optimiser."""
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        for key, comp_state in state.get("components", {}).items():
            self.components[key].fn.load_state_dict(comp_state)
        ckpt.set_rng_state(state["rng"], self.generator, self.sample_generator)
        self.step, self.skipped_steps = state["step"], state["skipped_steps"]
        self.budget.load_state_dict(state.get("budget"))
        if self.cfg.dtype == "auto" and state.get("dtype") in DTYPE_NAMES:  # keep the precision `auto` chose then
            self.dtype = DTYPE_NAMES[state["dtype"]]
            self.dtype_reason = f"kept from the checkpoint: {state.get('dtype_reason', 'dtype auto at the start')}"
        if state.get("behavior") is not None:
            self._refresh_behavior(state["behavior"])

    # ----------------------------------------------------------------- helpers
    # hooks grpolab.distributed.DistributedTrainer replaces (one process: the identity)
    def wrap_for_training(self) -> torch.nn.Module:
        """The module the update runs through (its parameters are optimised)."""
        return self.model

    def micro_batch_loss(self, mb, totals, want: frozenset):
        """:meth:`_micro_batch_loss` through the training module."""
        return self._micro_batch_loss(mb, totals, want)

    def train_micro_batches(self, batch, mbs: list) -> list:
        """The micro-batches this process runs the forward and backward on (one process: all of ``mbs``)."""
        return mbs

    def grad_sync(self, last: bool):
        """Context of one micro-batch's forward and backward; ``last``: the step's last on this process."""
        return contextlib.nullcontext()

    def pass_precision(self):
        """Context of one optimiser pass's micro-batches: an outer autocast region, so autocast casts each
        float32 weight to the forward precision once per pass instead of once per micro-batch (its cast cache
        lives until the outermost region exits; the weights change only at the optimiser step, after it).
        Gradients are the same bit for bit (tested): a cached cast's backward converts each micro-batch's
        gradient to float32 as the per-micro-batch cast did. The backward runs with autocast off
        (:meth:`backward_precision`). A no-op in float32; the FSDP2 trainer keeps per-micro-batch casts."""
        return self.precision()

    def backward_precision(self):
        """Context of a micro-batch's backward: autocast off, as outside :meth:`pass_precision`'s region."""
        return torch.autocast(self.device.type, enabled=False) if self.dtype != torch.float32 else \
            contextlib.nullcontext()

    def reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Sums over the micro-batches of every process (one process: ``sums``)."""
        return sums

    def after_update(self) -> None:
        """Called once the step's optimiser passes are done."""

    def components_after_step(self) -> None:
        """Components whose state follows the policy as the step's update left it (SPO's value tracker): their
        ``after_optimizer_step(logprobs, pad_id)``, ``logprobs(batch)`` the updated policy's log-probs [R, T]."""
        hooks = [c.fn.after_optimizer_step for c in self.components.values()
                 if hasattr(c.fn, "after_optimizer_step")]
        if not hooks:
            return

        def logprobs(batch):
            with torch.no_grad(), self.precision():
                return self.ctx.logprobs(batch.to(self.device), model=self.model).float().cpu()

        for hook in hooks:
            hook(logprobs, pad_id=self.policy.pad_id)

    # hooks a subclass may replace (the Python API, grpolab/api.py: in-memory data, callables, a loaded model)
    def setup_data(self, cfg: Config):
        """``(train rows, eval rows, reward functions, accuracy reward name, extra eval rewards)``."""
        return setup_data(cfg)

    def load_policy(self, cfg: Config):
        """``(module, tokenizer or None)`` of the policy, loaded by the policy kind (``self.rows`` /
        ``self.eval_rows`` are set)."""
        shown = checks.strategy_hook(cfg, "model_texts")  # text the rollout shows besides the data (tools)
        extra = shown(cfg, self.environment, self.rows) if shown and cfg.model == "tiny" else []
        module = self.policy.load(cfg, self.rows, self.eval_rows, extra_texts=extra, log=self.log)
        return module, self.policy.tokenizer

    def _lr_lambda(self, step: int) -> float:
        cfg = self.cfg
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        if cfg.lr_scheduler_type == "linear":
            return max(0.0, 1.0 - frac)
        if cfg.lr_scheduler_type == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))
        return 1.0

    def _state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "sampler": self.sampler.state_dict(), "rng": ckpt.rng_state(self.generator, self.sample_generator),
                "components": {k: c.fn.state_dict() for k, c in self.components.items() if c.stateful},
                "step": self.step, "skipped_steps": self.skipped_steps, "budget": self.budget.state_dict(),
                "dtype": str(self.dtype).removeprefix("torch."), "dtype_reason": self.dtype_reason,
                "behavior": None if self.behavior_model is None else ckpt.trainable_state(self.behavior_model)}

    def save(self) -> Path | None:
        """A checkpoint of this step; one that cannot be written (a full disk) is skipped with one warning line
        naming the folder, the cause, the space and the resume command, and the run goes on (None)."""
        try:
            return self.write_checkpoint()
        except WriteError as e:
            last = ckpt.latest_checkpoint(self.out)
            if self.is_main:
                self.log(f"[grpolab] warning: {e}; skipped, and training goes on: free space there to keep the "
                         f"next checkpoints (stopped now, the run continues with {self.resume_command} from "
                         f"{f'its newest, {last.name}, intact' if last else 'step 0: it has no checkpoint yet'})")
            return None

    def write_checkpoint(self) -> Path:
        """Write this step's checkpoint (train/checkpoint.py; the distributed trainer: DCP, on every rank)."""
        return ckpt.save_checkpoint(self.out, self.step, self.model, self._state(), self.cfg.save_total_limit)

    def precision(self):
        """Autocast context of the configured forward precision (a no-op for float32)."""
        return autocast(self.device, self.dtype)

    def evaluate(self, progress=None) -> dict:
        with self.precision():
            return evaluate(functools.partial(self.policy.sample, self.model, evaluation=True), self.eval_rows,
                            self.rewards, batch_size=self.cfg.eval_batch_size,
                            accuracy_reward=self.accuracy_reward, extra=self.eval_extra, progress=progress,
                            reward_timeout=self.cfg.reward_timeout, rollout=self._eval_rollout(),
                            pass_k=self.cfg.eval_pass_k, temperature=self.cfg.temperature, seed=self.cfg.seed,
                            render=self.policy.render)

    def _eval_rollout(self):
        """The rollout strategy's own greedy evaluation rollout (``eval_rollout``, e.g. the agent's episodes),
        or None (plain greedy completions)."""
        fn = getattr(self.strategy.fn, "eval_rollout", None)
        if fn is None:
            return None
        return lambda rows, uids: fn(self.ctx, self.model, rows, uids, **self.strategy.fixed)

    # -------------------------------------------------------------------- step
    def _refresh_behavior(self, weights: dict | None = None) -> None:
        """Copy the current policy (or ``weights``) into the stale rollout snapshot."""
        if self.behavior_model is None:
            self.behavior_model = copy.deepcopy(self.model).eval()  # same trainable set as the policy
        src = weights if weights is not None else ckpt.trainable_state(self.model)
        self.behavior_model.load_state_dict(src, strict=False)

    def behavior_policy(self):
        """The model rollouts are sampled from.

        On-policy this is the policy itself. With ``off_policy_refresh_steps = N
        > 1`` it is a snapshot refreshed every N steps, so rollouts are up to
        N-1 updates stale; their behaviour log-probs are the snapshot's, and the
        clipped ratio pi_theta / pi_old corrects for the staleness (Off-policy
        GRPO, Mroueh et al. 2025, arXiv:2505.22257, seed 000-07).
        """
        n = self.cfg.off_policy_refresh_steps
        if n <= 1:
            return self.model
        if self.behavior_model is None or self.step % n == 0:
            self._refresh_behavior()
        return self.behavior_model

    def rollout(self, num_prompts: int | None = None):
        """Sample prompts, then let the rollout strategy produce their completions.

        A sampler may also choose each prompt's number of completions
        (``budgets(idx)``) and sampling temperature (``temperatures(idx)``).
        """
        cfg = self.cfg
        if self.engine is not None and self._engine_stale:
            self.engine.sync(self.behavior_policy())
            self._engine_stale = False
        n = num_prompts or cfg.prompts_per_step
        if self.prompts_ahead is not None:  # async_rollouts: drawn (and being sampled) during the last step
            (idx, budgets, temps), self.prompts_ahead = self.prompts_ahead, None
        else:
            idx, budgets, temps = self.next_prompts(n)
        offset = self.ctx.allocate_groups(len(idx))
        batch = self.run_strategy(list(idx), offset, budgets, temps)
        if cfg.async_rollouts and offset == 0 and self.step + 1 < cfg.steps:
            self.prefetch_next(n)
        return batch

    def next_prompts(self, n: int):
        """``(prompt indices, completions per prompt or None, temperature per prompt or None)`` from the sampler."""
        idx = self.sampler.next(n)
        return (idx, self.sampler.budgets(idx) if hasattr(self.sampler, "budgets") else None,
                self.sampler.temperatures(idx) if hasattr(self.sampler, "temperatures") else None)

    def prefetch_next(self, n: int) -> None:
        """``async_rollouts``: draw the next step's prompts now; the rollout workers sample them while this step
        trains, with this step's weights (one version stale when used; distributed/ray_workers.py)."""
        self.prompts_ahead = idx, budgets, temps = self.next_prompts(n)
        self.engine.prefetch(self.ctx, [self.rows[i] for i in idx], list(idx), step=self.step + 1, group_offset=0,
                             num_generations=budgets, temperature=temps)

    def run_strategy(self, idx: list[int], offset: int, budgets, temps):
        """The rollout strategy on the prompts ``idx`` (group ids from ``offset``); a distributed run draws its
        rank's share and gathers the scored batch."""
        return self.strategy(ctx=self.ctx, rows=[self.rows[i] for i in idx], uids=idx, group_offset=offset,
                             budgets=budgets, temperatures=temps, step=self.step)

    def generate(self, n: int):
        """``n`` prompts' completions, scored: ``(batch, reward-call errors)``; ``(None, 0)`` when the rollout
        strategy had nothing to train on this step (it returned None; e.g. dr_zero's solver step without a valid
        question): the step is skipped."""
        batch = self.rollout(n)
        if batch is None:
            return None, 0
        if self.cfg.behavior_logprobs == "trainer" and self.engine is None:  # (the engines always do this)
            trainer_behavior(batch, self.ctx, batch.behavior_logprobs, self.cfg.vllm_is_cap, "sampler_logprob_mismatch")
        errors = self.scorer.score(batch) if batch.rewards is None else 0
        errors += self.ctx.reward_errors
        self.ctx.reward_errors = 0
        return batch, errors

    def collect(self):
        """The step's scored batch: one round of ``prompts_per_step`` prompts, or the collector's rounds
        (``dynamic_sampling``: grpolab/stages/collectors.py). Returns ``(batch or None, reward-call errors,
        stats)``; None: no group was kept, the step is skipped."""
        if self.collector is None:
            batch, errors = self.generate(self.cfg.prompts_per_step)
            return batch, errors, {}
        return self.collector(generate=self.generate, scalar=lambda b: self.scorer.scalar(b, step=self.step),
                              prompts_per_step=self.cfg.prompts_per_step, step=self.step, log=self.log,
                              pad_id=self.policy.pad_id, ctx=self.ctx)

    def compute_advantages(self, batch) -> torch.Tensor:
        """Advantages ``[R, T]`` of a batch with ``scalar_rewards`` (estimator, then weightings; zero off the
        loss mask). Reads the batch, changes nothing in it."""
        inputs = {"rewards": batch.scalar_rewards, "group_ids": batch.group_ids, "reward_matrix": batch.rewards,
                  "reward_weights": self.scorer.weights, "prompt_uids": batch.prompt_uids,
                  "completion_mask": batch.completion_mask, "lengths": batch.completion_mask.sum(-1),
                  "truncated": batch.truncated, "behavior_logprobs": batch.behavior_logprobs,
                  "batch": batch, "step": self.step,
                  "policy": self.model}  # read-only, for components that need the model (a critic on its states)
        # inputs the policy computes with its model, for the components that ask (causal LM: TW-GRPO's divergence)
        want = frozenset(p.name for c in [self.advantage] + self.weightings for p in c.params)
        extra = getattr(self.policy, "advantage_inputs", None)
        if extra is not None:
            with torch.no_grad(), self.precision():
                inputs.update(extra(self.model, batch, want, micro_batch_size=self.cfg.micro_batch_size,
                                    max_tokens=self.cfg.micro_batch_tokens))
        adv = self.advantage(**inputs)
        for w in self.weightings:
            adv = w(advantages=adv, **inputs)
        if adv.dim() == 1:
            adv = adv[:, None]
        return adv * batch.completion_mask

    @contextlib.contextmanager
    def reference_policy(self):
        """The frozen initial policy: the reference copy, or (LoRA) the policy with its adapters off."""
        if self.ref_model is not None:
            yield self.ref_model
        else:
            with self.model.disable_adapter():
                yield self.model

    def reference_logprobs(self, batch) -> None:
        """Log-probs of the batch under the frozen reference (LoRA: the base model, adapters off)."""
        if self.cfg.beta <= 0:
            return
        with self.reference_policy() as ref:
            batch.ref_logprobs = self.ctx.logprobs(batch, model=ref)

    def update(self, batch) -> dict:
        """``num_iterations`` optimiser passes over the batch, in micro-batches (the LR schedule steps in
        :meth:`train_step`, once per step)."""
        cfg = self.cfg
        mbs = batch.micro_batches(cfg.micro_batch_size, max_tokens=cfg.micro_batch_tokens)
        if cfg.gradient_checkpointing:
            self.model.train()  # Hugging Face checkpoints layers only in training mode (no dropout in our models)
        totals = step_totals(mbs, constant=cfg.loss_constant or cfg.max_completion_length)  # per role: a team
        params = [p for p in self.train_module.parameters() if p.requires_grad]
        mbs = self.train_micro_batches(batch, mbs)
        sums: dict[str, float] = {}
        ntok = max(float(batch.completion_mask.sum()), 1.0)
        loss_value, skipped, grad_norm = 0.0, 0, float("nan")
        for it in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            loss_value, finite = 0.0, True
            with self.pass_precision():  # each weight cast to the forward precision once per pass
                for i, mb in enumerate(mbs):
                    mb = mb.to(self.device)
                    with self.grad_sync(last=i == len(mbs) - 1):
                        with self.precision():
                            loss, logp, ent, tok_metrics = self.micro_batch_loss(mb, totals, self.loss_wants)
                        if not torch.isfinite(loss):
                            finite = False
                            if self.world_size == 1:
                                break  # ranks run every backward (collectives); the gradient norm check skips
                        with self.backward_precision():  # ranks' gradients are averaged: their sum is the loss's
                            (loss * self.world_size).backward()
                    loss_value += float(loss.detach())
                    m = mb.completion_mask
                    if it == 0 and ent is not None:
                        tok_metrics = {**tok_metrics, "entropy": ent.detach()}
                    for k, v in tok_metrics.items():
                        sums[k] = sums.get(k, 0.0) + float((v.detach() * m).sum())
            finite = bool(self.reduce_sums({"__finite__": float(finite)})["__finite__"] == self.world_size)
            if finite:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(
                    params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")))
                finite = math.isfinite(grad_norm)
            if not finite:  # skip the step: weights and optimiser state stay untouched
                self.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                self.log(f"[grpolab] step {self.step + 1}: non-finite loss or gradient in pass {it + 1}; "
                         f"optimiser step skipped, weights unchanged")
                continue
            self.optimizer.step()
        self.model.eval()
        sums = self.reduce_sums({**sums, "__loss__": loss_value})  # over the ranks (one process: unchanged)
        loss_value = sums.pop("__loss__")
        out = {"loss": loss_value if not skipped else float("nan"), "grad_norm": grad_norm,
               "skipped": skipped}
        # a policy whose forward offers no entropy (the image policies) logs none, not a collapse to 0
        out["entropy"] = sums.get("entropy", 0.0) / ntok if "entropy" in self.loss_wants else None
        out["kl"] = sums["kl"] / (ntok * cfg.num_iterations) if "kl" in sums else None
        for k in ("clip_frac_low", "clip_frac_high"):
            out[k] = sums.get(k, 0.0) / (ntok * cfg.num_iterations)
        for k, v in sums.items():
            if k not in out:
                out[k] = v / (ntok * cfg.num_iterations)
        return out

    def _micro_batch_loss(self, mb, totals, want: frozenset, model=None):
        """Forward one micro-batch and its aggregated loss: ``(loss, logprobs, entropy or None, token metrics)``;
        ``want``: what the loss components ask of the policy's forward besides log-probs (:attr:`loss_wants`)."""
        cfg = self.cfg
        ref_out = {}
        if self.ref_wants:  # the frozen reference's terms of this micro-batch (ref_<name>), without gradients
            with torch.no_grad(), self.reference_policy() as ref:
                r = self.policy.forward(ref, mb, want=self.ref_wants, grad=False)
            ref_out = {f"ref_{k}": r[k] for k in self.ref_wants}
        out = {**self.policy.forward(self.model if model is None else model, mb, want=want, grad=True), **ref_out}
        logp, ent = out["logprobs"], out.get("entropy")
        inputs = {**out, "old_logprobs": mb.behavior_logprobs, "advantages": mb.advantages,
                  "mask": mb.completion_mask, "ref_logprobs": mb.ref_logprobs,
                  "group_ids": mb.group_ids, "batch": mb, "step": self.step}
        per_token, tok_metrics = self.policy_loss(**inputs)
        if mb.token_weights is not None:  # e.g. engine/trainer truncated importance weights
            per_token = per_token * mb.token_weights
        if cfg.beta > 0:
            kl = kl_penalty(logp, mb.ref_logprobs, cfg.kl_estimator, gradient=cfg.kl_gradient)
            per_token = per_token + cfg.beta * kl
            tok_metrics = {**tok_metrics, "kl": kl.detach()}
        for reg in self.regularizers:
            extra, reg_metrics = reg(**inputs)
            per_token = per_token + extra
            tok_metrics = {**tok_metrics, **reg_metrics}
        loss = aggregate_loss(self.aggregate, per_token, mb.completion_mask, totals, mb.row_data.get("role"))
        return loss, logp, ent, tok_metrics

    def train_step(self) -> dict:
        """One step; a component's stand-in for a missing defining input stops it (``StandInError``) unless
        ``allow_stand_ins``."""
        with stand_in_policy(self.cfg.allow_stand_ins):
            return self._train_step()

    def _train_step(self) -> dict:
        t0 = time.perf_counter()
        self.scored_batch = None
        self.model.eval()
        self.ctx.new_step(self.step)
        with self.precision():
            batch, errors, stats = self.collect()
        t1 = time.perf_counter()
        if batch is None:  # no group with signal (dynamic sampling), or the rollout had nothing to train on
            self.step += 1  # no optimiser step: the LR schedule does not advance either
            self.skipped_steps += 1
            return {"step": self.step, "skipped": 1, "reward_errors": errors, **stats,
                    "rollout_s": t1 - t0, "train_s": 0.0}
        batch.scalar_rewards = self.scorer.scalar(batch, step=self.step)  # weights, then reward transforms
        if "frac_zero_std_groups" not in stats:  # the generated groups (dynamic sampling counted its rounds)
            stats["frac_zero_std_groups"] = (zero_variance_groups_count(batch.scalar_rewards, batch.group_ids)
                                             / len(torch.unique(batch.group_ids)))
        if self.cfg.mask_truncated_completions:  # truncated rows leave the loss (after the rewards saw them)
            batch.completion_mask = mask_truncated(batch.completion_mask, batch.truncated)
        batch.advantages = self.compute_advantages(batch)
        # kept for log_completions (any step may turn out the last: a budget spent, a stall)
        self.scored_batch = batch if self.completions.due(self.step + 1, last=True) else None
        for stage in self.stages:  # pruning, replay, ...: may change the rows trained on
            batch = stage(batch=batch, rewards=batch.scalar_rewards, ctx=self.ctx, step=self.step)
        scalar = batch.scalar_rewards
        errors += self.ctx.reward_errors
        self.ctx.reward_errors = 0
        with self.precision():
            self.reference_logprobs(batch)
        updates = self.optimizer_updates
        upd = self.update_strategy(update=self.update, batch=batch, model=self.model, optimizer=self.optimizer,
                                   ctx=self.ctx, step=self.step)
        self.after_update()
        self.components_after_step()
        if self.optimizer_updates > updates:  # the LR schedule counts the steps that updated the weights: once
            self.scheduler.step()  # per step, however many passes; none when every pass was skipped (non-finite)
        self._engine_stale = True
        self.sampler.feedback(prompt_uids=batch.prompt_uids, rewards=scalar, group_ids=batch.group_ids,
                              reward_matrix=batch.rewards, lengths=batch.completion_attention_mask.sum(-1),
                              completion_ids=batch.completion_ids * batch.completion_attention_mask, step=self.step)
        t2 = time.perf_counter()
        self.step += 1
        self.skipped_steps += upd["skipped"]
        return {**self._metrics(batch, scalar, errors, upd, t1 - t0, t2 - t1), **stats}

    def _metrics(self, batch, scalar, errors, upd, rollout_s, train_s) -> dict:
        lengths = batch.completion_attention_mask.sum(-1).float()
        m = {"step": self.step,
             "reward_mean": float(torch.nanmean(scalar)) if (~scalar.isnan()).any() else None,
             "reward_std": float(np.nanstd(scalar.numpy(), ddof=1)) if (~scalar.isnan()).sum() > 1 else None}
        for k, name in enumerate(batch.reward_names):
            col = batch.rewards[:, k]
            m[f"rewards/{name}/mean"] = float(torch.nanmean(col)) if (~col.isnan()).any() else None
            m[f"rewards/{name}/unscorable"] = int(col.isnan().sum())
        m.update({"reward_errors": errors,
                  "loss": upd["loss"], "kl": upd["kl"], "entropy": upd["entropy"],
                  "clip_frac_low": upd["clip_frac_low"], "clip_frac_high": upd["clip_frac_high"],
                  "grad_norm": upd["grad_norm"], "skipped": upd["skipped"],
                  "completion_len_mean": float(lengths.mean()), "completion_len_max": int(lengths.max()),
                  "frac_truncated": float(batch.truncated.float().mean()),
                  "advantage_abs_mean": float(batch.advantages.abs().sum() / batch.completion_mask.sum().clamp(min=1)),
                  "lr": self.scheduler.get_last_lr()[0],
                  "rollout_s": rollout_s, "train_s": train_s,
                  "tokens_per_s": float(lengths.sum()) / max(rollout_s + train_s, 1e-9),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "prompt_len": int(batch.prompt_mask.sum(-1).max())})
        present = batch.completion_attention_mask > 0
        for origin, key in ((INJECTED, "frac_injected_tokens"), (ENVIRONMENT, "frac_environment_tokens")):
            share = (batch.token_origin == origin) & present  # injection strategies; agent observations
            if share.any():
                m[key] = float(share.sum()) / max(float(present.sum()), 1.0)
        m.update({f"rollout/{k}": v for k, v in self.ctx.metrics.items()})
        for key in ("engine_logprob_mismatch", "sampler_logprob_mismatch", "rollout_staleness"):  # engine rollouts
            # (vLLM, Ray workers), behavior_logprobs: trainer
            if key in batch.columns:
                m[key] = float(np.mean(batch.columns[key]))
        for k, v in upd.items():
            m.setdefault(k, v)
        return m

    def log_completions(self, last: bool = False) -> None:
        """Sampled groups of this step to OUT/completions.jsonl (every ``log_completions_steps``, and the first
        and the ``last`` step), and as a table to the trackers that have tables."""
        if self.scored_batch is None or not self.completions.due(self.step, last=last or self.step == self.cfg.steps):
            return
        records = self.completions.records(self.scored_batch, self.policy.describe, self.step)
        self.completions.write(records)
        self.metrics.log_table("completions", *completions_table(records), step=self.step)
        pictures = self.policy.render(self.scored_batch)
        if pictures is not None:  # a policy of pictures: the logged groups' pictures to the trackers
            from ..media import to_uint8
            rows = sorted({i for i, g in enumerate(self.scored_batch.group_ids.tolist())
                           if g in {r["group"] for r in records}})
            self.metrics.log_images("samples", to_uint8(pictures[rows]), step=self.step)
        self.scored_batch = None

    # --------------------------------------------------------------------- run
    def train(self, progress: bool = True) -> dict:
        # the run folder's lock, held since __init__, is released when the run ends (train/runlock.py)
        with self.run_lock.training(self.log), catch_lost_interrupts() as interrupted:  # a Ctrl-C whose
            return self._train(progress, interrupted)  # KeyboardInterrupt Python lost still stops the run

    def _train(self, progress: bool, interrupted) -> dict:
        cfg = self.cfg
        from tqdm import tqdm

        summary: dict = {}
        if cfg.eval_before and self.step == 0 and self.eval_rows and self.is_main:
            summary["before"] = self._eval("before")
            save_eval_before(self.out, summary["before"], log=self.log)  # a resumed run's summary keeps it
        elif self.step > 0 and self.is_main and (before := load_eval_before(self.out, log=self.log)) is not None:
            summary["before"] = before
        bar = tqdm(total=cfg.steps, initial=self.step, desc="train", disable=not progress or not self.is_main,
                   file=sys.stderr,
                   dynamic_ncols=True)
        try:
            while self.step < cfg.steps:
                interrupted()  # raises KeyboardInterrupt after a lost one (train/interrupt.py)
                self.budget.begin_step()
                m = self.train_step()
                interrupted()
                m.update(self.budget.end_step())
                if cfg.eval_steps and self.eval_rows and self.step % cfg.eval_steps == 0 and self.step < cfg.steps:
                    m.update({f"eval/{k}": v for k, v in self.evaluate().items() if isinstance(v, (int, float))})
                self.metrics.write(m)
                self.log_completions()
                bar.update(1)
                bar.set_postfix(progress_fields(m))  # a step that kept no group says so (never reward=nan)
                saved = self.step % cfg.save_steps == 0 or self.step == cfg.steps
                if saved:
                    self.save()
                stop = self.budget.spent()
                if stop is not None:  # a budget is spent: end the run here, as if `steps` were reached
                    if not saved:
                        self.save()
                    self.log_completions(last=True)
                    self.log(f"[grpolab] stopping after step {self.step}: {stop}")
                    summary["stopped_by"] = stop
                    break
                stalled = self.stall.update(m)
                if stalled is not None:  # nothing can be learned: stop now, with a checkpoint of this step
                    if not saved:
                        self.save()
                    self.log_completions(last=True)
                    raise checks.RunStalled(stalled)
        finally:
            bar.close()
            self.metrics.close()
        if not self.is_main:  # rank 0 writes the final model, the evaluation and the summary
            return summary
        try:
            plot = plot_rewards(self.out)
        except OSError as e:  # a full disk: the curve is a convenience, the run's end is not
            why = write_failure(e, self.out / "reward_curve.png")
            if why is None:
                raise
            plot = None
            self.log(f"[grpolab] warning: {self.out / 'reward_curve.png'} could not be written: {why}; skipped")
        final = self.out / "final"
        roles = getattr(self.policy, "adapters", [])
        if roles:  # role_adapters lora: final/<role> is the base with that role's adapter merged in
            for name in roles:
                merged = copy.deepcopy(self.model).merge_and_unload(adapter_names=[name])
                self._write_end(final / name, lambda m=merged, n=name: self.policy.save(m, final / n),
                                f"role {name}'s final model")
        elif getattr(self.policy, "role_models", []):  # role_adapters separate: final/<role> is that role's model
            for name in self.policy.role_models:
                self._write_end(final / name, lambda n=name: self.policy.save(self.model.roles[n], final / n),
                                f"role {name}'s final model")
        else:
            to_save = copy.deepcopy(self.model).merge_and_unload() if cfg.use_lora else self.model
            self._write_end(final, lambda: self.policy.save(to_save, final), "the final model")
            if cfg.use_lora:  # the adapters too, where the model's own library loads them (PolicyBase.save_adapters)
                self._write_end(final, lambda: self.policy.save_adapters(self.model, final), "the final adapters")
        where = f"{final}/{{{','.join(roles)}}} (one model per role)" if roles else str(final)
        self.log(f"[grpolab] final model saved to {where}" + (f"; reward curve: {plot}" if plot else ""))
        if cfg.eval_after and self.eval_rows:
            summary["after"] = self._eval("after")
        if "before" in summary and "after" in summary and "accuracy" in summary["before"]:
            b, a = summary["before"]["accuracy"], summary["after"]["accuracy"]
            self.log(f"[grpolab] held-out accuracy: before {100 * b:.1f}%  after {100 * a:.1f}%  "
                     f"({100 * (a - b):+.1f} points, {len(self.eval_rows)} problems, "
                     f"{'deterministic' if 'text' not in self.policy.capabilities else 'greedy'})")
        summary["dtype"], summary["dtype_reason"] = str(self.dtype).removeprefix("torch."), self.dtype_reason
        summary["cpu_heap_reuse"] = self.heap_reason
        if hasattr(self.policy, "compile_decode_reason"):  # causal LM: the decode step compiled or eager, and why
            summary["compile_decode"] = COMPILE.get("reason") or self.policy.compile_decode_reason
        summary["skipped_steps"] = self.skipped_steps
        summary["spent"] = {**self.budget.state_dict(), "steps": self.step}
        summary["data"] = {**self.data_info, "statement": data_statement(self.data_info)}
        self._write_end(self.out / "summary.json",
                        lambda: write_atomic(self.out / "summary.json", to_json(summary, indent=2)), "the summary")
        return summary

    def _write_end(self, path: Path, write, what: str) -> None:
        """``write()`` one of the files that end a run; if it cannot be written (a full disk) remove what part
        of it was written and raise ``WriteError`` naming it, the cause and the resume that writes it again."""
        try:
            write()
        except Exception as e:
            why = write_failure(e, path)
            if why is None:
                raise
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            last = ckpt.latest_checkpoint(self.out)
            raise WriteError(f"{what} could not be written to {path}: {why}. The run's checkpoints are kept "
                             f"(newest: {last.name if last else 'none'}); free space, then {self.resume_command} "
                             f"ends the run again from there") from None

    def _eval(self, when: str) -> dict:
        from tqdm import tqdm
        bar = tqdm(total=len(self.eval_rows), desc=f"eval ({when})", file=sys.stderr, dynamic_ncols=True)
        try:
            res = self.evaluate(progress=bar.update)
        finally:  # ends the bar's line: an error raised here is printed on a line of its own
            bar.close()
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()
                 if k not in ("samples", "image_grid")}  # the grid (a data URI) is in summary.json and the report
        self.log(f"[grpolab] eval {when}: {to_json(shown)}")
        return res
