"""The catalogue: every built-in component, imported once so that its registry knows it.

Importing this module registers the algorithms, rewards, tasks, prompt samplers,
rollout strategies and stages (``grpolab/__init__.py`` does it, so any
``import grpolab...`` sees a full catalogue). Components registered from user
code join the same registries and are first-class: their declared parameters
are config keys of the runs that select them, and :func:`describe` lists them.

:func:`describe` is the catalogue as plain data (``grpolab components``,
docs/components.md): for each component its kind, name, source file and line,
the papers its docstring cites (arXiv ids, seed ids), the recipes that select
it, the first line of its docstring and its declared parameters.
"""
from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
from pathlib import Path
from typing import Any

# the packages by their own names (``from . import agents`` would read them off grpolab's __init__, which imports
# this module: a cycle)
import grpolab.agents as agents
import grpolab.algorithms as algorithms
import grpolab.policies as policies
import grpolab.prompts as prompts
import grpolab.rewards as rewards
import grpolab.rollouts as rollouts
import grpolab.stages as stages
import grpolab.tasks as tasks

from .distributed import ray_workers as _ray_workers  # noqa: F401  (registers the Ray generation engine)
from .errors import UnknownComponentError
from .registry import ALL_REGISTRIES, declared_params

COMPONENT_PACKAGES = (agents, algorithms, policies, prompts, rewards, rollouts, stages, tasks)

# A new component is one new file: every module of the component packages is imported (and so registers
# what it defines) without an edit to the package's __init__. A policy kind is one package of
# grpolab/policies (policies/<kind>/, shared code in policies/_<name>/): every module of it is imported too, so a
# new kind edits no shared list (docs/architecture.md).
for _pkg in COMPONENT_PACKAGES:
    for _mod in pkgutil.iter_modules(_pkg.__path__):
        _m = importlib.import_module(f"{_pkg.__name__}.{_mod.name}")
        if _pkg is policies and _mod.ispkg:
            for _sub in pkgutil.iter_modules(_m.__path__):
                importlib.import_module(f"{_m.__name__}.{_sub.name}")

__all__ = ["ALL_REGISTRIES", "COMPONENT_PACKAGES", "PROVENANCE_KINDS", "describe", "components_markdown",
           "components_text", "parse_provenance", "provenance_markdown"]

_SRC = Path(__file__).resolve().parent.parent  # src/: built-in files are named relative to it
_ARXIV = re.compile(r"arXiv:\s*(\d{4}\.\d{4,5})")
_SEED = re.compile(r"(?<![\w.:/-])(\d{3}-\d{2,3})(?![\w-])")


# The provenance of a component: a docstring paragraph ``Provenance: <kind> — <source>; <notes>.``
# (the em dash may be written `` - ``). Kind -> the words of docs/variants/provenance.md.
PROVENANCE_KINDS = {
    "authors' code": "matches the authors' code",
    "paper equations": "matches the paper's equations",
    "reconstructed from the abstract": "reconstructed from the abstract",
    "grpolab's own": "grpolab's own (no published method)",
    "user's own": "a user's own method (not published, or not yet)",
}
_PROVENANCE = re.compile(r"^Provenance:\s*(?P<kind>" + "|".join(map(re.escape, PROVENANCE_KINDS))
                         + r")\s*(?:—| - )\s*(?P<rest>.*)$", re.S)
_URL = re.compile(r"https?://[^\s,;]+")
# The paragraph's optional last sentence ``Test: tests/<file>.py::<name>[, ...].``: the tests that check the
# component against values re-derived from the authors' code or the paper's equations.
_TESTS = re.compile(r"(?:^|(?<=[.;])\s+)Tests?:\s*(?P<tests>tests/[\w/]+\.py::\w+(?:\s*,\s*tests/[\w/]+\.py::\w+)*)\.?$")


def parse_provenance(doc: str) -> dict | None:
    """The ``Provenance:`` paragraph of a docstring as data, or None when it has none (or an unknown kind).

    ``kind`` (a key of :data:`PROVENANCE_KINDS`), ``source`` (the text before the first ``;``: for authors'
    code the repository URL and the file, for paper equations the paper and equation numbers, for a
    reconstruction the choices), ``notes`` (the rest), ``url`` and ``path`` (authors' code only: the
    repository and the file named right after it, ``None`` when missing), ``tests`` (the
    ``tests/<file>.py::<name>`` entries of the paragraph's last sentence ``Test: ...``, empty when it has none).
    """
    for para in re.split(r"\n\s*\n", doc or ""):
        text = " ".join(para.split())
        if not text.startswith("Provenance:"):
            continue
        m = _PROVENANCE.match(text)
        if m is None:
            return None
        rest = m.group("rest").strip()
        tests: list[str] = []
        t = _TESTS.search(rest)
        if t:
            tests = [x.strip() for x in t.group("tests").split(",")]
            rest = rest[:t.start()].strip()
        depth, cut = 0, len(rest)
        for i, ch in enumerate(rest):  # the first "; " outside parentheses ends the source
            depth += (ch == "(") - (ch == ")")
            if depth == 0 and rest.startswith("; ", i):
                cut = i
                break
        source, notes = rest[:cut], rest[cut + 2:]
        url = path = None
        if m.group("kind") == "authors' code":
            u = _URL.search(source)
            if u:
                url = u.group(0).rstrip(".")
                after = source[u.end():].lstrip(" ,")
                path = after.split(" ")[0].strip("`,.()") or None
        return {"kind": m.group("kind"), "source": source.rstrip("."), "notes": notes.strip(), "url": url,
                "path": path, "tests": tests}
    return None


