"""The suite's CPU cost per test file, from a run with ``GRPOLAB_TEST_CPU=FILE`` (tests/conftest.py).

    GRPOLAB_TEST_CPU=/tmp/cpu.txt make test; python scripts/test_costs.py /tmp/cpu.txt [--tests 30]
"""
import argparse
import collections


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--tests", type=int, default=30, help="also list the N most costly tests")
    a = ap.parse_args(argv)
    per_file, per_test = collections.Counter(), []
    for line in open(a.file):
        sec, node = line.split(" ", 1)
        per_file[node.split("::")[0]] += float(sec)
        per_test.append((float(sec), node.strip()))
    total = sum(per_file.values())
    print(f"total {total:.0f} CPU s over {len(per_test)} tests (2 cores: about {total / 2:.0f} s of wall time)")
    for f, s in per_file.most_common():
        print(f"{s:8.1f}  {f}")
    print()
    for s, n in sorted(per_test, reverse=True)[:a.tests]:
        print(f"{s:8.1f}  {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
