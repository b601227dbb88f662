"""Python API, a TRL drop-in: ``from grpolab import GRPOConfig, GRPOTrainer``.

A script written for TRL's ``GRPOTrainer`` runs with one changed import::

    args = GRPOConfig(output_dir="out", per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=32, max_steps=2, logging_steps=1, report_to="none")
    trainer = GRPOTrainer(model="tiny", reward_funcs=[my_reward], args=args, train_dataset=rows)
    trainer.train()
    trainer.save_model()

``GRPOConfig`` takes TRL's field names (:data:`TRL_FIELDS`, mapped onto grpolab's core keys and components
by :func:`to_grpolab`), grpolab's own ``recipe`` and any grpolab config key. A TRL field grpolab does not
implement (:data:`TRL_UNSUPPORTED`) and an unknown field are errors that name it; nothing is ignored quietly.
The training loop is :class:`grpolab.train.trainer.Trainer`; :class:`GRPOTrainer` only supplies the data, the
reward callables, the model and the callbacks. The field table is in docs/python_api.md.
"""
from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

from .config import CORE_KEYS, Config
from .data import load_jsonl, to_json
from .errors import ConfigError
from .registry import POLICIES, POLICY_LOSSES
from .rewards import RewardFn, check_signature, parse_reward_spec
from .data import columns_of
from .train.trainer import Trainer, rollout_columns

# --------------------------------------------------------------------------- the field tables
# TRL GRPOConfig / TrainingArguments field -> (its grpolab meaning, TRL's default used when the field is not given;
# NO_DEFAULT = grpolab's own default applies). Keys a TRL field maps onto by name are the same key in grpolab.
NO_DEFAULT = object()

TRL_FIELDS: dict[str, tuple[str, Any]] = {
    "output_dir": ("out", "trainer_output"),
    "per_device_train_batch_size": ("micro_batch_size; with gradient_accumulation_steps and num_generations: "
                                    "prompts_per_step = per_device_train_batch_size x gradient_accumulation_steps "
                                    "/ num_generations (one generation batch = one optimiser step, TRL's default "
                                    "steps_per_generation)", 8),
    "gradient_accumulation_steps": ("see per_device_train_batch_size (grpolab accumulates every micro-batch of "
                                    "the step; the loss is normalised once per step)", 1),
    "num_generations": ("num_generations (G)", 8),
    "steps_per_generation": ("steps_per_generation = TRL's steps_per_generation / gradient_accumulation_steps "
                             "(TRL counts micro-batches, grpolab optimiser steps; 1 when it divides "
                             "gradient_accumulation_steps); not with generation_batch_size", NO_DEFAULT),
    "generation_batch_size": ("completions per generation call: TRL's steps_per_generation = "
                              "generation_batch_size / per_device_train_batch_size, then as steps_per_generation; "
                              "a multiple of per_device_train_batch_size and of num_generations", NO_DEFAULT),
    "max_steps": ("steps (<= 0: ceil(num_train_epochs x rows / prompts_per_step), as TRL)", -1),
    "num_train_epochs": ("only when max_steps <= 0: steps = ceil(num_train_epochs x rows / prompts_per_step)", 3.0),
    "loss_type": ("policy_loss + loss_aggregation (LOSS_TYPES)", "dapo"),
    "importance_sampling_level": ("'token' = the loss_type's policy loss; 'sequence' = sequence_ratio (GSPO)",
                                  "token"),
    "scale_rewards": ("advantage: 'group'/True = group_zscore, 'batch' = group_mean_batch_std, "
                      "'none'/False = group_mean", "group"),
    "multi_objective_aggregation": ("'sum_then_normalize' = the scale_rewards estimator; 'normalize_then_sum' = "
                                    "advantage gdpo (scale_rewards 'group' only)", "sum_then_normalize"),
    "mask_truncated_completions": ("mask_truncated_completions", False),
    "logging_steps": ("how often the callbacks' on_log runs (metrics.jsonl gets every step)", 10),
    "save_steps": ("save_steps", 500),
    "save_total_limit": ("save_total_limit", NO_DEFAULT),
    "report_to": ("tensorboard: 'none' / [] = off, 'tensorboard' = on (or grpolab's report_to key when present)",
                  NO_DEFAULT),
    "learning_rate": ("learning_rate", 1e-6),
    "lr_scheduler_type": ("lr_scheduler_type ('constant', 'linear', 'cosine')", "linear"),
    "warmup_steps": ("warmup_steps", NO_DEFAULT),
    "weight_decay": ("weight_decay", NO_DEFAULT),
    "adam_beta1": ("adam_beta1", NO_DEFAULT),
    "adam_beta2": ("adam_beta2", NO_DEFAULT),
    "max_grad_norm": ("max_grad_norm", NO_DEFAULT),
    "gradient_checkpointing": ("gradient_checkpointing", NO_DEFAULT),
    "beta": ("beta", 0.0),
    "epsilon": ("epsilon", 0.2),
    "epsilon_high": ("epsilon_high; with loss_type cispo: cispo_epsilon_high = epsilon_high - 1 (TRL caps the "
                     "weight at epsilon_high, grpolab at 1 + cispo_epsilon_high)", NO_DEFAULT),
    "temperature": ("temperature", 1.0),
    "top_p": ("top_p", 1.0),
    "top_k": ("top_k (None = 0, off)", 0),
    "max_completion_length": ("max_completion_length", 256),
    "max_prompt_length": ("max_prompt_length (None = grpolab's default)", NO_DEFAULT),
    "num_iterations": ("num_iterations (mu)", 1),
    "seed": ("seed", 42),
    "reward_weights": ("reward_weights", NO_DEFAULT),
    "sapo_temperature_pos": ("sapo_tau_pos (loss_type sapo)", NO_DEFAULT),
    "sapo_temperature_neg": ("sapo_tau_neg (loss_type sapo)", NO_DEFAULT),
    "use_vllm": ("generation_engine 'vllm' (colocated)", False),
    "vllm_mode": ("'colocate' only", "colocate"),
    "vllm_gpu_memory_utilization": ("vllm_gpu_memory_utilization", NO_DEFAULT),
    "vllm_importance_sampling_cap": ("vllm_is_cap", NO_DEFAULT),
    "overwrite_output_dir": ("Trainer(overwrite=...): write into an output_dir that is not a grpolab run "
                             "folder", False),
    "remove_unused_columns": ("False only (grpolab passes every column to the reward functions)", False),
    "logging_dir": ("None only (TensorBoard files go to output_dir/tensorboard)", None),
    "disable_tqdm": ("progress bar off", False),
    "bf16": ("True: dtype 'bfloat16' (forward passes; weights stay float32); False (with fp16 False): 'float32'",
             NO_DEFAULT),
    "fp16": ("True: dtype 'float16'", NO_DEFAULT),
    "use_cpu": ("True: device 'cpu'", NO_DEFAULT),
    "optim": ("'adamw_torch' / 'adamw_torch_fused' only (grpolab's AdamW)", NO_DEFAULT),
}
for _name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
    TRL_FIELDS[_name] = (f"{_name} (a parameter of the vespo policy loss)", NO_DEFAULT)

