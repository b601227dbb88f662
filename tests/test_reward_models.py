"""Reward models, math answer checking, IRPO / E-GRPO / paraphrase-consistency transforms (hand-computed)."""
import math
from types import SimpleNamespace

import pytest
import torch

from grpolab.components import Component
from grpolab.config import Config
from grpolab.recipes import recipe_overrides
from grpolab.rewards import RewardFn, RewardScorer, check_signature
from grpolab.rewards.answers import (extract_answer, fallback_math_equal, last_boxed, math_accuracy, math_equal,
                                     math_verify_module)
from grpolab.rewards.transforms import REWARD_TRANSFORMS, entity_match_rate

from _helpers import close, tr  # noqa: E402

NAN = float("nan")


def batch(completions, **columns):
    return SimpleNamespace(columns={"completion": completions, **columns})


# ---------------------------------------------------------------- reward model (RewardModelFn)

TEXTS = ["You are a judge.", "Compute 2 + 3.", "Answer: 5", "Answer: 6", "Hello there, world!",
         "the quick brown fox jumps over the lazy dog 0123456789 +-*/=:.,!?"]


def _save_tiny_rm(folder, chat_template=True, seed=0):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from grpolab.model.loading import build_tiny

    _, tok = build_tiny(TEXTS)
    if not chat_template:
        tok.chat_template = None
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id, num_labels=1)
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(cfg).eval()
    with torch.no_grad():  # a random score head is tiny; make scores clearly differ between texts
        model.score.weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rm") / "tiny_rm"
    model, tok = _save_tiny_rm(folder)
    return folder, model, tok


CHAT = [{"role": "system", "content": "You are a judge."}, {"role": "user", "content": "Compute 2 + 3."}]
COMPLETIONS = ["Answer: 5", "Answer: 6", "the lazy dog", "5", "Hello there, world! Answer: 5 0123456789", "!"]


def test_reward_model_fits_the_contract_and_is_deterministic(rm_folder):
    from grpolab.rewards.models import RewardModelFn

    folder, _, _ = rm_folder
    fn = RewardModelFn(folder)
    prompts = [CHAT] * len(COMPLETIONS)
    a = fn(prompts=prompts, completions=COMPLETIONS, answer=["5"] * 6)  # extra columns are ignored
    assert isinstance(a, list) and len(a) == len(COMPLETIONS) and all(isinstance(x, float) for x in a)
    assert all(math.isfinite(x) for x in a)
    assert len(set(round(x, 6) for x in a)) > 1  # the scores depend on the completion
    assert fn(prompts=prompts, completions=COMPLETIONS) == a  # deterministic
    assert RewardModelFn(folder)(prompts=prompts, completions=COMPLETIONS) == a  # and across loads
    # the trainer's path: signature check and the scorer
    r = RewardFn("rm", fn, 1.0)
    check_signature(r, {"answer"})
    m, errors = RewardScorer([r]).score(prompts, COMPLETIONS, [[1]] * 6, {"answer": ["5"] * 6})
    assert errors == 0 and close(m[:, 0], torch.tensor(a, dtype=torch.float32))


def test_reward_model_batched_equals_unbatched(rm_folder):
    from grpolab.rewards.models import RewardModelFn

    folder, _, _ = rm_folder
    prompts = [CHAT] * 3 + ["Compute 2 + 3. "] * 3  # chat and plain prompts mixed
    batched = RewardModelFn(folder, batch_size=8)(prompts=prompts, completions=COMPLETIONS)
    single = RewardModelFn(folder, batch_size=1)(prompts=prompts, completions=COMPLETIONS)
    assert close(batched, single, tol=1e-5)
    # order of rows does not matter either
    perm = [5, 2, 0, 4, 1, 3]
    shuffled = RewardModelFn(folder, batch_size=4)(prompts=[prompts[i] for i in perm],
                                                   completions=[COMPLETIONS[i] for i in perm])
    assert close(shuffled, [batched[i] for i in perm], tol=1e-5)


