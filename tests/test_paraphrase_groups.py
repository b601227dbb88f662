"""Paraphrase sets: GRPO groups over the wordings of a question (000-30), PS-GRPO's BLEU group similarity and
its subsampled approximation (000-77), the entropy helpfulness / stability rewards (000-30), the free-form
fact_paraphrase task (consistency is not correctness), and one training step of each recipe."""
import math
import warnings
from types import SimpleNamespace

import pytest
import torch

from grpolab.algorithms.advantages import group_zscore
from grpolab.batch import RolloutBatch
from grpolab.config import Config
from grpolab.errors import FallbackWarning
from grpolab.recipes import recipe_overrides
from grpolab.tasks.text_similarity import sentence_bleu, word_entropy
from grpolab.rewards.transforms import group_similarity
from grpolab.rollouts.paraphrase_groups import paraphrase_set_group_ids
from grpolab.registry import ROLLOUT_STRATEGIES
from grpolab.tasks import get_task
from grpolab.train.metrics import read_metrics
from grpolab.train.trainer import Trainer

from _helpers import close, tr  # noqa: E402

NAN = float("nan")


def batch(completions, **columns):
    return SimpleNamespace(columns={"completion": completions, **columns})


# ---------------------------------------------------------------- groups over the paraphrases (000-30)

def test_set_group_ids_follow_the_first_wording_of_each_set():
    rows = [{"paraphrase_group": g} for g in ["A", "A", "B", "B", "A"]]
    # prompt k of set S gets offset + (index of S's first prompt): A -> 10 + 0, B -> 10 + 2
    assert paraphrase_set_group_ids(rows, 10, "paraphrase_group") == [10, 10, 12, 12, 10]
    with pytest.raises(ValueError, match="paraphrase_set_column"):
        paraphrase_set_group_ids([{"question": "x"}], 0, "paraphrase_group")


class _Ctx:
    """ctx.generate as the trainer's: G rows per prompt, group id offset + prompt index, data columns repeated."""

    def generate(self, rows, uids, *, group_offset, num_generations=None, temperature=None):
        g = 2
        R = len(rows) * g
        return RolloutBatch(
            prompt_ids=torch.zeros(R, 1, dtype=torch.long), prompt_mask=torch.ones(R, 1, dtype=torch.long),
            completion_ids=torch.zeros(R, 1, dtype=torch.long), completion_mask=torch.ones(R, 1),
            behavior_logprobs=torch.zeros(R, 1),
            group_ids=torch.arange(len(rows)).repeat_interleave(g) + group_offset,
            prompt_uids=torch.tensor(uids).repeat_interleave(g), truncated=torch.zeros(R, dtype=torch.bool),
            columns={"paraphrase_group": [r["paraphrase_group"] for r in rows for _ in range(g)]})


def test_set_groups_advantages_hand_computed():
    """2 wordings x 2 samples of question A (and of question B): one group per question, not per wording."""
    strategy = ROLLOUT_STRATEGIES.get("paraphrase_groups")
    rows = [{"paraphrase_group": "A"}, {"paraphrase_group": "A"}, {"paraphrase_group": "B"},
            {"paraphrase_group": "B"}]
    b = strategy(_Ctx(), rows, [7, 8, 9, 11], group_offset=4)
    assert b.group_ids.tolist() == [4, 4, 4, 4, 6, 6, 6, 6]
    assert b.prompt_uids.tolist() == [7, 7, 8, 8, 9, 9, 11, 11]  # the wordings stay apart for feedback
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    adv = group_zscore(r, b.group_ids, advantage_epsilon=1e-4)
    # group A = {1, 0, 1, 1}: mean 0.75, Bessel std sqrt((3 * 0.25^2 + 0.75^2) / 3) = sqrt(0.25) = 0.5
    # A = (1 - 0.75) / 0.5001 = 0.499900..., (0 - 0.75) / 0.5001 = -1.499700...; group B: all 0 -> 0
    hi, lo = 0.25 / 0.5001, -0.75 / 0.5001
    assert close(adv, [hi, lo, hi, hi, 0, 0, 0, 0])
    # one group per wording (plain) gives other numbers: wording 7 = {1, 0} -> +-0.5 / (0.7071 + 1e-4)
    per_wording = group_zscore(r, torch.tensor([4, 4, 5, 5, 6, 6, 7, 7]), advantage_epsilon=1e-4)
    s = math.sqrt(0.5) + 1e-4
    assert close(per_wording, [0.5 / s, -0.5 / s, 0, 0, 0, 0, 0, 0])