# TRL GRPOConfig / TrainingArguments fields grpolab has no equivalent for: setting one is an error naming it.
TRL_UNSUPPORTED = frozenset("""
model_init_kwargs disable_dropout cast_lm_head_to_fp32 shuffle_dataset num_generations_eval ds3_gather_for_generation
min_p generation_kwargs chat_template_kwargs repetition_penalty
use_transformers_paged cache_implementation vllm_model_impl vllm_structured_outputs_regex vllm_server_base_url
vllm_server_host vllm_server_port vllm_server_timeout vllm_group_port vllm_tensor_parallel_size vllm_enable_sleep_mode
vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_max_model_length vllm_guided_decoding_regex
delta top_entropy_quantile entropy_coef use_adaptive_entropy entropy_coef_min entropy_coef_max entropy_coef_delta
entropy_target sync_ref_model ref_model_mixup_alpha ref_model_sync_steps off_policy_mask_threshold
use_bias_correction_kl use_liger_loss use_liger_kernel log_completions num_completions_to_print log_unique_prompts
log_completions_hub_repo max_tool_calling_iterations reward_processing_classes wandb_log_unique_prompts
per_device_eval_batch_size eval_strategy eval_steps eval_on_start eval_accumulation_steps do_train do_eval
do_predict tf32 bf16_full_eval fp16_full_eval optim_args adam_epsilon lr_scheduler_kwargs
warmup_ratio save_strategy save_only_model save_safetensors logging_strategy logging_first_step
logging_nan_inf_filter push_to_hub hub_model_id hub_token hub_strategy hub_private_repo run_name
resume_from_checkpoint deepspeed fsdp fsdp_config accelerator_config ddp_backend ddp_find_unused_parameters
torch_compile torch_compile_backend torch_compile_mode dataloader_num_workers dataloader_pin_memory
dataloader_drop_last dataloader_persistent_workers dataloader_prefetch_factor gradient_checkpointing_kwargs
label_smoothing_factor load_best_model_at_end metric_for_best_model greater_is_better group_by_length
length_column_name include_num_input_tokens_seen neftune_noise_alpha data_seed full_determinism
auto_find_batch_size max_grad_value average_tokens_across_devices activation_offloading padding_free
""".split())

# loss_type -> (policy_loss, loss_aggregation). TRL normalises bnpo per local (per-device, per-accumulation)
# micro-batch and dapo over the global accumulated batch; grpolab normalises once per optimiser step over the
# whole step batch, so both map to token_mean (equal to TRL's bnpo when gradient_accumulation_steps = 1 on one
# process, and to TRL's dapo always).
# TRL's grpo / sapo / luspo average over every row (``.mean()``), a row that mask_truncated_completions emptied
# included: seq_mean_token_mean_all_rows (grpolab's own seq_mean_token_mean divides by rows with loss tokens).
LOSS_TYPES: dict[str, tuple[str, str]] = {
    "grpo": ("clipped_ratio", "seq_mean_token_mean_all_rows"),
    "bnpo": ("clipped_ratio", "token_mean"),
    "dr_grpo": ("clipped_ratio", "constant"),
    "dapo": ("clipped_ratio", "token_mean"),
    "cispo": ("cispo", "token_mean"),
    "sapo": ("soft_gate", "seq_mean_token_mean_all_rows"),
    "luspo": ("luspo", "seq_mean_token_mean_all_rows"),
    "vespo": ("vespo", "token_mean"),
}
SCALE_REWARDS = {"group": "group_zscore", True: "group_zscore", "batch": "group_mean_batch_std",
                 "none": "group_mean", False: "group_mean"}
SEQUENCE_LEVEL_LOSS = "sequence_ratio"  # GSPO (importance_sampling_level='sequence')


def _recipe_aggregation(name: str) -> str | None:
    """The loss_aggregation of recipe ``name`` when one exists (luspo / vespo come with their recipes)."""
    from .recipes import load_recipe, recipe_names
    if name not in recipe_names():
        return None
    return (load_recipe(name).get("components") or {}).get("loss_aggregation")


