"""The Python API as a TRL drop-in (grpolab/api.py): a TRL script runs with one changed import, the loss of each
mapped loss_type equals TRL's formula (written here from TRL's grpo_trainer.py, not from grpolab), and every
field grpolab does not support is an error that names it."""
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch

import grpolab
from grpolab.algorithms.aggregation import StepTotals
from grpolab.api import (LOSS_TYPES, SCALE_REWARDS, TRL_FIELDS, TRL_UNSUPPORTED, GRPOConfig, GRPOTrainer,
                         build_config, field_table, to_grpolab)
from grpolab.components import Component
from grpolab.config import Config
from grpolab.errors import ConfigError
from grpolab.registry import AGGREGATIONS, POLICY_LOSSES

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- (1) a script written for TRL
TRL_SCRIPT = textwrap.dedent('''
    from trl import GRPOConfig, GRPOTrainer

    dataset = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(6) for b in range(4)]

    def reward_len(completions, **kwargs):
        return [-abs(6 - len(c)) for c in completions]

    def reward_answer(prompts, completions, completion_ids, answer, **kwargs):
        return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

    training_args = GRPOConfig(
        output_dir="Tiny-GRPO",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        logging_steps=1,
        report_to="none",
    )
    trainer = GRPOTrainer(
        model="tiny",
        reward_funcs=[reward_len, reward_answer],
        args=training_args,
        train_dataset=dataset,
    )
    result = trainer.train()
    trainer.save_model()
''')


def test_trl_script_runs_with_one_changed_import(tmp_path, monkeypatch):
    lines = TRL_SCRIPT.splitlines()
    changed = [line.replace("from trl import", "from grpolab import") for line in lines]
    assert sum(a != b for a, b in zip(lines, changed)) == 1  # only the import line differs
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile("\n".join(changed), "trl_script.py", "exec"), scope)
    result = scope["result"]
    assert result.global_step == 2 and result.metrics["step"] == 2
    assert "train_loss" in result.metrics and result.training_loss == result.metrics["train_loss"]
    out = tmp_path / "Tiny-GRPO"
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert {"rewards/reward_len/mean", "rewards/reward_answer/mean"} <= set(steps[0])
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()  # save_model()
    assert not (out / "tensorboard").exists()  # report_to='none'
    cfg = scope["trainer"].cfg  # the mapping: 8 completions per step / 4 per prompt = 2 prompts
    assert (cfg.prompts_per_step, cfg.num_generations, cfg.micro_batch_size) == (2, 4, 8)
    assert (cfg.policy_loss, cfg.loss_aggregation, cfg.advantage) == ("clipped_ratio", "token_mean", "group_zscore")


def test_callbacks_loaded_model_and_eval_dataset(tmp_path):
    from transformers import TrainerCallback

    seen = []

    class Recorder(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            seen.append(("step_end", state.global_step))

        def on_log(self, args, state, control, logs=None, **kw):
            seen.append(("log", state.global_step, "loss" in logs))
            control.should_training_stop = state.global_step >= 2

    rows = [{"prompt": f"{a} plus {b} is", "answer": str(a + b)} for a in range(5) for b in range(5)]
    base = GRPOTrainer(model="tiny", reward_funcs=lambda completions, **kw: [len(c) % 3 for c in completions],
                       args=GRPOConfig(output_dir=str(tmp_path / "a"), max_steps=1, per_device_train_batch_size=4,
                                       num_generations=2, max_completion_length=4, report_to="none"),
                       train_dataset=rows)
    trainer = GRPOTrainer(model=base.model, processing_class=base.processing_class,
                          reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
                          args=GRPOConfig(output_dir=str(tmp_path / "b"), max_steps=5, logging_steps=2,
                                          per_device_train_batch_size=4, num_generations=2,
                                          max_completion_length=4, report_to="none", eval_problems=3),
                          train_dataset=rows, eval_dataset=rows[-3:], callbacks=[Recorder()])
    result = trainer.train()
    assert result.global_step == 2  # the callback stopped the run at step 2
    assert seen == [("step_end", 1), ("step_end", 2), ("log", 2, True)]  # on_log every logging_steps
    assert {"eval_before_reward_mean", "eval_after_reward_mean"} <= set(result.metrics)  # held out: eval_dataset


def test_unsupported_callback_event_is_an_error(tmp_path):
    from transformers import TrainerCallback

    class OnEvaluate(TrainerCallback):
        def on_evaluate(self, args, state, control, **kw):
            pass

    with pytest.raises(ConfigError, match="on_evaluate"):
        GRPOTrainer(model="tiny", reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                    args=GRPOConfig(output_dir=str(tmp_path / "c"), max_steps=1, report_to="none"),
                    train_dataset=[{"prompt": "a b"}], callbacks=[OnEvaluate])


def test_peft_config_maps_onto_grpolab_lora(tmp_path):
    peft = pytest.importorskip("peft")
    from grpolab.api import _lora_settings
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    assert _lora_settings(cfg) == {"use_lora": True, "lora_r": 4, "lora_alpha": 8,
                                   "lora_target_modules": ["q_proj", "v_proj"]}
    with pytest.raises(ConfigError, match="lora_dropout"):
        _lora_settings(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], lora_dropout=0.1))


