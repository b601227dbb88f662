"""The turn primitive (generation/turns.py): continue token ids, stops, episodes, the engine route."""
import sys

import pytest
import torch

from grpolab.batch import ENVIRONMENT, INJECTED, SAMPLED
from grpolab.config import Config
from grpolab.data import model_texts
from grpolab.generation.plain import eos_token_ids
from grpolab.generation.sampling import sample_completions
from grpolab.generation.turns import Episode, continue_sequences, pack_episodes
from grpolab.model.loading import load_policy, save_policy
from grpolab.model.logprobs import completion_logprobs
from grpolab.tasks import get_task

from test_vllm_engine import SHIFT, fake_vllm_module

TEMP = 0.7


@pytest.fixture(scope="module")
def tiny():
    t = get_task("repeat")
    model, tok = load_policy("tiny", task_texts=model_texts(t.train_rows + t.eval_rows), seed=0,
                             log=lambda *a: None)
    return model.eval(), tok


def ids_of(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ (a) two turns
def test_two_turn_episode_logprobs_match_a_plain_forward(tiny):
    """Model turn, a fixed ENVIRONMENT observation (loss mask 0), second model turn; spans 1/2/3; the
    behaviour log-probs recorded while sampling equal a plain forward of the whole packed sequence."""
    model, tok = tiny
    prompts = ["say 6:", "say 12:", "say 345:"]  # different lengths: rows are left-padded
    eps = [Episode(ids_of(tok, p)) for p in prompts]
    g = gen(3)
    first = continue_sequences(model, tok, [e.context() for e in eps], max_new_tokens=[5, 3, 4],
                               temperature=TEMP, generator=g, eos_ids=[])
    obs = ids_of(tok, " 42: ")
    for e, ids, lp, r in zip(eps, first.ids, first.logprobs, first.finish_reasons):
        e.add_model_turn(ids, lp, finish_reason=r)
        e.add_observation(obs)
    second = continue_sequences(model, tok, [e.context() for e in eps], max_new_tokens=6, temperature=TEMP,
                                generator=g)
    for e, ids, lp, r in zip(eps, second.ids, second.logprobs, second.finish_reasons):
        e.add_model_turn(ids, lp, finish_reason=r)
    assert [len(a) for a in first.ids] == [5, 3, 4] and first.finish_reasons == ["length"] * 3
    rows = [{"prompt": p, "digit": p[4:-1]} for p in prompts]
    batch = pack_episodes(tok, eps, rows, uids=[10, 11, 12], group_ids=[0, 0, 1])
    assert batch.columns["digit"] == ["6", "12", "345"] and batch.prompt_uids.tolist() == [10, 11, 12]
    for i, e in enumerate(eps):
        n1, n2 = len(first.ids[i]), len(second.ids[i])
        no = len(obs)
        n = n1 + no + n2
        assert batch.completion_ids[i, :n].tolist() == first.ids[i] + obs + second.ids[i]
        assert batch.span_ids[i, :n].tolist() == [1] * n1 + [2] * no + [3] * n2
        assert batch.token_origin[i, :n].tolist() == [SAMPLED] * n1 + [ENVIRONMENT] * no + [SAMPLED] * n2
        assert batch.completion_mask[i, :n].tolist() == [1.0] * n1 + [0.0] * no + [1.0] * n2
        assert batch.completion_attention_mask[i, :n].tolist() == [1] * n
        assert (batch.behavior_logprobs[i, n1:n1 + no] == 0).all()
        assert (batch.completion_attention_mask[i, n:] == 0).all() and (batch.span_ids[i, n:] == 0).all()
        assert bool(batch.truncated[i]) == (second.finish_reasons[i] == "length")
        prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
        assert prompt == ids_of(tok, prompts[i])
    assert model.dtype == torch.float32
    forced, _ = completion_logprobs(model, batch, TEMP, shared_prefix=False)
    sampled = (batch.token_origin == SAMPLED) & (batch.completion_attention_mask > 0)
    diff = (forced - batch.behavior_logprobs).abs()[sampled].max()
    assert diff < 1e-5, diff
    # the second turn really conditions on the observation: without it its tokens have other log-probs
    alt = [Episode(ids_of(tok, p)) for p in prompts]
    for a, ids, lp, ids2 in zip(alt, first.ids, first.logprobs, second.ids):
        a.add_model_turn(ids + ids2, [0.0] * (len(ids) + len(ids2)))
    ab = pack_episodes(tok, alt, rows, uids=[0, 1, 2], group_ids=[0, 1, 2])
    other, _ = completion_logprobs(model, ab, TEMP, shared_prefix=False)
    i, n1 = 0, len(first.ids[0])
    n2 = len(second.ids[0])
    assert (other[i, n1:n1 + n2] - batch.behavior_logprobs[i, n1 + len(obs):n1 + len(obs) + n2]).abs().max() > 1e-3


# ------------------------------------------------------------------ (b) stops
def _reference(model, tok, context, seed, n=40):
    """One row sampled without any stop (EOS excluded): ids, log-probs."""
    out = continue_sequences(model, tok, [context], max_new_tokens=n, temperature=TEMP, generator=gen(seed),
                             eos_ids=[])
    return out.ids[0], out.logprobs[0]


def test_stop_token_ids_and_stop_strings_stop_exactly_there(tiny):
    model, tok = tiny
    context = ids_of(tok, "say 7:")
    ref, ref_lp = _reference(model, tok, context, seed=5)
    assert len(ref) == 40
    # a stop token id: the row ends at its first occurrence (after position 2), the token kept
    k = next(j for j in range(2, len(ref)) if ref[j] not in ref[:j])
    out = continue_sequences(model, tok, [context], max_new_tokens=40, temperature=TEMP, generator=gen(5),
                             eos_ids=[], stop_token_ids=[ref[k]])
    assert out.ids[0] == ref[:k + 1] and out.finish_reasons == ["stop_token"]
    assert out.logprobs[0] == pytest.approx(ref_lp[:k + 1], abs=1e-6)
    # the same token given as an EOS id: same stop, reason eos
    out = continue_sequences(model, tok, [context], max_new_tokens=40, temperature=TEMP, generator=gen(5),
                             eos_ids=[ref[k]])
    assert out.ids[0] == ref[:k + 1] and out.finish_reasons == ["eos"]
    # a stop string of two characters: the row ends at the token that completes it (kept)
    text = [tok.decode(ref[:j + 1], skip_special_tokens=True) for j in range(len(ref))]
    s = next(text[j][-2:] for j in range(3, len(ref)) if len(text[j]) >= 2 and text[j][-2:] not in text[j - 1]
             and len(text[j]) > len(text[j - 1]))
    end = next(j for j in range(len(ref)) if s in text[j])
    out = continue_sequences(model, tok, [context], max_new_tokens=40, temperature=TEMP, generator=gen(5),
                             eos_ids=[], stop_strings=["never-there", s])
    assert out.ids[0] == ref[:end + 1] and out.finish_reasons == ["stop_string"]
    got = tok.decode(out.ids[0], skip_special_tokens=True)
    assert got.endswith(s) and s not in tok.decode(out.ids[0][:-1], skip_special_tokens=True)
    # a limit before the stop: cut there, reason length
    out = continue_sequences(model, tok, [context], max_new_tokens=end, temperature=TEMP, generator=gen(5),
                             eos_ids=[], stop_strings=[s])
    assert out.ids[0] == ref[:end] and out.finish_reasons == ["length"]


def test_stops_in_a_batch_end_each_row_at_its_own_stop(tiny):
    """Greedy rows (no randomness, so each row's reference is exact in any batch) stop on their own."""
    model, tok = tiny
    contexts = [ids_of(tok, p) for p in ("say 1:", "say 23:", "say 456:")]
    refs = [continue_sequences(model, tok, [c], max_new_tokens=20, temperature=0, eos_ids=[]).ids[0]
            for c in contexts]
    stop_tok = refs[0][3]
    out = continue_sequences(model, tok, contexts, max_new_tokens=20, temperature=0, eos_ids=[],
                             stop_token_ids=[stop_tok])
    for r, ids, reason in zip(refs, out.ids, out.finish_reasons):
        want = r[:r.index(stop_tok) + 1] if stop_tok in r else r
        assert ids == want and reason == ("stop_token" if stop_tok in r else "length")
    assert out.ids[0] == refs[0][:refs[0].index(stop_tok) + 1]


# ------------------------------------------------------------------ (c) partial sequences
def test_continuing_partially_finished_sequences_of_different_lengths(tiny):
    model, tok = tiny
    prompts = [ids_of(tok, p) for p in ("say 1:", "say 23:", "say 456:")]
    full = [continue_sequences(model, tok, [p], max_new_tokens=12, temperature=0, eos_ids=[]).ids[0]
            for p in prompts]
    cut = [2, 7, 0]  # tokens already generated per row (row 2 starts from its prompt)
    contexts = [p + f[:k] for p, f, k in zip(prompts, full, cut)]
    out = continue_sequences(model, tok, contexts, max_new_tokens=[12 - k for k in cut], temperature=0,
                             eos_ids=[])
    for f, k, ids, r in zip(full, cut, out.ids, out.finish_reasons):
        assert ids == f[k:] and r == "length"  # greedy: the continuation is the rest of the full sequence
    # sampled, per-row limits: each row's behaviour log-probs are those of its own context
    out = continue_sequences(model, tok, contexts, max_new_tokens=[3, 5, 4], temperature=TEMP, generator=gen(1),
                             eos_ids=[])
    assert [len(a) for a in out.ids] == [3, 5, 4] and out.finish_reasons == ["length"] * 3
    eps = []
    for p, f, k, ids, lp in zip(prompts, full, cut, out.ids, out.logprobs):
        e = Episode(p)
        e.add_model_turn(f[:k], [0.0] * k)
        e.add_model_turn(ids, lp)
        eps.append(e)
    batch = pack_episodes(tok, eps, [{"prompt": "x"}] * 3, [0, 1, 2], [0, 1, 2])
    forced, _ = completion_logprobs(model, batch, TEMP, shared_prefix=False)
    for i, (k, ids) in enumerate(zip(cut, out.ids)):
        assert (forced[i, k:k + len(ids)] - batch.behavior_logprobs[i, k:k + len(ids)]).abs().max() < 1e-5
        assert batch.span_ids[i, k:k + len(ids)].tolist() == [2] * len(ids)
    # the random stream is that of one sample_completions call of the largest budget (rows cut afterwards)
    width = max(len(c) for c in contexts)
    ids = torch.zeros((3, width), dtype=torch.long)
    mask = torch.zeros((3, width), dtype=torch.long)
    for j, c in enumerate(contexts):
        ids[j, width - len(c):] = torch.tensor(c)
        mask[j, width - len(c):] = 1
    direct = sample_completions(model, ids, mask, num_samples=1, max_new_tokens=5,
                                eos_ids=eos_token_ids(tok, model), pad_id=tok.pad_token_id, temperature=TEMP,
                                generator=gen(1))
    again = continue_sequences(model, tok, contexts, max_new_tokens=[3, 5, 4], temperature=TEMP, generator=gen(1))
    for j, a in enumerate(again.ids):
        n = min(int(direct.lengths[j]), [3, 5, 4][j])
        assert a == direct.completion_ids[j, :n].tolist()
    with pytest.raises(ValueError, match="at least one token"):
        continue_sequences(model, tok, [[]], max_new_tokens=2)
    empty = continue_sequences(model, tok, contexts, max_new_tokens=0)
    assert empty.ids == [[], [], []] and empty.finish_reasons == ["length"] * 3


def test_injected_segments_are_teacher_forced_at_packing(tiny):
    from grpolab.generation.turns import Segment
    model, tok = tiny
    e = Episode(ids_of(tok, "say 8:")).add(Segment(ids_of(tok, "8 8"), INJECTED, True))
    with pytest.raises(ValueError, match="logprobs_fn"):
        pack_episodes(tok, [e], [{"prompt": "say 8:"}], [0], [0])
    b = pack_episodes(tok, [e], [{"prompt": "say 8:"}], [0], [0],
                      logprobs_fn=lambda batch: completion_logprobs(model, batch, 1.0)[0])
    assert (b.behavior_logprobs[0, :3] < 0).all() and b.token_origin[0, :3].tolist() == [INJECTED] * 3


# ------------------------------------------------------------------ (d) the engine route
@pytest.fixture
def engine(tiny, tmp_path, monkeypatch):
    fake = fake_vllm_module()
    monkeypatch.setitem(sys.modules, "vllm", fake)
    model, tok = tiny
    save_policy(model, tok, tmp_path / "model")
    from grpolab.generation.vllm_engine import VLLMEngine
    return VLLMEngine(str(tmp_path / "model"))


def test_engine_route_passes_stops_and_maps_finish_reasons(tiny, engine):
    model, tok = tiny
    contexts = [ids_of(tok, "say 7:"), ids_of(tok, "say 89:")]
    eos = eos_token_ids(tok, model)
    native = continue_sequences(model, tok, contexts[:1], max_new_tokens=30, temperature=TEMP,
                                generator=gen(0), eos_ids=[])
    stop_tok = native.ids[0][2]
    g = gen(4)
    out = continue_sequences(model, tok, contexts, max_new_tokens=[6, 3], temperature=[TEMP, 1.0], generator=g,
                             stop_token_ids=[stop_tok], stop_strings=["7 7"], engine=engine)
    params = engine.llm.params
    assert out.from_engine and len(out.ids) == 2
    assert [p.max_tokens for p in params] == [6, 3] and [p.temperature for p in params] == [TEMP, 1.0]
    assert all(p.stop == ["7 7"] and p.stop_token_ids == [stop_tok] and p.include_stop_str_in_output
               and p.n == 1 for p in params)
    seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=gen(4)))
    assert [p.seed for p in params] == [seed, seed + 1]
    for ids, lp, r, m in zip(out.ids, out.logprobs, out.finish_reasons, [6, 3]):
        assert len(ids) == len(lp) <= m
        want = ("eos" if ids[-1] in eos else "stop_token" if ids[-1] == stop_tok
                else "stop_string" if "7 7" in tok.decode(ids, skip_special_tokens=True) else "length")
        assert r == want
        assert r != "length" or len(ids) == m
    # the engine's log-probs are reported as they are (SHIFT below the trainer's)
    e = Episode(contexts[0]).add_model_turn(out.ids[0], out.logprobs[0])
    b = pack_episodes(tok, [e], [{"prompt": "say 7:"}], [0], [0])
    forced, _ = completion_logprobs(model, b, TEMP, shared_prefix=False)
    n = len(out.ids[0])
    assert (forced[0, :n] - b.behavior_logprobs[0, :n] - SHIFT).abs().max() < 1e-4
    # a stop token the engine reports as its stop_reason is a stop_token; a string, a stop_string
    out = continue_sequences(model, tok, contexts[:1], max_new_tokens=30, temperature=TEMP, generator=gen(7),
                             stop_token_ids=[stop_tok], eos_ids=[], engine=engine)
    assert out.finish_reasons[0] in ("stop_token", "length", "eos")
    assert (out.finish_reasons[0] == "stop_token") == (stop_tok in out.ids[0])


