"""Demo: concurrent writers on one table, on the embedded slot store (no server).

1. Four processes blind-append to one table at once: every append commits, versions are
   gapless, nothing is lost.
2. The documented example: ``UPDATE ... WHERE date > '2010-01-01'`` and ``DELETE ... WHERE
   date < '2010-01-01'`` run concurrently. On a table partitioned by ``date`` they touch
   disjoint files and both commit; on an unpartitioned table the second one to commit is
   rejected with ConcurrentAppendException, and the table keeps the first one's result.

Run: ``./scripts/demo.sh [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from eventlog import ConcurrentAppendException, Table

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("amount", pa.int64())])


def _appender(uri: str, worker: int, count: int, barrier: mp.synchronize.Barrier) -> None:  # type: ignore[name-defined]
    table = Table.open(uri)
    barrier.wait()
    for i in range(count):
        row = pa.table({"id": [worker * 1000 + i], "date": ["2024-01-01"], "amount": [1]}, schema=SCHEMA)
        table.append(row)


def concurrent_appends(root: Path, workers: int = 4, count: int = 25) -> None:
    uri = str(root / "appends")
    Table.create(uri, SCHEMA)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=_appender, args=(uri, w, count, barrier)) for w in range(workers)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - started
    table = Table.open(uri)
    rows = table.to_arrow().num_rows
    print(f"[1] {workers} processes x {count} blind appends: version {table.version}, {rows} rows, "
          f"{workers * count / elapsed:.0f} commits/s (incl. process start-up)")  # fmt: skip
    assert table.version == workers * count and rows == workers * count
    assert all(p.exitcode == 0 for p in procs)


def update_vs_delete(root: Path, partitioned: bool) -> None:
    uri = str(root / ("partitioned" if partitioned else "unpartitioned"))
    table = Table.create(uri, SCHEMA, partition_by=["date"] if partitioned else None)
    table.append(
        pa.table({"id": [1, 2], "date": ["2009-06-01", "2011-06-01"], "amount": [10, 20]}, schema=SCHEMA)
    )
    # The UPDATE reads the table first; the DELETE commits while the UPDATE is in flight.
    updater = Table.open(uri).transaction()
    updater.update("date > '2010-01-01'", set={"amount": "amount + 1"})
    deleted = table.delete("date < '2010-01-01'")
    label = "partitioned by date" if partitioned else "unpartitioned"
    try:
        result = updater.commit()
        print(f"[2] {label}: DELETE committed v{deleted.version}, UPDATE committed v{result.version} "
              "(disjoint partitions, no conflict)")  # fmt: skip
    except ConcurrentAppendException as exc:
        print(f"[2] {label}: DELETE committed v{deleted.version}; UPDATE rejected with "
              f"{type(exc).__name__}(winning_version={exc.winning_version}, operation={exc.operation!r}, "
              f"isolation_level={exc.isolation_level!r})")  # fmt: skip
    rows = sorted((r["id"], r["date"], r["amount"]) for r in table.to_arrow().to_pylist())
    print(f"    table now: {rows}")
    print(f"    history: {[(h['version'], h['operation']) for h in table.history()]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", help="where to create the demo tables (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.dir) if args.dir else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        concurrent_appends(root)
        update_vs_delete(root, partitioned=True)
        update_vs_delete(root, partitioned=False)


if __name__ == "__main__":
    main()
