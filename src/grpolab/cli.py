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


def cmd_train(args, rest: list[str]) -> int:
    from .config import Config, ConfigError, load_yaml
    from .recipes import recipe_overrides

    cli = _kv_pairs(rest, Config.field_names())
    if args.reward:
        cli["reward"] = args.reward
    if args.resume:
        saved = Path(args.resume) / "config.yaml"
        if not saved.exists():
            raise ConfigError(f"--resume {args.resume}: no config.yaml there; is it a grpolab run folder?")
        base = load_yaml(saved)
        # lenient: a config.yaml written before components owned their parameters lists every variant's keys
        cfg = Config.build(base, cli, sources=[str(saved), "command line"], lenient=True)
        cfg.out = str(args.resume)
        if cfg.dropped_keys:
            print(f"[grpolab] {saved}: {len(cfg.dropped_keys)} keys of components this run does not select were "
                  f"ignored ({', '.join(cfg.dropped_keys[:8])}{', ...' if len(cfg.dropped_keys) > 8 else ''})",
                  file=sys.stderr)
    else:
        file_cfg = load_yaml(args.config) if args.config else {}
        recipe = cli.get("recipe") or file_cfg.get("recipe") or args.recipe
        rec = recipe_overrides(recipe) if recipe else {}
        if args.recipe:
            cli["recipe"] = args.recipe
        cfg = Config.build(rec, file_cfg, cli, sources=[f"recipe {recipe}", args.config or "", "command line"])
        out = Path(cfg.out)
        from .train.checkpoint import latest_checkpoint

        def used(p: Path) -> bool:
            return latest_checkpoint(p) is not None or (p / "metrics.jsonl").exists()

        explicit = "out" in cli or "out" in file_cfg or "out" in rec
        if not explicit and used(out):  # default run folder taken: pick the next free one, never overwrite
            n = 2
            while used(out.with_name(f"{out.name}-{n}")):
                n += 1
            out = out.with_name(f"{out.name}-{n}")
            cfg.out = str(out)
            print(f"[grpolab] {Path(Config().out)} already holds a run; writing this one to {out}", file=sys.stderr)
        if used(out) and not args.overwrite:
            raise ConfigError(f"--out {out} already holds a run; continue it with `grpolab train --resume {out}` "
                              f"or choose another --out (nothing was overwritten)")
    from .train.trainer import Trainer

    trainer = Trainer(cfg, resume=bool(args.resume), overwrite=args.overwrite)
    summary = trainer.train(progress=not args.quiet)
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "samples"} if isinstance(v, dict) else v
                      for k, v in summary.items()}))
    return 0


def cmd_eval(args, rest: list[str]) -> int:
    from .config import Config, ConfigError
    from .model.loading import load_policy
    from .train.evaluate import evaluate
    from .train.trainer import setup_data

    cli = _kv_pairs(rest, Config.field_names())
    layers = {"model": args.model, **cli}
    if args.data:
        layers["data"] = args.data
        layers["reward"] = args.reward or []
    elif args.task:
        layers["task"] = args.task
    elif args.reward:
        raise ConfigError("--reward needs --data FILE (or use --task NAME)")
    cfg = Config.build(layers, sources=["command line"])
    rows, eval_rows, rewards, acc, extra = setup_data(cfg)
    if args.data:
        eval_rows = rows[:cfg.eval_problems]
    model, tok = load_policy(cfg.model, task_texts=None if cfg.model != "tiny" else [str(r) for r in rows],
                             tiny_arch=cfg.tiny_arch, seed=cfg.seed)
    res = evaluate(model, tok, eval_rows, rewards, max_completion_length=cfg.max_completion_length,
                   max_prompt_length=cfg.max_prompt_length, batch_size=cfg.eval_batch_size,
                   accuracy_reward=acc, extra=extra)
    res["model"] = args.model
    print(json.dumps(res, indent=None if args.compact else 2))
    return 0


def cmd_sft(args, rest: list[str]) -> int:
    """Supervised cold start (``grpolab sft``): see :mod:`grpolab.train.sft`."""
    from .config import Config, ConfigError
    from .train.sft import SFT_COMPONENTS, run_sft

    cli = _kv_pairs(rest, Config.field_names())
    if "out" in cli or "data" in cli or "model" in cli or "task" in cli:
        raise ConfigError("grpolab sft: give --model, --task, --data and --out as options of the command "
                          "(before other --key value pairs)")
    layers = {"model": args.model, **cli}
    if args.task:
        layers["task"] = args.task
    if args.data and args.task:
        raise ConfigError("grpolab sft: give --data FILE or --task NAME, not both")
    cfg = Config.build(layers, sources=["command line"], extra=SFT_COMPONENTS)
    out = Path(args.out)
    if (out / "config.json").exists() and not args.overwrite:
        raise ConfigError(f"--out {out} already holds a model; choose another --out or pass --overwrite")
    summary = run_sft(cfg, out, data=args.data, log=lambda *a: print(*a, file=sys.stderr, flush=True))
    print(json.dumps(summary))
    return 0


def recipes_markdown(recipes: list[dict]) -> str:
    """The recipe table of the README and docs/recipes.md."""
    def cell(d: dict) -> str:
        return ", ".join(f"{k}={'/'.join(map(str, v)) if isinstance(v, list) else v}" for k, v in d.items())

    lines = ["| recipe | paper | seed | components | parameters |", "|---|---|---|---|---|"]
    for r in recipes:
        lines.append(f"| `{r['name']}` | {r['title']} ({r['citation']}) | {r.get('seed') or '—'} | "
                     f"{cell(r['components'])} | {cell(r['parameters'])} |")
    return "\n".join(lines) + "\n"