def test_context_continuation_goes_through_the_engine(tiny_args, tmp_path, monkeypatch):
    """With generation_engine: vllm the injection strategies' continuation is the engine's: its tokens get
    the trainer's behaviour log-probs and the truncated importance weight, like plain engine rows."""
    from grpolab.batch import INJECTED as INJ
    from grpolab.rollouts import injection as inj
    from grpolab.train.trainer import Trainer

    fake = fake_vllm_module()
    monkeypatch.setitem(sys.modules, "vllm", fake)
    init = Trainer(Config.build(tiny_args, {"out": str(tmp_path / "init")}), log=lambda *a: None)
    save_policy(init.model, init.tok, tmp_path / "model")
    cfg = Config.build(tiny_args, {"model": str(tmp_path / "model"), "generation_engine": "vllm",
                                   "vllm_is_cap": 2.0, "out": str(tmp_path / "run"), "max_completion_length": 8})
    tr = Trainer(cfg, log=lambda *a: None)
    tr.model.eval()
    tr.ctx.new_step()
    rows = tr.rows[:2]
    heads = [[inj.Segment(inj.text_ids(tr.tok, "1"), INJ, False)] for _ in rows]
    calls = []
    orig = tr.engine.continue_
    monkeypatch.setattr(tr.engine, "continue_", lambda *a, **k: calls.append(k) or orig(*a, **k))
    b = inj.compose_rows(tr.ctx, rows, [0, 1], [0, 1], heads)
    assert len(calls) == 1 and calls[0]["max_tokens"] == [7, 7]
    cont = (b.token_origin == SAMPLED) & (b.completion_attention_mask > 0)
    assert cont.any()
    own = tr.ctx.logprobs(b)
    assert torch.allclose(b.behavior_logprobs, own, atol=1e-5)
    w = b.token_weights
    assert torch.allclose(w[cont], torch.full_like(w[cont], float(torch.exp(torch.tensor(SHIFT)))), atol=1e-4)
    assert (w[~cont] == 1).all()
