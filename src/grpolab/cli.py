"""grpolab command line: train, eval, sft, recipes, config, components (and bench)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _kv_pairs(tokens: list[str], valid: list[str]) -> dict[str, str]:
    """``--key value`` / ``--key=value`` pairs; unknown keys list the valid ones."""
    from .errors import ConfigError

    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise ConfigError(f"unexpected argument '{tok}'; options are --key value")
        key, eq, value = tok[2:].partition("=")
        key = key.replace("-", "_")
        if not eq:
            if i + 1 >= len(tokens) or (tokens[i + 1].startswith("--") and not _is_number(tokens[i + 1])):
                raise ConfigError(f"--{key} needs a value")
            value = tokens[i + 1]
            i += 1
        out[key] = value
        i += 1
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


# `grpolab train` options listed in --help (any other config key is accepted as --key value too); the help text
# is the key's own (config.py), so it is written once
TRAIN_OPTIONS = ["model", "task", "data", "steps", "out", "learning_rate", "num_generations", "prompts_per_step",
                 "max_completion_length", "max_prompt_length", "temperature", "beta", "advantage", "policy_loss",
                 "loss_aggregation", "save_steps", "seed", "device", "stall_steps"]
# what `--resume` may change: how long the run goes on and what it logs, never what it trains
RESUME_OVERRIDES = ["steps", "save_steps", "save_total_limit", "eval_after", "eval_problems", "eval_batch_size",
                    "tensorboard", "threads", "device", "stall_steps", "reward_timeout", "report_to",
                    "log_completions_steps", "log_completions_groups", "distributed_strategy"]


def _options_of(args, cli: dict) -> dict:
    """``cli`` plus the config keys given as `grpolab train` options (``TRAIN_OPTIONS``)."""
    out = dict(cli)
    for key in TRAIN_OPTIONS:
        value = getattr(args, key, None)
        if value is not None:
            out[key] = value
    if getattr(args, "reward", None):
        out["reward"] = args.reward
    if getattr(args, "tools", None):
        out["tools"] = ",".join(args.tools)
    if getattr(args, "env", None):
        out["environment"] = args.env
    return out


def select_agent_strategy(*layers: dict) -> None:
    """Tools or an environment (``tools`` / ``environment`` keys, or a task that brings its environment) select
    the ``agent`` rollout strategy when no layer names a strategy (set in the last layer; see :func:`grpolab.agents.rollout.strategy_for_agents`)."""
    from .agents.rollout import strategy_for_agents
    from .tasks.base import task_provides_environment

    merged = {k.replace("-", "_"): v for layer in layers for k, v in (layer or {}).items()}
    given = [k for k in ("tools", "environment") if merged.get(k)]
    if not given and task_provides_environment(merged.get("task")):  # an agent task brings its environment
        given = ["environment"]
    strategy = strategy_for_agents(merged.get("rollout_strategy"), given)
    if strategy is not None:
        layers[-1]["rollout_strategy"] = strategy


def _recipe_layers(args, cli: dict) -> tuple[str | None, dict, dict]:
    """``(recipe, recipe keys, --config keys)``. The recipe is ``--recipe`` if given, else the ``recipe:`` of
    the --config file: the command line wins over the file, for the recipe as for every key."""
    from .config import load_yaml

    file_cfg = load_yaml(args.config) if args.config else {}
    recipe = args.recipe or cli.get("recipe") or file_cfg.get("recipe")
    if recipe:
        cli["recipe"] = recipe  # config.yaml names the recipe that was trained
        return recipe, recipe_layer(recipe, file_cfg, cli), file_cfg
    return None, task_run_defaults(file_cfg, cli), file_cfg


def task_run_defaults(*user_layers: dict) -> dict:
    """A run with no recipe and no --data: the built-in task's own settings (``run_defaults``; the default job's
    on ``arithmetic``: tasks/arithmetic.py), as the lowest layer, so any option or --config key wins."""
    from .config import Config
    from .registry import TASKS
    merged = {k.replace("-", "_"): v for layer in user_layers for k, v in (layer or {}).items()}
    task = merged.get("task") or Config.task
    if merged.get("data") or not isinstance(task, str) or task not in TASKS:
        return {}
    return dict(getattr(TASKS.get(task), "run_defaults", {}))


def recipe_layer(recipe: str, *user_layers: dict) -> dict:
    """The recipe's keys for a run whose own settings are ``user_layers``: on --data, its method settings only,
    and its method rewards (e.g. pm4grpo's) added to the user's reward functions (docs/data.md)."""
    from .recipes import method_rewards, recipe_overrides
    merged = {k.replace("-", "_"): v for layer in user_layers for k, v in (layer or {}).items()}
    if not merged.get("data"):
        return recipe_overrides(recipe)
    user_rewards = merged.get("reward")
    if user_rewards and method_rewards(recipe):
        if isinstance(user_rewards, str):
            user_rewards = [user_rewards]
        user_layers[-1]["reward"] = list(user_rewards) + [r for r in method_rewards(recipe) if r not in user_rewards]
    return recipe_overrides(recipe, user_data=True)


def _resume_config(args, cli: dict):
    """The saved configuration of the run in ``--resume OUT``, with the overrides a resume allows
    (``RESUME_OVERRIDES``); anything that would change what the run trains is refused."""
    from .config import Config, ConfigError, load_yaml
    from .registry import REPLACED_KEYS, replaced_key_note

    from .train.rundir import python_resume
    from .train.runlock import RunLock

    out = Path(args.resume)
    RunLock(out).check()  # another process trains in it: refused, naming it (train/runlock.py)
    if python_resume(out):
        raise ConfigError(f"--resume {out}: this run was started from the Python API (GRPOTrainer), whose reward "
                          f"functions, datasets and callbacks are Python objects that the run folder does not hold; "
                          f"continue it from Python: {python_resume(out)} (docs/python_api.md, 'Resuming a run')")
    saved = out / "config.yaml"
    if not saved.exists():
        raise ConfigError(f"--resume {args.resume}: no config.yaml there; is it a grpolab run folder?")
    if args.recipe or args.config:
        given = " and ".join(f"--{k} {getattr(args, k)}" for k in ("recipe", "config") if getattr(args, k))
        raise ConfigError(f"--resume {out}: {given} would change what the run trains; a resumed run keeps the "
                          f"settings saved in {saved}. Start a new run with them (--out NEW), or resume without "
                          f"them (--steps N extends the run)")
    base = load_yaml(saved)
    # lenient: a config.yaml written before components owned their parameters lists every variant's keys
    before = Config.build(base, sources=[str(saved)], lenient=True)
    cfg = Config.build(base, cli, sources=[str(saved), "command line"], lenient=True)
    for key in cli:
        if key in cfg.dropped_keys:
            note = replaced_key_note(key)
            raise ConfigError(f"--resume {out}: --{key} is not a key of this run" + (
                f": {note}" if note else f" (core keys and the parameters of the components it selects: "
                                         f"grpolab config --config {saved})"))
        if key in RESUME_OVERRIDES:
            continue
        old, new = before.to_dict().get(key), cfg.to_dict().get(key)
        if old != new:
            raise ConfigError(f"--resume {out}: --{key} {cli[key]} would change what the run trains (saved: "
                              f"{key}: {old}); a resumed run keeps its settings. On --resume only "
                              f"{', '.join('--' + k for k in RESUME_OVERRIDES)} may change; for other settings "
                              f"start a new run (--out NEW)")
    _check_replaced_keys(base, cfg, saved, out)
    cfg.out = str(out)
    others = [k for k in cfg.dropped_keys if k not in REPLACED_KEYS]
    replaced = [f"{k} -> {REPLACED_KEYS[k][0]}" for k in cfg.dropped_keys if k in REPLACED_KEYS]
    for keys, what in ((others, "keys of components this run does not select were ignored"),
                       (replaced, "keys grpolab has replaced were ignored (none changes what this run trains)")):
        if keys:
            print(f"[grpolab] {saved}: {len(keys)} {what} ({', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''})",
                  file=sys.stderr)
    return cfg


def _check_replaced_keys(saved_values: dict, cfg, saved: Path, out: Path) -> None:
    """Refuse to resume a run whose ``config.yaml`` sets a key grpolab has since replaced (``REPLACED_KEYS``, e.g.
    ``knapsack_success_threshold`` -> ``success_threshold``) to another value than the replacement has now.

    ``Config.build(lenient=True)`` drops such a key, so the run would go on with the replacement's value and train
    differently without a word. Only the old keys of components this run selects count (an old config.yaml lists
    every component's keys; the others never applied)."""
    from .config import ConfigError, _coerce
    from .registry import REPLACED_KEYS

    selected = {owner for owner, _ in cfg.selected()}
    for key, value in saved_values.items():
        key = key.replace("-", "_")
        if key not in REPLACED_KEYS or not selected & set(REPLACED_KEYS[key][1]):
            continue
        new = REPLACED_KEYS[key][0]
        current = getattr(cfg, new)
        if _coerce(new, value, str(saved)) != current:
            raise ConfigError(f"--resume {out}: {saved} sets {key}: {value}, a key grpolab has replaced by {new}; "
                              f"resumed now, the run would use {new}: {current} and train differently. In {saved} "
                              f"replace '{key}: {value}' by '{new}: {value}' (or delete the line to go on with "
                              f"{current}), then resume again")


def cmd_train(args, rest: list[str]) -> int:
    from .config import ConfigError
    from .data import to_json
    from .distributed import collective

    if args.nproc_per_node is not None and not collective.launched():  # start the ranks; each runs this again
        if args.nproc_per_node < 1:
            raise ConfigError(f"--nproc_per_node: must be >= 1, got {args.nproc_per_node}")
        # the config is checked here, before any rank starts, and the run folder chosen once (rank 0 would
        # otherwise pick the next free default folder again)
        cfg = _train_config(args, rest)
        from .distributed import launch as ranks
        return ranks.launch(args.nproc_per_node, args.argv + ([] if args.resume else ["--out", cfg.out]))
    if collective.launched():  # a torchrun rank: rank 0 resolves the run folder, every rank trains in it
        collective.init_from_env(_device_of(args, rest))
        cfg = collective.broadcast_object(_train_config(args, rest) if collective.rank() == 0 else None)
        if cfg is None:
            raise ConfigError("rank 0 stopped before training (its error is above)")
        from .distributed.trainer import DistributedTrainer as TrainerClass
    else:
        cfg = _train_config(args, rest)
        from .distributed.checkpoint import run_uses_dcp
        if args.resume and run_uses_dcp(Path(args.resume)):  # saved by torch.distributed ranks: DCP format
            from .distributed.trainer import DistributedTrainer as TrainerClass
        else:
            from .train.trainer import Trainer as TrainerClass
    from .train.supervisor import report
    report("out", cfg.out)  # for the watching process's message, should this one end early
    trainer = TrainerClass(cfg, resume=bool(args.resume), overwrite=args.overwrite)
    summary = trainer.train(progress=not args.quiet)
    if trainer.is_main:
        hidden = ("samples", "image_grid")  # text samples and image grids: in summary.json and the report
        print(to_json({k: {kk: vv for kk, vv in v.items() if kk not in hidden} if isinstance(v, dict) else v
                       for k, v in summary.items()}))
    return 0


def _device_of(args, rest: list[str]) -> str:
    """The ``device`` a torchrun rank joins its process group for (NCCL on CUDA, else gloo)."""
    from .config import Config
    return str(_kv_pairs(rest, Config.field_names()).get("device") or getattr(args, "device", None) or "auto")


def _train_config(args, rest: list[str]):
    """The run's config for `grpolab train` (``--resume``: the saved one), with the run folder decided."""
    from .config import Config, ConfigError

    cli = _options_of(args, _kv_pairs(rest, Config.field_names()))
    if args.resume:
        cfg = _resume_config(args, cli)
    else:
        recipe, rec, file_cfg = _recipe_layers(args, cli)
        select_agent_strategy(rec, file_cfg, cli)
        cfg = Config.build(rec, file_cfg, cli, sources=[f"recipe {recipe}" if recipe else "the task's defaults",
                                                        args.config or "", "command line"])
        if rec and not recipe:  # say which settings the task chose (the default job's)
            print(f"[grpolab] task {cfg.task} with no recipe: "
                  + ", ".join(f"{k} {getattr(cfg, k)}" for k in rec if k not in file_cfg and k not in cli)
                  + " (its default job's settings; any --key overrides them)", file=sys.stderr)
        out = Path(cfg.out)
        from .train.checkpoint import latest_checkpoint
        from .train.runlock import RunLock, holder_of

        def used(p: Path) -> bool:  # (or another process trains there now: train/runlock.py)
            return latest_checkpoint(p) is not None or (p / "metrics.jsonl").exists() or holder_of(p) is not None

        explicit = "out" in cli or "out" in file_cfg or "out" in rec
        if not explicit and used(out):  # default run folder taken: pick the next free one, never overwrite
            n = 2
            while used(out.with_name(f"{out.name}-{n}")):
                n += 1
            out = out.with_name(f"{out.name}-{n}")
            cfg.out = str(out)
            print(f"[grpolab] {Path(Config().out)} already holds a run; writing this one to {out}", file=sys.stderr)
        RunLock(out).check()  # another process trains there: refused, naming it
        if used(out) and not args.overwrite:
            raise ConfigError(f"--out {out} already holds a run; continue it with `grpolab train --resume {out}` "
                              f"or choose another --out (nothing was overwritten)")
    return cfg


def _run_settings(model: str) -> tuple[Path | None, dict]:
    """``(path, keys)`` of the config.yaml of the run a model folder came from (``OUT/final`` -> ``OUT``)."""
    from .config import load_yaml

    for folder in (Path(model).parent, Path(model)):
        saved = folder / "config.yaml"
        if model not in ("tiny", "smollm2") and saved.is_file():
            keys = load_yaml(saved)
            if "max_completion_length" in keys:
                return saved, keys
    return None, {}


def _from_run_workdir(keys: dict, run_dir: Path) -> dict:
    """A run's saved keys with its relative ``data`` / ``eval_data`` paths and ``reward`` files resolved against the
    working directory the run was started in (:func:`grpolab.train.rundir.run_workdir`), so that evaluating it
    works from any directory; its reward modules are imported from there. ``config.yaml`` keeps the paths as they
    were typed."""
    from .registry import REWARD_SPECS
    from .train.rundir import run_workdir

    base = run_workdir(run_dir)
    if base is None or base == Path.cwd():
        return keys

    def there(path: str) -> str:
        return str(base / path) if path and not Path(path).is_absolute() and (base / path).exists() else path

    def reward(spec: str) -> str:
        target, eq, weight = spec.partition("=")
        if target in REWARD_SPECS:  # rm:PATH, judge:PATH (judge:self / tiny name no file)
            prefix, sep, path = target.partition(":")
            return f"{prefix}{sep}{there(path)}{eq}{weight}" if sep else spec
        module, sep, fn = target.partition(":")
        if "/" in module or "\\" in module or module.endswith(".py") or module.startswith("."):
            file = module if module.endswith(".py") else module + ".py"
            return f"{there(file)}{sep}{fn}{eq}{weight}" if there(file) != file else spec
        top = module.split(".")[0]
        if ((base / f"{top}.py").is_file() or (base / top).is_dir()) and str(base) not in sys.path:
            sys.path.insert(0, str(base))  # a module of the run's directory, as when it trained
        return spec

    out = dict(keys)
    for key in ("data", "eval_data"):
        if isinstance(out.get(key), str):
            out[key] = there(out[key])
    specs = out.get("reward")
    if specs:
        out["reward"] = [reward(str(s)) for s in (specs if isinstance(specs, list) else [specs])]
    return out


def cmd_eval(args, rest: list[str]) -> int:
    import functools

    from .components import Component
    from .config import Config, ConfigError
    from .data import to_json
    from .policies import POLICIES
    from .train.evaluate import evaluate
    from .train.trainer import setup_data

    cli = _kv_pairs(rest, Config.field_names())
    saved, run = _run_settings(args.model)
    for key in ("model", "out", "recipe"):
        run.pop(key, None)
    if args.data or args.task:  # another data set than the run's: its task / data / rewards do not apply
        for key in ("task", "data", "reward"):
            run.pop(key, None)
    if saved is not None:
        run = _from_run_workdir(run, saved.parent)
    layers = {"model": args.model, **cli}
    if args.data:
        layers["data"] = args.data
        layers["reward"] = args.reward or []
        layers.setdefault("eval_split", 0)  # the file given is the evaluation data, all of it
        layers.setdefault("eval_data", None)
    elif args.task:
        layers["task"] = args.task
    elif args.reward:
        raise ConfigError("--reward needs --data FILE (or use --task NAME)")
    cfg = Config.build(run, layers, sources=[str(saved), "command line"], lenient=True)
    if saved is not None:
        what = f"data {cfg.data}" if cfg.data else f"task {cfg.task}"
        print(f"[grpolab] eval: settings of the run in {saved} ({what}, max_completion_length "
              f"{cfg.max_completion_length}, max_prompt_length {cfg.max_prompt_length}); --key value overrides them",
              file=sys.stderr)
    rows, eval_rows, rewards, acc, extra = setup_data(cfg)
    if args.data:
        eval_rows = rows[:cfg.eval_problems]
    if not eval_rows:
        what = f"the run in {saved.parent}" if saved is not None else f"--model {args.model}"
        why = (f"it trained on all of --data {cfg.data} (eval_split {cfg.eval_split:g})" if cfg.data and not args.data
               else f"{f'--data {cfg.data}' if cfg.data else f'task {cfg.task}'} gave none")
        raise ConfigError(f"eval: {what} has no held-out rows to evaluate ({why}); evaluate it on other data: "
                          f"grpolab eval --model {args.model} --data FILE --reward module:function (or --task NAME)")
    policy = Component(POLICIES.get(cfg.policy), cfg, cfg.policy).fn  # the kind of policy (causal_lm by default)
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    model = policy.load(cfg, rows, [], log=log) if cfg.model == "tiny" else policy.load(cfg, [], [], log=log)
    res = evaluate(functools.partial(policy.sample, model, evaluation=True), eval_rows, rewards,
                   batch_size=cfg.eval_batch_size, accuracy_reward=acc, extra=extra,
                   reward_timeout=cfg.reward_timeout, pass_k=cfg.eval_pass_k, temperature=cfg.temperature,
                   seed=cfg.seed, render=policy.render)
    res["model"] = args.model
    print(to_json(res, indent=None if args.compact else 2))
    return 0


# the core keys `grpolab sft` reads (besides --model, --task, --data); its own keys are the parameters of
# grpolab.train.sft (sft_steps, ...). Any other core key is grpolab train's, which sft would ignore: refused
SFT_CORE_KEYS = ["seed", "threads", "tiny_arch", "data_split", "prompt_column", "column_map"]
# a `grpolab train` key given to sft -> sft's own key for the same thing
SFT_INSTEAD = {"learning_rate": "sft_learning_rate", "prompts_per_step": "sft_batch_size",
               "micro_batch_size": "sft_batch_size", "max_prompt_length": "sft_max_length",
               "max_completion_length": "sft_max_length"}


def _sft_keys() -> dict:
    """``{key: help}`` of sft's options: its own parameters, then the core keys it reads."""
    import dataclasses

    from .config import Config
    from .registry import declared_params
    from .train.sft import SFT_COMPONENTS

    out = {}
    for fn in SFT_COMPONENTS:
        for name, p in declared_params(fn).items():
            choices = f"; one of {', '.join(map(str, p.choices))}" if p.choices else ""
            out[name] = f"{p.help} (default {p.default!r}{choices})"
    fields = {f.name: f for f in dataclasses.fields(Config)}
    for key in SFT_CORE_KEYS:
        out[key] = f"{fields[key].metadata['help']} (default {fields[key].default!r})"
    return out


def _sft_options(f) -> None:
    """`grpolab sft --help`: ``--steps`` and every key sft reads, with its own help text."""
    keys = _sft_keys()
    f.add_argument("--steps", metavar="N", help="optimiser steps: the same as --sft_steps")
    for key, help in keys.items():
        f.add_argument(f"--{key}", metavar=key.upper().rpartition("_")[2] if "_" in key else key.upper(),
                       default=None, help=help.replace("%", "%%"))
    f.epilog = "Task options (e.g. --arithmetic_n_train N) are accepted as --key value too (docs/sft.md)."


def cmd_sft(args, rest: list[str]) -> int:
    """Supervised cold start (``grpolab sft``): see :mod:`grpolab.train.sft`."""
    from .config import Config, ConfigError
    from .train.sft import SFT_COMPONENTS, run_sft

    cli = _kv_pairs(rest, Config.field_names())
    if "out" in cli or "data" in cli or "model" in cli or "task" in cli:
        raise ConfigError("grpolab sft: give --model, --task, --data and --out as options of the command "
                          "(before other --key value pairs)")
    for key in cli:
        if key in Config.field_names():
            instead = SFT_INSTEAD.get(key)
            raise ConfigError(f"grpolab sft: --{key} is a key of grpolab train, which sft does not read"
                              + (f"; sft's is --{instead}" if instead else "")
                              + "; sft's options: grpolab sft --help")
    given = {k: getattr(args, k) for k in _sft_keys() if getattr(args, k, None) is not None}
    if args.steps is not None:
        if "sft_steps" in given and str(given["sft_steps"]) != str(args.steps):
            raise ConfigError(f"grpolab sft: --steps {args.steps} and --sft_steps {given['sft_steps']} disagree; "
                              f"give one (they are the same setting)")
        given["sft_steps"] = args.steps
    layers = {"model": args.model, **given, **cli}
    if args.task:
        layers["task"] = args.task
    if args.data and args.task:
        raise ConfigError("grpolab sft: give --data FILE or --task NAME, not both")
    cfg = Config.build(layers, sources=["command line"], extra=SFT_COMPONENTS)
    out = Path(args.out)
    if (out / "config.json").exists() and not args.overwrite:
        raise ConfigError(f"--out {out} already holds a model; choose another --out or pass --overwrite")
    summary = run_sft(cfg, out, data=args.data, log=lambda *a: print(*a, file=sys.stderr, flush=True))
    from .data import to_json
    print(to_json(summary))
    return 0


def recipes_markdown(recipes: list[dict]) -> str:
    """The recipe table of the README and docs/recipes.md."""
    def cell(d: dict) -> str:
        return ", ".join(f"{k}={'/'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in d.items())

    from .recipes import partial_note

    lines = ["| recipe | paper | seed | components | parameters |", "|---|---|---|---|---|"]
    for r in recipes:
        cited = f" ({r['citation']})" if r.get("citation") else ""  # a user's own recipe may cite nothing
        if r.get("partial"):
            cited += f" — **{partial_note(r)}**"
        lines.append(f"| `{r['name']}` | {r['title']}{cited} | {r.get('seed') or '—'} | "
                     f"{cell(r['components'])} | {cell(r['parameters'])} |")
    return "\n".join(lines) + "\n"


def cmd_recipes(args, rest: list[str]) -> int:
    from .recipes import all_recipes, partial_note

    recipes = all_recipes()
    if args.name:
        return _show_recipe(args)
    if args.markdown:
        print(recipes_markdown(recipes), end="")
        return 0
    if args.json:
        print(json.dumps([{k: r.get(k) for k in ("name", "title", "citation", "seed", "description", "partial",
                                                 "components", "parameters")} for r in recipes], indent=2))
        return 0
    for r in recipes:
        seed = f" [seed {r['seed']}]" if r.get("seed") else ""
        print(f"{r['name']:<14} {r.get('citation') or '(no citation)'}{seed}")
        print(f"{'':<14} {r['title']}")
        if r.get("partial"):
            print(f"{'':<14} {partial_note(r)}")
        comps = ", ".join(f"{k}={v}" for k, v in r["components"].items())
        params = ", ".join(f"{k}={v}" for k, v in r["parameters"].items())
        print(f"{'':<14} components: {comps}")
        print(f"{'':<14} parameters: {params}")
    return 0


def _show_recipe(args) -> int:
    """`grpolab recipes NAME`: one recipe, whole."""
    from .recipes import load_recipe, partial_note

    r = load_recipe(args.name)
    if args.json:
        print(json.dumps({k: r.get(k) for k in ("name", "title", "citation", "seed", "description", "partial",
                                                 "components", "parameters")}, indent=2))
        return 0
    print(f"{r['name']}: {r['title']}")
    if r.get("citation") or r.get("seed"):
        print(f"  {r.get('citation') or '(no citation)'}" + (f" [seed {r['seed']}]" if r.get("seed") else ""))
    if r.get("description"):
        print("  " + " ".join(str(r["description"]).split()))
    if r.get("partial"):
        print("  " + partial_note(r))
    for title, part in (("components", r["components"]), ("parameters", r["parameters"])):
        print(f"  {title}:")
        for k, v in part.items():
            print(f"    {k}: {v}")
    print(f"  train it: grpolab train --recipe {r['name']}   (every key: grpolab config --recipe {r['name']})")
    return 0


def _show_key(cfg, key: str) -> int:
    """`grpolab config KEY`: the key's value in this configuration, its default, meaning and valid values."""
    import dataclasses

    from .config import CORE_KEYS, Config, ConfigError, _choices_text
    from .registry import ALL_REGISTRIES, declared_params

    key = key.lstrip("-").replace("-", "_")
    if key in CORE_KEYS:
        f = {f.name: f for f in dataclasses.fields(Config)}[key]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        print(f"{key}: {getattr(cfg, key)!r}   (default {default!r}; core key)")
        print(f"  {f.metadata.get('help', '')}{_choices_text(f.metadata.get('choices'))}")
        return 0
    decl = cfg.component_params()
    if key in decl:
        p = decl[key]
        print(f"{key}: {cfg.params[key]!r}   (default {p.default!r}; parameter of {', '.join(p.owners)})")
        print(f"  {p.help}" + (f" (valid: {', '.join(map(str, p.choices))})" if p.choices else ""))
        return 0
    owners, how = {}, []
    for reg in ALL_REGISTRIES.values():
        for name, obj in reg.items():
            if key in declared_params(obj):
                owners[key] = declared_params(obj)[key]
                how += [reg.selection(name)] if reg.selection(name) else []
    if owners:
        p = owners[key]
        print(f"{key}: not a key of this configuration   (default {p.default!r}; parameter of "
              f"{', '.join(p.owners)}, which it does not select)")
        print(f"  {p.help}")
        print(f"  select its component first ({' or '.join(how[:3]) or 'with its recipe'}); then --{key} VALUE "
              f"sets it")
        return 0
    from .registry import replaced_key_note
    if replaced_key_note(key):
        raise ConfigError(f"grpolab config: unknown key '{key}': {replaced_key_note(key)}")
    import difflib
    close = difflib.get_close_matches(key, CORE_KEYS + sorted(decl), n=3)
    raise ConfigError(f"grpolab config: unknown key '{key}'" + (f" (did you mean {', '.join(close)}?)" if close else "")
                      + "; `grpolab config` lists this run's keys, `grpolab components` every component's")


def cmd_config(args, rest: list[str]) -> int:
    """The resolved configuration of a run (core keys first, then the selected components' parameters), or
    one key of it (``grpolab config KEY``)."""
    from .config import Config, markdown_reference

    cli = _kv_pairs(rest, Config.field_names())
    recipe, rec, file_cfg = _recipe_layers(args, cli)
    select_agent_strategy(rec, file_cfg, cli)
    cfg = Config.build(rec, file_cfg, cli, sources=[f"recipe {recipe}" if recipe else "the task's defaults",
                                                    args.config or "", "command line"])
    if args.key:
        return _show_key(cfg, args.key)
    if args.markdown:
        print(markdown_reference(cfg), end="")
    else:
        import yaml
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


def cmd_components(args, rest: list[str]) -> int:
    """Every registered component: kind, name, file:line, paper, summary, parameters (:func:`catalog.describe`)."""
    from .catalog import components_markdown, components_text, describe, provenance_markdown
    from .errors import ConfigError

    if rest:
        raise ConfigError(f"grpolab components: unexpected arguments {' '.join(rest)} "
                          f"(usage: grpolab components [KIND] [--json] [--markdown] [--provenance])")
    comps = describe(args.kind)
    if args.json:
        print(json.dumps(comps, indent=2))
    elif args.provenance:
        print(provenance_markdown(comps), end="")
    elif args.markdown:
        print(components_markdown(comps), end="")
    else:
        print(components_text(comps), end="")
    return 0


def import_user_modules(modules: list[str]) -> None:
    """Import modules that register components (``grpolab --import MODULE ...``), from the current directory
    or PYTHONPATH, before any config is built: their components and parameters are then valid keys."""
    import importlib

    from .errors import ConfigError

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"--import {name}: cannot import it ({e}); it must be importable from the current "
                              f"directory or PYTHONPATH") from None


TRAIN_EPILOG = """\
Every other config key is an option too (--key value or --key=value):
  grpolab config                 this run's keys and values (core keys, then its components' parameters)
  grpolab config KEY             one key: value, default, meaning, valid values
  grpolab recipes [NAME]         the recipes, or one of them

Precedence (later wins): defaults < --recipe < --config FILE < options. --recipe on the command line
also wins over a 'recipe:' line in the --config file; OUT/config.yaml records what was trained.

--resume OUT continues that run with the settings saved in OUT/config.yaml. It refuses --recipe,
--config and any option that would change what the run trains; it accepts --steps (to extend the
run), --save_steps, --save_total_limit, --eval_after, --eval_problems, --eval_batch_size,
--tensorboard, --threads, --device, --stall_steps, --distributed_strategy (and --nproc_per_node: a run
resumes on any number of ranks, docs/distributed.md).

examples:
  grpolab train --recipe dapo --out runs/dapo
  grpolab train --data my.jsonl --reward my_rewards:correct --reward ./fmt.py:fmt=0.2
  grpolab train --resume runs/dapo --steps 60
"""


def _train_options(t) -> None:
    """The `grpolab train` options shown by --help (help text from config.py)."""
    import dataclasses

    from .config import Config

    fields = {f.name: f for f in dataclasses.fields(Config)}
    t.add_argument("--config", metavar="FILE", help="YAML file of config keys (may name a recipe: NAME)")
    t.add_argument("--recipe", metavar="NAME", help="named recipe (grpolab recipes; wins over the file's recipe:)")
    t.add_argument("--resume", metavar="OUT", help="continue the run in OUT from its last checkpoint (see below)")
    t.add_argument("--reward", action="append", metavar="SPEC",
                   help="reward function module:function[=weight] or path/to/file.py:function[=weight], "
                        "repeatable (also rm:PATH, judge:PATH, pm4grpo)")
    for key in TRAIN_OPTIONS:
        f = fields[key]
        choices = f.metadata.get("choices")
        extra = f" ({' / '.join(map(str, choices))})" if isinstance(choices, list) else ""
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        metavar = {"model": "MODEL", "task": "NAME", "data": "FILE", "out": "DIR", "device": "DEVICE"}.get(
            key, {int: "N", float: "X"}.get(type(default), "NAME"))
        t.add_argument(f"--{key}", metavar=metavar,
                       help=f"{f.metadata.get('help', '')}{extra} [default: {default}]".replace("%", "%%"))
    t.add_argument("--tools", action="append", metavar="MODULE:FN[,...]",
                   help="tool functions (type hints + docstring) for multi-turn agent episodes; selects "
                        "rollout_strategy agent (docs/agents.md)")
    t.add_argument("--env", metavar="MODULE:CLASS",
                   help="an environment class, gym-style (reset/step) or TRL-style (reset(**row) + tool "
                        "methods); selects rollout_strategy agent (docs/agents.md)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--nproc_per_node", type=int, metavar="N",
                   help="train on N processes of this machine (torch.distributed through torchrun's API: one per "
                        "GPU, or gloo ranks on the CPU; docs/distributed.md); the same as `torchrun "
                        "--standalone --nproc_per_node N -m grpolab train ...`")
    t.add_argument("--overwrite", action="store_true",
                   help="write into an --out folder that already has files (replacing a run there); without it "
                        "such a folder is refused")


def _report_parsers(sub) -> None:
    """``grpolab doctor RUN`` and ``grpolab report RUN [RUN ...]`` (src/grpolab/report/)."""
    d = sub.add_parser("doctor", help="known failure patterns in a run (also one in progress), with the evidence "
                                      "and a fix; exit code 0 healthy, 1 a pattern found")
    d.add_argument("run", help="a run folder (the --out of grpolab train)")
    d.add_argument("--json", action="store_true", help="print as JSON")
    p = sub.add_parser("report", help="one self-contained HTML file: config diff, curves (runs overlaid), "
                                      "evaluation before/after, completions per step")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (the --out of grpolab train)")
    p.add_argument("--out", default="report.html", help="the HTML file to write (default report.html)")


def cmd_doctor(args, rest) -> int:
    _no_extra(rest)
    from .report.doctor import main as doctor_main
    return doctor_main(args.run, as_json=args.json)


def cmd_report(args, rest) -> int:
    _no_extra(rest)
    from .report.html import write_report
    path = write_report(args.runs, args.out)
    print(f"[grpolab] report written to {path}")
    return 0


def cmd_compare(args, rest) -> int:
    from .compare import main as compare_main
    return compare_main(rest, imports=args.imports)


def _no_extra(rest) -> None:
    if rest:
        from .errors import ConfigError
        raise ConfigError(f"unrecognized arguments: {' '.join(rest)}")


def main(argv: list[str] | None = None) -> int:
    """The `grpolab` command (``argv``: its arguments; None: this process's command line). A single-process
    `grpolab train` of the command line trains in a forked child, watched by this process, so that a run that
    does not reach its end never exits 0 (train/supervisor.py)."""
    from .train import supervisor
    if argv is not None or not supervisor.wanted(sys.argv[1:]):
        try:
            return _main(argv)
        except BrokenPipeError:  # `grpolab recipes | head`: the reader has gone; no traceback, as other tools
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's docs: SIGPIPE)
            return 0
    code = supervisor.fork()
    if code is not None:  # the process the user started: the training process has ended
        return code
    try:
        rc = _main(None)
    except BaseException as e:
        supervisor.report("raised", type(e).__name__)
        raise
    supervisor.report("end", rc)
    return rc


def build_parser() -> argparse.ArgumentParser:
    """The `grpolab` argument parser (``bench`` and ``vllm-serve`` parse their own arguments; ``compare`` too:
    :func:`grpolab.compare.parser`). `train`, `eval` and `sft` take any config key as ``--key value`` besides."""
    parser = argparse.ArgumentParser(prog="grpolab", description="GRPO and its variants, as small exact components.")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (repeatable): components it registers can then be selected, "
                             "and their parameters are config keys")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a policy (any config key as --key value)", allow_abbrev=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=TRAIN_EPILOG,
                       description="Train a policy with GRPO or a variant. Every config key is an option "
                                   "(--key value); the ones most runs set are listed here.")
    _train_options(t)
    e = sub.add_parser("eval", help="greedy evaluation; prints JSON")
    e.add_argument("--model", required=True, help="'smollm2', 'tiny' or a model folder (e.g. OUT/final)")
    e.add_argument("--task", help="built-in task")
    e.add_argument("--data", help="data to evaluate, all of it: JSONL, JSON, CSV, Parquet or a dataset folder "
                                  "(docs/data.md)")
    e.add_argument("--reward", action="append", help="module:function[=weight] (with --data)")
    e.add_argument("--compact", action="store_true", help="one-line JSON")
    f = sub.add_parser("sft", help="supervised cold start (TON thought dropout, Thinkless control tokens); "
                                   "writes a model folder for --model")
    f.add_argument("--model", required=True, help="'smollm2', 'tiny' or a model folder")
    f.add_argument("--task", help="built-in task whose 'solution' column is the target (default: config task)")
    f.add_argument("--data", help="prompt / completion rows, in any --data format (docs/data.md)")
    f.add_argument("--out", default="runs/sft", help="folder for the trained model (default runs/sft)")
    f.add_argument("--overwrite", action="store_true", help="replace a model already in --out")
    _sft_options(f)
    r = sub.add_parser("recipes", help="list recipes with citations (or show one: grpolab recipes NAME)")
    r.add_argument("name", nargs="?", help="show this recipe: paper, description, components, parameters")
    r.add_argument("--json", action="store_true", help="print as JSON")
    r.add_argument("--markdown", action="store_true", help="print the recipe table as markdown")
    c = sub.add_parser("config", help="print a run's resolved configuration (YAML): core keys, then the "
                                      "parameters of the components it selects")
    c.add_argument("key", nargs="?", help="explain this key: its value in this configuration, default, meaning")
    c.add_argument("--recipe", help="show the configuration of this recipe")
    c.add_argument("--config", help="YAML file of config keys")
    c.add_argument("--markdown", action="store_true", help="the key reference as a markdown table")
    k = sub.add_parser("components", help="list every registered component: kind, name, file:line, paper, "
                                          "parameters")
    k.add_argument("kind", nargs="?", help="only this kind (advantage, policy_loss, rollout, prompt_sampler, ...)")
    k.add_argument("--json", action="store_true", help="print as JSON")
    k.add_argument("--markdown", action="store_true", help="print docs/components.md's tables")
    k.add_argument("--provenance", action="store_true", help="print docs/variants/provenance.md's table: how "
                                                             "each component was checked (authors' code, paper "
                                                             "equations, or reconstructed from the abstract)")
    sub.add_parser("vllm-serve", help="`grpolab vllm-serve --model FOLDER --port P`: a vLLM server for "
                                      "generation_engine: vllm_server (see `grpolab vllm-serve --help`)",
                   add_help=False)
    _report_parsers(sub)
    sub.add_parser("fc-prep", help="`grpolab fc-prep --data ROWS --out KEPT [--model M]`: two-stage data "
                                   "preparation for function-calling GRPO (model evaluation, AST validation of "
                                   "the reference calls; see `grpolab fc-prep --help`)", add_help=False)
    sub.add_parser("mqr", help="`grpolab mqr --model M --data ROWS --out FILE`: MathForge multi-aspect question "
                               "reformulation (seed 000-05): harder rewrites with the same gold answer, added to "
                               "the originals (see `grpolab mqr --help`)", add_help=False)
    sub.add_parser("rm-train", help="`grpolab rm-train --out DIR [--data ROWS] [--labels a,b]`: train a "
                                    "multi-label reward model, one regression head per label (seed 000-52); "
                                    "use it with --reward mlrm:DIR (see `grpolab rm-train --help`)", add_help=False)
    sub.add_parser("bench", help="`grpolab bench speed [options]`: grpolab vs TRL GRPOTrainer on the same job "
                                 "(see `grpolab bench speed --help`)", add_help=False)
    sub.add_parser("compare", help="`grpolab compare --recipes a,b --seeds 0,1,2 [train options] --out DIR`: "
                                   "recipes x seeds at one budget, mean ± 95%% CI, paired differences, plots "
                                   "(see `grpolab compare --help`)", add_help=False)
    return parser


