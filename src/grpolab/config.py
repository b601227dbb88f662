"""One validated configuration object.

Precedence (later wins): defaults < recipe < ``--config`` YAML < ``--key value``.
Names follow TRL's ``GRPOConfig`` where the concept is the same.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .devices import check_device_spec


from .errors import ConfigError
from .registry import (ADVANTAGES, AGGREGATIONS, BATCH_STAGES, KL_ESTIMATORS, POLICY_LOSSES, REGULARIZERS,
                       REWARD_TRANSFORMS, ROLLOUT_STRATEGIES, SAMPLERS, TASKS, UPDATE_STRATEGIES, WEIGHTINGS)
from .params import (AdvantageParamsA, AdvantageParamsB, BudgetParams, ObjectiveParams, RewardParams,  # noqa: E402
                     RolloutParams, SamplerParams, StageParams, TaskParams, InjectionParams, param as _f)


@dataclass
class Config(InjectionParams, TaskParams, StageParams, BudgetParams, RolloutParams, SamplerParams, RewardParams, ObjectiveParams,
             AdvantageParamsB, AdvantageParamsA):
    """All settings. Variant parameters live in ``params/`` mixins, one file per group."""

    # what to train
    model: str = _f("smollm2", "'smollm2', 'tiny', or a local Hugging Face causal-LM folder")
    task: str = _f("arithmetic", "built-in task (used when --data is not given)")
    data: str | None = _f(None, "JSONL file with a 'prompt' per row (string or chat messages)")
    reward: list = _f([], "reward functions 'module:function[=weight]' (with --data)")
    recipe: str | None = _f(None, "named preset of components and parameters (grpolab recipes)")
    out: str = _f("runs/default", "run folder: metrics, checkpoints, final model")
    # schedule
    steps: int = _f(30, "optimiser steps")
    prompts_per_step: int = _f(4, "prompts per optimiser step")
    num_generations: int = _f(8, "completions per prompt (G)")
    num_iterations: int = _f(1, "optimiser passes over each batch (mu)")
    dynamic_sampling: bool = _f(False, "DAPO dynamic sampling: drop zero-variance groups and generate more "
                                       "prompts until prompts_per_step groups are kept")
    dynamic_sampling_max_rounds: int = _f(4, "generation rounds per step before dynamic sampling gives up "
                                             "and trains on the groups it has (with a warning)")
    off_policy_refresh_steps: int = _f(1, "rollouts come from a policy snapshot refreshed every N steps "
                                          "(1 = on-policy; Off-policy GRPO, 000-07)")
    micro_batch_size: int = _f(8, "rows per forward/backward (gradient accumulation inside a step)")
    micro_batch_tokens: int = _f(0, "also close a micro-batch before its padded size (rows x (prompt + "
                                    "completion) tokens) exceeds this (0 = rows only)")
    prompt_sampler: str = _f("uniform", "which prompts come next", "SAMPLERS")
    rollout_strategy: str = _f("plain", "how completions are produced (hints, injected references, ...)",
                               "ROLLOUT_STRATEGIES")
    batch_stages: list = _f([], "stages applied to the scored batch before the loss, in order (pruning, "
                                "replay, ...)", "BATCH_STAGES*")
    update_strategy: str = _f("standard", "how the optimiser consumes a batch", "UPDATE_STRATEGIES")
    # generation
    max_prompt_length: int = _f(512, "prompts longer than this are rejected with an error")
    max_completion_length: int = _f(20, "maximum new tokens per completion")
    temperature: float = _f(0.7, "sampling temperature (log-probs use logits / temperature)")
    top_k: int = _f(0, "sample from the k most likely tokens (0 = off)")
    top_p: float = _f(1.0, "nucleus sampling mass (1.0 = off)")
    sampling_method: str = _f("race", "exact token sampler: 'race' (exponential race; the measured default "
                                      "runs) or 'inverse_cdf' (one uniform per row, ~40x cheaper per decode step, "
                                      "another random stream)", ["race", "inverse_cdf"])
    generation_engine: str = _f("native", "who samples completions: grpolab's KV-cache sampler, or a colocated "
                                          "vLLM engine (GPU; pip install 'grpolab[vllm]')", ["native", "vllm"])
    vllm_gpu_memory_utilization: float = _f(0.3, "vLLM: fraction of GPU memory the engine may take")
    vllm_max_model_len: int | None = _f(None, "vLLM: maximum prompt + completion length (default: the model's)")
    vllm_dtype: str = _f("auto", "vLLM: weight dtype in the engine ('auto' = the model's)")
    vllm_is_cap: float = _f(2.0, "vLLM: cap C of the truncated importance weight min(pi_trainer/pi_engine, C) "
                                 "per token (TRL's token_truncate correction)")
    # algorithm
    advantage: str = _f("group_zscore", "advantage estimator", "ADVANTAGES")
    advantage_epsilon: float = _f(1e-4, "epsilon added to the group std (group_zscore)")
    advantage_weightings: list = _f([], "weightings applied to the advantages, in order", "WEIGHTINGS*")
    policy_loss: str = _f("clipped_ratio", "policy objective", "POLICY_LOSSES")
    regularizers: list = _f([], "extra per-token loss terms", "REGULARIZERS*")
    loss_aggregation: str = _f("seq_mean_token_mean", "per-token loss -> scalar", "AGGREGATIONS")
    loss_constant: int | None = _f(None, "normaliser L for loss_aggregation=constant (default max_completion_length)")
    epsilon: float = _f(0.2, "lower clip range eps_low")
    epsilon_high: float | None = _f(None, "upper clip range eps_high (default: epsilon)")
    beta: float = _f(0.0, "KL coefficient; 0 loads no reference model")
    kl_estimator: str = _f("k3", "KL estimator (its value enters the loss)", "KL_ESTIMATORS")
    kl_gradient: str | None = _f(None, "estimator whose gradient is used instead (straight-through, e.g. k2 "
                                       "with kl_estimator k3 = verl's k3+); default: kl_estimator's own")
    reward_transforms: list = _f([], "transforms of the combined reward, in order (e.g. overlong_penalty)",
                                 "REWARD_TRANSFORMS*")
    overlong_buffer: int = _f(4, "overlong_penalty: the last L_cache tokens before max_completion_length "
                                 "are penalised linearly (DAPO)")
    overlong_penalty_factor: float = _f(1.0, "overlong_penalty: scale of the penalty (DAPO)")
    mask_truncated_completions: bool = _f(False, "leave completions that hit max_completion_length out of the "
                                                 "loss (DAPO overlong filtering; TRL's name)")
    reward_weights: list | None = _f(None, "one weight per reward function (overrides task / =weight)")
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
                            "'auto' = bfloat16 autocast on a GPU that supports it; on a CPU bfloat16 only where a "
                            "measured bf16 matmul is >= 1.5x faster than float32 (native BF16/AMX), else float32",
                    ["auto", "float32", "bfloat16", "float16"])
    static_kv_cache: bool = _f(True, "decode Llama / Qwen2 models with a preallocated KV cache and fused "
                                     "projections (same forward; rollout/fast_decode.py)")
    # evaluation, logging, checkpoints
    eval_before: bool = _f(True, "measure held-out accuracy before training")
    eval_after: bool = _f(True, "measure held-out accuracy after training")
    eval_problems: int = _f(200, "held-out rows for evaluation (greedy)")
    eval_batch_size: int = _f(100, "rows per generation batch during evaluation")
    save_steps: int = _f(10, "checkpoint every N steps (and always at the end)")
    save_total_limit: int = _f(2, "keep this many most recent checkpoints")
    tensorboard: bool = _f(True, "write TensorBoard event files to OUT/tensorboard")
    seed: int = _f(0, "random seed")

    # ---------------------------------------------------------------- helpers
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def build(cls, *layers: dict[str, Any], sources: list[str] | None = None) -> "Config":
        """Merge dicts of overrides in order, validate, and return a Config."""
        values: dict[str, Any] = {}
        for i, layer in enumerate(layers):
            src = sources[i] if sources else "config"
            for k, v in (layer or {}).items():
                values[k.replace("-", "_")] = _coerce(k.replace("-", "_"), v, src)
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        registries = {"ROLLOUT_STRATEGIES": ROLLOUT_STRATEGIES, "BATCH_STAGES": BATCH_STAGES,
                      "UPDATE_STRATEGIES": UPDATE_STRATEGIES, "ADVANTAGES": ADVANTAGES, "POLICY_LOSSES": POLICY_LOSSES, "WEIGHTINGS": WEIGHTINGS,
                      "AGGREGATIONS": AGGREGATIONS, "KL_ESTIMATORS": KL_ESTIMATORS, "REGULARIZERS": REGULARIZERS,
                      "REWARD_TRANSFORMS": REWARD_TRANSFORMS, "SAMPLERS": SAMPLERS}
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            many = isinstance(choices, str) and choices.endswith("*")
            if isinstance(choices, str):
                choices = registries[choices.rstrip("*")].names()
            for v in (value if many else [value]):
                if choices is not None and v not in choices:
                    raise ConfigError(f"{f.name}: '{v}' is not valid; valid values: {', '.join(choices) or 'none yet'}")
        positive = ["dynamic_sampling_max_rounds", "off_policy_refresh_steps", "steps", "prompts_per_step", "num_generations", "num_iterations", "micro_batch_size",
                    "max_completion_length", "max_prompt_length", "save_steps", "eval_batch_size"]
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.num_generations < 2 and self.advantage in ("group_zscore", "group_mean"):
            raise ConfigError(f"num_generations: group advantages need at least 2 completions per prompt, "
                              f"got {self.num_generations}")
        for name in ("epsilon", "beta", "learning_rate", "temperature", "max_grad_norm", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.epsilon_high is not None and self.epsilon_high < 0:
            raise ConfigError(f"epsilon_high: must be >= 0, got {self.epsilon_high}")
        _kl = KL_ESTIMATORS
        if self.kl_gradient is not None and self.kl_gradient not in _kl:
            raise ConfigError(f"kl_gradient: '{self.kl_gradient}' is not valid; valid values: "
                              f"{', '.join(_kl.names())}")
        check_device_spec(self.device)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p: must be in (0, 1], got {self.top_p}")
        self._check_components(registries)
        if self.data is None and self.task not in TASKS:
            raise ConfigError(f"task: '{self.task}' is not valid; valid values: {', '.join(TASKS.names())}")
        if self.data is not None and not self.reward:
            raise ConfigError("reward: --data needs at least one --reward module:function")

    def _check_components(self, registries: dict) -> None:
        """Let each chosen component reject settings it cannot work with.

        A component (function or class) may define ``check_config(cfg)`` that
        raises :class:`ConfigError` for an invalid combination, e.g. a pairwise
        objective with odd group sizes.
        """
        chosen = [registries["ADVANTAGES"].get(self.advantage), registries["POLICY_LOSSES"].get(self.policy_loss)]
        chosen += [registries["WEIGHTINGS"].get(n) for n in self.advantage_weightings]
        chosen += [registries["REGULARIZERS"].get(n) for n in self.regularizers]
        chosen += [registries["REWARD_TRANSFORMS"].get(n) for n in self.reward_transforms]
        chosen += [registries["BATCH_STAGES"].get(n) for n in self.batch_stages]
        chosen += [registries["ROLLOUT_STRATEGIES"].get(self.rollout_strategy),
                   registries["UPDATE_STRATEGIES"].get(self.update_strategy),
                   registries["SAMPLERS"].get(self.prompt_sampler)]
        for obj in chosen:
            check = getattr(obj, "check_config", None)
            if callable(check):
                check(self)
        from .algorithms.objectives import validate_objective_config
        validate_objective_config(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _coerce(key: str, value: Any, source: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(Config)}
    if key not in fields:
        close = difflib.get_close_matches(key, fields, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"{source}: unknown key '{key}'{hint}; valid keys: {', '.join(fields)}")
    hints = typing.get_type_hints(Config)
    tp = hints[key]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if args else tp
    optional = type(None) in typing.get_args(tp)
    origin = typing.get_origin(base) or base
    try:
        if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
            if not optional:
                raise ValueError("may not be empty")
            return None
        if origin is bool:
            if isinstance(value, str):
                if value.lower() in ("true", "1", "yes", "on"):
                    return True
                if value.lower() in ("false", "0", "no", "off"):
                    return False
                raise ValueError("expected true or false")
            if isinstance(value, bool):
                return value
            raise ValueError("expected true or false")
        if origin is list:
            if isinstance(value, str):
                return [v for v in (s.strip() for s in value.split(",")) if v]
            return list(value)
        if origin is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError("expected an integer")
            return int(value)
        if origin is float:
            if isinstance(value, bool):
                raise ValueError("expected a number")
            return float(value)
        if origin is str:
            return str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: {key}: invalid value {value!r} ({e}; "
                          f"{fields[key].metadata['help']})") from None
    return value


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


def markdown_reference() -> str:
    """Every config key with its default and help, as a markdown table."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(Config):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        choices = f.metadata.get("choices")
        extra = ""
        if isinstance(choices, list):
            extra = f" ({' / '.join(map(str, choices))})"
        elif isinstance(choices, str):
            extra = f" (registry {choices.rstrip('*')}{', a list' if choices.endswith('*') else ''})"
        lines.append(f"| `{f.name}` | `{default}` | {f.metadata.get('help', '')}{extra} |")
    return "\n".join(lines) + "\n"
