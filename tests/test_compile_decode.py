"""The compiled decode step (``compile_decode``, generation/fast_decode.py) against the plain path (issue 29).

One tiny float32 model; the compiled layer step is compiled once for the module (it is cached per process)."""
import pytest
import torch

from grpolab.errors import ConfigError
from grpolab.generation import fast_decode
from grpolab.generation.fast_decode import COMPILE, configure_compile
from grpolab.generation.sampling import sample_completions

from _helpers import decoder_matches_hf, decoder_prompts, tiny_decoder_model


@pytest.fixture(scope="module")
def model():
    return tiny_decoder_model("qwen2", 2, torch.float32)  # qwen2: q/k/v biases too


@pytest.fixture(autouse=True)
def keep_compile_state():
    saved = dict(COMPILE)
    yield
    COMPILE.clear()
    COMPILE.update(saved)


_prompts = decoder_prompts


def _frames():
    from torch._dynamo.utils import counters
    return sum(counters["frames"].values())


def _check_against_hf(m, steps=6, capacity_extra=0):
    """Compiled decoder vs the Hugging Face forward without cache, step by step: padding, ragged groups
    (2, 1, 3 rows), rows 1 and 4 leaving after step 2, and row 0 leaving after step 4."""
    # float32: both paths round at ~1e-7 relative in a different summation order (logits are O(1)); a wrong term
    # is far above 1e-4 (test_fast_decode.py: a 1% attention scale error gives 3e-5 in float64 at 3 layers, a
    # missing bias 4e-2)
    dec = decoder_matches_hf(m, torch.tensor([0, 0, 1, 2, 2, 2]), steps, atol=1e-4,
                             drops={2: [0, 2, 3, 5], 4: [1, 2, 3]}, capacity_extra=capacity_extra,
                             compile_layers=True)
    assert dec.compiled_fn is not None
    assert COMPILE["active"] or COMPILE["mode"] == "off"  # nothing failed on the way


def test_compiled_logits_equal_hf_forward_and_no_recompiles(model):
    """Logits equal the Hugging Face forward over steps with padding, ragged groups and rows dropping out;
    a second decoder with another cache length and row count compiles nothing new."""
    _check_against_hf(model)
    frames = _frames()
    _check_against_hf(model, steps=5, capacity_extra=3)
    assert _frames() == frames  # rows leaving, another capacity: no recompile


def test_compiled_step_reads_updated_weights(model):
    """Weights are inputs of the compiled graph, not constants: after an in-place update (as an optimiser
    step does) the compiled step gives the new model's logits."""
    m = model
    _check_against_hf(m, steps=2)
    frames = _frames()
    saved = {k: v.clone() for k, v in m.state_dict().items()}
    try:
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1.1).add_(0.01)
        _check_against_hf(m, steps=3)
        assert _frames() == frames  # new weight values: no recompile
    finally:
        m.load_state_dict(saved)


def test_sampler_same_tokens_compiled_and_eager(model):
    """Same seed: the same tokens, lengths and behaviour log-probs with the compiled and the eager step."""
    ids, mask = _prompts(model)
    outs = []
    for active in (False, True):
        COMPILE["active"] = active
        g = torch.Generator().manual_seed(5)
        outs.append(sample_completions(model, ids, mask, num_samples=[2, 3, 2], max_new_tokens=10,
                                       eos_ids=[5, 9], pad_id=0, temperature=[1.0, 0.7, 1.3], generator=g))
    a, b = outs
    assert a.truncated.any() and not a.truncated.all()  # some rows finished early: the drop path ran
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.lengths, b.lengths)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("where", ["torch.compile", "first step"])
def test_compile_failure_falls_back_to_eager_with_reason(model, monkeypatch, where):
    """torch.compile raising (when called, or at the first compiled step) runs the eager step, and the reason
    is recorded and printed once."""
    printed = []
    monkeypatch.setattr(fast_decode, "_COMPILED", {})
    if where == "torch.compile":
        def refuse(*a, **k):
            raise RuntimeError("no compiler here")
        monkeypatch.setattr(torch, "compile", refuse)
    else:
        def broken(*a, **k):
            def fn(*args):
                raise RuntimeError("no compiler here")
            return fn
        monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(fast_decode, "compile_unavailable", lambda: None)
    COMPILE.pop("configured", None)
    configure_compile("on", log=printed.append)
    assert COMPILE["active"]
    ids, mask = _prompts(model)
    outs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(5)
        outs.append(sample_completions(model, ids, mask, num_samples=2, max_new_tokens=6, eos_ids=[5],
                                       pad_id=0, generator=g))
    assert not COMPILE["active"]
    assert "RuntimeError: no compiler here" in COMPILE["reason"] and "eager" in COMPILE["reason"]
    assert sum("no compiler here" in p for p in printed) == 1  # once, not at every step or call
    COMPILE["active"] = False
    g = torch.Generator().manual_seed(5)
    ref = sample_completions(model, ids, mask, num_samples=2, max_new_tokens=6, eos_ids=[5], pad_id=0, generator=g)
    for out in outs:
        assert torch.equal(out.completion_ids, ref.completion_ids)


def test_configure_compile_modes(monkeypatch):
    """off never compiles; auto/on without a C++ compiler run eager and say why; a bad value names the field."""
    printed = []
    COMPILE.pop("configured", None)
    assert "off" in configure_compile(False, log=printed.append) and not COMPILE["active"]
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    reason = configure_compile("auto", log=printed.append)
    assert not COMPILE["active"] and "no C++ compiler" in reason and "eager" in reason
    assert printed[-1] == f"[grpolab] {reason}" and COMPILE["reason"] == reason
    with pytest.raises(ConfigError, match="compile_decode"):
        configure_compile("sometimes")


def test_compiled_step_under_bf16_autocast_matches_eager(model):
    """Under bfloat16 autocast (``dtype: bfloat16``) the compiled step writes the step's key and value into the
    bfloat16 cache and gives the eager step's logits up to bf16 rounding in another fusion order."""
    from transformers import DynamicCache

    from grpolab.generation.fast_decode import StaticDecoder
    ids, mask = _prompts(model)
    rep = torch.tensor([0, 0, 1, 2])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    outs = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for compiled in (True, False):
            cache = DynamicCache()
            model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, past_key_values=cache)
            dec = StaticDecoder(model, cache, rep, mask[rep], capacity=ids.shape[1] + 4, compile_layers=compiled)
            assert (dec.compiled_fn is not None) == compiled and dec.keys[0].dtype == torch.bfloat16
            g = torch.Generator().manual_seed(1)
            outs.append(torch.stack([dec.step(torch.randint(4, model.config.vocab_size, (4,), generator=g),
                                              pos[rep, -1] + 1 + t) for t in range(4)]))
    assert COMPILE["active"] or COMPILE["mode"] == "off"  # nothing failed on the way
    # logits here are at most 0.5 (bf16 spacing 2e-3 there; measured apart by 2e-3): a wrong term is far more
    torch.testing.assert_close(outs[0].float(), outs[1].float(), rtol=0, atol=1e-2)