def _config_key_first(argv: list[str]) -> list[str]:
    """``grpolab config [KEY] --name value ...``: argparse would take the first value (``--advantage X``'s X) as
    KEY. Find KEY the way the options are read (``--name value`` / ``--name=value``; ``--markdown`` takes no
    value) and put it right after ``config`` ("" when there is none), so every value stays with its name."""
    i = 0
    while i < len(argv) and argv[i].startswith("--import"):
        i += 1 if "=" in argv[i] else 2
    if argv[i:i + 1] != ["config"]:
        return argv
    head, tail = argv[:i + 1], argv[i + 1:]
    key, rest, j = None, [], 0
    while j < len(tail):
        tok = tail[j]
        if tok.startswith("--") and "=" not in tok and tok not in ("--markdown", "--help", "-h") \
                and j + 1 < len(tail) and (not tail[j + 1].startswith("--") or _is_number(tail[j + 1])):
            rest += tail[j:j + 2]
            j += 2
            continue
        if key is None and not tok.startswith("-"):
            key = tok
        else:
            rest.append(tok)
        j += 1
    return head + [key or ""] + rest


def _own_parser_main(main, argv: list[str], errors: tuple[type[Exception], ...]) -> int:
    """Run a subcommand that has its own argument parser: its exit code, or 2 with one of ``errors`` (the
    expected mistakes of its input) shown as ``grpolab: error: ...`` instead of a traceback."""
    try:
        return main(argv)
    except errors as e:
        print(f"grpolab: error: {e}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # its own argument parser (src/grpolab/bench.py)
        from .bench import main as bench_main
        return bench_main(argv[1:])
    if argv[:1] == ["fc-prep"]:  # its own argument parser (src/grpolab/tasks/fc_data_prep.py)
        from .errors import ConfigError
        from .tasks.fc_data_prep import main as fc_prep_main
        return _own_parser_main(fc_prep_main, argv[1:], (ConfigError, ValueError))
    if argv[:1] == ["mqr"]:  # its own argument parser (src/grpolab/tasks/mqr.py)
        from .data import DataError
        from .errors import ConfigError
        from .tasks.mqr import main as mqr_main
        return _own_parser_main(mqr_main, argv[1:], (ConfigError, DataError, FileNotFoundError))
    if argv[:1] == ["rm-train"]:  # its own argument parser (src/grpolab/rewards/multi_label_rm.py)
        from .errors import ConfigError
        from .rewards.multi_label_rm import main as rm_train_main
        return _own_parser_main(rm_train_main, argv[1:], (ConfigError, ValueError, FileNotFoundError))
    if argv[:1] == ["vllm-serve"]:  # its own argument parser (src/grpolab/generation/vllm_server.py)
        from .generation.vllm_server import main as serve_main
        return serve_main(argv[1:])
    args, rest = parser.parse_known_args(_config_key_first(argv))
    args.argv = argv
    from .errors import CheckpointError, ConfigError, RolloutWorkerDied, RunStalled
    from .data import DataError
    from .registry import UnknownComponentError
    from .errors import WriteError
    try:
        import_user_modules(args.imports)
        commands = {"train": cmd_train, "eval": cmd_eval, "sft": cmd_sft, "recipes": cmd_recipes,
                    "config": cmd_config, "components": cmd_components, "doctor": cmd_doctor,
                    "report": cmd_report, "compare": cmd_compare}
        return commands[args.command](args, rest)
    except (ConfigError, DataError, UnknownComponentError, FileNotFoundError, CheckpointError) as e:
        print(f"grpolab: error: {e}", file=sys.stderr)
        return 2
    except (RunStalled, RolloutWorkerDied) as e:  # the run stopped: nothing could be learned; a worker died
        print(f"grpolab: error: {e}", file=sys.stderr)
        return 1
    except WriteError as e:  # a full disk at the run's end: which file, the cause, the resume that ends it
        print(f"grpolab: error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # reward spec / signature problems found before training
        print(f"grpolab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
