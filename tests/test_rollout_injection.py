"""Rollout strategies that inject tokens into completions (rollout/injection.py)."""
import math

import pytest
import torch

from grpolab.batch import INJECTED, SAMPLED
from grpolab.config import Config, ConfigError
from grpolab.rollouts import injection as inj
from grpolab.rollouts.strategies import ROLLOUT_STRATEGIES
from grpolab.train.trainer import Trainer

from _helpers import countdown_trainer

L = 24  # max_completion_length of the shared trainer


@pytest.fixture(scope="module")
def tr(tmp_path_factory):
    """A tiny-model trainer on countdown; its RolloutContext is what strategies receive."""
    # gcpo_reference selects the injection strategies' shared reference template
    return countdown_trainer(tmp_path_factory.mktemp("inj") / "run", "gcpo_reference", L)


def short_rows(tr, n=3):
    """Rows whose reference completion ('Answer: <solution>' + EOS) fits in L tokens (char-level tokenizer)."""
    idx = [i for i, r in enumerate(tr.rows) if len("Answer: " + r["solution"]) <= L - 2][:n]
    return [tr.rows[i] for i in idx], idx


def injected_rows(batch):
    return (batch.token_origin == INJECTED).any(-1).nonzero().squeeze(-1).tolist()


def assert_behaviour_logprobs_exact(tr, batch):
    """Every token's behaviour log-prob is its log-prob under the behaviour policy in its context."""
    forced = tr.ctx.logprobs(batch)
    diff = ((batch.behavior_logprobs - forced) * batch.completion_attention_mask).abs().max()
    assert diff < 1e-4, diff


@pytest.fixture
def plant_success(tr, monkeypatch):
    """Make group 0 succeed: its first sampled row is replaced by the reference answer."""
    orig = tr.ctx.generate

    def generate(rows, uids, **kw):
        b = orig(rows, uids, **kw)
        first = int((b.group_ids == b.group_ids.min()).nonzero()[0])
        good = inj.reference_rows(tr.ctx, [rows[0]], [uids[0]], [int(b.group_ids[first])], train=True,
                                  template="Answer: {solution}")
        return inj.replace_rows(b, [first], good, tr.tok.pad_token_id)

    monkeypatch.setattr(tr.ctx, "generate", generate)


# ----------------------------------------------------------------- shared helper
def test_compose_rows_prefix_is_injected_and_continuation_conditions_on_it(tr):
    rows, uids = short_rows(tr, 2)
    pre = [inj.text_ids(tr.tok, "Answer: (")[:5], inj.text_ids(tr.tok, "Answer")]
    heads = [[inj.Segment(p, INJECTED, train=False)] for p in pre]
    b = inj.compose_rows(tr.ctx, rows, uids, [0, 1], heads)
    assert b.completion_ids.shape[1] <= L
    for i, p in enumerate(pre):
        assert b.completion_ids[i, :len(p)].tolist() == p  # the tokenization of the prefix, as injected
        assert (b.token_origin[i, :len(p)] == INJECTED).all()
        assert (b.token_origin[i, len(p):] == SAMPLED).all()
        assert (b.completion_mask[i, :len(p)] == 0).all()  # train=False: not in the loss ...
        assert (b.completion_attention_mask[i, :len(p)] == 1).all()  # ... but attended to
        n = int(b.completion_attention_mask[i].sum())
        assert n > len(p) and (b.completion_mask[i, len(p):n] == 1).all()
    # the prompt the loss conditions on is the original prompt
    prompts, _ = inj.tokenize_prompts(tr.tok, [r["prompt"] for r in rows], tr.cfg.max_prompt_length)
    assert torch.equal(b.prompt_ids, prompts)
    assert_behaviour_logprobs_exact(tr, b)
    # conditioning: without the prefix the same continuation has other log-probs
    i, p = 0, pre[0]
    n = int(b.completion_attention_mask[i].sum())
    cont = inj.compose_rows(tr.ctx, rows[:1], uids[:1], [0],
                            [[inj.Segment(b.completion_ids[i, len(p):n].tolist(), INJECTED, True)]],
                            continue_=False)
    m = n - len(p)
    assert (cont.behavior_logprobs[0, :m] - b.behavior_logprobs[i, len(p):n]).abs().max() > 1e-3


