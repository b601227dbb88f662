import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

#: torch threads per test process: 1 under pytest-xdist (`make test` runs one worker per core: two workers of 2
#: threads each on 2 cores oversubscribe them, and the suite's tiny models ran 2-4x slower so), else 2
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
torch.set_num_threads(THREADS)


@pytest.fixture
def tiny_args(tmp_path):
    """Config layers for a fast tiny-model run on the `repeat` task."""
    return {"model": "tiny", "task": "repeat", "steps": 4, "prompts_per_step": 4, "num_generations": 4,
            "max_completion_length": 6, "learning_rate": 3e-3, "eval_before": False, "eval_after": False,
            "tensorboard": False, "save_steps": 2, "micro_batch_size": 16, "out": str(tmp_path / "run")}


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """A test that runs with ``threads: 1`` (torch.set_num_threads is process-wide) must not change
    the numerics of the tests after it."""
    yield
    torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True)
def _float32_on_cpu(monkeypatch):
    """dtype auto picks bfloat16 on CPUs with native bf16 matrix units (grpolab.devices); the suite's
    numeric thresholds are for float32, so it runs in float32 on every CPU: the CPU kind is pinned to `avx2`
    (no native bf16) for the tests and the processes they start. Tests of the bf16 path set dtype bfloat16."""
    monkeypatch.setenv("GRPOLAB_CPU_KIND", "avx2")


@pytest.fixture(autouse=True)
def _forget_test_components():
    """Registries are process-wide: a component a test registers (one not defined in grpolab itself) is
    removed when the test ends, so the tests after it in the same process (``make test`` runs files on two
    workers in an order that varies) see only the built-in catalogue, e.g. test_components_doc_is_current."""
    from grpolab.registry import ALL_REGISTRIES, GENERATION_ENGINES

    registries = [*ALL_REGISTRIES.values(), GENERATION_ENGINES]
    before = [set(r._items) for r in registries]
    yield
    for registry, names in zip(registries, before):
        for name in set(registry._items) - names:
            if not getattr(registry._items[name], "__module__", "").startswith("grpolab"):
                for table in (registry._items, registry._checks, registry._prefixes, registry._min_group,
                              registry._columns, registry._needs):
                    table.pop(name, None)


#: The files that take longest, longest first (measured: a fresh clone, an empty model cache, `make test`).
#: pytest-xdist's loadfile hands a worker its next file when it is nearly done, in collection order; a long file
#: collected last runs alone at the end while the other worker idles, so these come first (longest first), then
#: the rest by their number of tests (xdist's own order; the Makefile passes --no-loadscope-reorder).
LONGEST_FIRST = ("test_training.py", "test_data_formats.py", "test_vision.py", "test_image_reliability.py",
                 "test_compare.py", "test_var_image.py", "test_ray_workers.py", "test_team.py", "test_dllm.py",
                 "test_ddpm_policy.py", "test_ar_image.py", "test_image_dgpo_vipo.py", "test_vllm_server.py",
                 "test_vision_tools_avatar.py", "test_image_policies.py", "test_distributed.py", "test_vgc.py")


def pytest_collection_modifyitems(config, items):
    from collections import Counter

    count = Counter(item.path.name for item in items)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -count[item.path.name], item.path.name))



# GRPOLAB_TEST_CPU=FILE: append one line per test, "<cpu seconds> <nodeid>", the CPU time of its setup, call and
# teardown in this process and in the child processes it waited for (resource.getrusage); the suite's cost by
# CPU rather than wall time, which other jobs on the machine inflate (scripts/test_costs.py sums it per file)
if os.environ.get("GRPOLAB_TEST_CPU"):
    import resource

    def _cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        t0 = _cpu()
        yield
        with open(os.environ["GRPOLAB_TEST_CPU"], "a") as f:
            f.write(f"{_cpu() - t0:.3f} {item.nodeid}\n")
