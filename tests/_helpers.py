"""Small helpers shared by several test files: reward transforms, learning seeds, tiny decoders, image policies,
resumed runs, scripted rollouts."""
import pytest
import torch

from grpolab.rewards.transforms import REWARD_TRANSFORMS


def tr(name, **kw):
    """Call the registered reward transform ``name``."""
    return REWARD_TRANSFORMS.get(name)(**kw)


def close(a, b, tol=1e-6):
    """Same shape and values (NaN equals NaN), compared in float64."""
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=tol, rtol=0, equal_nan=True))


#: The seeds of a learning test: ``make test`` runs seed 0, ``make test-learning`` (marker ``more_seeds``) seeds 1
#: and 2 too. Each test's margin was measured to hold on all three (its docstring has the figures).
LEARNING_SEEDS = [0, pytest.param(1, marks=pytest.mark.more_seeds), pytest.param(2, marks=pytest.mark.more_seeds)]


def tiny_decoder_model(arch: str, layers: int, dtype):
    """A tiny Llama / Qwen2 (``build_tiny``) in ``dtype`` with random biases (Qwen2's q/k/v) and norm weights,
    so every term of a decode step is exercised (tests/test_fast_decode.py, tests/test_compile_decode.py)."""
    import torch

    from grpolab.model.loading import build_tiny
    m, _ = build_tiny(["hello world 0123456789 abcdef"], arch=arch, layers=layers)
    m = m.to(dtype).eval()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(3)
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear) and mod.bias is not None:
                mod.bias.normal_(0, 0.5)
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.uniform_(0.5, 1.5)
    return m


