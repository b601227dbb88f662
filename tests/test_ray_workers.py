"""Rollout workers on Ray (distributed/ray_workers.py), on a local Ray cluster of 2 CPUs.

A group's completions depend on (step, group) only, so 2 workers give the batch 1 worker gives; pushed weights
arrive on every worker; a worker refuses to sample with weights older than max_staleness; a training run with
one-step-ahead asynchronous rollouts reports rollout_staleness and carries truncated importance weights.
"""
import hashlib
import copy
import json
import re
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from grpolab.config import Config, ConfigError  # noqa: E402
from grpolab.data import model_texts, render_prompt  # noqa: E402
from grpolab.distributed.ray_workers import RayRolloutEngine, StaleWeightsError  # noqa: E402
from grpolab.rollouts.context import group_seed  # noqa: E402
from grpolab.generation.sampling import sample_completions  # noqa: E402
from grpolab.generation.plain import eos_token_ids  # noqa: E402
from grpolab.model.loading import load_policy  # noqa: E402
from grpolab.registry import ROLLOUT_STRATEGIES  # noqa: E402
from grpolab.rewards import BatchScorer, RewardFn, RewardScorer  # noqa: E402
from grpolab.rollouts.context import RolloutContext  # noqa: E402
from grpolab.tasks import get_task  # noqa: E402

from _helpers import tiny_model_on_repeat  # noqa: E402

G, MAX_LEN = 3, 5


@pytest.fixture(scope="module")
def cluster():
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"ray.init: {time.perf_counter() - t0:.1f} s")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def parts(cluster):
    task, rows, model, tok = tiny_model_on_repeat(12)
    return model, tok, rows, [RewardFn(n, f, w) for n, f, w in task.rewards]


def config(**kw):
    # dtype float32 set: the module-scoped engines are built before conftest pins the CPU kind for a test, and
    # dtype auto would sample in bfloat16 on a CPU with native bf16 (the expected values here are float32)
    return Config.build({"model": "tiny", "task": "repeat", "num_generations": G, "max_completion_length": MAX_LEN,
                         "micro_batch_size": 16, "temperature": 1.0, "seed": 5, "generation_worker_cpus": 0.25,
                         "dtype": "float32", **kw})


ENGINES = []


@pytest.fixture(autouse=True)
def _close_engines():
    """Actors hold their CPUs until killed: end every engine a test started."""
    yield
    while ENGINES:
        ENGINES.pop().close()


@pytest.fixture(scope="module")
def shared(parts):
    """One engine with 1 worker and one with 2 (with their contexts), kept for the tests that only sample."""
    made = []
    for n in (1, 2):
        model, tok, rows, rewards = parts
        cfg = config(generation_workers=n)
        engine = RayRolloutEngine(cfg, model, tok, log=lambda *a: None)
        made.append((engine, RolloutContext(cfg, tok, rows, policy=model, scorer=BatchScorer(RewardScorer(rewards)),
                                            generator=torch.Generator().manual_seed(1), engine=engine)))
    yield made
    for engine, _ in made:
        engine.close()


def plain(ctx, step, uids, **kw):
    ctx.new_step(step)
    offset = ctx.allocate_groups(len(uids))
    return ROLLOUT_STRATEGIES.get("plain")(ctx=ctx, rows=[ctx.rows[u] for u in uids], uids=uids,
                                           group_offset=offset, **kw)


def same_batch(a, b):
    return (torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.behavior_logprobs, b.behavior_logprobs)
            and torch.equal(a.group_ids, b.group_ids) and torch.equal(a.prompt_uids, b.prompt_uids)
            and torch.equal(a.truncated, b.truncated) and a.columns["completion"] == b.columns["completion"])


