"""Measures the default test cases and writes tests/durations.json: the ones slower than a limit,
which conftest.py then marks `long` (skipped by `python -m pytest`, run by .ci/run's own step).

    python scripts/test_durations.py            # every case not `slow`, measured; the file rewritten
    python scripts/test_durations.py --add      # the current default suite only; cases over the limit added

A case's time is its setup, call and teardown together, so a module fixture's build counts on the
first case that uses it: after the file changes, the fixture lands on another case, which `--add`
finds (run it until it adds nothing). Run it with nothing else busy on the machine: the limit is in
seconds of this machine. Exit status: pytest's (the file is written only when every case passed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations.json"
LIMIT_S = 1.0


class Timer:
    """A pytest plugin summing each case's setup, call and teardown seconds by node id."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--add", action="store_true", help="measure the default suite only and add to the file")
    ap.add_argument("--limit", type=float, default=LIMIT_S, help=f"seconds a default case may take ({LIMIT_S})")
    args = ap.parse_args()
    os.chdir(ROOT)  # node ids relative to the repository, as conftest.py reads them
    timer = Timer()
    selection = "not slow and not long" if args.add else "not slow"
    status = pytest.main(["-q", "-p", "no:cacheprovider", "-m", selection, "tests"], plugins=[timer])
    if status != 0:
        print(f"test_durations.py: pytest exited {int(status)}; {DURATIONS} unchanged", file=sys.stderr)
        return int(status)
    long = json.loads(DURATIONS.read_text(encoding="utf-8")) if args.add else {}
    long.update({n: round(s, 2) for n, s in timer.seconds.items() if s > args.limit})
    DURATIONS.write_text(json.dumps(dict(sorted(long.items())), indent=0) + "\n", encoding="utf-8")
    print(f"{len(long)} cases over {args.limit} s -> {DURATIONS} "
          f"(this run: {sum(timer.seconds.values()):.0f} s in all, {len(timer.seconds)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