class GRPOConfig:
    """TRL's ``GRPOConfig`` field names (and grpolab's own keys) -> a grpolab :class:`~grpolab.config.Config`.

    Fields are checked here: a TRL field grpolab does not implement, or a name that is neither a TRL field nor a
    grpolab key, is a :class:`ConfigError` naming it. grpolab keys (core keys, component parameters, ``recipe``)
    pass through and are validated when the trainer builds the run's Config. Read fields as attributes.
    """

    def __init__(self, **fields: Any):
        object.__setattr__(self, "_fields", {})
        self._check(fields)
        self._fields.update(fields)

    def __setattr__(self, name: str, value: Any) -> None:  # ``args.max_steps = 5`` as on TRL's dataclass
        self._check({name: value})
        self._fields[name] = value

    @staticmethod
    def _check(fields: dict[str, Any]) -> None:
        from .registry import ALL_REGISTRIES, declared_params
        unsupported = sorted(k for k in fields if k in TRL_UNSUPPORTED)
        if unsupported:
            raise ConfigError(f"GRPOConfig: TRL field(s) {', '.join(unsupported)} not supported by grpolab; remove "
                              f"them (supported TRL fields: {', '.join(sorted(TRL_FIELDS))}; see docs/python_api.md)")
        grpolab_keys = set(CORE_KEYS) | {k for reg in ALL_REGISTRIES.values() for _, obj in reg.items()
                                         for k in declared_params(obj)}
        unknown = sorted(k for k in fields if k not in TRL_FIELDS and k not in grpolab_keys)
        if unknown:
            import difflib
            hints = [f"{k} (did you mean {', '.join(m)}?)" if (m := difflib.get_close_matches(
                k, list(TRL_FIELDS) + sorted(grpolab_keys), n=2)) else k for k in unknown]
            raise ConfigError(f"GRPOConfig: unknown field(s) {', '.join(hints)}: neither a TRL GRPOConfig field "
                              f"grpolab supports nor a grpolab config key (docs/python_api.md lists them)")

    def __getattr__(self, name: str):
        fields = self.__dict__.get("_fields", {})
        if name in fields:
            return fields[name]
        if name in TRL_FIELDS and TRL_FIELDS[name][1] is not NO_DEFAULT:
            return TRL_FIELDS[name][1]
        raise AttributeError(f"GRPOConfig has no field '{name}' set")

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            return default

    def to_dict(self) -> dict[str, Any]:
        return dict(self._fields)

    def __repr__(self) -> str:
        return f"GRPOConfig({', '.join(f'{k}={v!r}' for k, v in self._fields.items())})"


def _steps_per_generation(given: dict, bs: int, ga: int, g: int) -> int | None:
    """grpolab's ``steps_per_generation`` (optimiser steps per generation call) for TRL's ``steps_per_generation``
    / ``generation_batch_size`` (micro-batches / completions per generation call; one process), with TRL's
    ``GRPOConfig.__post_init__`` checks; None when neither is given (TRL's default: one call per optimiser step)."""
    spg, gbs = given.get("steps_per_generation"), given.get("generation_batch_size")
    if spg is None and gbs is None:
        return None
    if spg is not None and gbs is not None:
        raise ConfigError("GRPOConfig: generation_batch_size and steps_per_generation can not be both configured "
                          "at the same time (TRL refuses it too); give one")
    if gbs is not None:
        if int(gbs) < 1 or int(gbs) % bs:
            raise ConfigError(f"GRPOConfig: generation_batch_size ({gbs}) must be a positive multiple of "
                              f"per_device_train_batch_size ({bs}) (TRL: of the global batch size)")
        spg = int(gbs) // bs
    spg = int(spg)
    if spg < 1:
        raise ConfigError(f"GRPOConfig: steps_per_generation must be >= 1, got {spg}")
    if (bs * spg) % g:
        raise ConfigError(f"GRPOConfig: generation_batch_size ({bs * spg} = per_device_train_batch_size x "
                          f"steps_per_generation) must be divisible by num_generations ({g}) (TRL requires it too)")
    if spg % ga == 0:
        return spg // ga
    if ga % spg == 0:  # TRL generates several times within one optimiser step, all with the same weights
        return 1
    raise ConfigError(f"GRPOConfig: steps_per_generation ({spg} micro-batches) must be a multiple or a divisor of "
                      f"gradient_accumulation_steps ({ga}): grpolab generates for whole optimiser steps")


def to_grpolab(args: GRPOConfig) -> dict[str, Any]:
    """The grpolab config overrides that ``args`` means (TRL defaults apply to TRL fields not given)."""
    given = args.to_dict()
    out: dict[str, Any] = {k: v for k, v in given.items() if k not in TRL_FIELDS}  # grpolab keys and recipe
    recipe = "recipe" in given  # a recipe's settings win over TRL's defaults: only given TRL fields apply then
    _copy_fields(args, given, recipe, out)
    _batch_geometry(args, given, recipe, out)

    # loss_type / importance_sampling_level / scale_rewards -> components
    if recipe and not any(k in given for k in ("loss_type", "importance_sampling_level", "scale_rewards",
                                               "multi_objective_aggregation", "epsilon_high",
                                               "sapo_temperature_pos", "sapo_temperature_neg")):
        return _rest(args, given, out)
    _loss_components(args, given, recipe, out)
    _advantage_component(args, given, recipe, out)
    return _rest(args, given, out)


def _has(name: str, given: dict, recipe: bool) -> bool:
    """Given, or (without a recipe) a TRL default that differs from grpolab's own."""
    return name in given or (not recipe and TRL_FIELDS[name][1] is not NO_DEFAULT)


def _copy_fields(args: GRPOConfig, given: dict, recipe: bool, out: dict) -> None:
    """The TRL fields that are the grpolab key of the same name (or a renamed one) and the output folder."""
    for same in ("save_steps", "save_total_limit", "learning_rate", "lr_scheduler_type", "warmup_steps",
                 "weight_decay", "adam_beta1", "adam_beta2", "max_grad_norm", "gradient_checkpointing", "beta",
                 "epsilon", "temperature", "top_p", "max_completion_length", "num_iterations", "seed",
                 "reward_weights", "mask_truncated_completions", "num_generations", "vllm_gpu_memory_utilization"):
        if _has(same, given, recipe):
            out[same] = args.get(same)
    if "max_prompt_length" in given and given["max_prompt_length"] is not None:
        out["max_prompt_length"] = given["max_prompt_length"]
    if _has("top_k", given, recipe):
        out["top_k"] = args.get("top_k") or 0
    if "vllm_importance_sampling_cap" in given:
        out["vllm_is_cap"] = given["vllm_importance_sampling_cap"]
    out["out"] = str(args.get("output_dir"))
    for k in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
        if k in given:
            out[k] = given[k]