def cmd_recipes(args, rest: list[str]) -> int:
    from .recipes import all_recipes

    recipes = all_recipes()
    if args.markdown:
        print(recipes_markdown(recipes), end="")
        return 0
    if args.json:
        print(json.dumps([{k: r.get(k) for k in ("name", "title", "citation", "seed", "description",
                                                 "components", "parameters")} for r in recipes], indent=2))
        return 0
    for r in recipes:
        seed = f" [seed {r['seed']}]" if r.get("seed") else ""
        print(f"{r['name']:<14} {r['citation']}{seed}")
        print(f"{'':<14} {r['title']}")
        comps = ", ".join(f"{k}={v}" for k, v in r["components"].items())
        params = ", ".join(f"{k}={v}" for k, v in r["parameters"].items())
        print(f"{'':<14} components: {comps}")
        print(f"{'':<14} parameters: {params}")
    return 0


def cmd_config(args, rest: list[str]) -> int:
    """The resolved configuration of a run (core keys first, then the selected components' parameters)."""
    from .config import Config, load_yaml, markdown_reference
    from .recipes import recipe_overrides

    file_cfg = load_yaml(args.config) if args.config else {}
    cli = _kv_pairs(rest, Config.field_names())
    rec = recipe_overrides(args.recipe) if args.recipe else {}
    cfg = Config.build(rec, file_cfg, cli, sources=[f"recipe {args.recipe}", args.config or "", "command line"])
    if args.markdown:
        print(markdown_reference(cfg), end="")
    else:
        import yaml
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    return 0


def cmd_components(args, rest: list[str]) -> int:
    """Every registered component: kind, name, file:line, paper, summary, parameters (:func:`catalog.describe`)."""
    from .catalog import components_markdown, components_text, describe
    from .errors import ConfigError

    if rest:
        raise ConfigError(f"grpolab components: unexpected arguments {' '.join(rest)} "
                          f"(usage: grpolab components [KIND] [--json] [--markdown])")
    comps = describe(args.kind)
    if args.json:
        print(json.dumps(comps, indent=2))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpolab", description="GRPO and its variants, as small exact components.")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (repeatable): components it registers can then be selected, "
                             "and their parameters are config keys")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a policy (any config key as --key value)")
    t.add_argument("--config", help="YAML file of config keys")
    t.add_argument("--recipe", help="named recipe (see `grpolab recipes`)")
    t.add_argument("--resume", metavar="OUT", help="continue the run in OUT from its last checkpoint")
    t.add_argument("--reward", action="append", help="module:function[=weight], repeatable")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--overwrite", action="store_true",
                   help="write into an --out folder that already has files (replacing a run there); without it "
                        "such a folder is refused")
    e = sub.add_parser("eval", help="greedy evaluation; prints JSON")
    e.add_argument("--model", required=True, help="'smollm2', 'tiny' or a model folder (e.g. OUT/final)")
    e.add_argument("--task", help="built-in task")
    e.add_argument("--data", help="JSONL file")
    e.add_argument("--reward", action="append", help="module:function[=weight] (with --data)")
    e.add_argument("--compact", action="store_true", help="one-line JSON")
    f = sub.add_parser("sft", help="supervised cold start (TON thought dropout, Thinkless control tokens); "
                                   "writes a model folder for --model")
    f.add_argument("--model", required=True, help="'smollm2', 'tiny' or a model folder")
    f.add_argument("--task", help="built-in task whose 'solution' column is the target (default: config task)")
    f.add_argument("--data", help="JSONL file of prompt / completion rows")
    f.add_argument("--out", default="runs/sft", help="folder for the trained model (default runs/sft)")
    f.add_argument("--overwrite", action="store_true", help="replace a model already in --out")
    r = sub.add_parser("recipes", help="list recipes with citations")
    r.add_argument("--json", action="store_true", help="print as JSON")
    r.add_argument("--markdown", action="store_true", help="print the recipe table as markdown")
    c = sub.add_parser("config", help="print a run's resolved configuration (YAML): core keys, then the "
                                      "parameters of the components it selects")
    c.add_argument("--recipe", help="show the configuration of this recipe")
    c.add_argument("--config", help="YAML file of config keys")
    c.add_argument("--markdown", action="store_true", help="the key reference as a markdown table")
    k = sub.add_parser("components", help="list every registered component: kind, name, file:line, paper, "
                                          "parameters")
    k.add_argument("kind", nargs="?", help="only this kind (advantage, policy_loss, rollout, prompt_sampler, ...)")
    k.add_argument("--json", action="store_true", help="print as JSON")
    k.add_argument("--markdown", action="store_true", help="print docs/components.md's tables")
    sub.add_parser("bench", help="`grpolab bench speed [options]`: grpolab vs TRL GRPOTrainer on the same job "
                                 "(see `grpolab bench speed --help`)", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # its own argument parser (src/grpolab/bench.py)
        from .bench import main as bench_main
        return bench_main(argv[1:])
    args, rest = parser.parse_known_args(argv)
    from .errors import CheckpointError, ConfigError
    from .data import DataError
    from .registry import UnknownComponentError
    try:
        import_user_modules(args.imports)
        commands = {"train": cmd_train, "eval": cmd_eval, "sft": cmd_sft, "recipes": cmd_recipes,
                    "config": cmd_config, "components": cmd_components}
        return commands[args.command](args, rest)
    except (ConfigError, DataError, UnknownComponentError, FileNotFoundError, CheckpointError) as e:
        print(f"grpolab: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # reward spec / signature problems found before training
        print(f"grpolab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