def test_reference_rows_eos_and_truncation(tr):
    rows, uids = short_rows(tr, 1)
    text = inj.reference_text(rows[0], tr.cfg.injection_reference_template)
    assert text == "Answer: " + rows[0]["solution"]
    ids = inj.text_ids(tr.tok, text)
    b = inj.reference_rows(tr.ctx, rows, uids, [7], train=True, template="Answer: {solution}")
    n = len(ids) + 1  # + EOS
    assert b.completion_ids[0, :n].tolist() == ids + [tr.tok.eos_token_id]
    assert not b.truncated[0] and int(b.completion_attention_mask.sum()) == n
    assert (b.token_origin[0, :n] == INJECTED).all() and (b.completion_mask[0, :n] == 1).all()
    assert int(b.group_ids[0]) == 7 and int(b.prompt_uids[0]) == uids[0]
    assert tr.ctx.score(b)[0] == 1.5  # accuracy 1 + 0.5 * format 1: the task's reward accepts it
    assert_behaviour_logprobs_exact(tr, b)
    tr.cfg.max_completion_length = 5
    try:
        cut = inj.reference_rows(tr.ctx, rows, uids, [0], train=False, template="Answer: {solution}")
    finally:
        tr.cfg.max_completion_length = L
    assert cut.completion_ids.shape[1] == 5 and cut.truncated[0]  # cut to the budget, flagged truncated
    assert cut.completion_ids[0].tolist() == ids[:5] and cut.completion_mask.sum() == 0
    with pytest.raises(ConfigError, match="solution"):
        inj.reference_text({"answer": "3"}, "Answer: {solution}")


def test_replace_rows_keeps_order():
    from grpolab.batch import RolloutBatch

    def mk(vals):
        n = len(vals)
        one = torch.ones(n, 1, dtype=torch.long)
        return RolloutBatch(prompt_ids=one, prompt_mask=one,
                            completion_ids=torch.tensor(vals)[:, None], completion_mask=torch.ones(n, 1),
                            behavior_logprobs=torch.zeros(n, 1), group_ids=torch.zeros(n, dtype=torch.long),
                            prompt_uids=torch.zeros(n, dtype=torch.long), truncated=torch.zeros(n, dtype=torch.bool))
    out = inj.replace_rows(mk([10, 11, 12, 13]), [1, 3], mk([21, 23]), pad_id=0)
    assert out.completion_ids[:, 0].tolist() == [10, 21, 12, 23]


# ------------------------------------------------------------------------ GCPO
def test_gcpo_reference_only_in_all_failed_groups(tr, plant_success):
    rows, uids = short_rows(tr)
    b = inj.gcpo_reference(tr.ctx, rows, uids, 0, success_threshold=1.0)
    scalar = tr.ctx.scalar(b)
    assert b.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4  # replaced, not added
    # group 0 had a success (the planted row 0): nothing injected besides it
    assert injected_rows(b) == [0, 7, 11]  # the last row of each all-failed group
    for g in (1, 2):
        sel = b.group_ids == g
        assert scalar[sel].std() > 0  # the reference makes the group non-zero-variance
        assert scalar[sel][-1] == 1.5 and (scalar[sel][:-1] < 1.0).all()
    assert_behaviour_logprobs_exact(tr, b)