# ---------------------------------------------------------------- PS-GRPO group similarity (000-77)

def test_sentence_bleu_hand_computed():
    # "paris is the capital" vs "the capital is paris": p1 = 4/4; bigrams (paris is)(is the)(the capital) vs
    # (the capital)(capital is)(is paris): 1 of 3; BP = 1 (c = r = 4) -> sqrt(1 * 1/3)
    assert sentence_bleu("Paris is the capital.", "The capital is Paris!") == pytest.approx(math.sqrt(1 / 3))
    # one word against four: p1 = 1, BP = exp(1 - 4/1) = e^-3; BLEU-2 has no bigram -> 0 unless smoothed (add one:
    # p2 = (0 + 1) / (0 + 1) = 1)
    assert sentence_bleu("paris", "paris is the capital", order=1) == pytest.approx(math.exp(-3))
    assert sentence_bleu("paris", "paris is the capital", order=2) == 0.0
    assert sentence_bleu("paris", "paris is the capital", order=2, smoothing="add_one") == pytest.approx(math.exp(-3))
    # clipped counts: "the the the" vs "the cat": p1 = min(3, 1) / 3 = 1/3, BP = 1 (c 3 > r 2)
    assert sentence_bleu("the the the", "the cat", order=1) == pytest.approx(1 / 3)
    assert sentence_bleu("", "the cat") == 0.0


PS_TEXTS = ["paris is the capital", "rome", "paris is the capital", "the capital is paris"]
PS_UIDS = torch.tensor([1, 1, 2, 2])  # wording 1: rows 0, 1; wording 2: rows 2, 3 (one set)


def test_ps_grpo_bleu_similarity_hand_computed():
    out = tr("paraphrase_consistency", rewards=torch.zeros(4), prompt_uids=PS_UIDS,
             batch=batch(PS_TEXTS, paraphrase_group=["q"] * 4), paraphrase_similarity="bleu",
             paraphrase_weight=1.0)
    b = math.sqrt(1 / 3)  # BLEU-2 of the two word orders (test above)
    # row 0 vs rows 2, 3 (the other wording): (1 + b) / 2; row 1 "rome": no shared word -> 0
    # row 2 vs rows 0, 1: (1 + 0) / 2; row 3 vs rows 0, 1: (b + 0) / 2
    assert close(out, [(1 + b) / 2, 0.0, 0.5, b / 2])


