"""Generation engines: who samples the trainer's completions, built by name outside the trainer.

Without one (``generation_engine: native``, ``generation_workers: 0``) the trainer samples with grpolab's
KV-cache sampler in its own process. Otherwise :func:`build_engine` builds the engine the config selects
from the builders registered in :data:`~grpolab.registry.GENERATION_ENGINES`:

- ``vllm``: a colocated vLLM engine (:mod:`grpolab.generation.vllm_engine`),
- ``vllm_server``: ``grpolab vllm-serve`` servers at ``vllm_server_url`` (:mod:`grpolab.generation.vllm_server`),
- ``ray`` (``generation_workers > 0``): Ray actors, each a generation engine, registered by
  :mod:`grpolab.distributed.ray_workers` (the catalogue imports it, so ``import grpolab`` knows it).

A builder is ``builder(cfg, model, tokenizer, *, log, rank, world_size) -> engine``; the engine is what the
:class:`~grpolab.rollouts.context.RolloutContext` samples through (``rollout``, ``continue_``, ``sync``).
The trainer calls :func:`build_engine` and never imports an engine, so the algorithm core stays free of
vLLM and Ray and a user's own engine joins the same way (``@GENERATION_ENGINES.register("mine")``).
"""
from __future__ import annotations

from ..config import engine_name
from ..errors import ConfigError
from ..registry import GENERATION_ENGINES

__all__ = ["GENERATION_ENGINES", "build_engine", "engine_name"]


def build_engine(cfg, model, tokenizer, *, log, rank: int = 0, world_size: int = 1):
    """The generation engine ``cfg`` selects, built on ``model`` / ``tokenizer`` (None: the trainer samples)."""
    name = engine_name(cfg)
    if name is None:
        return None
    if name not in GENERATION_ENGINES:
        raise ConfigError(f"generation engine '{name}' is not registered (registered: "
                          f"{', '.join(GENERATION_ENGINES.names()) or 'none'}); 'ray' is registered by "
                          f"grpolab.distributed.ray_workers, which `import grpolab` imports")
    return GENERATION_ENGINES.get(name)(cfg, model, tokenizer, log=log, rank=rank, world_size=world_size)


@GENERATION_ENGINES.register("vllm")
def vllm_engine(cfg, model, tokenizer, *, log, rank, world_size):
    """A colocated vLLM engine that loads the policy's weights from disk (GPU; pip install 'grpolab[vllm]')."""
    from .vllm_engine import VLLMEngine, engine_model_path
    return VLLMEngine(engine_model_path(cfg), gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                      max_model_len=cfg.vllm_max_model_len, dtype=cfg.vllm_dtype, seed=cfg.seed,
                      enforce_eager=cfg.vllm_enforce_eager)


@GENERATION_ENGINES.register("vllm_server")
def vllm_server_engine(cfg, model, tokenizer, *, log, rank, world_size):
    """This rank's ``grpolab vllm-serve`` servers at ``vllm_server_url`` (docs/scaling.md)."""
    from .vllm_server import VLLMServerEngine
    return VLLMServerEngine(cfg.vllm_server_url, timeout=cfg.vllm_server_timeout, rank=rank, world_size=world_size)
