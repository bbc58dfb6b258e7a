"""Scanning a table larger than memory (issue 27, the read side): peak RSS and throughput
of ``Table.scan()`` against deltalake's ``DeltaTable(path).to_pyarrow_dataset().to_batches()``,
and the files a filtered DuckDB query over ``Table.to_pyarrow_dataset()`` opens.

Setup (in a child process): a table of about ``--gb`` GB of Parquet (default 4) under
``--dir`` (default /tmp), partitioned by ``day`` (a date), written by our writer (default
target file size, 128 MB) from in-memory chunks of about 300 MB appended one after the other
(one day each), so the setup never holds more than one chunk. Columns: ``id`` (int64,
ascending), ``user`` (int64, random), ``value`` (float64, random), ``payload`` (a random
32-character hex string), ``day``.

Timed, each in a fresh child process that prints its peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``), wall and CPU time (user + system, all threads) of
the read alone and the rows it saw:

* ours:      ``for b in Table.open(path).scan(): rows += b.num_rows``
* deltalake: ``for b in DeltaTable(path).to_pyarrow_dataset().to_batches(): rows += b.num_rows``

``--repeat`` runs of each (default 3), alternating, the first engine rotating; medians and
[min-max]. Throughput is the table's Parquet bytes over the wall time. Both must see every
row of the table, else ERROR and exit 1. Targets (issue 27): ours' peak RSS at most 600 MB,
and its throughput at least deltalake's.

Then a DuckDB query filtered on one partition (``WHERE day = <one day>``) over
``to_pyarrow_dataset()`` of the table opened through a file-counting fsspec filesystem:
the data files it opened against the files in the table and in that partition; its
result is checked against ``Table.to_arrow(filter=...)``.

The data is deleted at the end (``--keep`` keeps it). Run:
``.venv/bin/python bench/bench_scan_memory.py [--gb 4] [--repeat 3] [--dir /tmp] [--quick]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

ENGINES = ("ours", "deltalake")
RSS_TARGET_MB = 600.0
CHUNK_BYTES = 300 * 1024 * 1024  # Arrow bytes of each appended chunk
ROW_BYTES = 8 + 8 + 8 + 32 + 4 + 4  # id, user, value, payload (+ offset), day
FIRST_DAY = dt.date(2024, 1, 1)


def _chunk(start: int, rows: int, day: dt.date, seed: int) -> Any:
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    hexdigits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    chars = hexdigits[rng.integers(0, 16, size=(rows, 32), dtype=np.uint8)]
    payload = pa.array(chars.view("S32").ravel()).cast(pa.string())
    return pa.table(
        {
            "id": pa.array(np.arange(start, start + rows, dtype=np.int64)),
            "user": pa.array(rng.integers(0, 10_000_000, size=rows, dtype=np.int64)),
            "value": pa.array(rng.random(rows)),
            "payload": payload,
            "day": pa.array([day] * rows, pa.date32()),
        }
    )


def _parquet_bytes(path: str) -> tuple[int, int]:
    """(bytes, files) of the table's data files (the Parquet files under ``path``)."""
    files = [p for p in Path(path).rglob("*.parquet") if "_delta_log" not in p.parts]
    return sum(p.stat().st_size for p in files), len(files)


def setup(path: str, gb: float) -> None:
    """Append ~300 MB chunks (one day each) until the table holds ``gb`` GB of Parquet."""
    import pyarrow as pa

    from eventlog import Table

    schema = pa.schema(
        [("id", pa.int64()), ("user", pa.int64()), ("value", pa.float64()), ("payload", pa.string()),
         ("day", pa.date32())]
    )  # fmt: skip
    t = Table.create(path, schema, partition_by=["day"])
    rows, start, i = CHUNK_BYTES // ROW_BYTES, 0, 0
    while _parquet_bytes(path)[0] < gb * 1e9:
        chunk = _chunk(start, rows, FIRST_DAY + dt.timedelta(days=i), seed=i)
        t.append(chunk)
        del chunk
        start, i = start + rows, i + 1
        print(f"  setup: {i} chunks, {_parquet_bytes(path)[0] / 1e9:.2f} GB", file=sys.stderr, flush=True)


def _usage() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024  # CPU s, peak RSS MB (Linux: KB)


def child(engine: str, path: str) -> None:
    """One timed read, printed as JSON on stdout (run in a fresh process)."""
    rows = 0
    if engine == "ours":
        from eventlog import Table

        cpu0, wall0 = _usage()[0], time.perf_counter()
        for b in Table.open(path).scan():
            rows += b.num_rows
    elif engine == "deltalake":
        from deltalake import DeltaTable

        cpu0, wall0 = _usage()[0], time.perf_counter()
        for b in DeltaTable(path).to_pyarrow_dataset().to_batches():
            rows += b.num_rows
    else:
        raise SystemExit(f"unknown engine {engine}")
    wall = time.perf_counter() - wall0
    cpu, rss = _usage()
    print(json.dumps({"rows": rows, "wall": wall, "cpu": cpu - cpu0, "rss_mb": rss}))


