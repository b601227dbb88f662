"""Rollout workers on Ray: ``generation_workers: N`` generation engines as Ray actors.

Ray places the actors (``ray.remote``); grpolab only decides what each one
samples and which weights it holds. Each actor holds one generation engine:
grpolab's KV-cache sampler on a copy of the policy, or (``generation_engine:
vllm``) a :class:`~grpolab.generation.vllm_engine.VLLMEngine`.

**Seeds.** Group ``g`` of step ``s`` is sampled by one actor with its own
generator, seeded :func:`group_seed` ``(seed, s, g)``, from its own prompt
(unpadded, so no other prompt's padding enters its forward). A group's
completions therefore depend on (step, group) only — not on how many
workers there are nor on which one draws it: 2 workers give the batch 1
worker gives (tests/test_ray_workers.py).

**Weights.** The trainer pushes its trainable weights after every update
(:meth:`RayRolloutEngine.sync`; one ``ray.put``, every actor loads it) and
stamps them with a version (the number of pushes; the initial weights are
version 0). A request carries the oldest version it accepts, ``current -
max_staleness``; an actor holding older weights refuses it
(:class:`StaleWeightsError`) instead of sampling.

**Asynchronous rollouts** (``async_rollouts: true``, one step ahead): right
after step ``t``'s batch is collected, the trainer draws step ``t+1``'s
prompts and the actors sample them (:meth:`RayRolloutEngine.prefetch`) while
step ``t`` trains, so step ``t+1`` trains on completions of the weights one
version older (``rollout_staleness`` = 1). The existing off-policy
correction of the engine path (``generation/vllm_engine.py``) is applied to
every batch that was not sampled by the trainer's current weights (stale, or
sampled by vLLM): the trainer recomputes pi_old with its own forward (the
ratio's anchor) and each token gets the truncated importance weight
``min(exp(logp_trainer - logp_worker), vllm_is_cap)`` against the worker's
behaviour log-probs (``importance_weights``; TRL's token_truncate, Yao et al.
2025). A fresh batch of the built-in sampler keeps the worker's log-probs as
its behaviour log-probs, like a local rollout.

**A worker that dies** (out of memory, a lost machine, ``ray.kill``) ends the run with
:class:`~grpolab.errors.RolloutWorkerDied`: one sentence naming the worker, the cause read from Ray's report
and ``grpolab train --resume OUT`` (the checkpoints are written by the trainer, never by a worker, so the last
one is intact).

Multi-node is the same code: ``ray start --head`` on one machine, ``ray start
--address HEAD:6379`` on the others, ``ray_address: auto`` (docs/distributed.md).
"""
from __future__ import annotations

import copy
import re

import torch

from ..data import tokenize_prompts
from ..errors import RolloutWorkerDied
from ..generation.counting import GENERATED
from ..generation.plain import eos_token_ids, pack_completions
from ..generation.sampling import completion_counts, per_prompt, sample_completions
from ..generation.turns import continue_sequences
from ..generation.vllm_engine import importance_weights
from ..registry import GENERATION_ENGINES
from ..rollouts.context import group_seed


class StaleWeightsError(RuntimeError):
    """A worker was asked to sample with weights newer than the ones it holds."""


def import_ray():
    try:
        import ray
    except ImportError as e:
        raise RuntimeError("generation_workers > 0 needs Ray: pip install 'grpolab[ray]' (or set "
                           "generation_workers: 0 to sample in the trainer's process)") from e
    return ray


def worker_settings(cfg) -> dict:
    """What each :class:`RolloutWorker` samples with, from the config: the trainer's sampler settings, the
    forward precision the trainer resolves for ``dtype`` on the workers' device (so behaviour log-probs come
    from the precision the loss is computed in) and ``compile_decode``."""
    from ..devices import resolve_dtype
    device = torch.device("cuda" if cfg.generation_worker_gpus > 0 and torch.cuda.is_available() else "cpu")
    return {"max_new_tokens": cfg.max_completion_length, "top_k": cfg.top_k, "top_p": cfg.top_p,
            "sampling_method": cfg.sampling_method, "static_cache": cfg.static_kv_cache,
            "compile_decode": cfg.compile_decode,
            "dtype": str(resolve_dtype(cfg.dtype, device)).removeprefix("torch."),
            "threads": max(1, int(cfg.generation_worker_cpus)), "gpus": cfg.generation_worker_gpus}


