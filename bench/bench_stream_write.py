"""Streaming write of a generator of record batches: ours versus ``deltalake``.

Each run is a fresh Python process that builds a ``pyarrow.RecordBatchReader`` over a
generator of batches (500,000 rows each; ``id int64, ts timestamp[us, UTC], value
float64, kind string`` from 16 values; about 36 bytes a row in Arrow, 4 GB in all by
default) and hands it to one engine, which writes it into a fresh directory:

* ours:      ``Table.create(path, schema)`` (not timed), then ``append(reader)`` (default target
  file size 128 MB)
* deltalake: ``deltalake.write_deltalake(path, reader)``
* source:    the generator alone, iterated to the end (what both pay for the data)

Imports are done before the clock starts. The process reports wall and CPU time of the
write and its peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``, the whole process since it started). The
engines alternate, the first one rotating from run to run; ``os.sync()`` runs before
each write and the output is deleted after it. Throughput is Arrow bytes over wall time.

Run: ``.venv/bin/python bench/bench_stream_write.py [--quick] [--repeat N] [--gb G]``
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from bench._common import Stat, machine_note

ROOT = Path(__file__).resolve().parents[1]
BATCH_ROWS = 500_000
ROW_BYTES = 36  # Arrow bytes a row, measured on a batch (printed by every run)

_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, time
    import numpy as np
    import pyarrow as pa

    engine, path, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rows = int(sys.argv[4])
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")),
                        ("value", pa.float64()), ("kind", pa.string())])
    kinds = pa.array([f"kind-{k:02d}" for k in range(16)])

    def generate():
        rng = np.random.default_rng(7)
        for b in range(batches):
            ids = np.arange(b * rows, (b + 1) * rows, dtype=np.int64)
            yield pa.record_batch([
                pa.array(ids),
                pa.array(1_700_000_000_000_000 + ids * 1000, pa.int64()).cast(schema.field("ts").type),
                pa.array(rng.random(rows)),
                kinds.take(pa.array(rng.integers(0, 16, rows))),
            ], schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, generate())
    if engine == "ours":
        from eventlog import Table
        table = Table.create(path, schema)  # version 0, empty: not timed
    elif engine == "deltalake":
        from deltalake import write_deltalake
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    if engine == "ours":
        table.append(reader)
    elif engine == "deltalake":
        write_deltalake(path, reader)
    else:
        rows_read = sum(batch.num_rows for batch in reader)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    one = next(iter(generate()))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": peak, "row_bytes": one.nbytes / one.num_rows}))
    """
)


def _run(engine: str, path: Path, batches: int) -> dict[str, Any]:
    os.sync()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, engine, str(path), str(batches), str(BATCH_ROWS)],
        cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    shutil.rmtree(path, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} run failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="0.2 GB, one run each")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gb", type=float, default=4.0)
    args = parser.parse_args()
    gb, repeat = (0.2, 1) if args.quick else (args.gb, args.repeat)
    batches = max(1, round(gb * 1e9 / (BATCH_ROWS * ROW_BYTES)))
    engines = ["ours", "deltalake", "source"]
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    work = Path(tempfile.mkdtemp(prefix="bench-stream-write-", dir="/tmp"))
    try:
        for r in range(repeat):
            order = engines[r % len(engines) :] + engines[: r % len(engines)]
            for engine in order:
                out = _run(engine, work / f"{engine}-{r}", batches)
                runs[engine].append(out)
                print(f"run {r} {engine:9s} wall {out['wall']:.1f} s cpu {out['cpu']:.1f} s "
                      f"peak RSS {out['rss_mb']:.0f} MB", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = batches * BATCH_ROWS * runs["ours"][0]["row_bytes"]
    print(f"\n{batches} batches of {BATCH_ROWS:,} rows, {total / 1e9:.2f} GB of Arrow data; {machine_note()}")
    print(f"{'engine':10s} {'wall s':>16s} {'cpu s':>16s} {'MB/s':>8s} {'peak RSS MB':>18s}")
    walls = {}
    for engine in engines:
        wall = Stat.of([o["wall"] for o in runs[engine]])
        cpu = Stat.of([o["cpu"] for o in runs[engine]])
        rss = Stat.of([o["rss_mb"] for o in runs[engine]])
        walls[engine] = wall.median
        rate = total / 1e6 / wall.median
        print(f"{engine:10s} {wall.fmt():>16s} {cpu.fmt():>16s} {rate:8.0f} {rss.fmt('.0f'):>18s}")
    print(f"\nthroughput ours / deltalake: {walls['deltalake'] / walls['ours']:.2f}x")


if __name__ == "__main__":
    main()