def _batch_geometry(args: GRPOConfig, given: dict, recipe: bool, out: dict) -> None:
    """Batch geometry: one generation batch of per_device x GA completions = one optimiser step (TRL default)."""
    bs, ga, g = int(args.get("per_device_train_batch_size")), int(args.get("gradient_accumulation_steps")), int(
        args.get("num_generations"))
    if (bs * ga) % g:
        raise ConfigError(f"GRPOConfig: per_device_train_batch_size x gradient_accumulation_steps = {bs * ga} "
                          f"completions per step is not a multiple of num_generations = {g} (TRL requires it too)")
    if any(_has(k, given, recipe) for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                           "num_generations")):
        out["prompts_per_step"] = bs * ga // g
        out["micro_batch_size"] = bs
    spg = _steps_per_generation(given, bs, ga, g)
    if spg is not None:
        out["steps_per_generation"] = spg
    if int(args.get("max_steps")) > 0:
        out["steps"] = int(args.get("max_steps"))


def _loss_components(args: GRPOConfig, given: dict, recipe: bool, out: dict) -> None:
    """loss_type / importance_sampling_level (and the clip and SAPO fields) -> policy_loss and loss_aggregation."""
    loss_type = args.get("loss_type")
    if loss_type not in LOSS_TYPES:
        raise ConfigError(f"GRPOConfig: loss_type '{loss_type}' unknown; valid: {', '.join(LOSS_TYPES)}")
    policy_loss, aggregation = LOSS_TYPES[loss_type]
    if loss_type == "vespo":  # luspo keeps TRL's all-rows mean: its recipe's seq_mean_token_mean is grpolab's own
        aggregation = _recipe_aggregation(loss_type) or aggregation
    level = args.get("importance_sampling_level")
    if level not in ("token", "sequence"):
        raise ConfigError(f"GRPOConfig: importance_sampling_level '{level}' unknown; valid: token, sequence")
    if level == "sequence":
        if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo"):
            policy_loss = SEQUENCE_LEVEL_LOSS
        elif loss_type != "luspo":
            raise ConfigError(f"GRPOConfig: importance_sampling_level 'sequence' with loss_type '{loss_type}' is "
                              f"not supported (use it with grpo, bnpo, dr_grpo, dapo or luspo)")
    elif loss_type == "luspo":
        raise ConfigError("GRPOConfig: loss_type 'luspo' requires importance_sampling_level='sequence' (as TRL)")
    if policy_loss not in POLICY_LOSSES.names():
        raise ConfigError(f"GRPOConfig: loss_type '{loss_type}' needs grpolab's policy loss '{policy_loss}', "
                          f"which is not registered in this grpolab (registered: "
                          f"{', '.join(sorted(POLICY_LOSSES.names()))})")
    if not recipe or "loss_type" in given or "importance_sampling_level" in given:
        out.setdefault("policy_loss", policy_loss)
        out.setdefault("loss_aggregation", aggregation)
    if loss_type == "cispo" and "epsilon_high" in given:
        out["cispo_epsilon_high"] = float(given["epsilon_high"]) - 1.0
    elif "epsilon_high" in given:
        out["epsilon_high"] = given["epsilon_high"]
    for trl, ours in (("sapo_temperature_pos", "sapo_tau_pos"), ("sapo_temperature_neg", "sapo_tau_neg")):
        if trl in given:
            if loss_type != "sapo":
                raise ConfigError(f"GRPOConfig: {trl} applies to loss_type 'sapo' only (loss_type is '{loss_type}')")
            out[ours] = given[trl]


def _advantage_component(args: GRPOConfig, given: dict, recipe: bool, out: dict) -> None:
    """scale_rewards / multi_objective_aggregation -> the advantage estimator."""
    scale = args.get("scale_rewards")
    if scale not in SCALE_REWARDS:
        raise ConfigError(f"GRPOConfig: scale_rewards {scale!r} unknown; valid: 'group', 'batch', 'none', True, "
                          f"False")
    advantage = SCALE_REWARDS[scale]
    moa = args.get("multi_objective_aggregation")
    if moa == "normalize_then_sum":
        if advantage != "group_zscore":
            raise ConfigError("GRPOConfig: multi_objective_aggregation 'normalize_then_sum' (grpolab advantage "
                              "gdpo) needs scale_rewards 'group'")
        advantage = "gdpo"
    elif moa != "sum_then_normalize":
        raise ConfigError(f"GRPOConfig: multi_objective_aggregation '{moa}' unknown; valid: sum_then_normalize, "
                          f"normalize_then_sum")
    if not recipe or "scale_rewards" in given or "multi_objective_aggregation" in given:
        out.setdefault("advantage", advantage)


