"""RolloutBatch invariants, the sampler's log-probs and the shared-prefix forward."""
import pytest
import torch

from grpolab.batch import INJECTED, SAMPLED, RolloutBatch
from grpolab.model.loading import build_tiny
from grpolab.model.logprobs import completion_logprobs
from grpolab.generation.plain import plain_rollout

TEXTS = ["say 1:", "say 2:", "abc def = + - 0123456789"]


def _batch(arch="llama", dtype=torch.float32, seed=0):
    model, tok = build_tiny(TEXTS, arch=arch, seed=seed)
    model = model.to(dtype)
    rows = [{"prompt": "say 1:", "digit": "1"}, {"prompt": "a", "digit": "2"}, {"prompt": "abc def = 3", "digit": "3"}]
    g = torch.Generator().manual_seed(seed)
    batch = plain_rollout(model, tok, rows, [10, 11, 12], num_generations=3, max_completion_length=8,
                          max_prompt_length=64, temperature=1.0, generator=g)
    return model, tok, batch


def _assert_shared_prefix_matches_plain(model, b):
    """The shared-prefix forward of ``b`` (temperature 0.9) gives the plain forward's log-probs within 1e-10 on
    the completion mask and its parameter gradients within 1e-6 of the largest (float64 model)."""
    params = list(model.parameters())
    lp1, _ = completion_logprobs(model, b, 0.9, shared_prefix=False)
    lp2, _ = completion_logprobs(model, b, 0.9, shared_prefix=True)
    m = b.completion_mask
    assert torch.allclose(lp1 * m, lp2 * m, atol=1e-10)
    g1 = torch.autograd.grad((lp1 * m).sum(), params)
    g2 = torch.autograd.grad((lp2 * m).sum(), params)
    scale = max(float(g.abs().max()) for g in g1)
    for a, c in zip(g1, g2):
        assert float((a - c).abs().max()) <= 1e-6 * scale


def test_rollout_batch_fields_and_ids():
    _, _, b = _batch()
    assert b.num_rows == 9
    assert b.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert b.prompt_uids.tolist() == [10] * 3 + [11] * 3 + [12] * 3  # dataset index, not text
    assert b.token_origin.dtype == torch.int8 and bool((b.token_origin == SAMPLED).all())
    assert b.columns["digit"] == ["1"] * 3 + ["2"] * 3 + ["3"] * 3
    lengths = b.completion_attention_mask.sum(-1)
    assert bool(((lengths < 8) | b.truncated | (lengths == 8)).all())
    # truncated rows ran to the limit without EOS
    assert bool((lengths[b.truncated] == 8).all())
    sub = b.select([1, 4])
    assert sub.group_ids.tolist() == [0, 1] and sub.columns["digit"] == ["1", "2"]
    assert [mb.num_rows for mb in b.micro_batches(4)] == [4, 4, 1]


def test_rollout_batch_rejects_bad_shapes():
    with pytest.raises(ValueError, match="completion_mask"):
        RolloutBatch(prompt_ids=torch.zeros(2, 3, dtype=torch.long), prompt_mask=torch.ones(2, 3, dtype=torch.long),
                     completion_ids=torch.zeros(2, 4, dtype=torch.long), completion_mask=torch.ones(2, 5),
                     behavior_logprobs=torch.zeros(2, 4), group_ids=torch.zeros(2, dtype=torch.long),
                     prompt_uids=torch.zeros(2, dtype=torch.long), truncated=torch.zeros(2, dtype=torch.bool))


