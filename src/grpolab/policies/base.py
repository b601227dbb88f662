"""What the pipeline needs from a policy, and the capabilities components may ask of one.

A policy is the model being trained together with how it acts: it loads (or
builds) its network, says what one *step* of an action is, recomputes the
per-step log-probs of a batch's actions under given weights, and prepares its
network for training (LoRA, activation checkpointing). Every policy writes its
actions into the ``[rows, steps]`` layout of :class:`~grpolab.batch.RolloutBatch`
(``completion_ids``, ``completion_mask``, ``behavior_logprobs``; non-token
actions in ``step_data`` / ``row_data``), so masks, spans, per-step advantages
and loss aggregation keep one meaning: "per step".

Policies are registered in ``POLICIES`` (config key ``policy``); the causal
language model (``causal_lm``, policies/causal_lm/policy.py) is the default and the
one every text recipe trains. A component that only makes sense for some
policies declares what it needs at registration, ``register(name,
needs=("text",))``; selecting it with a policy that lacks a capability is a
start-up error naming the component, the capability and the policy
(``Config.validate``). Adding a kind of policy is one module in this package
plus its tests (docs/extending.md); the plan for image generators, diffusion
LMs, ... is docs/design/policies.md.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from ..errors import ConfigError
from ..generation.sampling import per_row
from ..registry import CAPABILITIES, POLICIES

__all__ = ["CAPABILITIES", "POLICIES", "PolicyBase", "check_own_sampler", "fanned_columns", "group_identity",
           "held_out_seed", "load_config_module", "repeat_rows", "reward_column", "save_config_module",
           "save_pretrained_folder", "saved_folder", "timed_pretraining"]


# ---------------------------------------------------------------- the group fan-out
# A policy's sample() draws counts[i] actions for row i (generation.sampling.completion_counts: one count for all
# rows or one per row, ragged groups) and packs them prompt-major: row i's actions follow row i-1's. Per-row
# lists: generation.sampling.per_row; per-action temperatures: generation.sampling.row_temperatures.

def repeat_rows(x: torch.Tensor, counts: list[int], dim: int = 0) -> torch.Tensor:
    """``x`` (one entry per row along ``dim``) with row ``i``'s entry repeated ``counts[i]`` times: one per
    action, prompt-major (``repeat_interleave``; the counts on ``x``'s device)."""
    return x.repeat_interleave(torch.tensor(counts, device=x.device), dim=dim)


def fanned_columns(rows: list[dict], counts: list[int]) -> dict[str, list]:
    """The rows' data columns (the first row's keys; a missing value is None), one entry per action: what
    ``RolloutBatch.columns`` carries to the reward functions."""
    return {k: per_row([r.get(k) for r in rows], counts) for k in rows[0]}


def group_identity(counts: list[int], uids: list[int], group_offset: int) -> dict[str, torch.Tensor]:
    """``group_ids`` (``group_offset + i`` for row ``i``'s actions) and ``prompt_uids`` (``uids[i]``), long, one
    per action: the two :class:`~grpolab.batch.RolloutBatch` fields that say which rows are compared
    (``RolloutBatch(..., **group_identity(counts, uids, group_offset))``)."""
    rep = torch.tensor(counts)
    return {"group_ids": torch.arange(group_offset, group_offset + len(counts)).repeat_interleave(rep),
            "prompt_uids": torch.tensor(uids, dtype=torch.long).repeat_interleave(rep)}


def held_out_seed(row: dict, uid: int, column: str = "noise_seed") -> int:
    """The seed of a held-out row's fixed random draws (an image policy's initial noise and step noises, a seeded
    evaluation's tokens), so that evaluations before and after training, and two ``grpolab eval`` runs of one
    model, draw the same for the same row: the row's ``column`` (``noise_seed``) where it has one; otherwise
    ``zlib.crc32`` of the UTF-8 text ``f"{uid}|{prompt}"``, ``uid`` being the row's index among the held-out rows
    (what ``train/evaluate.py`` passes) and ``prompt`` its ``prompt`` column (its ``label`` where it has no
    prompt; a non-string prompt as JSON). A stable hash, unlike Python's salted ``hash()``: the same on every
    process and machine; different rows (another index or another prompt) get different seeds. The one place
    this formula lives (docs/images.md)."""
    import json
    import zlib

    if row.get(column) is not None:
        return int(row[column])
    prompt = row.get("prompt", row.get("label", ""))
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return zlib.crc32(f"{int(uid)}|{text}".encode("utf-8"))


def check_own_sampler(cfg, reason: str) -> None:
    """The start-up checks of a token policy that samples in the trainer with its own sampler (speech, vision):
    rollout strategies other than ``plain`` (hints, injected text and tools continue a
    text prompt), except those that sample only whole data rows through ``ctx.generate`` (class attribute
    ``samples_rows = True``: e.g. ``difficulty_aug``, whose augmented rows keep their pictures), and ``top_k`` /
    ``top_p`` (the sampler draws from the full softmax) are refused; ``reason`` says why the text machinery does
    not apply (e.g. "transcribes audio")."""
    from ..config import ConfigError
    from ..registry import ROLLOUT_STRATEGIES
    strategy = ROLLOUT_STRATEGIES.get(cfg.rollout_strategy) if cfg.rollout_strategy in ROLLOUT_STRATEGIES else None
    if cfg.rollout_strategy != "plain" and not getattr(strategy, "samples_rows", False):
        raise ConfigError(f"rollout_strategy: '{cfg.rollout_strategy}' continues a text prompt (hints, injected "
                          f"text, tools); policy {cfg.policy} {reason}: use rollout_strategy: plain")
    if int(getattr(cfg, "top_k", 0) or 0) != 0 or float(getattr(cfg, "top_p", 1.0)) != 1.0:
        raise ConfigError(f"top_k / top_p: policy {cfg.policy} samples from the full softmax at the run's "
                          f"temperature (set top_k: 0 and top_p: 1.0)")


def reward_column(reward: str, column: str, values, n: int, holds: str, plural: str) -> list:
    """A reward function's data column ``values`` as a list of one entry per completion (``n``); a missing column
    is a ValueError ``reward '<reward>' needs the data column '<column>' (<holds>)``, a wrong length one saying
    ``<n> completions but <len> <plural>``."""
    if values is None:
        raise ValueError(f"reward '{reward}' needs the data column '{column}' ({holds})")
    values = list(values)
    if len(values) != n:
        raise ValueError(f"reward '{reward}': {n} completions but {len(values)} {plural}")
    return values


def save_config_module(module: torch.nn.Module, path) -> None:
    """Write a small built-in network to folder ``path``: ``config.json`` (``_class_name`` + ``module.config``,
    what its constructor takes) and ``model.safetensors``; :func:`load_config_module` reads it back."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"_class_name": type(module).__name__, **module.config},
                                                 indent=2) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()},
              str(path / "model.safetensors"))


def save_pretrained_folder(module, path, *companions):
    """Folder ``path`` (made when missing) with ``module.save_pretrained`` (safetensors) and each companion's
    ``save_pretrained`` (a tokenizer, a processor); the folder as a ``Path``, for the policy's own files."""
    from pathlib import Path

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    module.save_pretrained(path, safe_serialization=True)
    for companion in companions:
        companion.save_pretrained(path)
    return path


def saved_folder(model: str, policy: str, needed: tuple[str, ...], what: str, *, builds: str | None = None):
    """``model`` (a ``--model`` folder) as a ``Path`` holding every file of ``needed``; a missing one is a
    ConfigError ``model: policy <policy> loads <what>; <folder> has no <file>`` (with ``builds``: ``model: policy
    <policy> builds <builds> or loads <what>; ...``)."""
    from pathlib import Path

    from ..errors import ConfigError
    path = Path(model)
    verb = "loads" if builds is None else f"builds {builds} or loads"
    for name in needed:
        if not (path / name).exists():
            raise ConfigError(f"model: policy {policy} {verb} {what}; {path} has no {name}")
    return path


def timed_pretraining(seed: int, pretrain, *args):
    """``(outputs, meta)``: a built-in tiny model's pre-training ``pretrain(*args)`` (outputs: the model first, its
    loss curve last) and the ``meta.json`` fields of its cache folder: ``seed``, ``parameters``, ``loss_curve``,
    ``train_seconds`` (the pre-training's wall-clock time, saving excluded)."""
    import time

    t0 = time.perf_counter()
    out = pretrain(*args)
    seconds = time.perf_counter() - t0
    return out, {"seed": seed, "parameters": sum(p.numel() for p in out[0].parameters()), "loss_curve": out[-1],
                 "train_seconds": round(seconds, 2)}


def load_config_module(cls, path, policy: str):
    """``cls`` rebuilt from a folder :func:`save_config_module` wrote; ``(module, config)``. A folder saved for
    another class is a ConfigError naming ``policy``."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    from ..errors import ConfigError
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    if config.get("_class_name", cls.__name__) != cls.__name__:
        raise ConfigError(f"model: {path} holds a {config.get('_class_name')!r}, not a {cls.__name__} "
                          f"(policy {policy})")
    module = cls(**{k: v for k, v in config.items() if not k.startswith("_")})
    module.load_state_dict(load_file(str(path / "model.safetensors")))
    return module, config


class PolicyBase(ABC):
    """The interface every policy implements (the causal LM: policies/causal_lm/policy.py; a 40-line example in
    docs/extending.md). Required: :meth:`load` (build or load the network), :meth:`sample` (draw G actions per
    condition and pack them as a :class:`~grpolab.batch.RolloutBatch` with per-step behaviour log-probs),
    :meth:`forward` (recompute per-step log-probs of a micro-batch under given weights) and :meth:`save`. The
    rest has defaults.

    Class attributes: ``step`` (what one column of ``[rows, steps]`` is, e.g. "token"), ``capabilities``
    (a subset of :data:`CAPABILITIES`), ``description`` (one line, for errors and ``grpolab components``),
    ``steps_key`` (a policy with a fixed number of steps per training sample, e.g. a denoising sampler: the
    config key that sets it, e.g. ``flow_steps``; the stages that choose steps check against it at start-up).
    Instance attribute ``tokenizer``: the tokenizer of a text policy (``RolloutContext.tokenizer``), None for
    policies whose actions are not text. The frozen reference copy, the optimiser, DDP/FSDP2 and checkpoints
    are the trainer's and work on any ``torch.nn.Module`` the policy loads.
    """

    step: ClassVar[str] = "step"
    capabilities: ClassVar[frozenset[str]] = frozenset()
    description: ClassVar[str] = ""
    float32_only: ClassVar[bool] = False  # True: the trainer runs this policy in float32 whatever the dtype key
    steps_key: ClassVar[str | None] = None  # the config key of a training sample's number of steps (fixed T)
    #: True: the text generation engines (vLLM, Ray workers) may sample for this policy (the causal LM). False:
    #: it samples in the trainer, and selecting an engine is a start-up error (config.py, the one guard)
    text_engines: ClassVar[bool] = False
    tokenizer: Any = None

    @property
    def pad_id(self) -> int:
        """The filler of ``completion_ids`` past a row's last step when batches of different lengths are
        concatenated (``RolloutBatch.concat``); the mask is 0 there."""
        return 0

    @abstractmethod
    def load(self, cfg, rows: list[dict], eval_rows: list[dict], *, extra_texts=(), log=print):
        """Build or load the network for ``cfg.model`` and return it as a ``torch.nn.Module`` (set
        ``self.tokenizer`` for a text policy). ``rows`` / ``eval_rows`` are the run's data (a tiny model may
        size its vocabulary from them; ``extra_texts``: text the rollout shows besides the data)."""

    @abstractmethod
    def sample(self, module, rows: list[dict], uids: list[int], *, group_offset: int = 0,
               num_generations: int | list[int], temperature: float | list[float],
               generator: torch.Generator | None = None, evaluation: bool = False):
        """``num_generations`` actions for each row (one count per row: ragged groups), packed prompt-major as a
        :class:`~grpolab.batch.RolloutBatch`: group ids ``group_offset + i``, prompt uids ``uids``, per-step
        behaviour log-probs and masks, data columns repeated per action, ``columns["completion"]`` = what the
        reward functions receive. Every random draw comes from ``generator``. ``evaluation``: held-out
        evaluation (``temperature`` 0: the deterministic sampler)."""

    @abstractmethod
    def forward(self, module, mb, *, want: frozenset[str] = frozenset(), grad: bool = True) -> dict[str, Any]:
        """Per-step terms of micro-batch ``mb`` under ``module``: ``logprobs`` [R, T] (with gradients when
        ``grad``), plus the names in ``want`` that :meth:`offers` lists."""

    @abstractmethod
    def save(self, module, path) -> None:
        """Write ``module`` (safetensors) and what loading it needs into folder ``path``, so that ``--model
        path`` with this policy loads it."""

    def prepare(self, module):
        """The module to train: LoRA adapters, activation checkpointing (returns the module, maybe wrapped)."""
        return module

    def save_adapters(self, module, path) -> None:
        """With ``use_lora``: write the trained adapters of ``module`` (the PEFT-wrapped module, before merging)
        into ``path`` in the format the model's own library loads (an image pipeline: diffusers'
        ``pytorch_lora_weights.safetensors``). The merged model is saved by :meth:`save` beside it. Default:
        nothing (the merged model is the result)."""

    @classmethod
    def api_rows(cls, rows: list[dict], what: str) -> list[dict]:
        """Rows given from Python (``grpolab.GRPOTrainer``'s datasets) in the form ``--data`` rows take: they
        travel as JSONL through the same checks, so a policy whose rows may hold Python objects (an environment
        instance, ...) names them here. Default: the rows as they are."""
        return rows

    def perturb_inputs(self, row: dict, strength: float, generator: torch.Generator) -> dict:
        """A copy of ``row`` whose non-text input (pictures, frames) is degraded with ``strength`` (>= 0), drawing
        from ``generator``: DeepVideo-R1's difficulty-increasing augmentation (rollout ``difficulty_aug`` with
        ``dva_perturb: frames``). The default: the policy has no such input, a configuration error naming it (the
        rollout's start-up check refuses ``dva_perturb: frames`` for a policy without capability ``vision``
        first; this is for a vision policy that has no frames to degrade)."""
        raise ConfigError(f"dva_perturb: frames: policy {type(self).__name__} has no non-text input to perturb; "
                          f"use dva_perturb: text")

    def offers(self) -> frozenset[str]:
        """Names besides ``logprobs`` that :meth:`forward` can return (loss components ask for them by name)."""
        return frozenset()

    def describe(self, batch, i: int) -> dict:
        """Row ``i`` of ``batch`` for the completions log and the report: ``prompt`` and ``completion`` as
        text (a policy whose actions are not text adds e.g. ``image``, a data URI)."""
        prompt, completion = batch.columns.get("prompt"), batch.columns.get("completion")
        return {"prompt": "" if prompt is None else str(prompt[i]),
                "completion": "" if completion is None else str(completion[i])}

    def render(self, batch) -> torch.Tensor | None:
        """The pictures of ``batch``'s rows, one per row, as float images ``[R, C, H, W]`` in [0, 1] (media.py's
        convention), or None when the policy's actions are not pictures. The held-out evaluation's grid
        (``image_grid`` in summary.json and the report, instead of text samples: train/evaluate.py) and the
        trackers' ``samples`` images beside the completions log (the trainer) show them.

        The default is ``batch.row_data["images"]`` where the batch has it (None otherwise): every image kind
        keeps its decoded samples there (capability ``images``), so none needs to override this; a kind whose
        pictures live elsewhere, or that draws them on demand, does."""
        return batch.row_data.get("images")

    @torch.no_grad()
    def logprobs(self, module, batch, *, micro_batch_size: int, max_tokens: int = 0) -> torch.Tensor:
        """Per-step log-probs [R, T] of ``batch``'s actions under ``module``, without gradients, micro-batched
        (the behaviour log-probs of injected steps, the reference pass); 0 off the action mask."""
        parts = [self.forward(module, mb, grad=False)["logprobs"]
                 for mb in batch.micro_batches(micro_batch_size, trim=False, max_tokens=max_tokens)]
        return torch.cat(parts).to(batch.completion_attention_mask.device) * batch.completion_attention_mask
