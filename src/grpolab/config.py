"""One validated configuration: the core keys, plus the parameters of the components the run selects.

Precedence (later wins): defaults < recipe < ``--config`` YAML < ``--key value``.
Core key names follow TRL's ``GRPOConfig`` where the concept is the same. A
component (advantage estimator, policy loss, sampler, rollout strategy, task,
...) declares its own parameters next to its code (``registry.param``); the
keys of a run are the core keys and the parameters of the components it
selects, and an unknown key is an error that lists the valid keys *for this
run*. ``cfg.NAME`` reads a core key or a selected component's parameter.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .devices import HEAP_MODES, check_device_spec
from .errors import ConfigError
from .registry import (ADVANTAGES, AGGREGATIONS, ALL_REGISTRIES, BATCH_STAGES, CAPABILITIES, COLLECTORS,
                       KL_ESTIMATORS, POLICIES, POLICY_LOSSES, REGULARIZERS, REWARD_SPECS, REWARD_TRANSFORMS,
                       ROLLOUT_STRATEGIES, SAMPLERS, TASKS, UPDATE_STRATEGIES, WEIGHTINGS, Param, Registry,
                       declared_params, replaced_key_note)


def _switched_on(value) -> bool:
    """A switch field selects its component: a bool when true, a count (``steps_per_generation``) above 1."""
    return value is True or (not isinstance(value, bool) and isinstance(value, int) and value > 1)


def _f(default, help: str, choices: Any = None, switch: Registry | None = None):
    """A core config field with its help text and (optional) choices: a list, or a Registry (``many``: a list
    of names from it). ``switch``: a bool field whose ``true`` selects the registry's component named like
    the field (the registry's key), or a count field (int, default 1) whose value above 1 selects it."""
    kw = {"default_factory": lambda: list(default)} if isinstance(default, list) else {"default": default}
    return field(metadata={"help": help, "choices": choices, "switch": switch}, **kw)


# report_to's trackers and the pip extra each needs (None: a core dependency)
TRACKER_EXTRAS = {"tensorboard": None, "trackio": "trackio", "wandb": "wandb", "mlflow": "mlflow", "none": None}


def check_report_to(report_to: list) -> None:
    """Refuse, before any work, a tracker whose package is not installed (naming the extra that brings it),
    and ``none`` mixed with a tracker."""
    import importlib.util
    if "none" in report_to and len(set(report_to)) > 1:
        raise ConfigError(f"report_to: 'none' turns every tracker off and cannot be combined with others, got "
                          f"{','.join(report_to)}")
    for name in report_to:
        extra = TRACKER_EXTRAS.get(name)
        if extra is not None and importlib.util.find_spec(extra) is None:
            raise ConfigError(f"report_to: '{name}' needs the {extra} package, which is not installed; install it "
                              f"with `pip install 'grpolab[{extra}]'` (or `pip install 'grpolab[trackers]'` for "
                              f"all three), or remove '{name}' from report_to")


def _many(registry: Registry) -> tuple:
    return (registry, "many")



def engine_name(cfg) -> str | None:
    """The engine a config selects: ``ray`` with ``generation_workers > 0`` (each actor then samples with the
    built-in sampler or vLLM), else ``generation_engine``; None for the trainer's own sampler (``native``)."""
    if cfg.generation_workers:
        return "ray"
    return None if cfg.generation_engine == "native" else cfg.generation_engine

@dataclass
class Config:
    """The core settings; component parameters of this run are in ``params`` (read them as ``cfg.NAME``)."""

    # what to train
    model: str = _f("smollm2", "'smollm2', 'tiny', or a local Hugging Face causal-LM folder (policy causal_lm); "
                    "other policies name their own built-in models and folders (their default_model when unset)")
    policy: str = _f("causal_lm", "what kind of model is trained and how it acts (one step of an action: a token "
                                  "for causal_lm); grpolab components policy lists them", POLICIES)
    task: str = _f("arithmetic", "built-in task (used when --data is not given; a policy other than causal_lm "
                                 "names its own default_task, e.g. digits for the image policies)", TASKS)
    data: str | None = _f(None, "prompt data: JSONL, JSON, CSV, Parquet, a datasets.save_to_disk folder or a local "
                                "dataset folder, with a 'prompt' per row (string or chat messages; docs/data.md)")
    data_split: str = _f("train", "split of --data to train on (JSON {split: rows}, save_to_disk or dataset folders)")
    prompt_column: str | None = _f(None, "column of --data/--eval_data that holds the prompt (renamed to 'prompt')")
    column_map: str | None = _f(None, "rename columns of --data/--eval_data, 'old:new,old2:new2' (e.g. "
                                      "'question:prompt,label:answer')")
    eval_data: str | None = _f(None, "held-out evaluation data (any --data format); default: an eval_split of --data")
    eval_data_split: str | None = _f(None, "split of --eval_data (e.g. 'test' of a saved DatasetDict); default: "
                                           "data_split")
    eval_split: float = _f(0.1, "with --data and no --eval_data: rows held out of --data for evaluation (never "
                                "trained on), a fraction (< 1; none when it rounds to 0 rows) or a count, seeded by "
                                "seed, at most eval_problems; 0 = none")
    reward: list = _f([], "reward functions 'module:function[=weight]', or a registered reward spec (rm:PATH, "
                          "judge:PATH, pm4grpo)", _many(REWARD_SPECS))
    recipe: str | None = _f(None, "named preset of components and parameters (grpolab recipes)")
    out: str = _f("runs/default", "run folder: metrics, checkpoints, final model")
    # schedule
    steps: int = _f(30, "optimiser steps")
    prompts_per_step: int = _f(4, "prompts per optimiser step")
    num_generations: int = _f(8, "completions per prompt (G)")
    num_iterations: int = _f(1, "optimiser passes over each batch (mu)")
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: drop groups whose accuracy does not vary and generate "
                                       "more prompts until prompts_per_step groups are kept (the collector "
                                       "grpolab/stages/collectors.py; its keys: dynamic_sampling_metric, "
                                       "dynamic_sampling_oversample, dynamic_sampling_max_rounds)",
                                switch=COLLECTORS)
    off_policy_refresh_steps: int = _f(1, "rollouts come from a policy snapshot refreshed every N steps "
                                          "(1 = on-policy; Off-policy GRPO, 000-07)")
    steps_per_generation: int = _f(1, "optimiser steps one generation call serves (TRL GRPOConfig "
                                      "steps_per_generation, counted there in micro-batches): every K steps, K x "
                                      "prompts_per_step prompts are decoded together (K x the rows per decode "
                                      "step), scored, split into K step batches in sampler order and trained one "
                                      "per step with the behaviour log-probs of generation time (later steps of "
                                      "the window are up to K-1 updates off-policy; the clipped ratio corrects "
                                      "them); 1 = generate every step (the collector grpolab/stages/collectors.py)",
                                   switch=COLLECTORS)
    micro_batch_size: int = _f(8, "rows per forward/backward (gradient accumulation inside a step)")
    micro_batch_tokens: int = _f(0, "also close a micro-batch before its padded size (rows x (prompt + "
                                    "completion) tokens) exceeds this (0 = rows only)")
    prompt_sampler: str = _f("uniform", "which prompts come next", SAMPLERS)
    rollout_strategy: str = _f("plain", "how completions are produced (hints, injected references, ...)",
                               ROLLOUT_STRATEGIES)
    batch_stages: list = _f([], "stages applied to the scored batch before the loss, in order (pruning, "
                                "replay, ...)", _many(BATCH_STAGES))
    update_strategy: str = _f("standard", "how the optimiser consumes a batch", UPDATE_STRATEGIES)
    # generation
    max_prompt_length: int = _f(512, "prompts longer than this are rejected with an error, at start-up; a rollout "
                                     "strategy may set a larger default when no layer sets it (agent and tree "
                                     "rollouts: room for the tool schemas, grpolab.agents.rollout."
                                     "AGENT_MAX_PROMPT_LENGTH)")
    max_completion_length: int = _f(20, "maximum new tokens per completion")
    temperature: float = _f(0.7, "sampling temperature (log-probs use logits / temperature)")
    top_k: int = _f(0, "sample from the k most likely tokens (0 = off)")
    top_p: float = _f(1.0, "nucleus sampling mass (1.0 = off)")
    sampling_method: str = _f("race", "exact token sampler: 'race' (exponential race; the measured default "
                                      "runs) or 'inverse_cdf' (one uniform per row, ~40x cheaper per decode step, "
                                      "another random stream)", ["race", "inverse_cdf"])
    generation_engine: str = _f("native", "who samples completions: grpolab's KV-cache sampler, a colocated "
                                          "vLLM engine (GPU; pip install 'grpolab[vllm]'), or a vLLM server "
                                          "(`grpolab vllm-serve`) at vllm_server_url",
                                ["native", "vllm", "vllm_server"])
    vllm_server_url: str = _f("http://127.0.0.1:8000", "vllm_server: the address of `grpolab vllm-serve` (the "
                                                        "trainer pushes its weights there after every update); "
                                                        "several servers comma-separated: the prompts are spread "
                                                        "over them, each gets one push per update")
    vllm_server_timeout: float = _f(240.0, "vllm_server: seconds to wait for the server to answer /health")
    rollout_seeding: str = _f("batch", "token-draw random stream: 'batch' (one stream for the step's whole batch) or "
                                       "'group' (each group drawn from its own generator seeded by seed, step and "
                                       "group id, so a group's completions do not depend on which rank or batch "
                                       "draws it; needed by distributed runs, docs/distributed.md)", ["batch", "group"])
    distributed_strategy: str = _f("ddp", "how torch.distributed ranks train (torchrun / --nproc_per_node): 'ddp' "
                                          "(DistributedDataParallel) or 'fsdp2' (torch.distributed.fsdp.fully_shard)",
                                   ["ddp", "fsdp2"])
    vllm_gpu_memory_utilization: float = _f(0.3, "vLLM: fraction of GPU memory the engine may take")
    vllm_max_model_len: int | None = _f(None, "vLLM: maximum prompt + completion length (default: the model's)")
    vllm_dtype: str = _f("auto", "vLLM: weight dtype in the engine ('auto' = the model's)")
    vllm_enforce_eager: bool = _f(False, "vLLM: run the engine eagerly (no CUDA graphs / torch.compile); "
                                         "faster start-up, and what the CPU build is tested with")
    vllm_is_cap: float = _f(2.0, "vLLM: cap C of the truncated importance weight min(pi_trainer/pi_engine, C) "
                                 "per token (TRL's token_truncate correction); also the cap of "
                                 "behavior_logprobs: trainer")
    behavior_logprobs: str = _f("sampler", "pi_old of the ratio with the built-in sampler: 'sampler' = the "
                                           "log-probs recorded while sampling (free; equal to the training "
                                           "forward's up to rounding in float32); 'trainer' = recomputed with the "
                                           "training forward after sampling (one forward without gradients per "
                                           "generation) and a truncated importance weight min(pi_trainer / "
                                           "pi_sampler, vllm_is_cap) per token for the sampler's own mismatch "
                                           "(metric sampler_logprob_mismatch), as the vLLM engines do: for "
                                           "half-precision sampling, where the two differ (docs/benchmarks.md, "
                                           "Speed II); text policies only",
                                ["sampler", "trainer"])
    # algorithm
    advantage: str = _f("group_zscore", "advantage estimator", ADVANTAGES)
    advantage_epsilon: float = _f(1e-4, "epsilon added to the group std (group_zscore)")
    advantage_weightings: list = _f([], "weightings applied to the advantages, in order", _many(WEIGHTINGS))
    policy_loss: str = _f("clipped_ratio", "policy objective", POLICY_LOSSES)
    regularizers: list = _f([], "extra per-token loss terms", _many(REGULARIZERS))
    loss_aggregation: str = _f("seq_mean_token_mean", "per-token loss -> scalar", AGGREGATIONS)
    loss_constant: int | None = _f(None, "normaliser L for loss_aggregation=constant (default max_completion_length)")
    epsilon: float = _f(0.2, "lower clip range eps_low")
    epsilon_high: float | None = _f(None, "upper clip range eps_high (default: epsilon)")
    beta: float = _f(0.0, "KL coefficient; 0 loads no reference model unless a selected component needs one "
                          "(e.g. the aapo_reference rollout)")
    kl_estimator: str = _f("k3", "KL estimator (its value enters the loss)", KL_ESTIMATORS)
    kl_gradient: str | None = _f(None, "estimator whose gradient is used instead (straight-through, e.g. k2 "
                                       "with kl_estimator k3 = verl's k3+); default: kl_estimator's own")
    reward_transforms: list = _f([], "transforms of the combined reward, in order (e.g. overlong_penalty)",
                                 _many(REWARD_TRANSFORMS))
    mask_truncated_completions: bool = _f(False, "leave completions that hit max_completion_length out of the "
                                                 "loss (DAPO overlong filtering; TRL's name)")
    reward_weights: list | None = _f(None, "one weight per reward function (overrides task / =weight)")
    success_threshold: float = _f(1.0, "a completion counts as a success (correct) when its scalar reward >= this: "
                                       "the one threshold of every component that counts successes (prompt "
                                       "samplers, budgets, hints, injected references); a component whose paper "
                                       "sets its own keeps its own key (e.g. dcpo_success_threshold)")
    # 300 s: a call scores a whole step's completions; verifiers take milliseconds, a reward model or judge on
    # a CPU up to about a minute: far below this, while a hung call costs minutes instead of the run
    reward_timeout: float = _f(300.0, "seconds one reward function call may run; a call still running then is "
                                      "abandoned: its rows are unscorable (NaN) for that step, a warning names it "
                                      "and it counts in reward_errors (0 = no limit; a call still running after "
                                      "60 s, or half this limit, is named on screen either way)")
    # optimiser
    learning_rate: float = _f(2e-5, "AdamW learning rate")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.99, "AdamW beta2")
    max_grad_norm: float = _f(1.0, "gradient clipping (0 = off)")
    lr_scheduler_type: str = _f("constant", "learning-rate schedule", ["constant", "linear", "cosine"])
    warmup_steps: int = _f(0, "linear warm-up steps")
    # model options
    tiny_arch: str = _f("llama", "architecture of --model tiny", ["llama", "qwen2"])
    use_lora: bool = _f(False, "train LoRA adapters (PEFT) instead of all weights")
    lora_r: int = _f(16, "LoRA rank")
    lora_alpha: int = _f(32, "LoRA alpha")
    lora_target_modules: list = _f(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                   "modules that get LoRA adapters")
    shared_prefix_forward: bool = _f(True, "encode each group's prompt once in the training forward (exact)")
    gradient_checkpointing: bool = _f(False, "recompute activations in the backward pass (less memory, slower); "
                                             "uses the plain forward, since the shared-prefix forward keeps a "
                                             "KV cache that recomputation would duplicate")
    threads: int = _f(0, "torch CPU threads (0 = all cores)")
    device: str = _f("auto", "where the policy trains and samples: 'auto' (cuda if available, else cpu), "
                             "'cpu', 'cuda', 'cuda:N' or 'mps'")
    dtype: str = _f("auto", "compute precision of forward passes (weights and optimiser state stay float32): "
                            "'auto' = bfloat16 autocast on a GPU that supports it; on a CPU decided from the CPU's "
                            "features, never a timing: bfloat16 where it has native bf16 matrix instructions "
                            "(AVX512-BF16 or AMX-BF16), else float32 (env GRPOLAB_CPU_KIND=avx2|avx512_bf16 "
                            "overrides the detected kind); the choice and why are logged and in summary.json",
                    ["auto", "float32", "bfloat16", "float16"])
    cpu_heap_reuse: str = _f("auto", "keep freed CPU memory in the process's heap for the next step instead of "
                                     "unmapping blocks over 32 MB and faulting them in again (glibc mallopt; "
                                     "measured on a bf16 CPU: system time halved, step 19.3 -> 18.7 s, "
                                     "docs/performance.md): 'auto' = on when the policy runs on the CPU, 'on' = "
                                     "also beside a GPU, 'off' = glibc's default", list(HEAP_MODES))
    static_kv_cache: bool = _f(True, "decode Llama / Qwen2 models with a preallocated KV cache and fused "
                                     "projections (same forward; generation/fast_decode.py)")
    compile_decode: str = _f("off", "compile the static-KV-cache decode step's layers with torch.compile "
                                    "(inductor; once per process): 'on' or 'auto' compile where torch.compile "
                                    "runs (else the eager step, the reason logged once), "
                                    "'off' never; off by default: not measured faster on the 2-core CPU "
                                    "(docs/performance.md)", ["auto", "on", "off"])
    # rollout workers on Ray (docs/distributed.md)
    generation_workers: int = _f(0, "generation engines placed as Ray actors (grpolab's sampler, or vLLM with "
                                    "generation_engine: vllm); 0 = sample in the trainer's process")
    async_rollouts: bool = _f(False, "with generation_workers: sample the next step's prompts while this step "
                                     "trains (one step ahead; corrected with truncated importance weights capped at "
                                     "vllm_is_cap; metric rollout_staleness)")
    max_staleness: int = _f(1, "with generation_workers: a worker never samples with weights more than this many "
                               "pushes older than the trainer's (async_rollouts needs >= 1)")
    ray_address: str | None = _f(None, "Ray cluster to join: 'auto' = the one started with `ray start` on this "
                                       "machine, or HOST:PORT; default: start a local one")
    generation_worker_cpus: float = _f(1.0, "CPUs Ray reserves for each generation worker (its torch threads)")
    generation_worker_gpus: float = _f(0.0, "GPUs Ray reserves for each generation worker (1 for vLLM on a GPU)")
    # evaluation, logging, checkpoints
    eval_before: bool = _f(True, "measure held-out accuracy before training")
    eval_after: bool = _f(True, "measure held-out accuracy after training")
    eval_problems: int = _f(200, "held-out rows for evaluation (greedy)")
    eval_batch_size: int = _f(100, "rows per generation batch during evaluation")
    eval_steps: int = _f(0, "also evaluate every N training steps: held-out accuracy over steps as eval/* in "
                            "metrics.jsonl, with the tokens generated so far (0 = only before and after)")
    eval_pass_k: int = _f(0, "also sample K completions per held-out row at `temperature` and report pass@K "
                             "(share of rows with at least one correct) and sampled_accuracy (0 = off)")
    # budgets: stop before `steps` when one is spent (0 = no limit); `grpolab compare --budget` sets them
    max_generated_tokens: int = _f(0, "stop once the run has sampled this many tokens (every rollout, refill, "
                                      "hint, tree node and turn counts; evaluation does not)")
    max_completions: int = _f(0, "stop once the run has sampled this many completions")
    max_train_seconds: float = _f(0.0, "stop once the training steps have taken this many seconds (evaluation "
                                       "excluded; a resumed run counts the time before)")
    save_steps: int = _f(10, "checkpoint every N steps (and always at the end)")
    save_total_limit: int = _f(2, "keep this many most recent checkpoints")
    allow_stand_ins: bool = _f(False, "when a method's defining input is missing at run time (a data column, "
                                      "span ids, ...), run with the component's documented stand-in and a "
                                      "warning instead of stopping with an error naming what is missing")
    stall_steps: int = _f(10, "stop the run with an error (after a checkpoint) when for this many consecutive "
                              "steps every group had zero reward spread (all advantages 0) or every reward call "
                              "failed; a warning at half of it (0 = never)")
    tensorboard: bool = _f(True, "write TensorBoard event files to OUT/tensorboard (false drops 'tensorboard' "
                                 "from report_to; kept for configs written before report_to)")
    report_to: list = _f(["tensorboard"], "where metrics go besides OUT/metrics.jsonl: a list or comma string of "
                                          "tensorboard, trackio, wandb, mlflow, or none (docs/tracking.md; "
                                          "trackio/wandb/mlflow need `pip install grpolab[NAME]`)",
                         (list(TRACKER_EXTRAS), "many"))
    log_completions_steps: int = _f(10, "every N steps, and at a run's first and last step, append a sample of "
                                        "groups (prompt, completions, rewards, advantages, token counts) to "
                                        "OUT/completions.jsonl (0 = off; 10 = TRL's logging_steps default)")
    log_completions_groups: int = _f(2, "groups per logged step in OUT/completions.jsonl (seeded choice; "
                                        "0 = every group)")
    seed: int = _f(0, "random seed")

    params: dict = field(default_factory=dict, repr=False, metadata={"internal": True})
    dropped_keys: list = field(default_factory=list, repr=False, metadata={"internal": True})

    # ---------------------------------------------------------------- helpers
    def __getattr__(self, name: str):  # only called when normal lookup fails: a component parameter
        params = self.__dict__.get("params", {})
        if name in params:
            return params[name]
        raise AttributeError(f"config has no key '{name}' (core keys and the parameters of this run's components: "
                             f"grpolab config --recipe NAME lists them)")

    def __setattr__(self, name: str, value) -> None:
        params = self.__dict__.get("params")
        if params is not None and name in params and name not in CORE_KEYS:
            params[name] = value
        else:
            object.__setattr__(self, name, value)

    @classmethod
    def field_names(cls) -> list[str]:
        """The core keys."""
        return list(CORE_KEYS)

    @classmethod
    def build(cls, *layers: dict[str, Any], sources: list[str] | None = None, extra: tuple = (),
              lenient: bool = False) -> "Config":
        """Merge dicts of overrides in order, validate, and return a Config.

        ``extra``: further components whose parameters are keys of this run (e.g. ``grpolab sft``'s).
        ``lenient``: keys that no longer apply are dropped instead of rejected (resuming a run folder whose
        ``config.yaml`` an older grpolab wrote, with the parameters of every component).
        """
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for i, layer in enumerate(layers):
            src = (sources[i] if sources and i < len(sources) else "") or "config"
            for k, v in (layer or {}).items():
                key = k.replace("-", "_")
                values[key], origin[key] = v, src
        core = {k: _coerce(k, values[k], origin[k]) for k in values if k in CORE_KEYS}
        cfg = cls(**core)
        if "max_prompt_length" not in core:  # a rollout strategy may size its own default (the agent's tools)
            own = getattr(ROLLOUT_STRATEGIES.get(cfg.rollout_strategy), "max_prompt_length", None) \
                if cfg.rollout_strategy in ROLLOUT_STRATEGIES else None
            if own:
                cfg.max_prompt_length = int(own)
        if cfg.policy in POLICIES:  # a policy kind names its own built-in model and task
            kind = POLICIES.get(cfg.policy)
            if "model" not in core:
                cfg.model = getattr(kind, "default_model", cfg.model)
            if "task" not in core:
                cfg.task = getattr(kind, "default_task", cfg.task)
        decl = cfg.component_params(extra)
        params: dict[str, Any] = {}
        dropped = []
        for k, v in values.items():
            if k in CORE_KEYS:
                continue
            if k in decl:
                params[k] = _coerce_param(decl[k], v, origin[k])
            elif lenient:
                dropped.append(k)
            else:
                raise ConfigError(_unknown_key(k, origin[k], decl))
        for k, p in decl.items():
            if k not in params:
                params[k] = p.value()
        cfg.params = dict(sorted(params.items()))
        cfg.dropped_keys = dropped
        cfg.validate(extra)
        return cfg

    def selected(self, extra: tuple = ()) -> list[tuple[str, Any]]:
        """``(kind/name, component)`` for every component this config selects (plus ``extra``)."""
        out = []
        for f in dataclasses.fields(self):
            switch = f.metadata.get("switch")
            if switch is not None and _switched_on(getattr(self, f.name)):
                out.append((f"{switch.kind}/{f.name}", switch.get(f.name)))
            choices = f.metadata.get("choices")
            many = isinstance(choices, tuple)
            reg = choices[0] if many else choices
            if not isinstance(reg, Registry):
                continue
            if f.name == "task" and self.data is not None:
                continue
            values = getattr(self, f.name)
            for v in (values if many else [values]):
                if reg is REWARD_SPECS:
                    v = v.partition("=")[0]
                    if v not in REWARD_SPECS:
                        continue  # a user reward function module:function
                if v in reg:
                    out.append((f"{reg.kind}/{v}", reg.get(v)))
        for obj in extra:
            out.append((getattr(obj, "__qualname__", str(obj)), obj))
        return out

    def component_params(self, extra: tuple = ()) -> dict[str, Param]:
        """The parameters (config keys) declared by the components this config selects."""
        out: dict[str, Param] = {}
        for _, obj in self.selected(extra):
            out.update(declared_params(obj))
        return out

    def validate(self, extra: tuple = ()) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            many = isinstance(choices, tuple)
            if many:
                choices = choices[0]
            if f.name == "reward":
                continue  # user functions are checked when they are imported (rewards/scoring.py)
            if f.name == "task" and self.data is not None:
                continue
            for v in (value if many else [value]):
                if isinstance(choices, Registry):
                    if v not in choices:
                        raise ConfigError(f"{f.name}: '{v}' is not valid; valid values: "
                                          f"{', '.join(choices.names()) or 'none yet'}")
                elif choices is not None and v not in choices:
                    raise ConfigError(f"{f.name}: '{v}' is not valid; valid values: {', '.join(map(str, choices))}")
        decl = self.component_params(extra)
        for key, value in self.params.items():
            p = decl.get(key)
            if p is not None and p.choices is not None and value not in p.choices:
                raise ConfigError(f"{key}: '{value}' is not valid; valid values: {', '.join(map(str, p.choices))} "
                                  f"({p.help})")
        positive = ["off_policy_refresh_steps", "steps_per_generation", "steps", "prompts_per_step",
                    "num_generations", "num_iterations", "micro_batch_size", "max_completion_length",
                    "max_prompt_length", "save_steps", "eval_batch_size"]
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        self._check_finite()
        for name in ("epsilon", "beta", "learning_rate", "temperature", "max_grad_norm", "weight_decay",
                     "top_k", "threads", "stall_steps", "warmup_steps", "micro_batch_tokens",
                     "log_completions_steps", "log_completions_groups"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.temperature == 0:
            raise ConfigError("temperature: 0 samples greedily, so every completion of a prompt is the same text "
                              "with the same reward (all advantages 0), and the training log-probs divide the "
                              "logits by it; use a sampling temperature > 0 (e.g. 0.7 to 1.0)")
        self._check_group_size(extra)
        if self.epsilon_high is not None and self.epsilon_high < 0:
            raise ConfigError(f"epsilon_high: must be >= 0, got {self.epsilon_high}")
        if self.kl_gradient is not None and self.kl_gradient not in KL_ESTIMATORS:
            raise ConfigError(f"kl_gradient: '{self.kl_gradient}' is not valid; valid values: "
                              f"{', '.join(KL_ESTIMATORS.names())}")
        check_device_spec(self.device)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p: must be in (0, 1], got {self.top_p}")
        check_report_to(self.report_to)
        if self.data is not None and not self.reward:
            self._check_reward_source()
        from .recipes import check_recipe_fits
        check_recipe_fits(self)  # a text recipe on an image run, named with its image recipe (flow_grpo_images)
        self._check_components(extra)
        self._check_rollout_workers()
        self.check_distributed()

    def _check_reward_source(self) -> None:
        """--data without --reward: the run's environment may be the reward (a gym-style ``step()`` or a TRL
        environment's ``reward``: the rollout strategy's ``extra_rewards``, e.g. the agent's ``env_reward``);
        tools alone give none."""
        strategy = ROLLOUT_STRATEGIES.get(self.rollout_strategy) if self.rollout_strategy in ROLLOUT_STRATEGIES \
            else None
        extra = getattr(strategy, "extra_rewards", None)
        if self.params.get("environment"):
            if extra is not None and extra(self):
                return
            raise ConfigError("reward: --data needs at least one --reward module:function; the environment's "
                              "rewards count for nothing here (env_reward_weight is 0): give a --reward or a "
                              "non-zero --env_reward_weight")
        why = (" (tools give no reward of their own; an --env environment whose step() returns rewards is one)"
               if self.params.get("tools") else "")
        raise ConfigError(f"reward: --data needs at least one --reward module:function{why}")

    def check_distributed(self) -> None:
        """What FSDP2 cannot train, refused here, before `--nproc_per_node` starts any rank: its sharded copy of
        the policy is driven only by the standard update, and sharding PEFT's LoRA modules is not supported."""
        if self.distributed_strategy != "fsdp2":
            return
        if self.use_lora:
            raise ConfigError("distributed_strategy: fsdp2 with use_lora: true is not supported (FSDP2 shards the "
                              "full model; LoRA adapters are small enough to replicate); use distributed_strategy: "
                              "ddp with LoRA, or use_lora: false with fsdp2")
        if self.update_strategy != "standard":
            raise ConfigError(f"distributed_strategy: fsdp2 trains a sharded copy of the policy, which "
                              f"update_strategy '{self.update_strategy}' does not drive; use update_strategy: "
                              f"standard with fsdp2, or distributed_strategy: ddp")

    def _check_rollout_workers(self) -> None:
        """Ray rollout workers: counts and resources >= 0; asynchronous rollouts need workers, a staleness of at
        least one version and a strategy that generates the sampled prompts as they are."""
        for name in ("generation_workers", "max_staleness", "generation_worker_cpus", "generation_worker_gpus"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.async_rollouts:
            if self.generation_workers < 1:
                raise ConfigError("async_rollouts: needs rollout workers to sample while the trainer trains; set "
                                  "generation_workers: 1 or more (or async_rollouts: false)")
            if self.max_staleness < 1:
                raise ConfigError("async_rollouts: the next step's completions come from weights one version old; "
                                  "set max_staleness: 1 or more (or async_rollouts: false)")
            if self.rollout_strategy != "plain":
                raise ConfigError(f"async_rollouts: the workers can only sample ahead the prompts a strategy asks "
                                  f"for unchanged; rollout_strategy '{self.rollout_strategy}' changes them: use "
                                  f"rollout_strategy: plain, or async_rollouts: false")

    def _check_finite(self) -> None:
        """NaN makes no sense for any numeric setting (a weight of nan turns every reward into nan), nor does
        inf, except for a clip range (``epsilon: .inf`` = no clipping)."""
        values = {**{k: getattr(self, k) for k in CORE_KEYS}, **self.params}
        for key, value in values.items():
            for v in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and key not in _INF_MEANS_OFF)):
                    what = "a number (not nan)" if key in _INF_MEANS_OFF else "a finite number"
                    raise ConfigError(f"{key}: must be {what}, got {value!r}; give a real number")
                if key == "reward_weights" and v is not None and not isinstance(v, (int, float)):
                    try:
                        ok = math.isfinite(float(v))
                    except (TypeError, ValueError):
                        raise ConfigError(f"reward_weights: {v!r} is not a number; give one number per reward "
                                          f"function") from None
                    if not ok:
                        raise ConfigError(f"reward_weights: must be finite numbers, got {value!r}")

    def _selected_in(self, extra: tuple = ()):
        """``(registry, name)`` of every selected component that sits in a registry."""
        by_kind = {r.kind: r for r in ALL_REGISTRIES.values()}
        for kind_name, _ in self.selected(extra):
            kind, _, name = kind_name.partition("/")
            if kind in by_kind:
                yield by_kind[kind], name

    def _check_group_size(self, extra: tuple = ()) -> None:
        """An advantage that compares the completions of one prompt needs num_generations >= its
        ``min_group_size`` (declared at registration); a sampler that chooses each prompt's number of
        completions (``budgets``) decides group sizes itself."""
        sampler = SAMPLERS.get(self.prompt_sampler) if self.prompt_sampler in SAMPLERS else None
        if sampler is not None and hasattr(sampler, "budgets"):
            return
        for reg, name in self._selected_in(extra):
            need = reg.min_group_size(name)
            if self.num_generations < need:
                raise ConfigError(
                    f"num_generations: {reg.kind} '{name}' compares the completions of one prompt with each other "
                    f"and needs at least {need} per prompt, got {self.num_generations} (every advantage would be "
                    f"0 and nothing is learned); set num_generations >= {need}, or choose an estimator that works "
                    f"with one completion (advantage spo_single_stream)")

    def _check_components(self, extra: tuple = ()) -> None:
        """Refuse a text generation engine for a policy that samples in the trainer (its ``text_engines`` is
        False); refuse a chosen component that needs a capability the policy lacks (``register(...,
        needs=...)``), naming the component, the capability, the policy and the ways out; then let each chosen
        component reject settings it cannot work with (its registered ``check``)."""
        policy = POLICIES.get(self.policy)
        if engine_name(self) is not None and not getattr(policy, "text_engines", True):
            raise ConfigError(f"generation_engine: {engine_name(self)} samples text from a causal LM; policy "
                              f"{self.policy} samples in the trainer (set generation_engine: native and "
                              f"generation_workers: 0)")
        has = frozenset(getattr(policy, "capabilities", ()))
        for reg, name in self._selected_in(extra):
            missing = [c for c in reg.needs(name) if c not in has]
            if missing:
                need = missing[0]
                others = [n for n, p in POLICIES.items() if need in getattr(p, "capabilities", ())]
                how = reg.selection(name)
                raise ConfigError(
                    f"{reg.kind} '{name}' needs a policy with {need} ({CAPABILITIES.get(need, need)}); policy "
                    f"'{self.policy}' ({getattr(policy, 'description', '')}) has "
                    f"{', '.join(sorted(has)) or 'none of the capabilities'}. Use policy "
                    f"{' or '.join(others) or '(none has it)'}"
                    + (f", or leave '{name}' out ({how.partition(':')[0]})" if how else "") + ".")
            check = reg.check(name)
            if check is not None:
                check(self)

    def required_columns(self) -> dict[str, list[str]]:
        """``{"kind 'name'": [columns]}``: the data columns the selected components declared they read from
        every training row (``register(..., columns=...)``)."""
        out = {}
        for reg, name in self._selected_in():
            cols = reg.columns(name, self)
            if cols:
                out[f"{reg.kind} '{name}'"] = cols
        return out

    def to_dict(self) -> dict[str, Any]:
        """Core keys, then this run's component parameters (what ``config.yaml`` holds)."""
        core = {k: copy.deepcopy(getattr(self, k)) for k in CORE_KEYS}
        return {**core, **copy.deepcopy(self.params)}

    def save(self, path: Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


_INF_MEANS_OFF = {"epsilon", "epsilon_high"}  # clip ranges: .inf turns clipping off (r2vpo)
CORE_KEYS: list[str] = [f.name for f in dataclasses.fields(Config) if not f.metadata.get("internal")]
_CORE_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_TYPES = {"bool": bool, "int": int, "float": float, "str": str, "list": list, "tuple": list, "dict": dict}


def _coerce(key: str, value: Any, source: str) -> Any:
    """A core key's value from YAML or the command line, converted to its declared type."""
    if key not in _CORE_FIELDS:
        raise ConfigError(_unknown_key(key, source, {}))
    tp = typing.get_type_hints(Config)[key]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = typing.get_origin(args[0] if args else tp) or (args[0] if args else tp)
    return _convert(key, value, source, [base], type(None) in typing.get_args(tp), _CORE_FIELDS[key].metadata["help"])


def _coerce_param(p: Param, value: Any, source: str) -> Any:
    """A component parameter's value, converted to the type its declaration names (or its default's type)."""
    names = [t.strip().split("[")[0] for t in (p.annotation or "").split("|") if t.strip()]
    types = [_TYPES[n] for n in names if n in _TYPES]
    optional = "None" in names or p.default is None
    if not types and p.default is not None:
        types = [type(p.default) if not isinstance(p.default, tuple) else list]
    return _convert(p.name, value, source, types, optional, p.help)


def _convert(key: str, value: Any, source: str, types: list, optional: bool, help: str) -> Any:
    """``value`` as the first of ``types`` (strings from the command line are parsed); ConfigError if it is not."""
    try:
        if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
            if not optional:
                raise ValueError("may not be empty")
            return None
        base = types[0] if types else None
        if base is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if base is list:
            if isinstance(value, str):
                return [v for v in (s.strip() for s in value.split(",")) if v]
            return list(value)
        if base is dict:  # a mapping: from YAML as it is, from the command line as a JSON object
            if isinstance(value, str):
                try:
                    value = json.loads(value) if value.strip() else {}
                except json.JSONDecodeError as e:
                    raise ValueError(f"expected a JSON object such as '{{\"key\": 1}}' ({e})") from None
            if not isinstance(value, dict):
                raise ValueError("expected a mapping (a JSON object on the command line)")
            return dict(value)
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError("expected an integer")
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError("expected a number")
            return float(value)
        if base is str and (len(types) == 1 or isinstance(value, (str, int, float))):
            return str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: {key}: invalid value {value!r} ({e}; {help})") from None
    return value


def _unknown_key(key: str, source: str, decl: dict[str, Param]) -> str:
    """The message for a key that is neither a core key nor a parameter of this run's components."""
    note = replaced_key_note(key)
    if note:  # a key grpolab has replaced (registry.REPLACED_KEYS): say what replaced it
        return f"{source}: unknown key '{key}': {note}"
    valid = CORE_KEYS + sorted(decl)
    close = difflib.get_close_matches(key, valid, n=3)
    msg = f"{source}: unknown key '{key}'"
    owners = sorted({(o, reg.selection(name)) for reg in ALL_REGISTRIES.values() for name, obj in reg.items()
                     for o in (declared_params(obj).get(key).owners if key in declared_params(obj) else [])},
                    key=lambda t: t[0])
    if owners:
        how = [s for _, s in owners if s]
        msg += (f": it is a parameter of {', '.join(o for o, _ in owners)}, which this run does not select "
                f"(select the component first" + (f": {' or '.join(how[:3])}" if how else "")
                + ", or with a recipe that does)")
    elif close:
        msg += f" (did you mean {', '.join(close)}?)"
    return msg + f"; valid keys for this run: {', '.join(valid)}"


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--config: file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"--config: {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {p} must contain a mapping of key: value")
    return data


def _choices_text(choices) -> str:
    if isinstance(choices, tuple) and isinstance(choices[0], list):
        return f" (a list of: {' / '.join(map(str, choices[0]))})"
    if isinstance(choices, tuple):
        return f" (names from the {choices[0].kind} registry, a list)"
    if isinstance(choices, Registry):
        return f" (a {choices.kind}: grpolab components)"
    if isinstance(choices, list):
        return f" ({' / '.join(map(str, choices))})"
    return ""


def markdown_reference(cfg: "Config | None" = None) -> str:
    """The core keys with their defaults and help, then (with ``cfg``) the parameters of its components."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(Config):
        if f.metadata.get("internal"):
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        lines.append(f"| `{f.name}` | `{default}` | {f.metadata.get('help', '')}"
                     f"{_choices_text(f.metadata.get('choices'))} |")
    if cfg is not None and cfg.params:
        decl = cfg.component_params()
        lines += ["", "| component parameter | default | meaning |", "|---|---|---|"]
        for k, p in decl.items():
            lines.append(f"| `{k}` | `{p.default}` | {p.help}{_choices_text(p.choices)} ({', '.join(p.owners)}) |")
    return "\n".join(lines) + "\n"