def test_datasets_dataset_is_accepted():
    datasets = pytest.importorskip("datasets")
    from grpolab.api import _rows_of
    ds = datasets.Dataset.from_list([{"prompt": "x", "answer": "1"}, {"prompt": "y", "answer": "2"}])
    assert _rows_of(ds, "train_dataset") == [{"prompt": "x", "answer": "1"}, {"prompt": "y", "answer": "2"}]


# --------------------------------------------------------------------------- (2) loss = TRL's formula
def trl_per_token_loss(logp, old, adv, eps_low, eps_high):
    """TRL grpo_trainer.py _compute_loss (token level): coef_1 = exp(logp - old), coef_2 = clamp(coef_1, 1-eps_low,
    1+eps_high), per_token_loss = -min(coef_1 * A, coef_2 * A)."""
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    a = adv.unsqueeze(1)
    return -torch.min(coef_1 * a, coef_2 * a)


def trl_loss(loss_type, micro_batches, eps_low, eps_high, max_completion_length):
    """TRL's normalisation of each loss_type, summed over gradient-accumulation micro-batches (one process)."""
    ga = len(micro_batches)
    num_items_in_batch = sum(float(m.sum()) for _, _, _, m in micro_batches)  # dapo: global accumulated tokens
    total = 0.0
    for logp, old, adv, m in micro_batches:
        lt = trl_per_token_loss(logp, old, adv, eps_low, eps_high)
        if loss_type == "grpo":
            total += float(((lt * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()) / ga
        elif loss_type == "bnpo":
            total += float((lt * m).sum() / m.sum().clamp(min=1.0)) / ga
        elif loss_type == "dr_grpo":
            total += float((lt * m).sum() / (lt.size(0) * max_completion_length)) / ga
        elif loss_type == "dapo":
            total += float((lt * m).sum() / num_items_in_batch)
    return total


def fixed_batch(ga):
    """6 rows (3 groups of 2), completion lengths 1..6 of 6 positions, ratios on both sides of the clip range."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([1, 6, 3, 2, 5, 4])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    old = -torch.rand(6, 6, generator=g) * 2
    logp = old + (torch.rand(6, 6, generator=g) - 0.5) * 0.9  # ratios in ~[0.64, 1.57]
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, -1.2, 1.2])
    rows = torch.arange(6).chunk(ga)
    return [(logp[r], old[r], adv[r], mask[r]) for r in rows]


def grpolab_loss(loss_type, micro_batches, eps_low, eps_high, max_completion_length):
    """grpolab's loss through the components the loss_type mapping selects (the trainer's own calls)."""
    bs = micro_batches[0][0].shape[0]
    args = GRPOConfig(loss_type=loss_type, epsilon=eps_low, epsilon_high=eps_high,
                      max_completion_length=max_completion_length, per_device_train_batch_size=bs,
                      gradient_accumulation_steps=len(micro_batches), num_generations=2)
    cfg = Config.build(to_grpolab(args))
    policy_loss = Component(POLICY_LOSSES.get(cfg.policy_loss), cfg, cfg.policy_loss)
    aggregate = AGGREGATIONS.get(cfg.loss_aggregation)
    totals = StepTotals.from_masks([m for *_, m in micro_batches],
                                   constant=cfg.loss_constant or cfg.max_completion_length)
    total = 0.0
    for logp, old, adv, m in micro_batches:
        per_token, _ = policy_loss(logprobs=logp, old_logprobs=old, advantages=adv, mask=m)
        total += float(aggregate(per_token, m, totals))
    return total


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
def test_loss_equals_trl_formula_one_micro_batch(loss_type):
    mbs = fixed_batch(ga=1)
    expected = trl_loss(loss_type, mbs, 0.2, 0.28, 8)
    assert grpolab_loss(loss_type, mbs, 0.2, 0.28, 8) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_loss_equals_trl_formula_with_gradient_accumulation(loss_type):
    mbs = fixed_batch(ga=2)  # equal micro-batch sizes, unequal token counts (10 and 11)
    expected = trl_loss(loss_type, mbs, 0.2, 0.28, 8)
    assert grpolab_loss(loss_type, mbs, 0.2, 0.28, 8) == pytest.approx(expected, abs=1e-6)


def test_bnpo_normalises_over_the_step_not_per_micro_batch():
    """TRL's bnpo divides by each local micro-batch's tokens; grpolab normalises once per step, so with
    gradient accumulation grpolab's bnpo is the step's token mean (TRL's dapo), which differs here."""
    mbs = fixed_batch(ga=2)
    ours = grpolab_loss("bnpo", mbs, 0.2, 0.28, 8)
    assert ours == pytest.approx(trl_loss("dapo", mbs, 0.2, 0.28, 8), abs=1e-6)
    assert abs(ours - trl_loss("bnpo", mbs, 0.2, 0.28, 8)) > 1e-4
    # the variants really differ on this batch (the test could not pass with a wrong mapping)
    values = {t: trl_loss(t, fixed_batch(1), 0.2, 0.28, 8) for t in ("grpo", "dr_grpo", "dapo")}
    assert len({round(v, 6) for v in values.values()}) == 3


@pytest.mark.parametrize("loss_type", ["grpo", "luspo"])
def test_fully_masked_row_counts_in_trl_grpo_and_luspo(loss_type):
    """TRL's grpo and luspo losses average over every row (``.mean()``), a row that mask_truncated_completions
    emptied included; grpolab's own seq_mean_token_mean divides by the rows with loss tokens (-0.759847 vs TRL's
    -0.664866 on 8 rows with one masked, as filed). The drop-in must give TRL's number. Hand-computed: 8 rows,
    advantages A, ratio 1 on every token except row 0 (ratio 1.5 > 1 + epsilon_high = 1.28: clipped, A > 0), row 7
    truncated and masked out; epsilon 0.2 / epsilon_high 0.28, beta 0.
      per-row loss l_i = -A_i, l_0 = -1.28:  [-1.28, -0.5, 0.25, -2, -1.5, 1, -0.75, (masked)]
      grpo  = (1/8) * sum_i mean_t l_i     = -4.78 / 8  = -0.5975    (grpolab's own: -4.78 / 7)
      luspo = (1/8) * sum_i |o_i| * l_i,  |o| = [3, 1, 2, 4, 2, 3, 1, 0]:
              3(-1.28) - 0.5 + 2(0.25) + 4(-2) + 2(-1.5) + 3(1) - 0.75 = -12.59;  -12.59 / 8 = -1.57375"""
    from grpolab.algorithms import mask_truncated
    lengths = torch.tensor([3, 1, 2, 4, 2, 3, 1, 4])
    truncated = torch.tensor([False] * 7 + [True])
    mask = mask_truncated((torch.arange(4)[None, :] < lengths[:, None]).float(), truncated)
    old = -torch.rand(8, 4, generator=torch.Generator().manual_seed(0))
    logp = old.clone()
    logp[0] += torch.log(torch.tensor(1.5))
    adv = torch.tensor([1.0, 0.5, -0.25, 2.0, 1.5, -1.0, 0.75, 3.0])
    fields = {"loss_type": loss_type, "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0,
              "mask_truncated_completions": True, "per_device_train_batch_size": 8, "num_generations": 2}
    if loss_type == "luspo":
        fields["importance_sampling_level"] = "sequence"
    cfg = Config.build(to_grpolab(GRPOConfig(**fields)))
    per_token, _ = Component(POLICY_LOSSES.get(cfg.policy_loss), cfg, cfg.policy_loss)(
        logprobs=logp, old_logprobs=old, advantages=adv, mask=mask)
    totals = StepTotals.from_masks([mask], constant=cfg.max_completion_length)
    ours = float(AGGREGATIONS.get(cfg.loss_aggregation)(per_token, mask, totals))
    expected = {"grpo": -4.78 / 8, "luspo": -12.59 / 8}[loss_type]
    assert ours == pytest.approx(expected, abs=1e-5)
    # grpolab's own aggregation (its recipes) keeps dividing by the 7 rows with loss tokens
    native = float(AGGREGATIONS.get("seq_mean_token_mean")(per_token, mask, totals))
    assert native == pytest.approx(expected * 8 / 7, abs=1e-5)


# --------------------------------------------------------------------------- (3) fields: supported or an error
@pytest.mark.parametrize("field", sorted(TRL_UNSUPPORTED))
def test_every_unsupported_trl_field_is_an_error_naming_it(field):
    with pytest.raises(ConfigError, match=rf"\b{re.escape(field)}\b.*not supported"):
        GRPOConfig(**{field: 1})


def test_attribute_assignment_is_checked_and_used():
    args = GRPOConfig(max_steps=2)
    args.max_steps = 5  # TRL's GRPOConfig is a dataclass: scripts set fields after construction
    assert args.max_steps == 5 and to_grpolab(args)["steps"] == 5
    with pytest.raises(ConfigError, match="use_liger_kernel"):
        args.use_liger_kernel = True
    with pytest.raises(ConfigError, match="max_stepz"):
        args.max_stepz = 3


def test_unknown_field_is_an_error():
    with pytest.raises(ConfigError, match="per_device_batch_size.*did you mean per_device_train_batch_size"):
        GRPOConfig(per_device_batch_size=4)
    with pytest.raises(ConfigError, match="no_such_field"):
        GRPOConfig(no_such_field=1)


def test_supported_and_unsupported_lists_are_disjoint_and_grpolab_keys_pass():
    assert not set(TRL_FIELDS) & TRL_UNSUPPORTED
    ov = to_grpolab(GRPOConfig(recipe="dr_grpo", max_steps=3, kl_estimator="k2"))
    assert ov["recipe"] == "dr_grpo" and ov["kl_estimator"] == "k2" and ov["steps"] == 3
    assert "policy_loss" not in ov and "advantage" not in ov  # the recipe's components stay
    cfg = build_config(ov)
    assert (cfg.advantage, cfg.loss_aggregation) == ("group_mean", "constant")


MAPPING = [  # (GRPOConfig fields, expected grpolab keys)
    ({"loss_type": "grpo"}, {"policy_loss": "clipped_ratio", "loss_aggregation": "seq_mean_token_mean_all_rows"}),
    ({"loss_type": "bnpo"}, {"policy_loss": "clipped_ratio", "loss_aggregation": "token_mean"}),
    ({"loss_type": "dr_grpo"}, {"policy_loss": "clipped_ratio", "loss_aggregation": "constant"}),
    ({"loss_type": "dapo"}, {"policy_loss": "clipped_ratio", "loss_aggregation": "token_mean"}),
    ({"loss_type": "cispo", "epsilon_high": 5.0}, {"policy_loss": "cispo", "loss_aggregation": "token_mean",
                                                   "cispo_epsilon_high": 4.0}),
    ({"loss_type": "sapo", "sapo_temperature_neg": 1.1}, {"policy_loss": "soft_gate", "sapo_tau_neg": 1.1,
                                                          "loss_aggregation": "seq_mean_token_mean_all_rows"}),
    ({"loss_type": "grpo", "importance_sampling_level": "sequence"}, {"policy_loss": "sequence_ratio"}),
    ({"scale_rewards": "group"}, {"advantage": "group_zscore"}),
    ({"scale_rewards": True}, {"advantage": "group_zscore"}),
    ({"scale_rewards": "batch"}, {"advantage": "group_mean_batch_std"}),
    ({"scale_rewards": "none"}, {"advantage": "group_mean"}),
    ({"scale_rewards": False}, {"advantage": "group_mean"}),
    ({"multi_objective_aggregation": "normalize_then_sum"}, {"advantage": "gdpo"}),
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "num_generations": 8},
     {"prompts_per_step": 2, "micro_batch_size": 4}),
    ({"mask_truncated_completions": True, "beta": 0.04, "max_steps": 7, "save_steps": 3, "output_dir": "o",
      "learning_rate": 1e-5, "seed": 3, "num_iterations": 2, "temperature": 0.9, "top_p": 0.95, "top_k": None,
      "max_prompt_length": 64, "reward_weights": [1.0, 0.5]},
     {"mask_truncated_completions": True, "beta": 0.04, "steps": 7, "save_steps": 3, "out": "o",
      "learning_rate": 1e-5, "seed": 3, "num_iterations": 2, "temperature": 0.9, "top_p": 0.95, "top_k": 0,
      "max_prompt_length": 64, "reward_weights": [1.0, 0.5]}),
    ({"bf16": True, "use_cpu": True, "optim": "adamw_torch"}, {"dtype": "bfloat16", "device": "cpu"}),
    ({"bf16": False}, {"dtype": "float32"}),
    ({"report_to": "none"}, {"tensorboard": False}),
    ({"report_to": ["tensorboard"]}, {"tensorboard": True}),
    ({}, {"loss_aggregation": "token_mean", "learning_rate": 1e-6, "temperature": 1.0, "max_completion_length": 256,
          "out": "trainer_output", "save_steps": 500, "seed": 42, "prompts_per_step": 1}),  # TRL's defaults
]