def decoder_prompts(m):
    """Three 6-token prompts for ``m`` with left padding on two of them: ``(ids, mask)``."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, m.config.vocab_size, (3, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    mask[2, :1] = 0
    return ids, mask


def decoder_matches_hf(m, rep, steps: int, atol: float, drops: dict | None = None, capacity_extra: int = 0,
                       **decoder_kwargs):
    """A ``StaticDecoder`` over :func:`decoder_prompts` fanned out by ``rep``, stepped on random tokens against the
    Hugging Face forward of the whole sequence without a cache: logits equal within ``atol`` (and in the model's
    dtype) at every step; ``drops`` ``{t: keep}``: after step t only the rows ``keep`` stay (rows that finished).
    Returns the decoder."""
    import torch
    from transformers import DynamicCache

    from grpolab.generation.fast_decode import StaticDecoder
    ids, mask = decoder_prompts(m)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        cache = DynamicCache()
        m(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, past_key_values=cache)
        dec = StaticDecoder(m, cache, rep, mask[rep], capacity=ids.shape[1] + steps + capacity_extra,
                            **decoder_kwargs)
        ctx, cmask = ids[rep], mask[rep]  # the full sequences, for the reference forward without cache
        g = torch.Generator().manual_seed(1)
        for t in range(steps):
            tok = torch.randint(4, m.config.vocab_size, (ctx.shape[0],), generator=g)
            ctx = torch.cat([ctx, tok[:, None]], 1)
            cmask = torch.cat([cmask, torch.ones_like(tok[:, None])], 1)
            cpos = (cmask.cumsum(-1) - 1).clamp(min=0)
            ref = m(input_ids=ctx, attention_mask=cmask, position_ids=cpos).logits[:, -1]
            got = dec.step(tok, cpos[:, -1])
            assert got.dtype == m.dtype
            torch.testing.assert_close(got, ref, rtol=0, atol=atol)
            if t in (drops or {}):
                keep = torch.tensor(drops[t])
                dec.keep(keep)
                ctx, cmask = ctx[keep], cmask[keep]
    return dec


# ------------------------------------------------------------------ image policies (ddpm, flow_matching)
def image_policy(name: str, **over):
    """``(config, policy)`` of the image policy ``name`` on a stand-in data file and reward, ``over`` on top."""
    from grpolab.components import Component
    from grpolab.config import Config
    from grpolab.policies import POLICIES

    cfg = Config.build({"policy": name, "data": "rows.jsonl", "reward": ["m:f"], **over})
    return cfg, Component(POLICIES.get(name), cfg, name).fn


def loaded_image_policy(name: str):
    """``(policy, module, rows)``: the image policy ``name`` with its model loaded on three rows (classes 0, 1, 2)."""
    cfg, pol = image_policy(name)
    rows = [{"prompt": str(i), "label": i} for i in range(3)]
    return pol, pol.load(cfg, rows, [], log=lambda *a: None), rows


def sample_packed_steps(pol, module, rows):
    """Samples the three ``rows`` (uids 5, 6, 7, groups from 2, 2 + 3 + 1 generations, seed 0) and asserts how the
    batch packs them: one row a generation, T steps of 1x8x8 images, and an 8x8x1 image in [0, 1]. Returns it."""
    b = pol.sample(module, rows, [5, 6, 7], group_offset=2, num_generations=[2, 3, 1], temperature=1.0,
                   generator=torch.Generator().manual_seed(0))
    T = pol.T
    assert b.completion_mask.shape == (6, T) and b.step_data["x"].shape == (6, T, 1, 8, 8)
    assert b.group_ids.tolist() == [2, 2, 3, 3, 3, 4] and b.prompt_uids.tolist() == [5, 5, 6, 6, 6, 7]
    assert b.row_data["cond"].tolist() == [0, 0, 1, 1, 1, 2] and b.columns["label"] == [0, 0, 1, 1, 1, 2]
    img = b.columns["completion"][0]
    assert img.shape == (8, 8, 1) and img.dtype.name == "float32" and 0 <= img.min() and img.max() <= 1
    return b


def assert_bad_rows_and_models_are_named(make_policy, tmp_path):
    """A row without a class, a held-out class outside the model's, a model folder without config.json: each
    refused with its reason (``make_policy(**over)`` gives ``(config, policy)``). Returns that folder's pair."""
    from grpolab.config import ConfigError

    cfg, pol = make_policy()
    with pytest.raises(ConfigError, match="train row 1: .*'label' column.*'cat'"):
        pol.load(cfg, [{"prompt": "1"}, {"prompt": "cat"}], [], log=lambda *a: None)
    with pytest.raises(ConfigError, match="held-out row 0: class 12 is outside the model's classes 0..9"):
        pol.load(cfg, [{"prompt": "1"}], [{"prompt": "12"}], log=lambda *a: None)
    cfg2, pol2 = make_policy(model=str(tmp_path))
    with pytest.raises(ConfigError, match="has no config.json"):
        pol2.load(cfg2, [{"prompt": "1"}], [], log=lambda *a: None)
    return cfg2, pol2


def assert_saved_model_loads_the_same(make_policy, pol, module, rows, path):
    """``pol.save`` to ``path`` then a load from it by a new policy: the same weights, tensor by tensor.
    Returns ``(new policy, loaded module)``."""
    pol.save(module, path)
    cfg2, pol2 = make_policy(model=str(path))
    again = pol2.load(cfg2, rows, [], log=lambda *a: None)
    for (k, p), (_, q) in zip(module.state_dict().items(), again.state_dict().items()):
        assert torch.equal(p, q), k
    return pol2, again


def assert_token_kl_and_text_engines_are_refused(make_policy):
    """An image policy refuses the token KL (beta) and a text engine (vllm), each with the fix, and takes
    gaussian_mean_kl."""
    from grpolab.config import ConfigError

    with pytest.raises(ConfigError, match=r"beta: .*set beta: 0 and add regularizers: \[gaussian_mean_kl\]"):
        make_policy(beta=0.04)
    with pytest.raises(ConfigError, match="generation_engine: vllm samples text.*generation_engine: native"):
        make_policy(generation_engine="vllm")
    cfg, _ = make_policy(regularizers=["gaussian_mean_kl"], gaussian_kl_beta=0.01)
    assert cfg.regularizers == ["gaussian_mean_kl"]