def _rest(args: GRPOConfig, given: dict, out: dict) -> dict:
    """Reporting, vLLM and the TrainingArguments fields that have one accepted value."""
    def val(name):
        return args.get(name)

    report = val("report_to")
    if report is not None and "report_to" in CORE_KEYS:
        out["report_to"] = report
    elif report is not None:
        names = [report] if isinstance(report, str) else list(report)
        bad = [n for n in names if n not in ("none", "tensorboard")]
        if bad:
            raise ConfigError(f"GRPOConfig: report_to {', '.join(bad)} not supported by this grpolab; valid: "
                              f"'none', 'tensorboard'")
        out["tensorboard"] = "tensorboard" in names
    if val("use_vllm"):
        if val("vllm_mode") != "colocate":
            raise ConfigError(f"GRPOConfig: vllm_mode '{val('vllm_mode')}' not supported; grpolab runs vLLM "
                              f"colocated only (vllm_mode='colocate')")
        out["generation_engine"] = "vllm"
    if given.get("bf16") and given.get("fp16"):
        raise ConfigError("GRPOConfig: bf16 and fp16 both True; choose one")
    if "bf16" in given or "fp16" in given:
        out["dtype"] = "bfloat16" if given.get("bf16") else "float16" if given.get("fp16") else "float32"
    if given.get("use_cpu"):
        out["device"] = "cpu"
    if "optim" in given and given["optim"] not in ("adamw_torch", "adamw_torch_fused"):
        raise ConfigError(f"GRPOConfig: optim '{given['optim']}' not supported; grpolab uses AdamW "
                          f"(optim='adamw_torch' or 'adamw_torch_fused')")
    if val("remove_unused_columns"):
        raise ConfigError("GRPOConfig: remove_unused_columns=True not supported (grpolab passes every column to "
                          "the reward functions); leave it False")
    if val("logging_dir") is not None:
        raise ConfigError("GRPOConfig: logging_dir not supported (TensorBoard files go to output_dir/tensorboard); "
                          "remove it")
    return out


def build_config(overrides: dict[str, Any]) -> Config:
    """The run's Config: the recipe's settings (when ``recipe`` is given), then ``overrides`` (as the CLI)."""
    from .recipes import recipe_overrides
    recipe = overrides.get("recipe")
    layers = ([recipe_overrides(recipe)] if recipe else []) + [overrides]
    return Config.build(*layers, sources=(["recipe " + recipe] if recipe else []) + ["GRPOConfig"])


def field_table() -> str:
    """The Markdown tables of docs/python_api.md: supported TRL fields, loss types, unsupported fields."""
    def default(v):
        return "grpolab's" if v is NO_DEFAULT else f"`{v!r}`"

    lines = ["| TRL field | grpolab | default here |", "|---|---|---|"]
    lines += [f"| `{k}` | {meaning.replace('|', '/')} | {default(d)} |" for k, (meaning, d) in TRL_FIELDS.items()]
    lines += ["", "| `loss_type` | policy_loss | loss_aggregation |", "|---|---|---|"]
    lines += [f"| `{k}` | `{p}` | `{a}` |" for k, (p, a) in LOSS_TYPES.items()]
    lines += ["", "Not supported (an error naming the field): " + ", ".join(f"`{k}`" for k in sorted(TRL_UNSUPPORTED))
              + "."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the trainer
SUPPORTED_CALLBACK_EVENTS = ("on_init_end", "on_train_begin", "on_step_begin", "on_step_end", "on_log",
                             "on_save", "on_train_end")


def _rows_of(dataset, what: str) -> list[dict]:
    if dataset is None:
        return []
    if isinstance(dataset, dict):
        raise ConfigError(f"{what}: a dict of datasets is not supported; pass one dataset (a list of dicts or a "
                          f"datasets.Dataset)")
    try:
        rows = [dict(r) for r in _audio_undecoded(dataset)]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what}: expected a list of dicts or a datasets.Dataset, got "
                          f"{type(dataset).__name__} ({e})") from None
    if not rows:
        raise ConfigError(f"{what}: the dataset is empty")
    return [_pictures_as_uris(r, f"{what} row {i}") for i, r in enumerate(rows)]


def _audio_undecoded(dataset):
    """A ``datasets.Dataset`` whose ``datasets.Audio()`` columns are cast to ``Audio(decode=False)``: datasets'
    own audio decoding needs torchcodec and FFmpeg; the speech policy decodes the bytes or paths itself
    (``policies/speech_to_text/audio.py``). Anything else is returned as it is."""
    features = getattr(dataset, "features", None)
    if not isinstance(features, dict) or not hasattr(dataset, "cast_column"):
        return dataset
    for name, feature in features.items():
        if type(feature).__name__ == "Audio" and getattr(feature, "decode", False):
            dataset = dataset.cast_column(name, type(feature)(decode=False))
    return dataset


def _pictures_as_uris(row: dict, where: str) -> dict:
    """A row whose ``image`` / ``images`` hold pictures (PIL images, arrays, ``datasets.Image()`` values: TRL's VLM
    datasets) in the form ``--data`` rows take (:func:`grpolab.data.with_pictures`: a path, or a data URI), so
    the row travels through the same JSONL data checks as the CLI's."""
    from .data import DataError, with_audio, with_pictures
    try:
        return with_pictures(with_audio(row, where), where)
    except DataError as e:
        raise ConfigError(str(e)) from None


