"""Row tracking: append latency with ``delta.enableRowTracking`` on versus the same appends
to a table without it (issue 24's target: within 10%).

Each run creates a table of each configuration on the embedded slot store, then one process
appends the same batches to both, interleaved one by one (which table goes first alternates),
so that drift in the machine's load hits both alike; what is timed is each ``Table.append``
call (wall and the process's CPU). With row tracking every commit also gets fresh row ids (``baseRowId`` above
the high-water mark, ``defaultRowCommitVersion``) and a ``delta.rowTracking`` domain action.
Two batch shapes: 1 row (the commit path dominates) and 10,000 rows (the data file does).
The median of each run's median latency is reported, with the range over runs.

Afterwards each row-tracking table must hold unique row ids ``0..rows-1`` and a high-water
mark of ``rows - 1`` (checked, not timed).

Run: ``.venv/bin/python bench/bench_row_tracking.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa

from bench._common import Stat, machine_note, parse_args, print_table, ratio, rotated, verdict, wall_and_cpu

CONFIGS = ("row tracking", "plain")
TARGET = 1.10
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.float64()), ("tag", pa.string())])


def _batch(start: int, n: int) -> pa.Table:
    ids = pa.array(range(start, start + n), pa.int64())
    return pa.table(
        {"id": ids, "v": pa.array([float(i) for i in range(n)]), "tag": ["x" * 8] * n}, schema=SCHEMA
    )


def run(appends: int, rows: int) -> dict[str, tuple[float, float]]:
    """{config: (median wall ms, median CPU ms) per append}: both tables fresh, their
    appends interleaved one by one (which goes first alternates), so that a change of the
    machine's load hits both alike."""
    from eventlog import Table
    from eventlog.files import row_tracking as rt

    root = tempfile.mkdtemp(prefix="bench-rt-")
    try:
        tables = {
            "row tracking": Table.create(
                f"{root}/rt", SCHEMA, properties={"delta.enableRowTracking": "true"}
            ),
            "plain": Table.create(f"{root}/plain", SCHEMA),
        }
        batches = [_batch(i * rows, rows) for i in range(appends)]
        for table in tables.values():
            table.append(batches[0])  # warm-up (imports, first file)
        walls: dict[str, list[float]] = {c: [] for c in CONFIGS}
        cpus: dict[str, list[float]] = {c: [] for c in CONFIGS}
        for i, b in enumerate(batches[1:]):
            for config in rotated(CONFIGS, i):
                wall, cpu = wall_and_cpu(lambda t=tables[config], b=b: t.append(b))
                walls[config].append(wall * 1000)
                cpus[config].append(cpu * 1000)
        tracked = tables["row tracking"]
        got = tracked.to_arrow(row_ids=True).column("_row_id").to_pylist()
        assert sorted(got) == list(range(appends * rows)), "row ids must be 0..rows-1, each once"
        assert rt.high_water_mark(tracked.refresh().domains) == appends * rows - 1
        for table in tables.values():
            table.close()
        return {c: (statistics.median(walls[c]), statistics.median(cpus[c])) for c in CONFIGS}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    args = parse_args("append latency with and without row tracking", default_repeat=5, quick_repeat=1)
    appends = 20 if args.quick else 200
    print(machine_note())
    for rows in (1, 10_000):
        n = max(5, appends // 4) if rows > 1 else appends
        wall: dict[str, list[float]] = {c: [] for c in CONFIGS}
        cpu: dict[str, list[float]] = {c: [] for c in CONFIGS}
        for _ in range(args.repeat):
            for config, (w, c) in run(n, rows).items():
                wall[config].append(w)
                cpu[config].append(c)
        stats = {c: (Stat.of(wall[c]), Stat.of(cpu[c])) for c in CONFIGS}
        print_table(
            f"{n} appends of {rows:,} row(s) to each table, interleaved; median per append, "
            f"median [range] over {args.repeat} run(s)",
            ["config", "wall ms", "CPU ms"],
            [[c, stats[c][0].fmt(".2f"), stats[c][1].fmt(".2f")] for c in CONFIGS],
        )
        w_ratio = ratio(stats["row tracking"][0].median, stats["plain"][0].median)
        c_ratio = ratio(stats["row tracking"][1].median, stats["plain"][1].median)
        print(
            f"\nrow tracking / plain: wall {w_ratio:.2f}x, CPU {c_ratio:.2f}x "
            f"(target <= {TARGET:.2f}x: {verdict(w_ratio <= TARGET)})"
        )


if __name__ == "__main__":
    main()