def sha_seed(seed, step, group):
    digest = hashlib.sha256(f"grpolab-group:{seed}:{step}:{group}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2 ** 63 - 1)


def test_group_seed_depends_on_seed_step_and_group_only():
    assert group_seed(5, 2, 3) == group_seed(5, 2, 3)
    seeds = {group_seed(s, t, g) for s in (0, 1) for t in (0, 1, 2) for g in range(4)}
    assert len(seeds) == 24  # every (seed, step, group) its own stream
    # the documented definition: the first 8 bytes of a sha256 of the triple, little-endian, 63 bits
    assert group_seed(0, 1, 2) == sha_seed(0, 1, 2)


def test_two_workers_give_the_batch_of_one_worker(parts, shared):
    uids = [4, 0, 7, 2, 9]
    (one, ctx1), (two, ctx2) = shared
    for step in (0, 3):
        a, b = plain(ctx1, step, uids), plain(ctx2, step, uids)
        assert same_batch(a, b)
        assert a.columns["rollout_staleness"] == [0.0] * len(uids) * G and a.token_weights is None
    # ragged groups and per-prompt temperatures travel too
    a = plain(ctx1, 1, uids, budgets=[1, 2, 3, 2, 1], temperatures=[0.5, 1.0, 1.5, 1.0, 0.7])
    b = plain(ctx2, 1, uids, budgets=[1, 2, 3, 2, 1], temperatures=[0.5, 1.0, 1.5, 1.0, 0.7])
    assert same_batch(a, b) and a.num_rows == 9
    # a group's completions depend on (step, group) only: group 2 alone (offset 2) is the full batch's group 2
    c = plain(ctx2, 3, [4, 0, 7, 2, 9])
    ctx2.new_step(3)
    alone = ctx2.generate([ctx2.rows[7]], [7], group_offset=2)
    rows = (c.group_ids == 2).nonzero().squeeze(-1)
    T = alone.completion_ids.shape[1]
    assert torch.equal(c.completion_ids[rows][:, :T], alone.completion_ids)
    assert bool((c.completion_ids[rows][:, T:] == parts[1].pad_token_id).all())


def test_workers_sample_like_the_trainers_own_sampler(parts, shared):
    """Expected values from the trainer's process: the same prompt, unpadded, sampled with a generator seeded by
    the (seed, step, group) formula written out here (sha_seed), one torch thread like the worker."""
    model, tok, rows, _ = parts
    engine, ctx = shared[1]
    b = plain(ctx, 2, [3, 8])
    torch.set_num_threads(1)  # the workers' thread count (one thread per worker); conftest restores it
    for g, uid in enumerate([3, 8]):
        ids = tok(render_prompt(tok, rows[uid]["prompt"]), return_tensors="pt", add_special_tokens=False)["input_ids"]
        seed = sha_seed(5, 2, g)
        out = sample_completions(model, ids, torch.ones_like(ids), num_samples=G, max_new_tokens=MAX_LEN,
                                 eos_ids=eos_token_ids(tok, model), pad_id=tok.pad_token_id, temperature=1.0,
                                 generator=torch.Generator().manual_seed(seed))
        sel = (b.group_ids == g).nonzero().squeeze(-1)
        T = out.completion_ids.shape[1]
        assert torch.equal(b.completion_ids[sel][:, :T], out.completion_ids)
        assert torch.allclose(b.behavior_logprobs[sel][:, :T], out.logprobs, atol=1e-6)


def test_continuations_through_workers(parts, shared):
    """ctx.continue_ with the workers: the same continuations with 1 and 2 workers, each the trainer's own
    continue_sequences of that context alone with the request's seed (base + i), marked as engine-sampled."""
    from grpolab.generation.turns import continue_sequences

    model, tok, rows, _ = parts
    contexts = [tok(render_prompt(tok, rows[u]["prompt"]), add_special_tokens=False)["input_ids"] for u in (0, 5, 6)]
    out = []
    for _, ctx in shared:
        ctx.generator.manual_seed(11)
        out.append(ctx.continue_(contexts, max_new_tokens=[4, 2, 4], stop_strings=["8"]))
    a, b = out
    assert a.ids == b.ids and a.logprobs == b.logprobs and a.finish_reasons == b.finish_reasons and a.from_engine
    base = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=torch.Generator().manual_seed(11)))
    torch.set_num_threads(1)
    for i, (c, m) in enumerate(zip(contexts, [4, 2, 4])):
        ref = continue_sequences(model, tok, [c], max_new_tokens=m, temperature=1.0,
                                 generator=torch.Generator().manual_seed(base + i), stop_strings=["8"])
        assert a.ids[i] == ref.ids[0] and a.finish_reasons[i] == ref.finish_reasons[0]