def test_ps_grpo_subsampling_is_unbiased():
    """kappa other wordings and s outputs of each, drawn per output: the mean over draws is the full reward."""
    # one set, wordings 0 (row 0), 1 (rows 1, 2, 3), 2 (rows 4, 5): ragged, as a cut set can be
    uids = [0, 1, 1, 1, 2, 2]
    rows = list(range(6))
    S = [[0.0, 0.9, 0.1, 0.5, 0.2, 0.6]]  # sim(0, j)
    sim = lambda i, j: S[i][j]  # noqa: E731
    # full reward of row 0: pooled mean over the 5 rows of the other wordings = (0.9+0.1+0.5+0.2+0.6)/5 = 0.46
    assert group_similarity(0, rows, uids, sim) == pytest.approx(0.46)
    draws = []
    for k in range(4000):
        gen = torch.Generator().manual_seed(k)
        draws.append(group_similarity(0, rows, uids, sim, paraphrases=1, rollouts=1, generator=gen))
    d = torch.tensor(draws, dtype=torch.float64)
    se = float(d.std() / math.sqrt(len(d)))
    # one draw: wording 1 (p 1/2): 2/(1*5) * 3 * sim = 1.2 sim with sim in {0.9, 0.1, 0.5}; wording 2:
    # 2/5 * 2 * sim = 0.8 sim with sim in {0.2, 0.6} -> E = 1/2 * 1.2 * 0.5 + 1/2 * 0.8 * 0.4 = 0.46
    assert abs(float(d.mean()) - 0.46) < 4 * se and se < 0.01, (float(d.mean()), se)
    # equal sizes (the paper's n x g): the estimator is 1/(kappa s) sum sim over the drawn outputs
    uids_eq, S_eq = [0, 0, 1, 1, 2, 2], [[0.0, 0.0, 0.3, 0.7, 0.4, 0.8]]
    values = {group_similarity(0, list(range(6)), uids_eq, lambda i, j: S_eq[i][j], paraphrases=1, rollouts=1,
                               generator=torch.Generator().manual_seed(k)) for k in range(200)}
    # (n - 1) / (kappa N) * N_u * sim = 2 / 4 * 2 * sim = sim: each draw is one of the four similarities
    assert sorted(values) == pytest.approx([0.3, 0.4, 0.7, 0.8])


def test_ps_grpo_draws_are_seeded_by_step_and_row():
    texts = ["a b", "a c", "b c", "a b c", "c a", "b a", "a", "c b a"]
    kw = dict(rewards=torch.zeros(8), prompt_uids=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]),
              batch=batch(texts, paraphrase_group=["q"] * 8), paraphrase_similarity="bleu",
              paraphrase_bleu_order=1, paraphrase_sample_paraphrases=1, paraphrase_sample_rollouts=1)
    a, b = tr("paraphrase_consistency", step=3, **kw), tr("paraphrase_consistency", step=3, **kw)
    assert torch.equal(a, b)  # the dynamic-sampling filter and the advantages see the same value
    assert any(not torch.equal(a, tr("paraphrase_consistency", step=s, **kw)) for s in range(4, 9))


# ---------------------------------------------------------------- entropy helpfulness and stability (000-30)

def test_information_consistency_hand_computed():
    texts = ["a a", "a b c", "a b", "x y", "x y", "p q r s t"]
    uids = torch.tensor([1, 1, 2, 3, 4, 4])
    sets = ["A", "A", "A", "B", "B", "B"]
    r = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, NAN])
    out = tr("information_consistency", rewards=r, prompt_uids=uids, batch=batch(texts, paraphrase_group=sets))
    l2, l3 = math.log(2), math.log(3)
    assert word_entropy("a a") == 0.0 and word_entropy("a b c") == pytest.approx(l3)
    # H = [0, ln 3, ln 2, ln 2, ln 2, (ln 5, NaN row: left out)] -> H_min 0, H_max ln 3: H_norm = H / ln 3
    helpful = [0.0, 1.0, l2 / l3, l2 / l3, l2 / l3]
    # set A cross-wording gaps: (0, 2) = ln 2, (1, 2) = ln 3 - ln 2; MAX_GAP = ln 2
    # F0 = 1 - ln2/ln2 = 0; F1 = 1 - (ln3 - ln2)/ln2; F2 = 1 - ((ln2 + ln3 - ln2) / 2) / ln2
    # set B: rows 3, 4 have equal entropies -> MAX_GAP 0 -> F = 1
    stable = [0.0, 1 - (l3 - l2) / l2, 1 - (l3 / 2) / l2, 1.0, 1.0]
    expected = [0.5 * h + 0.5 * f for h, f in zip(helpful, stable)] + [NAN]
    assert close(out, expected)


# ---------------------------------------------------------------- free-form task: consistency is not correctness

def _fact_rows(group="capital:France"):
    task = get_task("fact_paraphrase")
    rows = [r for r in task.train_rows + task.eval_rows if r["paraphrase_group"] == group]
    assert len(rows) == 4 and len({r["prompt"][1]["content"] for r in rows}) == 4  # 4 distinct wordings
    return task, rows