def _lora_settings(peft_config) -> dict[str, Any]:
    """A peft ``LoraConfig`` -> grpolab's LoRA keys; settings grpolab's LoRA does not have are errors."""
    if peft_config is None:
        return {}
    name = type(peft_config).__name__
    if name != "LoraConfig":
        raise ConfigError(f"peft_config: {name} not supported; grpolab trains LoRA adapters only (peft.LoraConfig)")
    checks = {"lora_dropout": 0.0, "bias": "none", "use_dora": False, "use_rslora": False, "modules_to_save": None,
              "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}
    bad = [k for k, ok in checks.items() if hasattr(peft_config, k) and getattr(peft_config, k) not in (ok, None)
           and not (ok == {} and not getattr(peft_config, k))]
    if bad:
        raise ConfigError(f"peft_config: LoraConfig field(s) {', '.join(bad)} not supported by grpolab's LoRA "
                          f"(supported: r, lora_alpha, target_modules); leave them at their defaults")
    out = {"use_lora": True, "lora_r": int(peft_config.r), "lora_alpha": int(peft_config.lora_alpha)}
    targets = peft_config.target_modules
    if isinstance(targets, str):
        raise ConfigError(f"peft_config: target_modules '{targets}' (a string) not supported; give a list of "
                          f"module names")
    if targets:
        out["lora_target_modules"] = sorted(targets)
    return out


class _Callbacks:
    """transformers-style callbacks: ``cb.on_EVENT(args, state, control, **kwargs)``."""

    def __init__(self, callbacks, args, max_steps: int):
        from transformers import TrainerCallback, TrainerControl, TrainerState
        self.callbacks = [cb() if isinstance(cb, type) else cb for cb in (callbacks or [])]
        for cb in self.callbacks:
            base = TrainerCallback if isinstance(cb, TrainerCallback) else None
            for attr in dir(cb):
                if not attr.startswith("on_") or attr in SUPPORTED_CALLBACK_EVENTS:
                    continue
                if base is None or getattr(type(cb), attr, None) is not getattr(base, attr, None):
                    raise ConfigError(f"callbacks: {type(cb).__name__}.{attr} is not supported by grpolab's "
                                      f"GRPOTrainer (events it calls: {', '.join(SUPPORTED_CALLBACK_EVENTS)})")
        self.args = args
        self.state = TrainerState(max_steps=max_steps, logging_steps=int(args.logging_steps),
                                  save_steps=int(args.get("save_steps") or 0))
        self.control = TrainerControl()

    def __call__(self, event: str, **kwargs) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                fn(self.args, self.state, self.control, **kwargs)


class TrainOutput(tuple):
    """What :meth:`GRPOTrainer.train` returns, shaped as transformers' ``TrainOutput``: ``global_step``,
    ``training_loss`` (mean loss over the steps) and ``metrics`` (``train_runtime``, ``train_loss``,
    ``skipped_steps``, the held-out evaluation as ``eval_before_*`` / ``eval_after_*`` when an eval_dataset is
    given, and the last step's metrics)."""

    def __new__(cls, global_step: int, training_loss: float, metrics: dict):
        return super().__new__(cls, (global_step, training_loss, metrics))

    global_step = property(lambda self: self[0])
    training_loss = property(lambda self: self[1])
    metrics = property(lambda self: self[2])


class _APITrainer(Trainer):
    """grpolab's Trainer with in-memory data, reward callables, a loaded model and callbacks.

    The run folder is opened by :meth:`open_run` (``GRPOTrainer.train``, which knows whether it resumes), not in
    the constructor: at construction an output_dir that holds a run passes, and only what no run may write into
    is refused (a folder that is not a run, files grpolab did not write, another process training there). The
    folder's lock (train/runlock.py) is taken at construction and held until ``train()`` returns."""

    # `grpolab train --resume` cannot rebuild the Python objects a GRPOTrainer run was given (recorded in the marker)
    resume_from_python = ("`trainer.train(resume_from_checkpoint=True)` (the same script: a GRPOTrainer with the "
                          "same arguments)")

    def __init__(self, cfg: Config, *, rows, eval_rows, reward_funcs, model_obj, processing_class, callbacks,
                 overwrite: bool, environment=None):
        self.user_environment = environment  # tools / environment_factory: the agent rollout's (wins over a task's)
        self._api = dict(rows=rows, eval_rows=eval_rows, reward_funcs=reward_funcs, model_obj=model_obj,
                         processing_class=processing_class)
        self.callbacks = callbacks
        self.losses: list[float] = []
        self.last_metrics: dict = {}
        self.opened = False
        super().__init__(cfg, resume=True, overwrite=overwrite)  # resume=True: a run there passes; open_run decides

    def _open_run(self, resume: bool, overwrite: bool) -> None:
        self._overwrite = overwrite  # the folder is opened by open_run (class docstring)

    def open_run(self, resume: bool) -> None:
        """Claim the run folder (``resume``: continue its run from its newest checkpoint; otherwise a folder that
        holds a run is refused unless overwrite_output_dir) and open its logs; once."""
        if not self.opened:
            if resume:
                self._check_same_settings()
            Trainer._open_run(self, resume, self._overwrite)
            self.opened = True

    def _check_same_settings(self) -> None:
        """A resumed run trains as it did: a setting other than those `grpolab train --resume OUT` may change
        (``RESUME_OVERRIDES``: steps, save_steps, logging, ...) that differs from its config.yaml is refused."""
        from .cli import RESUME_OVERRIDES
        from .config import load_yaml

        saved = Path(self.cfg.out) / "config.yaml"
        if not saved.is_file():
            return
        import yaml

        before = load_yaml(saved)  # what Config.save wrote: the same YAML round trip on both sides
        now = yaml.safe_load(yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
        changed = [k for k, v in now.items() if k not in RESUME_OVERRIDES and k in before and before[k] != v]
        if changed:
            given = ", ".join(f"{k} {now[k]!r}" for k in changed[:5])
            then = ", ".join(f"{k} {before[k]!r}" for k in changed[:5])
            raise ConfigError(f"train(resume_from_checkpoint=True): {given} would change what the run in "
                              f"{self.cfg.out} trains (saved in {saved}: {then}); a resumed run keeps its settings "
                              f"(only {', '.join(RESUME_OVERRIDES)} may change). Give GRPOTrainer the arguments "
                              f"of the run, or start a new run in another output_dir")

    def setup_data(self, cfg: Config):
        tmp = Path(tempfile.mkdtemp(prefix="grpolab-api-"))
        loaded = []
        for name, rows in (("train_dataset", self._api["rows"]), ("eval_dataset", self._api["eval_rows"])):
            if not rows:
                loaded.append([])
                continue
            path = tmp / f"{name}.jsonl"
            path.write_text("".join(to_json(r) + "\n" for r in rows))
            loaded.append(load_jsonl(path))  # the same row checks as --data
        rows, eval_rows = loaded
        rewards = []
        for k, spec in enumerate(self._api["reward_funcs"]):
            if isinstance(spec, str):
                r = parse_reward_spec(spec if ":" in spec and not Path(spec).exists() else f"rm:{spec}", cfg=cfg)
            elif callable(spec):
                r = RewardFn(getattr(spec, "__name__", f"reward_{k}"), spec, 1.0)
            else:
                raise ConfigError(f"reward_funcs[{k}]: {type(spec).__name__} not supported; give a callable "
                                  f"(prompts, completions, completion_ids, **columns) or a reward-model folder "
                                  f"path ('rm:PATH', 'judge:PATH' or any grpolab reward spec)")
            check_signature(r, columns_of(rows) | rollout_columns(cfg), source="train_dataset")
            rewards.append(r)
        self.data_info = {"source": "eval_dataset" if eval_rows else "none (no eval_dataset given)",
                          "rows": min(len(eval_rows), cfg.eval_problems), "train_source": "train_dataset",
                          "train_rows": len(rows)}
        return rows, eval_rows[:cfg.eval_problems], rewards, None, {}

    def load_policy(self, cfg: Config):
        model, tok = self._api["model_obj"], self._api["processing_class"]
        if model is None:
            if tok is not None and cfg.model == "tiny":
                raise ConfigError("processing_class: model 'tiny' builds its own tokenizer from the data; do not "
                                  "pass processing_class with it")
            model, own = super().load_policy(cfg)
            tok = tok or own
            if tok is None:  # a policy whose actions are not text (policy: flow_matching, ...): no tokenizer
                return model, None
        elif hasattr(self.policy, "whisper"):  # a loaded Whisper: its WhisperProcessor is required
            if tok is None or getattr(tok, "feature_extractor", None) is None:
                raise ConfigError("processing_class: a loaded Whisper model needs its processor "
                                  "(WhisperProcessor.from_pretrained(...)), or pass the model's folder as model=")
            self.policy.use_loaded(model, tok)  # its decoder prefix, token masks and feature extractor
            self.policy.check_rows(self.rows, self.eval_rows)
            return model.eval(), None
        elif hasattr(self.policy, "processor"):  # a loaded VLM: its processor is required, as in TRL
            if tok is None or getattr(tok, "tokenizer", None) is None:
                raise ConfigError("processing_class: a loaded vision-language model needs its processor "
                                  "(AutoProcessor.from_pretrained(...)), or pass the model's folder as model=")
            self.policy.use_loaded(model, tok)  # its processor, tokenizer, image token and picture layout
            model.config.use_cache = True
            model.eval()
            tok = tok.tokenizer
        else:
            if tok is None:
                from transformers import AutoTokenizer
                path = Path(str(getattr(model, "name_or_path", "")))
                if not (path / "tokenizer_config.json").exists() and not (path / "tokenizer.json").exists():
                    raise ConfigError("model: a loaded model whose name_or_path is not a local folder with a "
                                      "tokenizer needs processing_class=<its tokenizer>")
                tok = AutoTokenizer.from_pretrained(path)
            model.config.use_cache = True
            model.eval()
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "left"
        return model, tok

    def train_step(self) -> dict:
        cb = self.callbacks
        cb("on_step_begin")
        m = super().train_step()
        cb.state.global_step = self.step
        if m.get("loss") is not None and math.isfinite(m["loss"]):
            self.losses.append(float(m["loss"]))
        self.last_metrics = m
        cb("on_step_end")
        if self.step % max(int(cb.args.logging_steps), 1) == 0 or self.step == self.cfg.steps:
            logs = {k: v for k, v in m.items() if isinstance(v, (int, float)) and v is not None}
            cb.state.log_history.append({**logs, "step": self.step})
            cb("on_log", logs=logs)
        if cb.control.should_training_stop:  # a callback stops the run: this step is the last (it is saved)
            self.cfg.steps = self.step
        return m

    def save(self) -> Path:
        path = super().save()
        self.callbacks("on_save")
        return path


class GRPOTrainer:
    """TRL's ``GRPOTrainer`` constructor on grpolab's trainer (module docstring).

    ``model``: 'tiny', 'smollm2', a local model folder, or a loaded ``PreTrainedModel`` (its tokenizer from
    ``processing_class`` or its local ``name_or_path``); nothing is downloaded. ``reward_funcs``: one or a list
    of callables with TRL's signature ``(prompts, completions, completion_ids, **columns) -> list[float | None]``
    or reward-model folder paths (grpolab's ``rm:PATH``; any grpolab reward spec string also works).
    ``train_dataset`` / ``eval_dataset``: a list of dicts or a ``datasets.Dataset`` with a ``prompt`` column
    (standard or conversational); without ``eval_dataset`` there is no held-out evaluation (as TRL).
    ``peft_config``: a ``peft.LoraConfig`` -> grpolab's LoRA keys. ``callbacks``: transformers-style
    (:data:`SUPPORTED_CALLBACK_EVENTS`; any other overridden event is an error). ``tools``: TRL-style tool
    functions (type hints + docstring); ``environment_factory``: TRL-style environment class (``reset(**row)``,
    public methods = tools; one instance per episode); either selects the multi-turn ``agent`` rollout
    (docs/agents.md).
    """

    def __init__(self, model, reward_funcs, args: GRPOConfig | None = None, train_dataset=None, eval_dataset=None,
                 processing_class=None, reward_processing_classes=None, callbacks=None, optimizers=(None, None),
                 peft_config=None, tools=None, environment_factory=None, **kwargs):
        if kwargs:
            raise ConfigError(f"GRPOTrainer: argument(s) {', '.join(sorted(kwargs))} not supported")
        if reward_processing_classes is not None:
            raise ConfigError("GRPOTrainer: reward_processing_classes not supported (a reward model uses the "
                              "tokenizer in its folder)")
        if optimizers != (None, None) and optimizers is not None:
            raise ConfigError("GRPOTrainer: optimizers not supported (grpolab builds AdamW from learning_rate, "
                              "weight_decay, adam_beta1/2 and lr_scheduler_type)")
        self.args = args if args is not None else GRPOConfig()
        if not isinstance(self.args, GRPOConfig):
            raise ConfigError(f"args: expected grpolab.GRPOConfig, got {type(self.args).__name__}")
        rows = _rows_of(train_dataset, "train_dataset")
        if not rows:
            raise ConfigError("train_dataset: required (a list of dicts or a datasets.Dataset with a 'prompt' "
                              "column)")
        eval_rows = _rows_of(eval_dataset, "eval_dataset")
        overrides = to_grpolab(self.args)
        if any(r.get("image") is not None or r.get("images") is not None for r in rows[:100]):
            overrides.setdefault("policy", "vision_language")  # TRL: an image column makes the run a VLM run
        if any(r.get("audio") is not None for r in rows[:100]):
            overrides.setdefault("policy", "speech_to_text")  # an audio column: a speech recogniser's run
        if any(r.get("env") is not None for r in rows[:100]):
            overrides.setdefault("policy", "control")  # an env column: episodes of a control policy
        if "steps" not in overrides:  # TRL: max_steps <= 0 -> epochs over the data
            per_step = overrides["prompts_per_step"]
            overrides["steps"] = max(1, math.ceil(float(self.args.num_train_epochs) * len(rows) / per_step))
        model_obj = None
        if isinstance(model, (str, Path)):
            overrides["model"] = str(model)
        elif hasattr(model, "generate") and hasattr(model, "config"):
            model_obj = model
            overrides["model"] = str(getattr(model, "name_or_path", "") or "in-memory")
        else:
            raise ConfigError(f"model: expected 'tiny', 'smollm2', a local folder or a loaded PreTrainedModel, "
                              f"got {type(model).__name__}")
        overrides.update(_lora_settings(peft_config))
        if not eval_rows:
            overrides.setdefault("eval_before", False)
            overrides.setdefault("eval_after", False)
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not funcs:
            raise ConfigError("reward_funcs: at least one reward function or reward model is required")
        agent_env = None
        if tools or environment_factory is not None:  # multi-turn episodes (grpolab.agents, docs/agents.md)
            from .agents.rollout import strategy_for_agents
            from .recipes import recipe_overrides
            recipe = overrides.get("recipe")
            named = overrides.get("rollout_strategy") or (recipe_overrides(recipe).get("rollout_strategy")
                                                          if recipe else None)
            strategy = strategy_for_agents(named, [k for k, v in (("tools", tools),
                                                                  ("environment", environment_factory)) if v])
            if strategy is not None:
                overrides["rollout_strategy"] = strategy
            agent_env = {"tools": list(tools or []), "environment": environment_factory, "kind": "trl"}
        self.cfg = build_config(overrides)
        policy = POLICIES.get(self.cfg.policy)  # its rows as JSON (e.g. an environment instance named by an id)
        rows, eval_rows = policy.api_rows(rows, "train_dataset"), policy.api_rows(eval_rows, "eval_dataset")
        self.cfg.data = "train_dataset"  # the rows are the user's (messages say where they came from)
        self.callbacks = _Callbacks(callbacks, self.args, self.cfg.steps)
        self.trainer = _APITrainer(self.cfg, rows=rows, eval_rows=eval_rows, reward_funcs=list(funcs),
                                   model_obj=model_obj, processing_class=processing_class,
                                   callbacks=self.callbacks, overwrite=bool(self.args.overwrite_output_dir),
                                   environment=agent_env)
        self.model, self.processing_class = self.trainer.model, self.trainer.tok
        self.state = self.callbacks.state
        self.callbacks("on_init_end")

    def train(self, resume_from_checkpoint=None) -> TrainOutput:
        """Train; returns :class:`TrainOutput` (``.global_step``, ``.training_loss``, ``.metrics``).
        ``resume_from_checkpoint=True`` (or ``args.output_dir``) continues the run in ``output_dir`` from its
        newest checkpoint that loads, as TRL (an empty or new output_dir starts at step 0)."""
        resume = self._resume_wanted(resume_from_checkpoint)
        with self.trainer.run_lock.training(self.trainer.log):  # the lock of output_dir, held since __init__
            self.trainer.open_run(resume)
            self.state.global_step = self.trainer.step
            return self._train()

    def _resume_wanted(self, given) -> bool:
        if given is None or given is False:
            return False
        out = Path(self.cfg.out)
        if given is True or (isinstance(given, (str, Path)) and Path(given).resolve() == out.resolve()):
            return True
        raise ConfigError(f"train(resume_from_checkpoint={given!r}): grpolab resumes the run in output_dir "
                          f"({out}) from its newest checkpoint that loads; pass True (or output_dir), and "
                          f"output_dir=<the run's folder> in GRPOConfig to resume another run")

    def _train(self) -> TrainOutput:
        t0 = time.perf_counter()
        self.callbacks("on_train_begin")
        summary = self.trainer.train(progress=not self.args.disable_tqdm)
        self.callbacks("on_train_end")
        loss = sum(self.trainer.losses) / len(self.trainer.losses) if self.trainer.losses else float("nan")
        metrics = {"train_runtime": time.perf_counter() - t0, "train_loss": loss,
                   "skipped_steps": summary.get("skipped_steps", 0)}
        for when in ("before", "after"):
            for k, v in (summary.get(when) or {}).items():
                if isinstance(v, (int, float)):
                    metrics[f"eval_{when}_{k}"] = v
        for k, v in self.trainer.last_metrics.items():
            metrics.setdefault(k, v)
        self.state.global_step = self.trainer.step
        return TrainOutput(self.trainer.step, loss, metrics)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> Path:
        """Save the policy (LoRA merged) and tokenizer to ``output_dir`` (default ``args.output_dir``)."""
        import copy

        path = Path(output_dir or self.args.output_dir)
        model = self.trainer.model
        if self.cfg.use_lora:
            model = copy.deepcopy(model).merge_and_unload()
        self.trainer.policy.save(model, path)
        return path