def test_injected_tokens_fit_without_new_fields():
    _, _, b = _batch()
    origin = b.token_origin.clone()
    origin[0, :2] = INJECTED  # e.g. a hint prefix: marked, kept out of the loss
    mask = b.completion_mask.clone()
    mask[0, :2] = 0
    b2 = RolloutBatch(**{**b.__dict__, "token_origin": origin, "completion_mask": mask})
    assert int((b2.token_origin == INJECTED).sum()) == 2
    assert bool((b2.completion_attention_mask[0, :2] == 1).all())  # still attended to


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sampler_logprobs_match_training_forward(arch):
    model, _, b = _batch(arch)
    lp, _ = completion_logprobs(model, b, 1.0, shared_prefix=False)
    m = b.completion_mask
    assert torch.allclose(lp * m, b.behavior_logprobs * m, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_shared_prefix_forward_equals_plain_forward(arch):
    """Identical log-probs and parameter gradients, float64, ragged lengths and left padding.

    Tolerance: 1e-10 on log-probs; 1e-6 relative on gradients (transformers runs
    the attention softmax in float32 even for a float64 model)."""
    model, tok, b = _batch(arch, dtype=torch.float64)
    for row, keep in ((1, 3), (5, 1), (7, 6)):  # ragged completion lengths (right padding)
        b.completion_attention_mask[row, keep:] = 0
        b.completion_mask[row, keep:] = 0
        b.completion_ids[row, keep:] = tok.pad_token_id
    assert len(set(b.completion_attention_mask.sum(-1).tolist())) >= 3
    assert int((b.prompt_mask == 0).sum()) > 0  # some prompts are left-padded
    from grpolab.model.grouped_forward import supports
    assert supports(model)  # the one-pass grouped forward (model/grouped_forward.py) is what is tested
    _assert_shared_prefix_matches_plain(model, b)


def test_shared_prefix_backward_accumulates_dense_tied_gradient():
    """The one-lookup embedding's sparse gradient lands in the tied LM head's dense .grad across
    micro-batches (what AdamW needs), equal to the plain forward's accumulated gradient."""
    model, tok, b = _batch("llama", dtype=torch.float64)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    grads = []
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        for rows in ([0, 1, 2, 3], [4, 5, 6, 7]):  # two micro-batches, gradient accumulation
            mb = b.select(rows)
            lp, _ = completion_logprobs(model, mb, 1.0, shared_prefix=shared)
            (lp * mb.completion_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    scale = max(float(g.abs().max()) for g in grads[0].values())
    for n, g in grads[1].items():  # tolerance as above: the HF float32 internals of a float64 model
        assert g.layout == torch.strided, n
        assert float((g - grads[0][n]).abs().max()) <= 1e-6 * scale, n


def test_kv_cache_shared_prefix_path_equals_plain_forward(monkeypatch):
    """Models outside the grouped forward (e.g. Qwen3, Mistral) take the KV-cache path on hidden states:
    same log-probs and gradients as the plain forward (float64)."""
    import grpolab.model.grouped_forward as gf
    monkeypatch.setattr(gf, "supports", lambda model: False)
    model, tok, b = _batch("llama", dtype=torch.float64)
    _assert_shared_prefix_matches_plain(model, b)


def test_grouped_forward_with_lora_equals_plain_forward():
    """LoRA layers are the model's own modules, so the grouped forward applies them: same log-probs and
    adapter gradients as the plain forward (float64, random adapter weights)."""
    from peft import LoraConfig, get_peft_model

    from grpolab.model.grouped_forward import supports
    model, tok, b = _batch("qwen2", dtype=torch.float64)
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    assert supports(lora)
    params = [p for p in lora.parameters() if p.requires_grad]
    out = []
    for shared in (False, True):
        lp, _ = completion_logprobs(lora, b, 1.0, shared_prefix=shared)
        out.append((lp * b.completion_mask, torch.autograd.grad((lp * b.completion_mask).sum(), params)))
    assert torch.allclose(out[0][0], out[1][0], atol=1e-10)
    scale = max(float(g.abs().max()) for g in out[0][1])
    for a, c in zip(out[0][1], out[1][1]):
        assert float((a - c).abs().max()) <= 1e-6 * scale


def test_greedy_sampling_is_deterministic():
    model, tok = build_tiny(TEXTS)
    rows = [{"prompt": "say 1:"}]
    a = plain_rollout(model, tok, rows, [0], num_generations=2, max_completion_length=5, max_prompt_length=32,
                      temperature=0.0)
    assert torch.equal(a.completion_ids[0], a.completion_ids[1])


def test_draw_matches_the_distribution_and_filters():
    from grpolab.generation.sampling import draw

    g = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7]])).repeat(50_000, 1)
    _, tok = draw(logits, 1.0, generator=g)
    freq = torch.bincount(tok, minlength=3).float() / tok.numel()
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.7]), atol=0.01)
    _, tok = draw(logits, 1.0, top_k=1, generator=g)
    assert bool((tok == 2).all())
    _, tok = draw(logits, 1.0, top_p=0.75, generator=g)  # nucleus {2, 1}
    assert not bool((tok == 0).any())
    logp, tok = draw(logits[:2], 0.0)
    assert tok.tolist() == [2, 2] and torch.allclose(logp.exp().sum(-1), torch.ones(2))


def test_inverse_cdf_sampler_matches_the_distribution():
    """sampling_method inverse_cdf draws from the same distribution as the race (and respects top-k)."""
    from grpolab.generation.sampling import draw

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    _, tok = draw(logits, 1.0, generator=g, method="inverse_cdf")
    freq = torch.bincount(tok, minlength=4).float() / len(tok)
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.01)
    _, tok = draw(logits, 1.0, top_k=2, generator=g, method="inverse_cdf")
    assert set(tok.tolist()) == {0, 1}
