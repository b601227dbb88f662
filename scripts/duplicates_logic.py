"""The `duplicates` pairs that remain once declarations are set aside: the measure behind issue 40's closing note.

    python scripts/duplicates_logic.py [--most N]

`duplicates` (the workplace's tool) pairs places of six or more lines of the same *shape*. In grpolab most of the
pairs it lists are component signatures (``name: type = param(default, 'help ...')``: distinct parameters, each
declared once, with their own help text) and ``self.a = a`` blocks that store them. This script copies the tracked
Python files to two temporary folders, one as they are and one with (1) every multi-line function signature's
lines after the ``def`` line (comment lines kept) and (2) every ``self.x = name`` / ``self.x, self.y = a, b``
statement blanked (line numbers kept), runs ``duplicates`` over both and prints both counts: what is left in the
second is code whose logic repeats. Nothing in the tree is changed.
"""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _stores_names(node: ast.Assign) -> bool:
    """``self.x = name`` or ``self.x, self.y = a, b``: attributes of ``self`` set to plain names."""
    if len(node.targets) != 1:
        return False
    t, v = node.targets[0], node.value
    targets, values = (t.elts, v.elts) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) else ([t], [v])
    return (len(targets) == len(values)
            and all(isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == "self"
                    for x in targets)
            and all(isinstance(x, ast.Name) for x in values))


def blank_declarations(source: str) -> str:
    """``source`` with multi-line signatures (all but their ``def`` line; comment lines kept) and ``self.x = name``
    statements blanked, line numbers kept."""
    lines = source.split("\n")
    blank: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            blank.update(i for i in range(node.lineno, node.body[0].lineno - 1)  # 0-based: after the def line
                         if not lines[i].lstrip().startswith("#"))
        elif isinstance(node, ast.Assign) and _stores_names(node):
            blank.update(range(node.lineno - 1, node.end_lineno))
    return "\n".join("" if i in blank else line for i, line in enumerate(lines))


def run_duplicates(repo: Path, most: int) -> str:
    try:
        return subprocess.run(["duplicates", "--repo", str(repo), "--most", str(most), "--seconds", "120"],
                              capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        sys.exit("duplicates_logic: the `duplicates` command is not on PATH (it is the workplace's tool, not a "
                 "Python package); run this where it is installed")


def copy_tree(files: list[str], dest: Path, blank: bool) -> None:
    """The tracked Python ``files`` under ``dest``, declarations blanked when ``blank``."""
    for rel in files:
        src = ROOT / rel
        if not src.is_file():
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        text = src.read_text()
        if blank:
            try:
                text = blank_declarations(text)
            except SyntaxError:
                pass
        out.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--most", type=int, default=200)
    a = ap.parse_args()
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    with tempfile.TemporaryDirectory() as as_is, tempfile.TemporaryDirectory() as blanked:
        copy_tree(files, Path(as_is), blank=False)
        copy_tree(files, Path(blanked), blank=True)
        print("the tracked Python files as they are:", run_duplicates(Path(as_is), 1).split("\n")[0])
        print("the same files, declarations blanked:")
        print(run_duplicates(Path(blanked), a.most))
    return 0


if __name__ == "__main__":
    sys.exit(main())