def duckdb_child(path: str) -> None:
    """DuckDB over to_pyarrow_dataset(), filtered on one day: the files it opened."""
    import duckdb
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    from eventlog import Table

    opened: list[str] = []

    class Counting(DirFileSystem):  # type: ignore[misc]
        def open(self, p: str, *args: Any, **kwargs: Any) -> Any:
            if str(p).endswith(".parquet"):
                opened.append(str(p))
            return super().open(p, *args, **kwargs)

    t = Table.open("/", filesystem=Counting(path=path, fs=LocalFileSystem()))
    day = FIRST_DAY + dt.timedelta(days=1)
    in_day = [a for a in t.snapshot().add_files if a.partition_values["day"] == day.isoformat()]
    con = duckdb.connect()
    con.register("events", t.to_pyarrow_dataset())
    wall0 = time.perf_counter()
    got = con.execute(f"SELECT count(*), sum(user) FROM events WHERE day = DATE '{day}'").fetchone()
    wall = time.perf_counter() - wall0
    want = Table.open(path).to_arrow(filter=f"day = '{day}'", columns=["user"])
    print(
        json.dumps(
            {
                "opened": len(set(opened)),
                "files": len(t.snapshot().add_files),
                "in_partition": len(in_day),
                "wall": wall,
                "correct": got == (want.num_rows, sum(want.column("user").to_pylist())),
            }
        )
    )


def _run(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"ERROR: child {args} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _stat(values: list[float], spec: str = ".1f") -> str:
    return f"{statistics.median(values):{spec}} [{min(values):{spec}}-{max(values):{spec}}]"


def main() -> None:
    from bench._common import machine_note, print_table, rotated, verdict

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=4.0, help="GB of Parquet in the table (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per engine (default 3)")
    parser.add_argument("--dir", default="/tmp", help="where the table is written (default /tmp)")
    parser.add_argument("--quick", action="store_true", help="0.3 GB, 1 run each: a smoke run")
    parser.add_argument("--keep", action="store_true", help="keep the table afterwards")
    args = parser.parse_args()
    if args.quick:
        args.gb, args.repeat = 0.3, 1
    print(machine_note())
    work = tempfile.mkdtemp(prefix="bench_scan_memory_", dir=args.dir)
    path = str(Path(work) / "table")
    try:
        t0 = time.perf_counter()
        setup_run = subprocess.run([sys.executable, __file__, "--setup", path, str(args.gb)], check=False)
        if setup_run.returncode:
            raise SystemExit("ERROR: setup failed")
        size, nfiles = _parquet_bytes(path)
        print(f"table: {size / 1e9:.2f} GB of Parquet in {nfiles} files ({time.perf_counter() - t0:.0f} s)")
        runs: dict[str, list[dict[str, Any]]] = {e: [] for e in ENGINES}
        for rep in range(args.repeat):
            for engine in rotated(ENGINES, rep):
                r = _run("--child", engine, path)
                runs[engine].append(r)
                print(f"  {engine}: {r}", flush=True)
        rows = {r["rows"] for e in ENGINES for r in runs[e]}
        if len(rows) != 1:
            raise SystemExit(f"ERROR: the engines saw different row counts: {rows}")
        table_rows = []
        for e in ENGINES:
            walls = [r["wall"] for r in runs[e]]
            table_rows.append(
                [
                    e,
                    _stat([r["rss_mb"] for r in runs[e]], ".0f"),
                    _stat(walls),
                    _stat([r["cpu"] for r in runs[e]]),
                    _stat([size / 1e6 / w for w in walls], ".0f"),
                ]
            )
        print_table(
            f"Full scan of {size / 1e9:.2f} GB ({rows.pop():,} rows, {nfiles} files), fresh process each",
            ["engine", "peak RSS MB", "wall s", "CPU s", "MB/s"],
            table_rows,
        )
        ours_rss = statistics.median(r["rss_mb"] for r in runs["ours"])
        ours_wall = statistics.median(r["wall"] for r in runs["ours"])
        peer_wall = statistics.median(r["wall"] for r in runs["deltalake"])
        print(f"ours peak RSS {ours_rss:.0f} MB (target <= {RSS_TARGET_MB:.0f}): {verdict(ours_rss <= 600)}")
        print(
            f"throughput ours / deltalake: {peer_wall / ours_wall:.2f}x (target >= 1.0): "
            f"{verdict(ours_wall <= peer_wall)}"
        )
        q = _run("--duckdb", path)
        print(
            f"DuckDB, WHERE day = one day, over to_pyarrow_dataset(): opened {q['opened']} data files of "
            f"{q['files']} ({q['in_partition']} in that partition), {q['wall']:.2f} s, "
            f"result {'equal to' if q['correct'] else 'DIFFERENT from'} to_arrow(filter)"
        )
        if not q["correct"] or q["opened"] > q["in_partition"]:
            raise SystemExit("ERROR: the filtered DuckDB query read too much or the wrong rows")
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--setup":
        setup(sys.argv[2], float(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--duckdb":
        duckdb_child(sys.argv[2])
    else:
        main()