class FakeVLLM:
    """vLLM's engine interface (``generate``, ``continue_``, ``sync``): fixed tokens, engine log-prob -1 each."""

    def __init__(self):
        self.syncs = 0

    def generate(self, prompts, counts, *, temperature, top_k, top_p, max_tokens, seed=None):
        return [([3 + (seed + j) % 5, 4], [-1.0, -1.0], True) for _, n in zip(prompts, counts) for j in range(n)]

    def sync(self, model):
        self.syncs += 1


def test_vllm_workers_get_the_engine_correction(parts):
    """With an engine in each worker (vLLM's interface; a stand-in here) pi_old is the trainer's forward and each
    token carries min(exp(logp_trainer - logp_engine), vllm_is_cap), as the colocated vLLM path."""
    import sys
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stand-in travels to the actors
    model, tok, rows, rewards = parts
    cfg = config(generation_workers=1, vllm_is_cap=1.5)
    engine = RayRolloutEngine(cfg, model, tok, log=lambda *a: None, engine_factory=FakeVLLM)
    ENGINES.append(engine)
    ctx = RolloutContext(cfg, tok, rows, policy=model, scorer=None, generator=torch.Generator(), engine=engine)
    b = plain(ctx, 0, [1, 2])
    mask = b.completion_attention_mask.bool()
    trainer_lp = ctx.logprobs(b)
    assert torch.allclose(b.behavior_logprobs, trainer_lp)
    expected = torch.where(mask, (trainer_lp + 1.0).exp().clamp(max=1.5), torch.ones_like(trainer_lp))
    assert torch.allclose(b.token_weights, expected)
    assert b.columns["rollout_staleness"] == [0.0] * 6 and "engine_logprob_mismatch" in b.columns
    engine.sync(model)  # the worker hands the pushed weights to its engine
    assert engine.version == 1


def test_more_workers_than_the_cluster_holds_is_an_error(parts):
    with pytest.raises(RuntimeError, match="generation_worker_cpus"):
        RayRolloutEngine(config(generation_workers=3, generation_worker_cpus=1), parts[0], parts[1])


def test_weights_on_workers_match_the_trainer_after_sync(parts, shared):
    """(Runs after the tests that sample with the shared engines: it pushes other weights into them.)"""
    model, tok, rows, _ = parts
    engine, ctx = shared[1]
    trainer_model = copy.deepcopy(model)
    with torch.no_grad():
        for p in trainer_model.parameters():  # an "update"
            p.add_(0.01 * torch.randn_like(p))
    before = plain(ctx, 0, [1, 2])
    engine.sync(trainer_model)
    assert engine.version == 1 and ctx.engine is engine
    for w in engine.worker_weights():
        for name, p in trainer_model.named_parameters():
            assert torch.equal(w[name], p.detach())
    # the pushed weights are the ones that sample: the teacher-forced log-probs of the new policy equal the
    # workers' behaviour log-probs, and differ from the old policy's
    ctx._policy = lambda: trainer_model
    after = plain(ctx, 0, [1, 2])
    mask = after.completion_attention_mask.bool()
    assert torch.allclose(ctx.logprobs(after)[mask], after.behavior_logprobs[mask], atol=1e-4)
    assert not torch.equal(before.behavior_logprobs, after.behavior_logprobs)


def test_a_worker_never_samples_with_weights_older_than_max_staleness(parts, shared):
    engine, ctx = shared[0]
    version, staleness = engine.version, engine.max_staleness
    engine.version, engine.max_staleness = version + 2, 0  # the trainer moved on without pushing (sync() prevents it)
    try:
        with pytest.raises(StaleWeightsError, match="max_staleness"):
            plain(ctx, 0, [1])
    finally:
        engine.version, engine.max_staleness = version, staleness


