"""Regenerate the generated parts of the docs: README recipe table, docs/configuration.md table.

Run: .venv/bin/python scripts/regen_docs.py   (tests check both are current)
"""
import contextlib
import io
import re
from pathlib import Path

from grpolab.cli import main

root = Path(__file__).resolve().parent.parent


def out(args):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(args) == 0
    return buf.getvalue()


readme = root / "README.md"
s = readme.read_text()
s = re.sub(r"(<!-- recipes:start -->\n).*?(<!-- recipes:end -->)",
           lambda m: m.group(1) + out(["recipes", "--markdown"]) + m.group(2), s, flags=re.S)
readme.write_text(s)
conf = root / "docs" / "configuration.md"
c = conf.read_text()
i = c.index("| key | default | meaning |")
conf.write_text(c[:i] + out(["config", "--markdown"]))
print("regenerated README recipe table and docs/configuration.md")