@pytest.mark.parametrize("fields,expected", MAPPING)
def test_supported_mapping_table(fields, expected):
    if "report_to" in fields and "report_to" in Config.field_names():
        pytest.skip("this grpolab has its own report_to key")
    ov = to_grpolab(GRPOConfig(**fields))
    assert {k: ov.get(k) for k in expected} == expected
    Config.build(ov)  # a valid grpolab configuration


@pytest.mark.parametrize("loss_type", ["luspo", "vespo"])
def test_luspo_vespo_map_to_their_components_or_error_naming_them(loss_type):
    fields = {"loss_type": loss_type}
    if loss_type == "luspo":
        fields["importance_sampling_level"] = "sequence"
    if loss_type in POLICY_LOSSES:
        ov = to_grpolab(GRPOConfig(**fields))
        # TRL: luspo weights each sequence's loss by its length and averages over sequences; vespo normalises
        # by the step's token count
        want = {"luspo": "seq_mean_token_mean_all_rows", "vespo": "token_mean"}[loss_type]
        assert ov["policy_loss"] == loss_type and ov["loss_aggregation"] == want
        Config.build(ov)
    else:
        with pytest.raises(ConfigError, match=rf"policy loss '{loss_type}'.*not registered"):
            to_grpolab(GRPOConfig(**fields))


