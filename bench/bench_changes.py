"""The change data feed read over 1,000 commits (issue 24): ``Table.changes`` versus
delta-rs's ``DeltaTable.load_cdf`` on the same table.

The table is written once by ``deltalake`` with ``delta.enableChangeDataFeed = true``:
version 0 creates it with ``--rows`` rows (default 1,000) in 4 partitions, then 999 [199
with ``--quick``] commits cycle through an append of 10 rows (no change data files: its
inserts come from the ``add`` actions), a DELETE of one row and an UPDATE of one row (both
with ``cdc`` actions and ``_change_data`` files, a rewritten data file each). So a read of
the whole feed plans from 1,000 commit files and reads about 330 appended data files and
670 change data files.

Timed, per engine, on the same directory, from opening the table to the Arrow rows of
versions 0 to latest:

* ours:      ``Table.open(path).changes(0)``
* deltalake: ``pa.table(DeltaTable(path).load_cdf(starting_version=0).read_all())``

Before any timing both must return the same rows (compared without ``_commit_timestamp``:
delta-rs dates commits by ``commitInfo.timestamp``, Delta and we by the commit file's
modification time), else ERROR and exit 1. Then one untimed warm-up read per engine and
``--repeat`` (default 5) timed reads each, interleaved, the first engine rotating,
``gc.collect()`` before each; median [min-max] of wall time and of CPU time (user +
system, all threads of this process). Target: ours at most 1.0x deltalake's wall time.

Run: ``.venv/bin/python bench/bench_changes.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from bench._common import Stat, cpu_seconds, machine_note, parse_args, print_table, ratio, rotated, verdict
from eventlog import Table

ENGINES = ("ours", "deltalake")
TARGET = 1.0  # ours / deltalake, wall time
CDF = {"delta.enableChangeDataFeed": "true"}


def build(path: str, commits: int, rows: int) -> None:
    """The benchmark table (see the module docstring), written by deltalake."""
    ids = pa.array(range(rows), pa.int64())
    first = pa.table({"id": ids, "part": pc.cast(pc.bit_wise_and(ids, 3), pa.string()), "value": ids})
    write_deltalake(path, first, partition_by=["part"], configuration=CDF)
    table = DeltaTable(path)
    next_id = rows
    for version in range(1, commits):
        step = version % 3
        if step == 1:
            new = pa.array(range(next_id, next_id + 10), pa.int64())
            batch = pa.table({"id": new, "part": pc.cast(pc.bit_wise_and(new, 3), pa.string()), "value": new})
            write_deltalake(table, batch, mode="append")
            next_id += 10
        elif step == 2:
            table.delete(f"id = {version}")
        else:
            table.update(predicate=f"id = {version + 1}", updates={"value": "value + 1"})


def ours(path: str) -> pa.Table:
    with Table.open(path) as table:
        return table.changes(0)


def theirs(path: str) -> pa.Table:
    return pa.table(DeltaTable(path).load_cdf(starting_version=0).read_all())


def comparable(rows: pa.Table) -> list[tuple[Any, ...]]:
    names = ["id", "part", "value", "_change_type", "_commit_version"]
    cols = [
        pc.cast(rows.column(n), pa.string() if n in ("part", "_change_type") else pa.int64()) for n in names
    ]
    return sorted(zip(*(c.to_pylist() for c in cols), strict=True))


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], default_repeat=5, quick_repeat=3)
    commits = 200 if args.quick else 1000
    rows = 1000
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "cdf")
        start = time.perf_counter()
        build(path, commits, rows)
        print(f"built {commits} commits with deltalake in {time.perf_counter() - start:.1f} s")
        runners: dict[str, Callable[[], pa.Table]] = {
            "ours": lambda: ours(path),
            "deltalake": lambda: theirs(path),
        }
        results = {engine: runners[engine]() for engine in ENGINES}  # also the warm-up
        if comparable(results["ours"]) != comparable(results["deltalake"]):
            print("ERROR: the engines return different rows", file=sys.stderr)
            return 1
        n_rows = results["ours"].num_rows
        del results
        wall: dict[str, list[float]] = {e: [] for e in ENGINES}
        cpu: dict[str, list[float]] = {e: [] for e in ENGINES}
        for rep in range(args.repeat):
            for engine in rotated(ENGINES, rep):
                gc.collect()
                t0, c0 = time.perf_counter(), cpu_seconds()
                out = runners[engine]()
                wall[engine].append(time.perf_counter() - t0)
                cpu[engine].append(cpu_seconds() - c0)
                assert out.num_rows == n_rows
                del out
    w = {e: Stat.of(wall[e]) for e in ENGINES}
    c = {e: Stat.of(cpu[e]) for e in ENGINES}
    print_table(
        f"Change data feed, versions 0-{commits - 1} ({n_rows} change rows), {args.repeat} runs",
        ["engine", "wall s", "CPU s"],
        [[e, w[e].fmt(".3f"), c[e].fmt(".3f")] for e in ENGINES],
    )
    wall_ratio = ratio(w["ours"].median, w["deltalake"].median)
    cpu_ratio = ratio(c["ours"].median, c["deltalake"].median)
    met = verdict(wall_ratio <= TARGET)
    print(f"ours / deltalake: wall {wall_ratio:.2f}x, CPU {cpu_ratio:.2f}x (target wall <= {TARGET}x: {met})")
    print(machine_note())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
