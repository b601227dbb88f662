"""Cost of one sandbox call (docs/safety.md "Cost per call").

    python scripts/bench_sandbox.py            # the grpolab on sys.path

The median of 30 ``Sandbox.call``s of a trivial function and of 5 ``Sandbox.map``s of 32 items, for a worker
without preload and one with sympy and reasoning-gym loaded (the size of ``rg:`` scoring's worker). For the
figure of another version, put its ``src`` first on PYTHONPATH.
"""
import statistics
import time


def warm():
    """Preload: make the worker as large as reasoning-gym scoring's (sympy and reasoning-gym imported)."""
    import reasoning_gym  # noqa: F401
    import sympy  # noqa: F401


def main():
    import bench_sandbox  # this file by name, so the worker can import ``warm`` without running main()
    from grpolab.sandbox import Sandbox

    for label, pre in (("no preload", []), ("sympy + reasoning-gym", [(bench_sandbox.warm, ())])):
        with Sandbox(preload=pre) as box:
            box.call(len, "x")
            calls, maps = [], []
            for _ in range(30):
                t = time.perf_counter()
                box.call(len, "abc")
                calls.append(time.perf_counter() - t)
            for _ in range(5):
                t = time.perf_counter()
                box.map(len, [("abc",)] * 32)
                maps.append(time.perf_counter() - t)
            print(f"| {label} | {statistics.median(calls) * 1000:.1f} ms | {statistics.median(maps) * 1000:.0f} ms | "
                  f"{box.isolation.get('view', 'host')} |")


if __name__ == "__main__":
    main()