def test_async_rollouts_need_workers_staleness_and_the_plain_strategy():
    with pytest.raises(ConfigError, match="generation_workers"):
        config(async_rollouts=True)
    with pytest.raises(ConfigError, match="max_staleness: 1"):
        config(async_rollouts=True, generation_workers=1, max_staleness=0)
    with pytest.raises(ConfigError, match="rollout_strategy: plain"):
        config(async_rollouts=True, generation_workers=1, rollout_strategy="ghpo")
    with pytest.raises(ConfigError, match="generation_workers: must be >= 0"):
        config(generation_workers=-1)


def test_training_with_async_rollout_workers(parts, tiny_args, monkeypatch):
    """3 steps with 2 workers one step ahead: step 1 is fresh, steps 2-3 train on completions one version old,
    corrected by truncated importance weights (pi_old = the trainer's forward); the completions and tokens the
    workers sampled are counted once, so max_completions ends the run."""
    from grpolab.train.trainer import Trainer

    seen = []
    real = Trainer.update

    def spy(self, batch):
        seen.append((list(batch.columns["rollout_staleness"]), batch.token_weights,
                     int(batch.completion_attention_mask.sum())))
        return real(self, batch)

    monkeypatch.setattr(Trainer, "update", spy)
    # the workers' completions count towards the budgets: 16 per step, so max_completions 40 ends the run after
    # step 3 of 4 (with nothing counted, it would run all 4 steps)
    cfg = Config.build({**tiny_args, "steps": 4, "generation_workers": 2, "generation_worker_cpus": 0.25,
                        "async_rollouts": True, "max_staleness": 1, "save_steps": 10, "max_completions": 40})
    tr = Trainer(cfg, log=lambda *a: None)
    ENGINES.append(tr.engine)
    summary = tr.train(progress=False)
    metrics = [json.loads(line) for line in open(tr.out / "metrics.jsonl")]
    assert [m["rollout_staleness"] for m in metrics] == [0.0, 1.0, 1.0]
    assert summary["stopped_by"].startswith("max_completions reached: 48")
    assert [m["generated_completions_total"] for m in metrics] == [16, 32, 48]
    assert [m["generated_tokens"] for m in metrics] == [tokens for _, _, tokens in seen]  # sampled on the workers
    assert summary["spent"]["tokens"] == sum(tokens for _, _, tokens in seen)
    assert seen[0][1] is None  # fresh: the workers' log-probs are the behaviour log-probs
    for staleness, w, _ in seen[1:]:
        assert set(staleness) == {1.0} and w is not None and float(w.max()) <= cfg.vllm_is_cap
    assert tr.engine.version == 2  # pushed after steps 1 and 2 (step 3's update needs no rollout)