# ---------------------------------------------------------------- DaGRPO anchors
def test_dagrpo_anchors_added_to_groups_without_positive(tr, plant_success):
    rows, uids = short_rows(tr)
    b = inj.dagrpo_anchors(tr.ctx, rows, uids, 0, success_threshold=1.0, dagrpo_num_anchors=2)
    # group 0 keeps its G = 4 rows; groups 1 and 2 grow to 4 + 2 (contiguous)
    assert b.group_ids.tolist() == [0] * 4 + [1] * 6 + [2] * 6
    assert injected_rows(b) == [0, 8, 9, 14, 15]
    scalar = tr.ctx.scalar(b)
    assert (scalar[[8, 9, 14, 15]] == 1.5).all()
    assert b.prompt_uids.tolist() == [uids[0]] * 4 + [uids[1]] * 6 + [uids[2]] * 6
    assert_behaviour_logprobs_exact(tr, b)


# ------------------------------------------------------------------------ G2RPO-A
def test_g2rpo_a_adaptation_hand_computed():
    c = inj.G2RPOAdaptiveGuidance(g2rpo_a_initial_length=8, g2rpo_a_max_length=64, g2rpo_a_window=2)
    assert [c.observe(0.5), c.observe(0.3)] == [8, 8]  # collecting the window
    assert c.observe(0.2) == 16  # r_bar = 0.4 > 0.2: worse -> int(8 * 0.4 / 0.2) = 16 (more guidance)
    assert c.history == []  # a new window starts
    assert [c.observe(0.6), c.observe(0.6)] == [16, 16]
    assert c.observe(0.9) == 10  # r_bar = 0.6 < 0.9: better -> int(16 * 0.6 / 0.9) = int(10.67) = 10
    c.observe(0.5), c.observe(0.5)
    assert c.observe(0.5) == 10  # equal: unchanged
    c.observe(0.4), c.observe(0.4)
    assert c.observe(0.0) == 10  # zero reward: unchanged (the ratio is undefined)
    capped = inj.G2RPOAdaptiveGuidance(g2rpo_a_initial_length=8, g2rpo_a_max_length=12, g2rpo_a_window=1)
    capped.observe(0.5)
    assert capped.observe(0.1) == 12  # int(8 * 5) = 40, capped at 12
    floor = inj.G2RPOAdaptiveGuidance(g2rpo_a_initial_length=2, g2rpo_a_window=1)
    floor.observe(0.1)
    assert floor.observe(1.0) == 1  # int(2 * 0.1) = 0, floored at 1


def test_g2rpo_a_restores_exactly():
    seq = [0.2, 0.4, 0.1, 0.3, 0.3, 0.6, 0.2, 0.05, 0.5, 0.5, 0.25]
    a = inj.G2RPOAdaptiveGuidance(g2rpo_a_initial_length=6, g2rpo_a_window=3)
    for r in seq[:5]:
        a.observe(r)
    b = inj.G2RPOAdaptiveGuidance(g2rpo_a_initial_length=99, g2rpo_a_window=3)
    b.load_state_dict(a.state_dict())
    out_a = [a.observe(r) for r in seq[5:]]
    assert out_a == [b.observe(r) for r in seq[5:]] and a.state_dict() == b.state_dict()
    assert len(set(out_a)) > 1  # the continuation really adapts (not a constant)


def test_g2rpo_a_rollout_prefix_guidance(tr):
    rows, uids = short_rows(tr)
    s = inj.G2RPOAdaptiveGuidance(g2rpo_a_guided_rows=2, g2rpo_a_initial_length=5, g2rpo_a_window=2)
    b = s(tr.ctx, rows, uids, 3)
    assert b.group_ids.tolist() == [3] * 4 + [4] * 4 + [5] * 4
    guided = injected_rows(b)
    assert len(guided) == 6
    for i in guided:
        g = int(b.group_ids[i]) - 3
        ref = inj.text_ids(tr.tok, "Answer: " + rows[g]["solution"])[:5]
        assert b.completion_ids[i, :5].tolist() == ref
        assert (b.token_origin[i, :5] == INJECTED).all() and (b.token_origin[i, 5:] == SAMPLED).all()
        assert (b.completion_mask[i, :5] == 1).all()  # guidance is trained on (authors' code)
    assert b.rewards is not None and s.history and len(s.history) == 1  # scored itself, fed the controller
    assert_behaviour_logprobs_exact(tr, b)  # continuation sampled conditioned on the guidance