class RolloutWorker:
    """One generation engine (what a Ray actor holds): a copy of the policy, or a vLLM engine.

    ``settings`` (:func:`worker_settings`): ``max_new_tokens``, ``top_k``, ``top_p``, ``sampling_method``,
    ``static_cache``, ``compile_decode``, ``dtype`` (the forward precision: bfloat16 / float16 sample under
    autocast, like the trainer's own sampler), ``threads``, ``gpus`` (> 0: the policy copy samples on the
    actor's GPU). ``engine_factory`` (a picklable zero-argument callable) builds a vLLM-like engine in the
    actor (``generate``, ``continue_``, ``sync``); then the policy copy only receives the pushed weights and
    hands them to it.
    """

    def __init__(self, model, tokenizer, settings: dict, engine_factory=None):
        from ..devices import DTYPES
        from ..generation.fast_decode import configure_compile
        torch.set_num_threads(max(1, int(settings.get("threads", 1))))
        self.model = model.eval().requires_grad_(False)
        if settings.get("gpus", 0) > 0 and engine_factory is None and torch.cuda.is_available():
            self.model.to("cuda")  # the GPU Ray gave this actor (CUDA_VISIBLE_DEVICES is set by Ray)
        self.dtype = DTYPES[settings.get("dtype", "float32")]
        self.compile_reason = configure_compile(settings.get("compile_decode", "off"), log=lambda *a: None)
        self.tok = tokenizer
        self.s = settings
        self.eos = eos_token_ids(tokenizer, model)
        self.version = 0
        self.engine = engine_factory() if engine_factory is not None else None

    def precision(self):
        """Autocast in the trainer's forward precision (a no-op for float32), as the trainer samples."""
        from ..devices import autocast
        return autocast(next(self.model.parameters()).device, self.dtype)

    def check(self, min_version: int) -> None:
        if self.version < min_version:
            raise StaleWeightsError(f"rollout worker holds weights version {self.version}, older than the "
                                    f"oldest the trainer accepts ({min_version}, max_staleness); push weights "
                                    f"with sync() before sampling")

    def load_weights(self, state: dict, version: int) -> int:
        """Load the pushed trainable weights (``{name: tensor}``) and take their version."""
        missing = sorted(set(state) - set(dict(self.model.named_parameters())))
        if missing:
            raise KeyError(f"pushed weights name parameters the worker's policy lacks: {missing[:5]}")
        with torch.no_grad():
            params = dict(self.model.named_parameters())
            for name, t in state.items():
                params[name].copy_(t)
        if self.engine is not None:
            merged = copy.deepcopy(self.model)  # vLLM takes merged weights; LoRA merging changes the model
            self.engine.sync(merged)
        self.version = int(version)
        return self.version

    def weights(self) -> dict:
        """Every parameter of the worker's policy copy (``{name: tensor}``), for checks."""
        return {n: p.detach().cpu().clone() for n, p in self.model.named_parameters()}

    def generate(self, requests: list[dict], min_version: int) -> dict:
        """Each request ``{prompt: ids, n, temperature, seed}`` -> ``n`` completions ``(ids, log-probs, finished)``.

        Returns ``{"version": weights version used, "groups": [[(ids, lps, finished), ...], ...], "generated":
        (completions, tokens) sampled for this call}`` (the trainer adds them to its tally: budgets).
        """
        self.check(min_version)
        s = self.s
        before = GENERATED.snapshot()
        groups = []
        for r in requests:
            if self.engine is not None:
                groups.append(self.engine.generate([r["prompt"]], [r["n"]], temperature=r["temperature"],
                                                   top_k=s["top_k"], top_p=s["top_p"],
                                                   max_tokens=s["max_new_tokens"], seed=r["seed"]))
                continue
            ids = torch.tensor([r["prompt"]], dtype=torch.long)
            with self.precision():
                out = sample_completions(self.model, ids, torch.ones_like(ids), num_samples=r["n"],
                                         max_new_tokens=s["max_new_tokens"], eos_ids=self.eos,
                                         pad_id=self.tok.pad_token_id, temperature=r["temperature"],
                                         top_k=s["top_k"], top_p=s["top_p"],
                                         generator=torch.Generator().manual_seed(r["seed"]),
                                         method=s["sampling_method"], static_cache=s["static_cache"])
            groups.append([(out.completion_ids[i, :n].tolist(), out.logprobs[i, :n].tolist(),
                            not bool(out.truncated[i])) for i, n in enumerate(out.lengths.tolist())])
        return {"version": self.version, "groups": groups, "generated": self._generated_since(before)}

    @staticmethod
    def _generated_since(before: tuple[int, int]) -> tuple[int, int]:
        """``(completions, tokens)`` this actor sampled since ``before`` (its process's tally; an actor runs one
        call at a time)."""
        (c0, t0), (c1, t1) = before, GENERATED.snapshot()
        return c1 - c0, t1 - t0

    def continue_(self, requests: list[dict], min_version: int) -> dict:
        """Each ``{context, max_tokens, temperature, seed}`` -> ``(ids, lps, finish_reason, stop_reason)`` (vLLM's).

        Returns ``{"outputs": [...], "generated": (completions, tokens)}``."""
        self.check(min_version)
        s, out = self.s, []
        before = GENERATED.snapshot()
        for r in requests:
            if self.engine is not None:
                out += self.engine.continue_([r["context"]], max_tokens=[r["max_tokens"]],
                                             temperature=[r["temperature"]], top_k=s["top_k"], top_p=s["top_p"],
                                             stop=r["stop"], stop_token_ids=r["stop_token_ids"], seed=r["seed"])
                continue
            with self.precision():
                c = continue_sequences(self.model, self.tok, [r["context"]], max_new_tokens=r["max_tokens"],
                                       temperature=r["temperature"], top_k=s["top_k"], top_p=s["top_p"],
                                       generator=torch.Generator().manual_seed(r["seed"]),
                                       stop_token_ids=r["stop_token_ids"], stop_strings=r["stop"],
                                       sampling_method=s["sampling_method"], static_cache=s["static_cache"])
            ids, reason = c.ids[0], c.finish_reasons[0]
            stop_reason = {"stop_string": "stop string", "stop_token": ids[-1] if ids else None}.get(reason)
            out.append((ids, c.logprobs[0], "length" if reason == "length" else "stop", stop_reason))
        return {"outputs": out, "generated": self._generated_since(before)}