def _source(obj) -> tuple[str | None, int | None]:
    """``(file, line)`` of a component's definition; built-in files relative to ``src/``."""
    target = inspect.unwrap(obj) if callable(obj) else obj
    try:
        path = Path(inspect.getsourcefile(target) or "").resolve()
        line = inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return None, None
    try:
        name = path.relative_to(_SRC).as_posix()
    except ValueError:
        name = str(path)
    return name, line


def _plain(value: Any) -> Any:
    """A default as JSON-able data (tuples become lists; other objects their repr)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def _recipes_by_component() -> dict[tuple[str, str], list[dict]]:
    """``(config key, registered name) -> recipes`` for every component a recipe names."""
    from .recipes import all_recipes

    regs = {reg.key: reg for reg in ALL_REGISTRIES.values() if reg.key}
    out: dict[tuple[str, str], list[dict]] = {}
    for r in all_recipes():
        info = {k: r.get(k) for k in ("name", "title", "citation", "seed")}
        for key, value in {**r["parameters"], **r["components"]}.items():
            reg = regs.get(key)
            if reg is None:
                continue
            for v in value if isinstance(value, list) else [value]:
                if reg.switch:  # `dynamic_sampling: true` selects the component named like the key
                    v = key if v is True else None
                if not isinstance(v, str):
                    continue
                name = reg.split(v.partition("=")[0])[0]
                lst = out.setdefault((key, name), [])
                if info not in lst:
                    lst.append(info)
    return out


def describe(kind: str | None = None) -> list[dict]:
    """Every registered component (built-in or registered from user code) as plain data.

    ``kind`` is a short kind name (a key of :data:`~grpolab.registry.ALL_REGISTRIES`: ``advantage``,
    ``rollout``, ...); ``None`` lists all. Each entry: ``kind``, ``registry`` (its long name), ``key`` (the
    config key that selects it, or None), ``name``, ``file``, ``line``, ``arxiv`` and ``seeds`` (ids cited by
    its docstring), ``recipes`` (``name``, ``title``, ``citation``, ``seed`` of the recipes that select it),
    ``summary`` (the docstring's first line, or first paragraph when it wraps), ``provenance``
    (:func:`parse_provenance` of its docstring, None when it has no such paragraph), ``params`` (``key``, ``default``, ``type``, ``help``,
    ``choices``, ``owners``) and ``needs`` (the policy capabilities it declared, ``register(..., needs=...)``).
    """
    if kind is not None and kind not in ALL_REGISTRIES:
        raise UnknownComponentError(f"unknown component kind '{kind}'; valid kinds: {', '.join(ALL_REGISTRIES)}")
    used = _recipes_by_component()
    out = []
    for short, reg in ALL_REGISTRIES.items():
        if kind is not None and short != kind:
            continue
        for name, obj in reg.items():
            doc = inspect.getdoc(obj) or ""
            file, line = _source(obj)
            recipes = used.get((reg.key, name), []) if reg.key else []
            seeds = list(dict.fromkeys(_SEED.findall(doc)))
            out.append({
                "kind": short, "registry": reg.kind, "key": reg.key,
                "name": name + reg._prefixes[name] if name in reg._prefixes else name,
                "file": file, "line": line,
                "arxiv": list(dict.fromkeys(_ARXIV.findall(doc))), "seeds": seeds,
                "recipes": recipes,
                "summary": " ".join(doc.strip().split("\n\n")[0].split()),
                "provenance": parse_provenance(doc),
                "params": [{"key": k, "default": _plain(p.default), "type": p.annotation, "help": p.help,
                            "choices": _plain(p.choices), "owners": list(p.owners)}
                           for k, p in sorted(declared_params(obj).items())],
                "needs": list(reg.needs(name)),
            })
    return out


# ----------------------------------------------------------------------------- text forms
def paper_text(c: dict, max_recipes: int = 2) -> str:
    """The papers of a component in one line: its docstring's ids, then the recipes that select it."""
    parts = [f"arXiv:{a}" for a in c["arxiv"]] + [f"seed {s}" for s in c["seeds"]]
    recipes = c["recipes"]
    if recipes and len(recipes) <= max_recipes:
        parts += [f"recipe `{r['name']}`: {r['title']}" + (f" ({r['citation']})" if r.get("citation") else "")
                  for r in recipes]
    elif recipes:
        parts.append(f"{len(recipes)} recipes: " + ", ".join(f"`{r['name']}`" for r in recipes))
    return "; ".join(parts)


def param_text(p: dict) -> str:
    choices = f" ({' / '.join(map(str, p['choices']))})" if p["choices"] else ""
    return f"`{p['key']}` = `{p['default']!r}`{choices}: {p['help']}"


def needs_text(c: dict) -> str:
    """What a component needs from the policy, in words (empty when it declared nothing)."""
    return f"needs a policy with {' and '.join(c['needs'])}" if c.get("needs") else ""


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def components_markdown(components: list[dict]) -> str:
    """One section per kind, a table of its components (docs/components.md; ``grpolab components --markdown``)."""
    lines: list[str] = []
    for short, reg in ALL_REGISTRIES.items():
        rows = [c for c in components if c["kind"] == short]
        if not rows:
            continue
        key = f"config key `{reg.key}`" if reg.key else "no config key"
        lines += [f"## {short}: {reg.kind} ({key}, {len(rows)})", "",
                  "| name | defined in | paper | what it does | parameters |", "|---|---|---|---|---|"]
        for c in rows:
            # the file only: line numbers (in `grpolab components`) would make every edit stale the generated page
            where = f"`{c['file']}`" if c["file"] else "—"
            params = "<br>".join(_cell(param_text(p)) for p in c["params"]) or "—"
            what = "<br>".join(_cell(s) for s in (c["summary"], needs_text(c) and f"*{needs_text(c)}*") if s)
            lines.append(f"| `{_cell(c['name'])}` | {where} | {_cell(paper_text(c)) or '—'} | "
                         f"{what or '—'} | {params} |")
        lines.append("")
    return "\n".join(lines)


def components_text(components: list[dict]) -> str:
    """The plain-text listing of ``grpolab components``."""
    lines: list[str] = []
    last = None
    for c in components:
        if c["kind"] != last:
            last = c["kind"]
            key = f" (--{c['key']})" if c["key"] else ""
            lines += ["" if lines else None, f"[{c['kind']}] {c['registry']}{key}"]
            lines = [x for x in lines if x is not None]
        where = f"{c['file']}:{c['line']}" if c["file"] else "?"
        lines.append(f"  {c['name']:<24} {where}")
        if c["summary"]:
            lines.append(f"  {'':<24} {c['summary']}")
        paper = paper_text(c, max_recipes=1).replace("`", "")
        if paper:
            lines.append(f"  {'':<24} paper: {paper}")
        if c.get("needs"):
            lines.append(f"  {'':<24} {needs_text(c)}")
        for p in c["params"]:
            lines.append(f"  {'':<24} --{param_text(p).replace('`', '')}")
    return "\n".join(lines) + "\n"


def provenance_markdown(components: list[dict]) -> str:
    """docs/variants/provenance.md's table (``grpolab components --provenance``): one row per component,
    grouped by provenance kind, with the paper, the source (repository and file, equations, or the choices
    made), the tests that check it against the authors' code or the paper's equations, and the recipes that
    select it. Components without a parseable paragraph are listed as missing."""
    order = list(PROVENANCE_KINDS) + [None]
    rows = sorted(components, key=lambda c: order.index((c["provenance"] or {}).get("kind")))
    counts = {k: sum((c["provenance"] or {}).get("kind") == k for c in components) for k in order}
    lines = [", ".join(f"{PROVENANCE_KINDS[k]}: {counts[k]}" for k in PROVENANCE_KINDS)
             + (f", **missing: {counts[None]}**" if counts[None] else "") + f" ({len(components)} components).",
             "", "| kind | component | registry | paper | source | tests | recipes |", "|---|---|---|---|---|---|---|"]
    for c in rows:
        prov = c["provenance"]
        kind = PROVENANCE_KINDS[prov["kind"]] if prov else "**missing**"
        paper = "; ".join([f"arXiv:{a}" for a in c["arxiv"]] + [f"seed {s}" for s in c["seeds"]]) or "—"
        source = prov["source"] if prov else "—"
        if prov and prov["kind"] == "reconstructed from the abstract" and prov["notes"]:
            source += "; " + prov["notes"].rstrip(".")  # the choices made are the point of this kind
        names = [f"`{r['name']}`" for r in c["recipes"]]
        recipes = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "") or "—"
        tests = "<br>".join(f"`{t}`" for t in (prov or {}).get("tests", [])) or "—"
        lines.append(f"| {kind} | `{_cell(c['name'])}` | {c['registry']} | {paper} | {_cell(source)} | {tests} "
                     f"| {recipes} |")
    return "\n".join(lines) + "\n"