# ------------------------------------------------------------------------- EditGRPO
def test_edit_sentences_follows_the_authors_operation_priority():
    # authors (taokz/EditGRPO, process_text_with_server_analysis): per operation try replace (a wrong sentence by
    # its most similar reference sentence, similarity >= tau), else delete a wrong sentence, else add a missing one
    ref = "Answer: (7 - 3) * 5"
    att = "Let me think. Answer: 7 - 3 * 5"
    # "Answer: 7 - 3 * 5" vs the reference: difflib ratio 2 * 17 / (17 + 19) = .944 >= .6 -> replaced
    assert inj.sentence_similarity("Answer: 7 - 3 * 5", ref) == pytest.approx(2 * 17 / 36)
    assert inj.edit_sentences(att, ref, 1, 0.6) == "Let me think. Answer: (7 - 3) * 5"
    # threshold above every similarity: no replacement, the first wrong sentence is deleted
    assert inj.edit_sentences(att, ref, 1, 0.99) == " Answer: 7 - 3 * 5"
    # two operations: replace, then delete the remaining wrong sentence
    assert inj.edit_sentences(att, ref, 2, 0.6) == " Answer: (7 - 3) * 5"
    # nothing wrong, something missing: add it
    assert inj.edit_sentences("Step one.", "Step one. Answer: 5", 1, 0.6) == "Step one. Answer: 5"
    # a text emptied by the deletion gets a missing sentence (the authors' empty-paragraph fallback)
    assert inj.edit_sentences("zzz", "Answer: 5", 1, 0.6) == "Answer: 5"
    assert inj.edit_sentences("Answer: 5", "Answer: 5", 1, 0.6) == "Answer: 5"  # nothing to edit
    assert inj.split_sentences("a. b!\nc") == ["a.", " b!\n", "c"]


def test_editgrpo_edited_copies_replace_other_rollouts(tr):
    rows, uids = short_rows(tr)
    b = inj.editgrpo(tr.ctx, rows, uids, 0, editgrpo_edit_fraction=0.5, editgrpo_num_ops=1,
                     editgrpo_similarity_threshold=0.6)
    edited = injected_rows(b)
    for g in range(3):
        members = (b.group_ids == g).nonzero().squeeze(-1).tolist()
        mine = [i for i in members if i in edited]
        assert len(mine) <= 2 and len(members) == 4  # G/2 = 2 targets at most; the group keeps G rows
        plain = [i for i in members if i not in edited]
        texts = []
        for i in plain:
            n = int(b.completion_attention_mask[i].sum())
            ids = [t for t in b.completion_ids[i, :n].tolist() if t != tr.tok.eos_token_id]
            texts.append(tr.tok.decode(ids, skip_special_tokens=True))
        ref = "Answer: " + rows[g]["solution"]
        candidates = {inj.edit_sentences(t, ref, 1, 0.6) for t in texts}
        for i in mine:
            n = int(b.completion_attention_mask[i].sum())
            assert int(b.completion_ids[i, n - 1]) == tr.tok.eos_token_id
            got = tr.tok.decode(b.completion_ids[i, :n - 1].tolist(), skip_special_tokens=True)
            assert got in candidates  # the edited copy of one of the rollouts kept in the group
    assert edited  # the tiny model's text is all wrong: every edit changes it
    assert_behaviour_logprobs_exact(tr, b)


