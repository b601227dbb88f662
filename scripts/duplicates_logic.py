"""The `duplicates` pairs that remain once declarations are set aside: the measure behind issue 40's closing note.

    python scripts/duplicates_logic.py [--most N]

`duplicates` (the workplace's tool) pairs places of six or more lines of the same *shape*. In grpolab most of the
pairs it lists are component signatures (``name: type = param(default, 'help ...')``: distinct parameters, each
declared once, with their own help text) and ``self.a = a`` blocks that store them. This script copies the tracked
Python files to a temporary folder with (1) every multi-line function signature's lines after the ``def`` line and
(2) every ``self.x = name`` statement blanked (line numbers kept), runs ``duplicates`` over the copy and prints
both counts, so what is left is code whose logic repeats. Nothing in the tree is changed.
"""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def blank_declarations(source: str) -> str:
    """``source`` with multi-line signatures (all but their ``def`` line) and ``self.x = name`` lines blanked."""
    lines = source.split("\n")
    blank: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            blank.update(range(node.lineno, node.body[0].lineno - 1))  # 0-based: the lines after the def line
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Name)
              and isinstance(node.targets[0], ast.Attribute) and isinstance(node.targets[0].value, ast.Name)
              and node.targets[0].value.id == "self"):
            blank.update(range(node.lineno - 1, node.end_lineno))
    return "\n".join("" if i in blank else line for i, line in enumerate(lines))


def run_duplicates(repo: Path, most: int) -> str:
    return subprocess.run(["duplicates", "--repo", str(repo), "--most", str(most), "--seconds", "120"],
                          capture_output=True, text=True, check=False).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--most", type=int, default=200)
    a = ap.parse_args()
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        for rel in files:
            src = ROOT / rel
            if not src.is_file():
                continue
            out = Path(tmp) / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text()
            try:
                text = blank_declarations(text)
            except SyntaxError:
                pass
            out.write_text(text)
        print("as the tree stands:", run_duplicates(ROOT, 1).split("\n")[0])
        print("declarations blanked:")
        print(run_duplicates(Path(tmp), a.most))
    return 0


if __name__ == "__main__":
    sys.exit(main())