def test_bad_values_are_errors_naming_the_field():
    for fields, word in [({"loss_type": "ppo"}, "loss_type"), ({"scale_rewards": "row"}, "scale_rewards"),
                         ({"importance_sampling_level": "segment"}, "importance_sampling_level"),
                         ({"per_device_train_batch_size": 6, "num_generations": 4}, "num_generations"),
                         ({"report_to": "comet_ml"}, "report_to"), ({"loss_type": "luspo"}, "sequence"),
                         ({"sapo_temperature_pos": 1.0}, "sapo_temperature_pos"),
                         ({"remove_unused_columns": True}, "remove_unused_columns"),
                         ({"optim": "adafactor"}, "optim"), ({"bf16": True, "fp16": True}, "fp16")]:
        if word == "report_to" and "report_to" in Config.field_names():
            continue
        with pytest.raises(ConfigError, match=word):
            to_grpolab(GRPOConfig(**fields))


def test_trainer_arguments_grpolab_does_not_support_are_errors(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path / "x"), max_steps=1, report_to="none")
    fn = [lambda completions, **kw: [0.0] * len(completions)]
    with pytest.raises(ConfigError, match="optimizers"):
        GRPOTrainer(model="tiny", reward_funcs=fn, args=args, train_dataset=[{"prompt": "a"}],
                    optimizers=(object(), None))
    with pytest.raises(ConfigError, match="reward_processing_classes"):
        GRPOTrainer(model="tiny", reward_funcs=fn, args=args, train_dataset=[{"prompt": "a"}],
                    reward_processing_classes=[object()])
    with pytest.raises(ConfigError, match="train_dataset"):
        GRPOTrainer(model="tiny", reward_funcs=fn, args=args, train_dataset=[])


