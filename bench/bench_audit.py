"""Auditing a long log: ``verify`` and ``replay`` on a 10,000-commit table, next to reading
the same log's history with deltalake.

The table is built once with our library (1-row appends through one handle, the default
checkpoint every 100 versions), so every commit is hash-chained and anchored in the
embedded slot store. Then, each ``--repeat`` times (interleaved, the first call rotating):

* ours: ``Table.handle(path).verify()``: reads every commit file, recomputes its hash,
  checks its link and its slot anchor;
* ours: ``list(Table.open(path).replay())``: folds every commit and compares the fold with
  every checkpoint and the final snapshot;
* peer: ``DeltaTable(path).history()``: deltalake reading every commit's commitInfo, the
  closest thing it has to walking the whole log;
* reference: ``Table.open(path).version`` (from the last checkpoint).

Wall and CPU time are reported; ratios are ours / deltalake's history (lower is better).
There is no target in the issue beyond reporting the times.

Run: ``.venv/bin/python bench/bench_audit.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import gc
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa

from bench._common import Stat, cpu_seconds, machine_note, parse_args, print_table, ratio, rotated

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])


def build_table(path: str, commits: int) -> float:
    from eventlog import Table

    start = time.perf_counter()
    t = Table.create(path, SCHEMA)
    for i in range(1, commits):
        t.append(pa.table({"id": pa.array([i], pa.int64()), "payload": [f"row-{i:06d}"]}, schema=SCHEMA))
    return time.perf_counter() - start


def main() -> int:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "", default_repeat=3, quick_repeat=1)
    commits = 500 if args.quick else 10_000
    print(f"# bench_audit ({'quick' if args.quick else 'full'}): {machine_note()}")
    tmp = tempfile.mkdtemp(prefix="bench-audit-")
    try:
        from deltalake import DeltaTable

        from eventlog import Table

        path = str(Path(tmp) / "table")
        secs = build_table(path, commits)
        print(f"built {commits} commits in {secs:.1f} s")
        report = Table.handle(path).verify()
        if not report.ok or report.versions_checked != commits or report.anchors_checked != commits:
            print(f"ERROR: the built table must verify with every anchor: {report}")
            return 1
        if len(list(Table.open(path).replay())) != commits or len(DeltaTable(path).history()) != commits:
            print("ERROR: replay and deltalake's history must see every commit")
            return 1

        calls: dict[str, Callable[[], object]] = {
            "ours: Table.handle(path).verify()": lambda: Table.handle(path).verify(),
            "ours: list(Table.open(path).replay())": lambda: list(Table.open(path).replay()),
            "deltalake: DeltaTable(path).history()": lambda: DeltaTable(path).history(),
            "ours: Table.open(path).version": lambda: Table.open(path).version,
        }
        wall: dict[str, list[float]] = {name: [] for name in calls}
        cpu: dict[str, list[float]] = {name: [] for name in calls}
        for rep in range(args.repeat):
            for name in rotated(list(calls), rep):
                gc.collect()
                c0, t0 = cpu_seconds(), time.perf_counter()
                calls[name]()
                wall[name].append(1000 * (time.perf_counter() - t0))
                cpu[name].append(1000 * (cpu_seconds() - c0))
        peer = Stat.of(wall["deltalake: DeltaTable(path).history()"]).median
        rows = []
        for name in calls:
            w, c = Stat.of(wall[name]), Stat.of(cpu[name])
            rows.append([name, w.fmt(".0f"), c.fmt(".0f"), f"{ratio(w.median, peer):.2f}x"])
        print_table(
            f"{commits} commits ({args.repeat} runs, median [min-max])",
            ["call", "wall ms", "CPU ms", "wall / deltalake history"],
            rows,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