def _score(task, rows, completions):
    cols = {k: [r[k] for r in rows] for k in ("answers", "reference", "paraphrase_group")}
    rewards = {name: fn(prompts=None, completions=completions, **cols) for name, fn, _ in task.rewards}
    uids = torch.arange(len(rows))
    b = batch(completions, **cols)
    cons = tr("paraphrase_consistency", rewards=torch.zeros(len(rows)), prompt_uids=uids, batch=b,
              paraphrase_similarity="bleu", paraphrase_weight=1.0)
    stab = tr("information_consistency", rewards=torch.zeros(len(rows)), prompt_uids=uids, batch=b,
              info_helpfulness_weight=0.0, info_stability_weight=1.0)
    return rewards, cons, stab


def test_consistently_wrong_is_consistent_and_wrong():
    task, rows = _fact_rows()
    wrong = ["The capital of France is Rome."] * 4
    varied = ["Paris.", "It is Paris, of course.", "The capital city of France is Paris.", "Paris, I think."]
    rw, cons_w, stab_w = _score(task, rows, wrong)
    rv, cons_v, stab_v = _score(task, rows, varied)
    assert rw["accuracy"] == [0.0] * 4 and rv["accuracy"] == [1.0] * 4  # the fact check
    # identical replies: BLEU 1 with every other wording's reply, equal entropies -> stability 1
    assert close(cons_w, [1.0] * 4) and close(stab_w, [1.0] * 4)
    assert float(cons_v.mean()) < 0.5 and float(stab_v.mean()) < 1.0


def test_fact_task_rows_and_split():
    task = get_task("fact_paraphrase")
    assert task.accuracy_reward == "accuracy" and [n for n, _, _ in task.rewards] == ["accuracy"]
    assert len(task.train_rows) == 24 * 4 and len(task.eval_rows) == 6 * 4
    train_sets = {r["paraphrase_group"] for r in task.train_rows}
    assert not train_sets & {r["paraphrase_group"] for r in task.eval_rows}
    two = get_task("fact_paraphrase", fact_paraphrases=2)
    assert len(two.train_rows) == 48 and {r["paraphrase_id"] for r in two.train_rows} == {0, 1}
    with pytest.raises(ValueError, match="fact_paraphrases"):
        get_task("fact_paraphrase", fact_paraphrases=5)


# ---------------------------------------------------------------- the recipes: one step each

@pytest.mark.parametrize("recipe", ["consistency_grpo", "ps_grpo"])
def test_recipe_step_groups_and_feedback(tiny_args, recipe):
    """One training step: the groups the advantages and the sampler feedback saw, and the metrics."""
    args = {**recipe_overrides(recipe), **tiny_args, "steps": 1, "task": "fact_paraphrase",
            "max_completion_length": 8}
    t = Trainer(Config.build(args), log=lambda *a: None)
    seen = {}
    feedback = t.sampler.feedback

    def spy(**outcomes):
        seen.update(outcomes)
        return feedback(**outcomes)

    t.sampler.feedback = spy
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # whole sets: no stand-in
        t.train(progress=False)
    gids, uids = seen["group_ids"].tolist(), seen["prompt_uids"].tolist()
    assert len(gids) == 4 * 4  # 4 prompts (one fact's 4 wordings) x 4 completions
    for g in set(gids):
        members = {u for gg, u in zip(gids, uids) if gg == g}
        assert len({t.rows[u]["paraphrase_group"] for u in members}) == 1
        # consistency_grpo: one group per question (all 4 wordings); ps_grpo: one per wording (the paper)
        assert len(members) == (4 if recipe == "consistency_grpo" else 1)
    row = read_metrics(args["out"])[0]
    assert row["skipped"] == 0 and row["frac_zero_std_groups"] is not None
    assert row["rewards/accuracy/mean"] is not None