def recipe_before_after(recipe: str, reward: str, tmp_path, seed: int, **over):
    """The learning run of a recipe: 12 steps on seed ``seed`` (``over`` on top), one thread, no stall stop.
    Returns ``(summary, before, after)``, the held-out means of ``rewards/<reward>/mean``."""
    from grpolab.config import Config
    from grpolab.recipes import recipe_overrides
    from grpolab.train.trainer import Trainer

    cfg = Config.build({**recipe_overrides(recipe), **over, "steps": 12, "seed": seed, "save_steps": 100,
                        "out": str(tmp_path / "run"), "stall_steps": 0, "threads": 1})
    summary = Trainer(cfg, log=lambda *a: None).train(progress=False)
    before, after = (summary[k][f"rewards/{reward}/mean"] for k in ("before", "after"))
    return summary, before, after


# ------------------------------------------------------------------ runs, resumed and saved
def straight_and_resumed(base: dict, tmp_path, **trainer_kw):
    """``base`` trained 4 steps straight (out a/), and 2 steps then a resume to 4 from the step-2 checkpoint by a
    new Trainer, as after a kill (out b/); ``base`` has save_steps 2. Returns ``(a, its summary, c, its summary)``,
    c the resumed trainer."""
    from grpolab.config import Config
    from grpolab.train.trainer import Trainer

    kw = {"log": lambda *a: None, **trainer_kw}
    a = Trainer(Config.build({**base, "steps": 4, "out": str(tmp_path / "a")}), **kw)
    sa = a.train(progress=False)
    Trainer(Config.build({**base, "steps": 2, "out": str(tmp_path / "b")}), **kw).train(progress=False)
    c = Trainer(Config.build({**base, "steps": 4, "out": str(tmp_path / "b")}), resume=True, **kw)
    sc = c.train(progress=False)
    return a, sa, c, sc


def assert_resume_is_exact(base: dict, tmp_path, reward: str, **trainer_kw):
    """:func:`straight_and_resumed`: the same weights to the bit and the same held-out mean of ``reward``."""
    a, sa, c, sc = straight_and_resumed(base, tmp_path, **trainer_kw)
    pc = dict(c.model.named_parameters())
    for k, v in a.model.named_parameters():
        assert torch.equal(v, pc[k]), k
    assert sa["after"][f"rewards/{reward}/mean"] == sc["after"][f"rewards/{reward}/mean"]


def final_weights(out) -> dict:
    """Every tensor of the run ``out``'s final/ safetensors files (one or several shards)."""
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(out, "final").glob("*.safetensors"))
    assert files, f"no final weights in {out}"
    w = {}
    for f in files:
        w.update(load_file(str(f)))
    return w


# ------------------------------------------------------------------ rollouts of tiny trainers
def countdown_trainer(out, rollout_strategy: str, max_completion_length: int):
    """A tiny-model trainer on countdown (3 prompts x 4 generations), its step begun: its RolloutContext is what
    the rollout strategies receive; ``rollout_strategy`` selects their shared settings (the reference template)."""
    from grpolab.config import Config
    from grpolab.train.trainer import Trainer

    args = {"model": "tiny", "task": "countdown", "steps": 1, "prompts_per_step": 3, "num_generations": 4,
            "max_completion_length": max_completion_length, "eval_before": False, "eval_after": False,
            "tensorboard": False, "micro_batch_size": 16, "out": str(out), "rollout_strategy": rollout_strategy}
    t = Trainer(Config.build(args), log=lambda *a: None)
    t.ctx.new_step()
    return t


def own_data_args(tiny_args: dict, data: str) -> dict:
    """``tiny_args`` on the user's data file ``data`` (no task, every row a training row)."""
    return {**{k: v for k, v in tiny_args.items() if k != "task"}, "data": data, "eval_split": 0}