def test_reward_model_scores_the_templated_or_concatenated_text(rm_folder):
    from grpolab.rewards.models import RewardModelFn

    folder, model, tok = rm_folder
    fn = RewardModelFn(folder)
    # chat prompt -> the tokenizer's chat template with the completion as an assistant turn
    text = tok.apply_chat_template(CHAT + [{"role": "assistant", "content": "Answer: 5"}], tokenize=False)
    assert text == "You are a judge.\nCompute 2 + 3.\nAnswer: 5"  # messages joined by newlines
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        expected = float(model(**ids).logits[0, 0])  # the model as saved, unpadded
    assert fn(prompts=[CHAT], completions=["Answer: 5"])[0] == pytest.approx(expected, abs=1e-5)
    # a chat completion (list of messages) is read as its text
    assert fn(prompts=[CHAT], completions=[[{"role": "assistant", "content": "Answer: 5"}]])[0] == \
        pytest.approx(expected, abs=1e-5)
    # plain prompt -> plain concatenation
    ids = tok("Compute 2 + 3. Answer: 5", return_tensors="pt")
    with torch.no_grad():
        expected = float(model(**ids).logits[0, 0])
    assert fn(prompts=["Compute 2 + 3. "], completions=["Answer: 5"])[0] == pytest.approx(expected, abs=1e-5)


def test_reward_model_without_chat_template_concatenates(tmp_path):
    from grpolab.rewards.models import RewardModelFn

    folder = tmp_path / "rm_plain"
    _save_tiny_rm(folder, chat_template=False, seed=1)
    fn = RewardModelFn(folder)
    # chat prompt without a template: contents joined by newlines, then the completion
    assert fn.text(CHAT, "Answer: 5") == "You are a judge.\nCompute 2 + 3.Answer: 5"
    assert fn(prompts=[CHAT], completions=["Answer: 5"]) == \
        fn(prompts=["You are a judge.\nCompute 2 + 3."], completions=["Answer: 5"])


def test_reward_model_spec_and_errors(rm_folder, tmp_path):
    from grpolab.rewards.models import RewardModelFn, parse_rm_spec

    folder, _, _ = rm_folder
    r = parse_rm_spec(f"rm:{folder}=2.5")
    assert r.name == "rm" and r.weight == 2.5 and isinstance(r.fn, RewardModelFn)
    assert parse_rm_spec(f"rm:{folder}").weight == 1.0
    with pytest.raises(FileNotFoundError, match="config.json"):
        RewardModelFn(tmp_path / "nothing")
    with pytest.raises(ValueError, match="rm:"):
        parse_rm_spec("mymodule:fn")


# ---------------------------------------------------------------- math answers

@pytest.mark.parametrize("pred,gold", [
    ("1/2", "0.5"), ("\\frac{1}{2}", "0.5"), ("\\boxed{\\dfrac{3}{4}}", "0.75"), ("1,000", "1000"),
    ("(-2)", "-2"), ("$5$", "5"), ("50\\%", "50"), ("1e3", "1000"), ("\\frac12", "0.5"),
    ("-\\frac{1}{2}", "-0.5"), ("The answer is \\boxed{7}.", "7"), ("x + 1", "X+1"), ("3.", "3"),
    ("0.1", "1/10"), ("\\left( 4 \\right)", "4"),
])
def test_fallback_math_equal_true(pred, gold):
    assert fallback_math_equal(pred, gold)
    assert math_equal(pred, gold, use_math_verify=False)


@pytest.mark.parametrize("pred,gold", [
    ("2", "3"), ("1/3", "0.33"), ("", ""), ("x+1", "x+2"), ("\\boxed{5}", "6"), ("10", "1,000"), ("-1", "1"),
])
def test_fallback_math_equal_false(pred, gold):
    assert not fallback_math_equal(pred, gold)
    assert not math_equal(pred, gold, use_math_verify=False)


def test_math_equal_none_and_boxed_extraction():
    assert not math_equal(None, "1") and not math_equal("1", None)
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"  # last box, balanced braces
    assert last_boxed("no box") is None
    assert extract_answer("so \\boxed{4}\nAnswer: 5") == "4"  # a box wins
    assert extract_answer("Answer: 3\nAnswer: 5 ") == "5"
    assert extract_answer("nothing") is None
    # reward function under TRL's contract: 1 when the final answer equals the column `answer`
    out = math_accuracy(prompts=None, completions=["Answer: 1/2", "\\boxed{0.5}", "Answer: 3", "nothing"],
                        answer=["0.5"] * 4)
    assert out == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.skipif(math_verify_module() is None, reason="math-verify is not installed")