# --------------------------------------------------------------------------- steps_per_generation
SPG = [  # (GRPOConfig fields, grpolab steps_per_generation or None = not set). TRL (grpo_config.py __post_init__,
    # one process): generation_batch_size = per_device_train_batch_size x steps_per_generation completions;
    # steps_per_generation counts micro-batches, gradient_accumulation_steps of them make one optimiser step
    ({"per_device_train_batch_size": 8, "num_generations": 4}, None),  # TRL default: steps_per_generation = GA
    ({"per_device_train_batch_size": 8, "num_generations": 4, "steps_per_generation": 4}, 4),  # 4 / GA 1
    ({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "num_generations": 4,
      "steps_per_generation": 8}, 4),  # 8 micro-batches = 4 optimiser steps of 2
    ({"per_device_train_batch_size": 8, "num_generations": 4, "generation_batch_size": 32}, 4),  # 32 / 8 = 4
    ({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "num_generations": 4,
      "steps_per_generation": 2}, 1),  # TRL generates twice per optimiser step, with the same weights
]


@pytest.mark.parametrize("fields,expected", SPG)
def test_steps_per_generation_and_generation_batch_size_map_onto_optimiser_steps(fields, expected):
    ov = to_grpolab(GRPOConfig(**fields))
    assert ov.get("steps_per_generation") == expected
    assert ov["prompts_per_step"] == fields["per_device_train_batch_size"] * fields.get(
        "gradient_accumulation_steps", 1) // fields["num_generations"]
    assert Config.build(ov).steps_per_generation == (expected or 1)