def test_a_dead_worker_ends_the_run_with_a_sentence_and_a_resume_hint(parts, tmp_path, monkeypatch, capsys):
    """`grpolab train` whose rollout worker is killed after step 1's checkpoint: exit 1, one line naming the worker
    and the likely cause, the resume command, no traceback; the step-1 checkpoint is complete and loads."""
    from grpolab import cli
    from grpolab.train.checkpoint import checkpoint_dirs, load_latest
    from grpolab.train.trainer import Trainer

    real_sync = RayRolloutEngine.sync

    def kill_then_sync(self, model):  # the first push comes after step 1 (and its checkpoint)
        ENGINES.append(self)
        ray.kill(self.workers[0])
        return real_sync(self, model)

    monkeypatch.setattr(RayRolloutEngine, "sync", kill_then_sync)
    out = tmp_path / "run"
    rc = cli.main(["train", "--model", "tiny", "--task", "repeat", "--steps", "3", "--save_steps", "1", "--quiet",
                   "--prompts_per_step", "2", "--num_generations", "2", "--max_completion_length", "4",
                   "--eval_before", "false", "--eval_after", "false", "--tensorboard", "false",
                   "--generation_workers", "1", "--generation_worker_cpus", "0.25", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1, err
    said = [line for line in err.splitlines() if line.startswith("grpolab: error:")]
    assert len(said) == 1 and "Traceback" not in err and "ActorDiedError" not in err, err
    assert re.search(r"rollout worker 1 of 1 \(a Ray actor, pid \d+, ip \S+\) died while loading pushed weights: "
                     r"it was ended with ray.kill", said[0]), said
    assert f"grpolab train --resume {out}" in said[0], said
    assert [d.name for d in checkpoint_dirs(out)] == ["step_000001"]
    last, state = load_latest(out, Trainer(config(out=str(tmp_path / "fresh")), log=lambda *a: None).model,
                              log=lambda *a: None)
    assert last == checkpoint_dirs(out)[0] and state["step"] == 1


def test_why_a_worker_died_is_read_from_rays_message():
    """Ray 2.60's reports (seen here: ray.kill, and os._exit / SIGKILL of the actor's process; the memory
    monitor's from Ray's documentation) each give their own cause."""
    from grpolab.distributed.ray_workers import death_cause

    head = ("The actor died unexpectedly before finishing this task.\n\tclass_name: RolloutWorker\n\tactor_id: "
            "a234f211eacb0442bf40f55901000000\n\tpid: 21336\n\tip: 192.0.2.2\n")
    assert "ray.kill" in death_cause(head + "The actor is dead because it was killed by `ray.kill`.", False)
    abrupt = death_cause(head + "The actor is dead because its worker process has died. Worker exit type: "
                         "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. "
                         "End of file.", False)
    assert "out-of-memory killer" in abrupt and "generation_workers" in abrupt
    assert "memory monitor" in death_cause(head + "The actor is dead because its worker process has died. Worker "
                                           "exit type: NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due "
                                           "to the node running low on memory.", False)
    assert "preempted" in death_cause(head, True)
    assert death_cause(head + "Something new.", False) == "Ray's report ends: Something new."


def test_workers_sample_in_the_trainers_precision_and_compile_setting():
    """A worker samples under autocast in the dtype the trainer resolves (bfloat16 here): tokens and behaviour
    log-probs equal the trainer's own sampler under the same autocast, and differ from float32 sampling; the
    settings carry compile_decode, which the worker configures in its process. No Ray needed: the actor class."""
    from grpolab.distributed.ray_workers import RolloutWorker, worker_settings
    from grpolab.generation.fast_decode import COMPILE
    saved = dict(COMPILE)
    try:
        task = get_task("repeat")
        rows = task.train_rows[:4]
        model, tok = load_policy("tiny", task_texts=model_texts(rows), seed=0, log=lambda *a: None)
        s = worker_settings(config(dtype="bfloat16", compile_decode="off"))
        assert s["dtype"] == "bfloat16" and s["compile_decode"] == "off" and s["static_cache"] is True
        assert worker_settings(config(dtype="float32"))["dtype"] == "float32"
        ids = tok(render_prompt(tok, rows[0]["prompt"]), return_tensors="pt", add_special_tokens=False)["input_ids"]
        req = [{"prompt": ids[0].tolist(), "n": G, "temperature": 1.0, "seed": 11}]
        worker = RolloutWorker(model, tok, s)
        assert worker.compile_reason == "compile_decode off: eager decode step"
        got = worker.generate(req, 0)["groups"][0]
        expect = {}
        for dtype in (torch.bfloat16, torch.float32):
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                out = sample_completions(model, ids, torch.ones_like(ids), num_samples=G, max_new_tokens=MAX_LEN,
                                         eos_ids=eos_token_ids(tok, model), pad_id=tok.pad_token_id,
                                         temperature=1.0, generator=torch.Generator().manual_seed(11))
            expect[dtype] = [(out.completion_ids[i, :n].tolist(), out.logprobs[i, :n].tolist())
                             for i, n in enumerate(out.lengths.tolist())]
        assert [(ids_, lps) for ids_, lps, _ in got] == expect[torch.bfloat16]
        assert [lps for _, lps in expect[torch.bfloat16]] != [lps for _, lps in expect[torch.float32]]
    finally:
        COMPILE.clear()
        COMPILE.update(saved)