def test_math_equal_with_math_verify():
    assert math_equal("\\boxed{\\frac{1}{2}}", "0.5")
    assert math_equal("$\\sqrt{4}$", "2")  # symbolic: beyond the fallback
    assert not math_equal("\\boxed{3}", "2")


# ---------------------------------------------------------------- IRPO Bradley-Terry (000-21)

def test_irpo_bradley_terry_hand_computed():
    ln3 = math.log(3.0)
    # group 0: scores [0, ln3, ln3]; group 1: [NaN, 5] ; columns [accuracy, rm]
    m = torch.tensor([[1.0, 0.0], [0.0, ln3], [0.0, ln3], [1.0, NAN], [0.0, 5.0]])
    gids = torch.tensor([0, 0, 0, 1, 1])
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    out = tr("irpo_bradley_terry", rewards=r, group_ids=gids, reward_matrix=m, reward_names=["accuracy", "rm"])
    # row 0: (sig(-ln3) + sig(-ln3)) / 2 = (1/4 + 1/4) / 2 = 0.25
    # row 1: (sig(ln3) + sig(0)) / 2 = (3/4 + 1/2) / 2 = 0.625 ; row 2 likewise
    # row 3: unscorable score -> no bonus; row 4: the only scored row of its group -> 0.5
    assert close(out, [1.25, 0.625, 0.625, 1.0, 0.5])
    p = out[:3] - r[:3]
    assert float(p.sum()) == pytest.approx(1.5)  # BT: win probabilities of a group sum to n/2
    # only differences matter; the scale k sharpens: k = 2 on halved scores gives the same
    shifted = m.clone()
    shifted[:, 1] = m[:, 1] + 10.0
    assert close(tr("irpo_bradley_terry", rewards=r, group_ids=gids, reward_matrix=shifted,
                    reward_names=["accuracy", "rm"]), out)
    halved = m.clone()
    halved[:, 1] = m[:, 1] / 2
    assert close(tr("irpo_bradley_terry", rewards=r, group_ids=gids, reward_matrix=halved,
                    reward_names=["accuracy", "rm"], irpo_scale=2.0), out)
    # weight, and a NaN combined reward stays NaN
    w = tr("irpo_bradley_terry", rewards=torch.tensor([NAN, 0.0, 0.0, 1.0, 0.0]), group_ids=gids,
           reward_matrix=m, reward_names=["accuracy", "rm"], irpo_weight=2.0)
    assert close(w, [NAN, 1.25, 1.25, 1.0, 1.0])
    with pytest.raises(ValueError, match="irpo_reward_column"):
        tr("irpo_bradley_terry", rewards=r, group_ids=gids, reward_matrix=m, reward_names=["accuracy", "format"])


# ---------------------------------------------------------------- E-GRPO entity match (000-54)

def test_entity_match_rate():
    ents = ["Paris", "Eiffel Tower", "1889"]
    assert entity_match_rate("the eiffel tower is in PARIS", ents) == pytest.approx(2 / 3)
    assert entity_match_rate("Parisian towers of 18890", ents) == 0.0  # whole words only
    assert entity_match_rate("I like c++ a lot", ["C++", "java"]) == 0.5  # punctuation at the edges
    assert entity_match_rate("3 + 4", [3, 4, 4, 10]) == pytest.approx(2 / 3)  # numbers, duplicates once
    assert entity_match_rate("anything", []) == 0.0
    assert entity_match_rate("paris", "Paris") == 1.0  # a single string is one entity