@pytest.mark.parametrize("fields,word", [
    ({"steps_per_generation": 2, "generation_batch_size": 16}, "both configured"),  # TRL's own refusal
    ({"per_device_train_batch_size": 8, "generation_batch_size": 12}, "multiple of per_device_train_batch_size"),
    ({"per_device_train_batch_size": 2, "num_generations": 2, "gradient_accumulation_steps": 2,
      "steps_per_generation": 3}, "multiple or a divisor of gradient_accumulation_steps"),
    ({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "num_generations": 4,
      "steps_per_generation": 1}, "divisible by num_generations"),  # 2 x 1 completions: no whole group of 4
    ({"steps_per_generation": 0}, "steps_per_generation must be >= 1"),
])
def test_steps_per_generation_errors_name_the_fields(fields, word):
    with pytest.raises(ConfigError, match=word):
        to_grpolab(GRPOConfig(**fields))


# --------------------------------------------------------------------------- docs and import cost
def test_docs_list_every_supported_field_and_loss_type():
    doc = (ROOT / "docs" / "python_api.md").read_text()
    assert field_table() in doc, "docs/python_api.md is stale: run scripts/regen_docs.py"
    for name in list(TRL_FIELDS) + list(LOSS_TYPES):
        assert f"`{name}`" in doc
    assert "Python API (TRL drop-in)" in (ROOT / "README.md").read_text()


def test_import_grpolab_stays_cheap():
    import subprocess
    import sys
    code = "import sys, grpolab; print('grpolab.api' in sys.modules, 'grpolab.train.trainer' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
    assert grpolab.GRPOConfig is GRPOConfig and set(SCALE_REWARDS.values()) <= set(
        __import__("grpolab.registry", fromlist=["ADVANTAGES"]).ADVANTAGES.names())
