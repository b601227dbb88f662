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
SOURCES = [ROOT / "docs" / "python_api.md", ROOT / "src" / "grpolab" / "api.py", ROOT / "docs" / "science.md"]


def _quoted_commands(text: str) -> list[str]:
    """`grpolab ...` in backticks, and the lines of fenced code blocks that start with ``grpolab``."""
    out = [c for c in re.findall(r"`(grpolab [a-z][^`]*)`", text) if " " in c.strip()[len("grpolab "):]]
    # (a bare `grpolab compare` names the subcommand; it is not a command line)
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


# Folders that exist only on the machine a document was written on (its temp dir, a home, a work tree). A
# document gives the command that reproduces a result, and the relative folder that command writes
# (`science_runs/...`, `runs/...`), never where a run happened to land. Placeholders a reader substitutes
# (`/shared/runs/...` for a shared file system, `/path/to/...`) and per-user folders every machine has
# (`~/.cache/grpolab`) are not machine folders.
MACHINE_PATH = re.compile(r"(?<![\w.~:/-])(?:/(?:tmp|work|home|root|Users|mnt|scratch|private|var/folders)/\S*"
                          r"|[A-Za-z]:\\\S*)")
MACHINE_PATH_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_machine_path_check_finds_what_it_should():
    found = MACHINE_PATH.findall("in `/work/science/`; (`/tmp/sci/show/compare.md` there); C:\\runs\\x")
    assert found == ["/work/science/`;", "/tmp/sci/show/compare.md`", "C:\\runs\\x"]
    assert not MACHINE_PATH.findall("science_runs/c1/compare.md, runs/dapo, --out /shared/runs/dapo32, "
                                    "https://example.org/tmp/x, /path/to/model, tokens/s, OUT/final, "
                                    "~/.cache/grpolab")


@pytest.mark.parametrize("doc", MACHINE_PATH_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_no_folder_of_the_machine_they_were_written_on(doc):
    lines = [f"{i}: {line.strip()}" for i, line in enumerate(doc.read_text().splitlines(), 1)
             if MACHINE_PATH.search(line)]
    assert not lines, (f"{doc.relative_to(ROOT)} names folders of one machine; give the command that reproduces "
                       f"the result and the relative folder it writes instead:\n" + "\n".join(lines))


def test_config_keeps_each_value_with_its_name(capsys):
    """`grpolab config --advantage X` (docs/extending.md): argparse took X as the KEY to explain and left
    `--advantage` without a value; the KEY may come before, after or between the options."""
    from grpolab.cli import main

    assert main(["config", "--advantage", "leave_one_out", "--beta", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "advantage: leave_one_out" in out and "\nbeta: 0.1" in out
    for argv in (["config", "beta", "--advantage", "leave_one_out"], ["config", "--advantage", "leave_one_out", "beta"]):
        assert main(argv) == 0
        assert capsys.readouterr().out.startswith("beta: 0.0")