class RayRolloutEngine:
    """``generation_workers`` Ray actors, each a :class:`RolloutWorker`; used through the RolloutContext.

    ``rollout`` (the context's ``generate``) and ``continue_`` (its ``continue_``)
    split the requests over the actors and reassemble them in order; ``sync``
    pushes weights; ``prefetch`` starts the next step's rollout early
    (``async_rollouts``). Ray is started by the engine (``ray.init(address=
    ray_address)``) unless the caller already did.
    """

    def __init__(self, cfg, model, tokenizer, *, log=print, engine_factory=None):
        ray = import_ray()
        self.ray, self.cfg, self.tok, self.log = ray, cfg, tokenizer, log
        if not ray.is_initialized():
            ray.init(address=cfg.ray_address, include_dashboard=False, log_to_driver=False)
        if engine_factory is None and cfg.generation_engine == "vllm":
            engine_factory = vllm_factory(cfg)
        self.uses_engine = engine_factory is not None
        settings = worker_settings(cfg)
        total = ray.cluster_resources()
        for res, per in (("CPU", cfg.generation_worker_cpus), ("GPU", cfg.generation_worker_gpus)):
            if cfg.generation_workers * per > total.get(res, 0.0) + 1e-9:
                key = f"generation_worker_{res.lower()}s"
                raise RuntimeError(f"generation_workers {cfg.generation_workers} x {key} {per} = "
                                   f"{cfg.generation_workers * per:g} {res}s, but the Ray cluster has "
                                   f"{total.get(res, 0.0):g}: lower {key} (fractions are allowed) or "
                                   f"generation_workers, or add machines (ray start --address HEAD:6379)")
        actor = ray.remote(num_cpus=cfg.generation_worker_cpus, num_gpus=cfg.generation_worker_gpus)(RolloutWorker)
        model_ref = ray.put(copy.deepcopy(model).cpu())
        self.workers = [actor.remote(model_ref, tokenizer, settings, engine_factory)
                        for _ in range(cfg.generation_workers)]
        self.actor_ids = [w._actor_id.hex() for w in self.workers]  # "worker k of N" in error messages
        self.version = 0
        self.max_staleness = cfg.max_staleness
        self.async_rollouts = cfg.async_rollouts
        self.pending = None  # (key, futures, assignment) of a prefetched rollout
        self.syncs = 0
        log(f"[grpolab] {len(self.workers)} rollout worker(s) on Ray "
            f"({'vLLM' if self.uses_engine else 'built-in sampler'}; "
            f"{'one step ahead, ' if self.async_rollouts else ''}max_staleness {self.max_staleness})")

    # ------------------------------------------------------------- weights
    @torch.no_grad()
    def sync(self, model) -> None:
        """Push the trainable weights to every worker (waits until all have loaded them); a new version."""
        state = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
        self.version += 1
        ref = self.ray.put(state)
        self._get([w.load_weights.remote(ref, self.version) for w in self.workers], "loading pushed weights")
        self.syncs += 1

    def close(self) -> None:
        """End the worker actors (their resources go back to the Ray cluster; Ray itself keeps running)."""
        for w in self.workers:
            self.ray.kill(w)
        self.workers = []

    def worker_weights(self) -> list[dict]:
        return self._get([w.weights.remote() for w in self.workers], "sending its weights")

    def min_version(self) -> int:
        return self.version - self.max_staleness

    # ------------------------------------------------------------ rollouts
    def _split(self, items: list) -> list[list[int]]:
        """Indices of ``items`` per worker (round robin)."""
        return [list(range(k, len(items), len(self.workers))) for k in range(len(self.workers))]

    def _requests(self, ctx, rows, *, step, group_offset, num_generations, temperature):
        cfg = ctx.cfg
        counts = completion_counts(cfg.num_generations if num_generations is None else num_generations, len(rows))
        temps = [float(t) for t in per_prompt(cfg.temperature if temperature is None else temperature,
                                              len(rows), "temperature")]
        prompt_ids, prompt_mask = tokenize_prompts(self.tok, [r["prompt"] for r in rows], cfg.max_prompt_length)
        reqs = [{"prompt": ids[m.bool()].tolist(), "n": c, "temperature": t,
                 "seed": group_seed(cfg.seed, step, group_offset + i)}
                for i, (ids, m, c, t) in enumerate(zip(prompt_ids, prompt_mask, counts, temps))]
        return reqs, counts, temps, prompt_ids, prompt_mask

    def _get(self, futures: list, doing: str) -> list:
        """``ray.get(futures)``; a dead worker raises :class:`RolloutWorkerDied` with one sentence instead of Ray's
        report."""
        try:
            return self.ray.get(futures)
        except self.ray.exceptions.RayActorError as e:
            raise RolloutWorkerDied(self._death_message(e, doing)) from None

    def _death_message(self, e, doing: str) -> str:
        """Which worker died (``k of N``, its pid and address), why (:func:`death_cause`), and the resume command."""
        ids = self.actor_ids
        which = f"rollout worker {ids.index(e.actor_id) + 1} of {len(ids)}" if e.actor_id in ids else "a rollout worker"
        text = str(e)
        where = ", ".join(f"{k} {m.group(1)}" for k in ("pid", "ip")
                          if (m := re.search(rf"^\s*{k}: (\S+)", text, re.MULTILINE)))
        cause = death_cause(text, bool(getattr(e, "preempted", False)))
        return (f"{which} (a Ray actor{', ' + where if where else ''}) died while {doing}: {cause}. The checkpoints "
                f"are the trainer's, so the last one is intact: continue the run with `grpolab train --resume "
                f"{self.cfg.out}`")

    def _submit(self, reqs):
        parts = self._split(reqs)
        futures = [w.generate.remote([reqs[i] for i in idx], self.min_version())
                   for w, idx in zip(self.workers, parts) if idx]
        return futures, [idx for idx in parts if idx]

    def prefetch(self, ctx, rows, uids, *, step, group_offset, num_generations=None, temperature=None) -> None:
        """Start sampling step ``step``'s rollout now (with the workers' current weights); :meth:`rollout` takes it."""
        reqs, counts, temps, _, _ = self._requests(ctx, rows, step=step, group_offset=group_offset,
                                                   num_generations=num_generations, temperature=temperature)
        key = (step, tuple(uids), group_offset, tuple(counts), tuple(temps))
        self.pending = (key, *self._submit(reqs))

    def rollout(self, ctx, rows, uids, *, group_offset, num_generations=None, temperature=None):
        """The RolloutBatch of ``rows`` (the prefetched one when it is this request), with staleness and corrections."""
        reqs, counts, temps, prompt_ids, prompt_mask = self._requests(
            ctx, rows, step=ctx.step, group_offset=group_offset, num_generations=num_generations,
            temperature=temperature)
        key = (ctx.step, tuple(uids), group_offset, tuple(counts), tuple(temps))
        if self.pending is not None:
            pending_key, futures, parts = self.pending
            self.pending = None
            if pending_key != key:
                raise RuntimeError(f"async_rollouts: the step's rollout asked for other prompts than the ones "
                                   f"prefetched (step {key[0]}, prompts {list(key[1])} vs step {pending_key[0]}, "
                                   f"prompts {list(pending_key[1])}); asynchronous rollouts need a strategy that "
                                   f"generates the sampled prompts as they are (rollout_strategy: plain)")
        else:
            futures, parts = self._submit(reqs)
        results = self._get(futures, "sampling")
        count_generated(results)
        groups: list = [None] * len(reqs)
        row_version: list = [None] * len(reqs)
        for res, idx in zip(results, parts):
            for i, g in zip(idx, res["groups"]):
                groups[i], row_version[i] = g, res["version"]
        outs = [o for g in groups for o in g]
        versions = [v for g, v in zip(groups, row_version) for _ in g]
        staleness = [self.version - v for v in versions]
        if max(staleness) > self.max_staleness:
            raise StaleWeightsError(f"a rollout was sampled with weights {max(staleness)} versions old, more than "
                                    f"max_staleness {self.max_staleness}")
        T = max(1, max(len(o[0]) for o in outs))
        ids = torch.full((len(outs), T), self.tok.pad_token_id, dtype=torch.long)
        lps = torch.zeros(len(outs), T)
        lengths = torch.zeros(len(outs), dtype=torch.long)
        for i, (t, lp, _) in enumerate(outs):
            ids[i, :len(t)] = torch.tensor(t, dtype=torch.long)
            lps[i, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
            lengths[i] = len(t)
        truncated = torch.tensor([not fin for _, _, fin in outs])
        batch = pack_completions(self.tok, rows, uids, prompt_ids, prompt_mask, counts, ids, lps, lengths,
                                 truncated, group_offset=group_offset)
        batch.columns["rollout_staleness"] = [float(s) for s in staleness]
        if self.uses_engine or max(staleness) > 0:  # not sampled by the trainer's current weights: correct it
            trainer_lp = ctx.logprobs(batch)
            mask = batch.completion_attention_mask.float()
            batch.token_weights = importance_weights(trainer_lp, batch.behavior_logprobs, mask, ctx.cfg.vllm_is_cap)
            batch.columns["engine_logprob_mismatch"] = ((trainer_lp - batch.behavior_logprobs).abs() * mask).sum(
                -1).div(mask.sum(-1).clamp(min=1)).tolist()
            batch.behavior_logprobs = trainer_lp
        return batch

    def continue_(self, contexts: list[list[int]], *, max_tokens: list[int], temperature: list[float], top_k: int,
                  top_p: float, stop=(), stop_token_ids=(), seed: int | None = None) -> list:
        """One continuation per context, split over the workers (the VLLMEngine interface; request ``i`` seeded
        ``seed + i``)."""
        base = 0 if seed is None else int(seed)
        reqs = [{"context": list(c), "max_tokens": int(m), "temperature": float(t), "seed": base + i,
                 "stop": list(stop), "stop_token_ids": list(stop_token_ids)}
                for i, (c, m, t) in enumerate(zip(contexts, max_tokens, temperature))]
        parts = [idx for idx in self._split(reqs) if idx]
        futures = [w.continue_.remote([reqs[i] for i in idx], self.min_version())
                   for w, idx in zip(self.workers, parts)]
        out: list = [None] * len(reqs)
        results = self._get(futures, "sampling")
        count_generated(results)
        for res, idx in zip(results, parts):
            for i, r in zip(idx, res["outputs"]):
                out[i] = r
        return out


@GENERATION_ENGINES.register("ray")
def ray_engine(cfg, model, tokenizer, *, log, rank, world_size) -> RayRolloutEngine:
    """``generation_workers > 0``: the Ray rollout workers (grpolab/generation/engines.py builds it by name)."""
    return RayRolloutEngine(cfg, model, tokenizer, log=log)


def death_cause(report: str, preempted: bool) -> str:
    """The likely cause of a worker's death, from Ray's report (``str`` of its ``ActorDiedError``), and the fix."""
    low = report.lower()
    if preempted or "preempt" in low:
        return "its machine was preempted (taken back by the cluster); the run resumes once the cluster has room"
    if "ray.kill" in low:
        return "it was ended with ray.kill (by another program or an operator)"
    if "low on memory" in low or "memory monitor" in low or "outofmemory" in low:
        return ("out of memory: Ray's memory monitor killed it as its machine ran low on memory; give the workers "
                "more memory, fewer generation_workers per machine or a smaller max_completion_length")
    if "creation task" in low:
        return f"it failed while starting ({report.strip().splitlines()[0][:300]})"
    if "worker process has died" in low or "connection error" in low:
        return ("its process ended abruptly, most likely killed by the kernel's out-of-memory killer (each worker "
                "holds a copy of the policy and its KV cache; `dmesg` on its machine shows OOM kills), else a "
                "crash (SIGSEGV) or `ray stop --force`; if memory, use fewer generation_workers per machine or a "
                "smaller max_completion_length")
    return f"Ray's report ends: {report.strip().splitlines()[-1][:300]}"


def count_generated(results: list[dict]) -> None:
    """Add what the workers sampled for ``results`` to this process's tally (:mod:`grpolab.train.budget` reads it
    around each step): the workers' own tallies live in their processes. A prefetched rollout is counted by the
    step that takes it; one the run ends before taking is not."""
    for res in results:
        GENERATED.add(*res["generated"])


class vllm_factory:
    """Builds a :class:`~grpolab.generation.vllm_engine.VLLMEngine` inside a worker (picklable)."""

    def __init__(self, cfg):
        from ..generation.vllm_engine import engine_model_path
        self.path = engine_model_path(cfg)
        self.kwargs = dict(gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                           max_model_len=cfg.vllm_max_model_len, dtype=cfg.vllm_dtype, seed=cfg.seed)

    def __call__(self):
        from ..generation.vllm_engine import VLLMEngine
        return VLLMEngine(self.path, **self.kwargs)