# ----------------------------------------------------------------------- ThinkTuning
def test_thinktuning_feedback_masked_and_student_continues(tr):
    rows, uids = short_rows(tr)
    s = inj.ThinkTuning(thinktuning_teacher="frozen", thinktuning_fraction=0.25, thinktuning_feedback_tokens=4)
    b = s(tr.ctx, rows, uids, 0)
    teacher = s.teacher(tr.ctx)[0]
    assert teacher is not tr.model and s.teacher(tr.ctx)[0] is teacher  # copied once
    guided = injected_rows(b)
    assert sorted(int(b.group_ids[i]) for i in guided) == [0, 1, 2]  # ceil(0.25 * 4) = 1 per group
    for i in guided:
        o = b.token_origin[i][b.completion_attention_mask[i].bool()]
        pos = (o == INJECTED).nonzero().squeeze(-1)
        first, last = int(pos[0]), int(pos[-1])
        assert (o[first:last + 1] == INJECTED).all()  # one block of feedback ...
        assert (b.completion_mask[i, first:last + 1] == 0).all()  # ... left out of the loss
        assert (o[:first] == SAMPLED).all() and first <= L // 2  # the attempt, capped at L // 2
        assert (o[last + 1:] == SAMPLED).all()  # the student's continuation (maybe empty if budget spent)
        assert int(b.completion_mask[i, last + 1:].sum()) == len(o) - last - 1
    assert_behaviour_logprobs_exact(tr, b)
    assert "Reference answer: Answer: " + rows[0]["solution"] in s.critique(rows[0], "xyz")


# --------------------------------------------------------------------------- EDGE
def test_edge_correction_only_failed(tr, plant_success):
    rows, uids = short_rows(tr)
    b = inj.edge_correction(tr.ctx, rows, uids, 0, success_threshold=1.0, edge_gec_only_all_failed=True)
    fixed = injected_rows(b)
    assert fixed[0] == 0 and all(i >= 4 for i in fixed[1:])  # group 0 had a success: only the planted row
    assert len(fixed) == 9  # every (failed) row of groups 1 and 2
    assert_behaviour_logprobs_exact(tr, b)
    b = inj.edge_correction(tr.ctx, rows, uids, 0, success_threshold=1.0)
    assert injected_rows(b) == list(range(12))  # now the failed rows of group 0 too


# ------------------------------------------------------------------- end to end
@pytest.mark.parametrize("strategy", ["gcpo_reference", "dagrpo_anchors", "g2rpo_a", "editgrpo", "thinktuning",
                                      "edge_correction"])
def test_trainer_runs_each_strategy(tiny_args, strategy):
    args = {**tiny_args, "task": "countdown", "rollout_strategy": strategy, "steps": 1, "prompts_per_step": 2,
            "max_completion_length": 16}
    t = Trainer(Config.build(args), log=lambda *a: None)
    seen = []
    orig = t.rollout

    def rollout(*a, **k):  # keep the batch and its log-probs under the behaviour policy of that moment
        batch = orig(*a, **k)
        seen.append((batch, t.ctx.logprobs(batch)))
        return batch

    t.rollout = rollout
    metrics = t.train_step()
    b, forced = seen[0]
    assert strategy in ROLLOUT_STRATEGIES and b.rewards is not None
    scalar = t.scorer.scalar(b, step=t.step)
    rows = injected_rows(b)
    assert rows  # the tiny model fails, so every strategy injects something
    if strategy in ("gcpo_reference", "dagrpo_anchors"):  # injected only into groups with no success
        for g in {int(b.group_ids[i]) for i in rows}:
            sel = (b.group_ids == g) & ~(b.token_origin == INJECTED).any(-1)
            assert (scalar[sel] < 1.0).all()
    assert ((b.behavior_logprobs - forced) * b.completion_attention_mask).abs().max() < 1e-4
    if strategy == "g2rpo_a":
        state = t.components["rollout/g2rpo_a"].fn.state_dict()
        assert state["history"] and state["length"] == 8
    assert math.isfinite(metrics["loss"]) and metrics["skipped"] == 0


def test_check_config_rejects_bad_settings(tiny_args):
    with pytest.raises(ConfigError, match="g2rpo_a_guided_rows"):
        Config.build({**tiny_args, "rollout_strategy": "g2rpo_a", "g2rpo_a_guided_rows": 4})
    with pytest.raises(ConfigError, match="thinktuning_teacher"):
        Config.build({**tiny_args, "rollout_strategy": "thinktuning", "thinktuning_teacher": "/nonexistent"})
    with pytest.raises(ConfigError, match="editgrpo_edit_fraction"):
        Config.build({**tiny_args, "rollout_strategy": "editgrpo", "editgrpo_edit_fraction": 1.5})