def scripted_strategy_step(args: dict, monkeypatch, module, sampler: str, fake):
    """The trainer of ``args`` with ``module.<sampler>`` replaced by the scripted ``fake``, and its rollout
    strategy's batch of the first two rows (uids 0, 1) with their scalar rewards: ``(trainer, batch)``."""
    from grpolab.config import Config
    from grpolab.train.trainer import Trainer

    tr = Trainer(Config.build(args), log=lambda *a: None)
    monkeypatch.setattr(module, sampler, fake)
    tr.ctx.new_step()
    b = tr.strategy(ctx=tr.ctx, rows=tr.rows[:2], uids=[0, 1], group_offset=tr.ctx.allocate_groups(2),
                    budgets=None, temperatures=None)
    b.scalar_rewards = tr.scorer.scalar(b, step=tr.step)
    return tr, b


def teacher_forced_turns(ctx, contexts, turns, temperatures):
    """The Continuation a sampler drawing the token lists ``turns`` (one a context) would return: each turn's
    tokens with the policy's teacher-forced log-probs at its temperature, each stopped by a stop string."""
    from grpolab.generation.turns import Continuation, Episode, pack_episodes
    from grpolab.model.logprobs import completion_logprobs

    ids, lps = [], []
    for c, a, t in zip(contexts, turns, temperatures):
        e = Episode(list(c)).add_model_turn(a, [0.0] * len(a))
        b = pack_episodes(ctx.tokenizer, [e], [{"prompt": ""}], [0], [0])
        lp, _ = completion_logprobs(ctx.policy, b, t, shared_prefix=False)
        ids.append(a)
        lps.append(lp[0, :len(a)].tolist())
    return Continuation(ids, lps, ["stop_string"] * len(ids))


def tiny_model_on_repeat(n_rows: int):
    """The repeat task's first ``n_rows`` training rows and the tiny model (seed 0, eval mode) built on them:
    ``(task, rows, model, tokenizer)``."""
    from grpolab.data import model_texts
    from grpolab.model.loading import load_policy
    from grpolab.tasks import get_task

    task = get_task("repeat")
    rows = task.train_rows[:n_rows]
    model, tok = load_policy("tiny", task_texts=model_texts(rows), seed=0, log=lambda *a: None)
    model.eval()
    return task, rows, model, tok


def micro_batched_loss(agg, per_token, mask, chunks, constant, wrt):
    """The step loss over the micro-batches ``chunks`` (row slices), each aggregated by ``agg`` with the whole
    step's totals (as with gradient accumulation), and its gradient with respect to ``wrt``: ``(loss, grad)``."""
    from grpolab.algorithms import StepTotals

    totals = StepTotals.from_masks([mask[c] for c in chunks], constant=constant)
    loss = sum(agg(per_token(c), mask[c], totals) for c in chunks)
    grad, = torch.autograd.grad(loss, wrt)
    return loss, grad


#: the words of the tiny CLIP tokenizers of the pipeline tests (tests/test_ddpm_pipelines.py, test_flow_pipeline.py)
PIPELINE_WORDS = ["a", "red", "blue", "bright", "dark", "image", "cat", "dog"]


def tiny_clip_tokenizer(path):
    """A CLIPTokenizer saved nowhere, read from ``path``'s vocab.json / merges.txt: one token per word of
    :data:`PIPELINE_WORDS` and per letter (no merges); ``(tokenizer, vocabulary size)``."""
    import json

    from transformers import CLIPTokenizer

    path.mkdir(parents=True, exist_ok=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for w in PIPELINE_WORDS:
        vocab[w + "</w>"] = len(vocab)
    for ch in "abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(path / "vocab.json"), str(path / "merges.txt"), model_max_length=16,
                        pad_token="<|endoftext|>")
    return tok, len(vocab)
