"""The static-KV-cache decode step (rollout/fast_decode.py) computes the Hugging Face forward exactly."""
import pytest
import torch

from grpolab.model.loading import build_tiny
from grpolab.generation.fast_decode import StaticDecoder, supports
from grpolab.generation.sampling import sample_completions

from _helpers import decoder_matches_hf, decoder_prompts, tiny_decoder_model


def _model(arch: str):
    return tiny_decoder_model(arch, 3, torch.float64)


_prompts = decoder_prompts


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_static_decoder_logits_equal_hf_forward(arch):
    """Step by step, with left padding, ragged fan-out and rows dropped mid-way: logits equal (float64)."""
    # 1e-6: the Hugging Face RMSNorm computes in float32 even in a float64 model, so both paths round there (in
    # a different summation order); a wrong term is far above that (measured: the attention scale 1% off gives
    # 3e-5, a missing q/k/v bias 4e-2). Ragged groups: 2, 1, 3 rows; after step 2 rows 1 and 4 finish
    decoder_matches_hf(_model(arch), torch.tensor([0, 0, 1, 2, 2, 2]), steps=6, atol=1e-6, drops={2: [0, 2, 3, 5]})


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_sampler_static_cache_matches_hf_path(arch):
    """Same seed, same tokens and behaviour log-probs with and without the static cache (EOS drops rows)."""
    m = _model(arch)
    ids, mask = _prompts(m)
    outs = []
    for static in (False, True):
        g = torch.Generator().manual_seed(5)
        outs.append(sample_completions(m, ids, mask, num_samples=[2, 3, 2], max_new_tokens=10,
                                       eos_ids=[5, 9], pad_id=0, temperature=[1.0, 0.7, 1.3], generator=g,
                                       static_cache=static))
    a, b = outs
    assert a.truncated.any() and not a.truncated.all()  # some rows finished early: the drop path ran
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.lengths, b.lengths)
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-6)  # log-probs are stored in float32


def test_supports_only_exact_architectures():
    llama = _model("llama")
    assert supports(llama) and supports(_model("qwen2"))
    llama.config.use_sliding_window = True  # a windowed model would need another mask
    assert not supports(llama)
    llama.config.use_sliding_window = False
    llama.config.hidden_act = "gelu"
    assert not supports(llama)
    from peft import LoraConfig, get_peft_model
    lora = get_peft_model(_model("llama"), LoraConfig(r=2, target_modules=["q_proj"]))
    assert not supports(lora)  # LoRA layers are not plain weights: the sampler keeps the HF path


def test_unsupported_model_falls_back_to_hf_path():
    """A PEFT model samples through the Hugging Face forward and gives the same tokens as the base model."""
    from peft import LoraConfig, get_peft_model
    base = _model("llama")
    ids, mask = _prompts(base)
    g = torch.Generator().manual_seed(2)
    ref = sample_completions(base, ids, mask, num_samples=2, max_new_tokens=6, eos_ids=[5], pad_id=0, generator=g)
    lora = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=True))
    g = torch.Generator().manual_seed(2)  # zero-initialised B: the LoRA model computes the base model
    got = sample_completions(lora, ids, mask, num_samples=2, max_new_tokens=6, eos_ids=[5], pad_id=0, generator=g)
    assert torch.equal(ref.completion_ids, got.completion_ids)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_autocast_weights_cast_once_give_the_same_logits(half):
    """Under autocast the decoder holds its products' weights and its key/value cache in autocast's dtype (cast
    once per sampling call / per written position) and its logits equal, bit for bit, those of the decoder that leaves autocast to cast every weight at every
    step (the same round-to-nearest conversion); without autocast the weights stay float32."""
    from transformers import DynamicCache
    m, _ = build_tiny(["hello world 0123456789 abcdef"], arch="llama", layers=2)
    m = m.float().eval()
    ids, mask = _prompts(m)
    rep = torch.tensor([0, 0, 1, 2])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad(), torch.autocast("cpu", dtype=half):
        outs = []
        for cast in (True, False):
            cache = DynamicCache()
            m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, past_key_values=cache)
            dec = StaticDecoder(m, cache, rep, mask[rep], capacity=ids.shape[1] + 4, cast_weights=cast)
            assert dec.head.dtype == (half if cast else torch.float32)
            assert dec.layers[0][2].dtype == (half if cast else torch.float32)  # the fused [W_q; W_k; W_v]
            # the KV cache (without the cast: keys float32 from the float32 RoPE, values as v_proj gave them)
            assert dec.keys[0].dtype == (half if cast else torch.float32) and dec.values[0].dtype == half
            g = torch.Generator().manual_seed(1)
            step = []
            for t in range(4):
                tok = torch.randint(4, m.config.vocab_size, (len(rep),), generator=g)
                step.append(dec.step(tok, pos[rep, -1] + 1 + t))
            outs.append(torch.stack(step))
        assert torch.equal(outs[0], outs[1])
    with torch.no_grad():
        cache = DynamicCache()
        m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, past_key_values=cache)
        assert StaticDecoder(m, cache, rep, mask[rep], capacity=ids.shape[1] + 4).head.dtype == torch.float32