def test_edge_correction_draw_and_edits_as_the_authors_gec(tiny_args, monkeypatch):
    """Authors (ZhangXJ199/EDGE-GRPO, trl_edge/trainer/grpo_aha_trainer.py, GEC): every failed rollout gets
    ``random.choice([reflection, "give_answer_directly"])`` and, in the second case, ``random.choice([give_answer,
    solution])``: P = 1/2 reflection (attempt + " Wait! Something is wrong here.", then the model continues), 1/4
    answer (attempt + "\\nWait! ... the correct answer is" + reference, no continuation), 1/4 solution (the
    reference alone). The two uniform draws per failed row are fixed here and the edit is read off the tree."""
    args = {**tiny_args, "task": "countdown", "rollout_strategy": "edge_correction", "steps": 1,
            "prompts_per_step": 1, "num_generations": 4, "max_completion_length": 200}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.ctx.new_step()
    rows, uids = short_rows(t, 1)
    tree = [(0.1, 0.9), (0.7, 0.2), (0.7, 0.6), (0.49, 0.1)]  # reflection, answer, solution, reflection

    def authors_choice(u1, u2):  # random.choice over two items: the first when u < 1/2
        return "reflection" if u1 < 0.5 else ("answer" if u2 < 0.5 else "solution")

    orig_rand, orig_gen, seen = torch.rand, t.ctx.generate, []

    def rand(*size, **kw):
        if len(size) == 2 and size[1] == 2:
            return torch.tensor([tree[j % len(tree)] for j in range(size[0])])
        return orig_rand(*size, **kw)

    def generate(*a, **k):
        seen.append(orig_gen(*a, **k))
        return seen[-1]

    monkeypatch.setattr(torch, "rand", rand)
    monkeypatch.setattr(t.ctx, "generate", generate)
    b = inj.edge_correction(t.ctx, rows, uids, 0, success_threshold=1.0)
    monkeypatch.undo()
    plain = seen[0]
    fixed = injected_rows(b)
    assert fixed == list(range(4))  # the tiny model fails every row
    enc = lambda text: inj.text_ids(t.tok, text)  # noqa: E731  (the char-level tokenizer drops unknown characters)
    eos = t.tok.eos_token_id
    counts = {"reflection": 0, "answer": 0, "solution": 0}
    for j, i in enumerate(fixed):
        kind = authors_choice(*tree[j % len(tree)])
        counts[kind] += 1
        n = int(b.completion_attention_mask[i].sum())
        ids, origin = b.completion_ids[i, :n].tolist(), b.token_origin[i, :n]
        inj_pos = (origin == INJECTED).nonzero().squeeze(-1).tolist()
        ref = "Answer: " + rows[i // 4]["solution"]
        n0 = int(plain.completion_attention_mask[i].sum())
        attempt = [x for x in plain.completion_ids[i, :n0].tolist() if x != eos][:100]  # half the budget
        if kind == "solution":
            assert inj_pos == list(range(n)) and ids == enc(ref) + [eos]
        elif kind == "answer":
            k = len(attempt)
            assert ids[:k] == attempt and (origin[:k] == SAMPLED).all() and inj_pos == list(range(k, n))
            assert ids[k:] == enc("\nWait! Something is wrong here. After verification, the correct answer is:\n"
                                  + ref) + [eos]
        else:
            k = len(attempt)
            assert ids[:k] == attempt and ids[inj_pos[0]:inj_pos[-1] + 1] == enc(" Wait! Something is wrong here.")
            assert inj_pos == list(range(k, k + len(inj_pos)))
            assert (origin[inj_pos[-1] + 1:] == SAMPLED).all()  # the model's own continuation (when room is left)
    assert counts == {"reflection": 2, "answer": 1, "solution": 1}  # 1/2, 1/4, 1/4 of the draws
