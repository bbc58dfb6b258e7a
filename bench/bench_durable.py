"""Durable mode's cost: append latency with and without fsync, on the real disk.

Three configurations, each run ``--repeat`` times on a fresh table in the system's temp
directory (interleaved, the first rotating, so that drift in machine load hits all alike):

* ours, default  -- ``Table.create(path, schema)`` then ``append`` (nothing fsynced)
* ours, durable  -- the same with ``durable=True`` (eventlog.log.durable: 7 fsyncs per append)
* deltalake      -- ``deltalake.write_deltalake(path, data, mode="append")`` (the peer)

Two workloads: ``--small`` 1-row appends, ``--large`` appends of ``--rows`` rows
(``id int64, value float64, name string``). Per run: the median latency of its appends
(wall, ``time.perf_counter``) and the CPU time of this process per append
(``time.process_time``: user + system, all threads); reported: the median over runs, and
the range. Table creation is not timed. Afterwards every table holds every row.

Run: ``.venv/bin/python bench/bench_durable.py [--repeat N] [--small N] [--large N] [--rows N]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import deltalake
import pyarrow as pa

from bench._common import machine_note, print_table
from eventlog import Table

CONFIGS = ("ours, default", "ours, durable", "deltalake")
SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.float64()), ("name", pa.string())])


def batch(start: int, rows: int) -> pa.Table:
    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.table(
        {
            "id": ids,
            "value": pa.array([i * 0.5 for i in range(rows)]),
            "name": [f"n{i % 97}" for i in range(rows)],
        },
        schema=SCHEMA,
    )


def appender(config: str, path: str) -> tuple[Callable[[pa.Table], object], Callable[[], int]]:
    """(append one table, count the rows) for ``config`` on a fresh table at ``path``."""
    if config == "deltalake":
        deltalake.write_deltalake(path, batch(-1, 1), mode="append")
        return (
            lambda data: deltalake.write_deltalake(path, data, mode="append"),
            lambda: deltalake.DeltaTable(path).to_pyarrow_table().num_rows,
        )
    table = Table.create(path, schema=SCHEMA, durable=config == "ours, durable")
    table.append(batch(-1, 1))
    return table.append, lambda: Table.open(path).to_arrow().num_rows


def run(config: str, appends: int, rows: int) -> tuple[float, float]:
    """(median wall seconds per append, CPU seconds per append) of one run."""
    where = tempfile.mkdtemp(prefix="bench-durable-")
    try:
        append, count = appender(config, f"{where}/t")
        data = [batch(i * rows, rows) for i in range(appends)]
        latencies = []
        cpu0 = time.process_time()
        for item in data:
            t0 = time.perf_counter()
            append(item)
            latencies.append(time.perf_counter() - t0)
        cpu = (time.process_time() - cpu0) / appends
        assert count() == appends * rows + 1, f"{config}: rows missing"
        return statistics.median(latencies), cpu
    finally:
        shutil.rmtree(where, ignore_errors=True)


def measure(title: str, appends: int, rows: int, repeat: int) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list[tuple[float, float]]] = {c: [] for c in CONFIGS}
    for rep in range(repeat):
        for config in CONFIGS[rep % len(CONFIGS) :] + CONFIGS[: rep % len(CONFIGS)]:
            results[config].append(run(config, appends, rows))
    table_rows = []
    base = statistics.median(w for w, _ in results["ours, default"])
    for config in CONFIGS:
        walls = [w * 1000 for w, _ in results[config]]
        cpus = [c * 1000 for _, c in results[config]]
        table_rows.append(
            [
                config,
                f"{statistics.median(walls):.2f} [{min(walls):.2f}-{max(walls):.2f}]",
                f"{statistics.median(cpus):.2f} [{min(cpus):.2f}-{max(cpus):.2f}]",
                f"{statistics.median(walls) / (base * 1000):.2f}x",
            ]
        )
    print_table(
        title, ["config", "wall ms per append, median [range]", "CPU ms per append", "vs default"], table_rows
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--small", type=int, default=100, help="1-row appends per run")
    parser.add_argument("--large", type=int, default=3, help="large appends per run")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per large append")
    args = parser.parse_args()
    print(machine_note())
    print(f"temp dir: {tempfile.gettempdir()}")
    measure(f"{args.small} appends of 1 row, {args.repeat} runs", args.small, 1, args.repeat)
    measure(
        f"{args.large} appends of {args.rows:,} rows, {args.repeat} runs", args.large, args.rows, args.repeat
    )


if __name__ == "__main__":
    main()
