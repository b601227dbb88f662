"""The built-in tiny models' default recipes ship their folders (grpolab/model/builtin/, model/cache.py): a run
finds them without building, nothing stale ships, and GRPOLAB_BUILD_BUILTINS=1 builds as before."""
import importlib.util
from pathlib import Path


from grpolab.model import cache
from grpolab.model.cache import META, SHIPPED, cached_build, read_meta

SCRIPT = Path(__file__).parents[1] / "scripts" / "ship_builtin_weights.py"


def _script():
    spec = importlib.util.spec_from_file_location("ship_builtin_weights", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_default_recipe_is_shipped_current_and_nothing_else(tmp_path, monkeypatch):
    """Each built-in's path function returns its shipped folder without a build (the cache stays empty); the
    shipped meta's recipe is the recipe the code asks for today (else: run scripts/ship_builtin_weights.py)."""
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GRPOLAB_BUILD_BUILTINS", raising=False)
    logs = []
    found = {label: Path(fn(log=logs.append)) for label, fn in _script().default_builders().items()}
    for label, path in found.items():
        assert path.parent == SHIPPED, f"{label}: not shipped; run scripts/ship_builtin_weights.py"
        assert read_meta(path)["name"] == label
    assert logs == [] and not (tmp_path / "cache").exists()
    shipped = {p.name for p in SHIPPED.iterdir() if p.is_dir()}
    assert shipped == {p.name for p in found.values()}, "stale shipped folders: run scripts/ship_builtin_weights.py"
    assert all((SHIPPED / name / META).exists() for name in shipped)


def test_a_shipped_folder_is_used_unless_builds_are_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "SHIPPED", tmp_path / "shipped")
    recipe = {"a": 1}
    shipped = tmp_path / "shipped" / cache.cached_path("fake", recipe).name
    shipped.mkdir(parents=True)
    (shipped / META).write_text("{}")
    calls = []

    def build(tmp):
        calls.append(tmp)
        (tmp / "w").write_text("built")

    monkeypatch.delenv("GRPOLAB_BUILD_BUILTINS", raising=False)
    assert cached_build("fake", recipe, build, log=lambda m: None) == shipped and calls == []
    assert cached_build("fake", {"a": 2}, build, log=lambda m: None).parent == tmp_path / "cache"  # another recipe
    monkeypatch.setenv("GRPOLAB_BUILD_BUILTINS", "1")
    built = cached_build("fake", recipe, build, log=lambda m: None)
    assert built == cache.cached_path("fake", recipe) and (built / "w").read_text() == "built" and len(calls) == 2