def test_egrpo_entity_hand_computed():
    ents = ["Paris", "Eiffel Tower", "1889"]
    texts = ["the eiffel tower is in paris", "Paris, 1889.", "Parisian tower", "EIFFEL TOWER", "Paris", "x"]
    m = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [NAN, 0.0], [0.0, 0.0]])
    gids = torch.tensor([0, 0, 0, 0, 1, 1])
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, NAN, 0.0])
    b = batch(texts, entities=[ents] * 6)
    out = tr("egrpo_entity", rewards=r, group_ids=gids, reward_matrix=m, reward_names=["accuracy", "format"],
             batch=b)
    # gamma = [2/3, 2/3, 0, 1/3 | 1/3, 0]; group maxima 2/3 and 1/3 -> gamma_hat = [1, 1, 0, 1/2 | 1, 0]
    # correct row 0 and unscorable row 4 get nothing; wrong rows get 0.3 * gamma_hat
    assert close(out, [1.0, 0.3, 0.0, 0.15, NAN, 0.0])
    raw = tr("egrpo_entity", rewards=r, group_ids=gids, reward_matrix=m, reward_names=["accuracy", "format"],
             batch=b, egrpo_normalize="none", egrpo_alpha=0.6)
    assert close(raw, [1.0, 0.4, 0.0, 0.2, NAN, 0.0])  # 0.6 * 2/3, 0.6 * 1/3
    with pytest.raises(ValueError, match="entities"):
        tr("egrpo_entity", rewards=r, group_ids=gids, reward_matrix=m, reward_names=["accuracy", "format"],
           batch=batch(texts))
    # countdown's `numbers` column (ints) as the entities, as the recipe does
    cd = tr("egrpo_entity", rewards=torch.tensor([0.0, 0.0]), group_ids=torch.tensor([0, 0]),
            reward_matrix=torch.tensor([[0.0, 0.0], [0.0, 0.0]]), reward_names=["accuracy", "format"],
            batch=batch(["Answer: 3 + 12", "Answer: 3"], numbers=[[3, 12, 7]] * 2), egrpo_entity_column="numbers")
    assert close(cd, [0.3, 0.15])  # gamma = [2/3, 1/3] -> hat [1, 1/2]


# ---------------------------------------------------------------- paraphrase-set consistency (000-77, 000-30)

PARA_TEXTS = ["so Answer: 1/2", "Answer: 0.5", "thus \\boxed{\\frac{1}{2}}", "Answer: 3", "Answer: 7", "no idea"]
PARA_SETS = ["A", "A", "A", "A", "B", "A"]
PARA_UIDS = torch.tensor([1, 1, 2, 2, 3, 4])


def test_paraphrase_agreement_hand_computed():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, NAN])
    out = tr("paraphrase_consistency", rewards=r, prompt_uids=PARA_UIDS,
             batch=batch(PARA_TEXTS, paraphrase_group=PARA_SETS))
    # set A: answers 1/2, 0.5 (prompt 1), 1/2, 3 (prompt 2), none (prompt 4)
    # row 0: others = rows 2, 3, 5 -> (1 + 0 + 0) / 3 = 1/3 ; row 1 likewise
    # row 2: others = rows 0, 1, 5 -> (1 + 1 + 0) / 3 = 2/3 ; row 3: 0 ; row 5: no answer -> 0 (NaN stays NaN)
    # set B: a single paraphrase -> 0
    w = 0.5
    assert close(out, [1 + w / 3, 1 + w / 3, 1 + w * 2 / 3, 0.0, 0.0, NAN])


