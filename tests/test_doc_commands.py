"""Every `grpolab ...` command line that docs/python_api.md and src/grpolab/api.py give a user parses with the
real command-line parser (issue 23: both said `grpolab train --resume --out DIR`, which does not parse).

Commands are parsed, never run: :func:`grpolab.cli.build_parser` (``compare``: :func:`grpolab.compare.parser`),
then the ``--key value`` pairs that `train`, `eval` and `sft` take besides, through the same reader the CLI uses.
"""
import ast
import re
import shlex
from pathlib import Path

import pytest

from grpolab import cli
from grpolab.config import Config

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "docs" / "python_api.md", ROOT / "src" / "grpolab" / "api.py"]


def _quoted_commands(text: str) -> list[str]:
    """`grpolab ...` in backticks, and the lines of fenced code blocks that start with ``grpolab``."""
    out = re.findall(r"`(grpolab [a-z][^`]*)`", text)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("grpolab "):
                out.append(line.split(" #")[0].strip())
    return out


def commands_in(path: Path) -> list[str]:
    """The command lines quoted in a markdown file, or in a Python module's docstrings and string literals
    (one string per literal: implicitly concatenated pieces are joined, f-string fields read as ``X``)."""
    text = path.read_text()
    if path.suffix != ".py":
        return _quoted_commands(text)
    strings = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.JoinedStr):
            strings.append("".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append(node.value)
    return [c for s in strings for c in _quoted_commands(s)]


def parse_error(command: str) -> str | None:
    """None when ``command`` parses with grpolab's own parsers; else why not."""
    argv = shlex.split(command)[1:]
    if argv[0] in ("bench", "vllm-serve"):  # parsers of their own that need optional packages
        return None
    try:
        if argv[0] == "compare":
            from grpolab.compare import parser
            parser().parse_known_args(argv[1:])
            return None
        args, rest = cli.build_parser().parse_known_args(argv)
        if args.command in ("train", "eval", "sft", "config"):
            cli._kv_pairs(rest, Config.field_names())
        elif rest:
            return f"unrecognised arguments {rest}"
    except SystemExit:
        return "argparse refuses it"
    except Exception as e:  # ConfigError from the --key value reader
        return f"{type(e).__name__}: {e}"
    return None


def test_the_checker_refuses_what_the_cli_refuses(capsys):
    assert parse_error("grpolab train --resume --out OUTPUT_DIR") is not None
    assert parse_error("grpolab train --steps") is not None
    assert parse_error("grpolab eval --data x.jsonl") is not None  # --model is required
    assert parse_error("grpolab train --resume OUTPUT_DIR --steps 60") is None
    assert parse_error("grpolab eval --model OUT/final --max_completion_length 64") is None
    capsys.readouterr()


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_quoted_command_parses(source, capsys):
    commands = commands_in(source)
    assert commands, f"no `grpolab ...` command found in {source}: the extraction is broken"
    bad = {c: parse_error(c) for c in commands}
    capsys.readouterr()
    assert not {c: e for c, e in bad.items() if e}, f"{source.name}: command lines that do not parse"