def test_paraphrase_entropy_hand_computed():
    r = torch.zeros(6)
    out = tr("paraphrase_consistency", rewards=r, prompt_uids=PARA_UIDS,
             batch=batch(PARA_TEXTS, paraphrase_group=PARA_SETS), paraphrase_mode="entropy", paraphrase_weight=1.0)
    # set A (n = 5): classes {1/2: rows 0,1,2}, {3: row 3}, {missing: row 5} -> p = 3/5, 1/5, 1/5
    h = -(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2))
    c = 1 - h / math.log(5)
    assert close(out, [c, c, c, c, 0.0, c])
    # full agreement -> 1, all different -> 0
    agree = tr("paraphrase_consistency", rewards=torch.zeros(3), prompt_uids=torch.tensor([1, 2, 3]),
               batch=batch(["Answer: 2", "Answer: 2.0", "\\boxed{2}"], paraphrase_group=[0, 0, 0]),
               paraphrase_mode="entropy", paraphrase_weight=1.0)
    assert close(agree, [1.0, 1.0, 1.0])
    differ = tr("paraphrase_consistency", rewards=torch.zeros(3), prompt_uids=torch.tensor([1, 2, 3]),
                batch=batch(["Answer: 1", "Answer: 2", "Answer: 3"], paraphrase_group=[0, 0, 0]),
                paraphrase_mode="entropy", paraphrase_weight=1.0)
    assert close(differ, [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="paraphrase_group"):
        tr("paraphrase_consistency", rewards=r, prompt_uids=PARA_UIDS, batch=batch(PARA_TEXTS))


# ---------------------------------------------------------------- recipe and config

def test_egrpo_recipe_selects_its_transform():
    rec = recipe_overrides("e_grpo_entity")
    cfg = Config.build(rec)
    assert cfg.reward_transforms == ["egrpo_entity"]
    assert cfg.task == "countdown" and cfg.egrpo_entity_column == "numbers" and cfg.egrpo_alpha == 0.3
    Component(REWARD_TRANSFORMS.get("egrpo_entity"), cfg)  # every parameter resolves from the config


@pytest.mark.parametrize("transform", ["irpo_bradley_terry", "paraphrase_consistency"])
def test_transforms_without_recipe_resolve_from_config(transform):
    """Without a recipe, every parameter the transform declares is bound from the config (its declared default),
    and a config value given for one of them reaches the component."""
    from grpolab.registry import declared_params

    obj = REWARD_TRANSFORMS.get(transform)
    declared = declared_params(obj)
    assert declared, transform  # each declares its parameters (param(...)), else this test checks nothing
    comp = Component(obj, Config.build({"reward_transforms": [transform]}))
    assert {k: comp.fixed[k] for k in declared} == {k: p.default for k, p in declared.items()}
    key, p = next((k, p) for k, p in declared.items() if isinstance(p.default, (int, float))
                  and not isinstance(p.default, bool))
    changed = Component(obj, Config.build({"reward_transforms": [transform], key: p.default + 1}))
    assert changed.fixed[key] == p.default + 1


def test_reward_spec_rm_prefix_goes_to_the_reward_model_loader(tmp_path):
    """`--reward rm:PATH=0.5` is a reward model, not module `rm`."""
    from grpolab.rewards import parse_reward_spec

    with pytest.raises(Exception) as e:
        parse_reward_spec(f"rm:{tmp_path / 'missing'}=0.5")
    assert "missing" in str(e.value) and "cannot import module" not in str(e.value)


def test_math_verify_runs_without_signal_alarm_in_a_reward_thread(monkeypatch):
    """Rewards run in a worker thread (reward_timeout); math-verify's own timeouts use signal.alarm, which only
    the main thread can use: there grpolab turns them off (math-verify would log an error and parse nothing,
    leaving the fallback to decide quietly). A stand-in math_verify that behaves as the real one does."""
    import threading

    from grpolab.rewards import answers

    calls = []

    class FakeMathVerify:
        @staticmethod
        def parse(text, parsing_timeout=5):
            calls.append(("parse", parsing_timeout, threading.current_thread() is threading.main_thread()))
            if parsing_timeout is not None and threading.current_thread() is not threading.main_thread():
                return []  # what math-verify 0.9 does: logs "doesn't support threaded environment", returns []
            return [text.strip("$")]

        @staticmethod
        def verify(gold, pred, timeout_seconds=5):
            calls.append(("verify", timeout_seconds, threading.current_thread() is threading.main_thread()))
            return gold == ["\\sqrt{4}"] and pred == ["2"]  # only math-verify knows; the fallback says no

    monkeypatch.setattr(answers, "math_verify_module", lambda: FakeMathVerify)
    assert answers.fallback_math_equal("2", "\\sqrt{4}") is False
    assert answers.math_equal("2", "\\sqrt{4}") is True  # main thread: math-verify's own timeouts
    out = []
    t = threading.Thread(target=lambda: out.append(answers.math_equal("2", "\\sqrt{4}")))
    t.start()
    t.join()
    assert out == [True]
    assert [c[1] for c in calls if not c[2]] == [None, None, None]


def test_reward_specs_share_one_target_and_weight_rule():
    """rm:, judge:, grm:, drirl:, sgpo_judge: and mlrm: read ``PREFIX:TARGET[=WEIGHT]`` the same way: the weight
    is what follows the last '=' when it is a number; a path may hold '='; a weight that is not finite is refused."""
    from grpolab.rewards.scoring import spec_target_and_weight as split
    assert split("rm:a/b=c", "rm:") == ("a/b=c", 1.0)
    assert split("rm:runs/x=1/final=0.5", "rm:") == ("runs/x=1/final", 0.5)
    assert split("mlrm:builtin#format=2", "mlrm:") == ("builtin#format", 2.0)
    assert split("sgpo_judge:self", "sgpo_judge:") == ("self", 1.0)
    with pytest.raises(ValueError, match="'nan' is not a finite number"):
        split("grm:p=nan", "grm:")
