"""Row-level DELETE on one large file: ours with deletion vectors, ours rewriting, and delta-rs.

One in-memory Arrow table of ``--rows`` rows (default 1,000,000) and 20 columns (``id int64``
ascending, 5 float64, 5 int64, 5 strings of 24 random letters, 2 timestamp[us, UTC], an
int32 and a bool; about 250 MB in Arrow) is written once by our library into **one** data
file (``delta.targetFileSize`` = 4 GiB; our writer cuts it into row groups of at most
64 MB, i.e. 4 row groups at the default size), as two master tables:

* ``dv``:      ``delta.enableDeletionVectors = true`` -- DELETE writes a deletion vector
* ``rewrite``: no deletion vectors -- DELETE rewrites the file without the deleted rows

Two DELETEs are timed, each on a **fresh copy** of a master (``shutil.copytree`` of the data
files and ``_delta_log``, then ``os.sync()``, neither timed; the table handle is opened
before the timing too):

* one row: ``id = 12345``
* 1%:      ``id % 100 = 7`` (rows in every row group)

by three engines, interleaved (the engine that goes first rotates from run to run), after
one untimed warm-up DELETE per engine (lazy imports, DataFusion's session):

* ``ours-dv``:      ``Table.open(copy of dv).delete(predicate)``
* ``ours-rewrite``: ``Table.open(copy of rewrite).delete(predicate)``
* ``deltalake``:    ``DeltaTable(copy of rewrite).delete(predicate)`` (delta-rs rewrites the
  file; it does not write deletion vectors)

Each measurement reports the median [min-max] of ``--repeat`` runs (default 5) of wall time
and of CPU time (user + system, all threads of the process). Every result is checked (the
live row count afterwards). Targets, for the one-row DELETE: ours with DVs at least 20x
faster than our rewrite and at least 20x faster than deltalake.

Run: ``.venv/bin/python -m bench.bench_dv [--rows N] [--repeat N]`` (or
``.venv/bin/python bench/bench_dv.py``); ``--rows 100000 --repeat 1`` is a quick smoke run.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._common import Stat, cpu_seconds, machine_note, print_table, ratio, rotated, verdict

ENGINES = ("ours-dv", "ours-rewrite", "deltalake")
CASES = (("one row", "id = 12345"), ("1%", "id % 100 = 7"))
TARGET_VS_REWRITE = 20.0  # speed-up of the one-row DV DELETE
TARGET_VS_DELTALAKE = 20.0
STRING_CHARS = 24
CHUNK_ROWS = 250_000


def make_data(rows: int, seed: int = 42) -> pa.Table:
    """The 20-column benchmark table, built chunk by chunk."""
    rng = np.random.default_rng(seed)
    base_us = 1_700_000_000_000_000
    batches = []
    for start in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        cols: dict[str, pa.Array] = {"id": pa.array(ids)}
        for i in range(5):
            cols[f"f{i}"] = pa.array(rng.standard_normal(n))
        for i in range(5):
            cols[f"i{i}"] = pa.array(rng.integers(0, 1 << 40, n, dtype=np.int64))
        offsets = pa.py_buffer(np.arange(0, (n + 1) * STRING_CHARS, STRING_CHARS, dtype=np.int32).tobytes())
        for i in range(5):
            letters = rng.integers(97, 123, n * STRING_CHARS, dtype=np.uint8)
            cols[f"s{i}"] = pa.StringArray.from_buffers(n, offsets, pa.py_buffer(letters.tobytes()))
        for i in range(2):
            ts = base_us + ids * 1000 + rng.integers(0, 1000, n)
            cols[f"t{i}"] = pa.array(ts, pa.timestamp("us", tz="UTC"))
        cols["n"] = pa.array(rng.integers(0, 1000, n, dtype=np.int32))
        cols["b"] = pa.array(rng.integers(0, 2, n).astype(bool))
        batches.append(pa.RecordBatch.from_pydict(cols))
    return pa.Table.from_batches(batches)


def expected_deleted(rows: int, predicate: str) -> int:
    if predicate == "id = 12345":
        return 1 if rows > 12345 else 0
    assert predicate == "id % 100 = 7"
    return len(range(7, rows, 100))


def build_masters(root: Path, data: pa.Table) -> dict[str, Path]:
    from eventlog.table import Table

    big = {"delta.targetFileSize": str(4 << 30)}
    masters = {"dv": root / "master-dv", "rewrite": root / "master-rewrite"}
    Table.create(str(masters["dv"]), data.schema, properties={**big, "delta.enableDeletionVectors": "true"})
    Table.create(str(masters["rewrite"]), data.schema, properties=big)
    for path in masters.values():
        Table.open(str(path)).append(data)
    return masters


def describe(path: Path) -> str:
    files = [p for p in path.rglob("*.parquet") if "_delta_log" not in p.parts]
    groups = [pq.ParquetFile(p).metadata.num_row_groups for p in files]
    size = sum(p.stat().st_size for p in files)
    return f"{len(files)} data file(s), {sum(groups)} row group(s), {size / 1e6:.0f} MB on disk"


def runner_for(engine: str, path: Path, predicate: str) -> tuple[Callable[[], object], Callable[[], int]]:
    """(the timed DELETE, a check returning the live row count afterwards); opened untimed."""
    if engine.startswith("ours"):
        from eventlog.table import Table

        t = Table.open(str(path))
        t.snapshot()
        return (lambda: t.delete(predicate)), (
            lambda: Table.open(str(path)).to_arrow(columns=["id"]).num_rows
        )
    from deltalake import DeltaTable

    dt = DeltaTable(str(path))
    return (lambda: dt.delete(predicate)), (
        lambda: DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).num_rows
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (default 5)")
    args = parser.parse_args()
    if args.repeat < 1 or args.rows < 1:
        parser.error("--rows and --repeat must be at least 1")
    print(f"# bench_dv: {machine_note()}")
    data = make_data(args.rows)
    print(f"data: {args.rows:,} rows, {data.num_columns} columns, {data.nbytes / 1e6:.0f} MB in Arrow")
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-dv-"))
    try:
        masters = build_masters(tmp, data)
        del data
        for name, path in masters.items():
            print(f"master {name}: {describe(path)}")
        master_of = {
            "ours-dv": masters["dv"],
            "ours-rewrite": masters["rewrite"],
            "deltalake": masters["rewrite"],
        }
        # Warm-up, untimed: the first DELETE of a process pays one-off costs (lazy imports, the
        # SQL dialect, DataFusion's session) that are no part of a DELETE's cost.
        for engine in ENGINES:
            copy = tmp / f"{engine}-warmup"
            shutil.copytree(master_of[engine], copy, ignore=shutil.ignore_patterns("_eventlog"))
            runner_for(engine, copy, CASES[0][1])[0]()
            shutil.rmtree(copy)
        for rep in range(args.repeat):
            line = []
            for case, predicate in CASES:
                for engine in rotated(ENGINES, rep):
                    copy = tmp / f"{engine}-{rep}"
                    # The Delta table proper (data files and _delta_log); our embedded slot
                    # store (_eventlog/) is keyed by the table's path, so a copy starts its own.
                    shutil.copytree(master_of[engine], copy, ignore=shutil.ignore_patterns("_eventlog"))
                    run, check = runner_for(engine, copy, predicate)
                    gc.collect()
                    os.sync()
                    start, cpu0 = time.perf_counter(), cpu_seconds()
                    run()
                    wall.setdefault((case, engine), []).append(time.perf_counter() - start)
                    cpu.setdefault((case, engine), []).append(cpu_seconds() - cpu0)
                    live = check()
                    want = args.rows - expected_deleted(args.rows, predicate)
                    if live != want:
                        print(f"ERROR: {engine} {case}: {live} live rows afterwards, expected {want}")
                        return 1
                    shutil.rmtree(copy)
                line.append(
                    f"{case}: " + ", ".join(f"{e} {wall[(case, e)][-1] * 1000:.0f} ms" for e in ENGINES)
                )
            print(f"  run {rep + 1}: " + "; ".join(line), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows = []
    for case, predicate in CASES:
        w = {e: Stat.of(wall[(case, e)]) for e in ENGINES}
        c = {e: Stat.of(cpu[(case, e)]) for e in ENGINES}
        for e in ENGINES:
            rows.append(
                [
                    f"{case} (`{predicate}`)",
                    e,
                    Stat.of([v * 1000 for v in wall[(case, e)]]).fmt(".1f"),
                    Stat.of([v * 1000 for v in cpu[(case, e)]]).fmt(".1f"),
                    f"{ratio(w[e].median, w['ours-dv'].median):.1f}x",
                    f"{ratio(c[e].median, c['ours-dv'].median):.1f}x",
                ]
            )
    print_table(
        f"DELETE on one {args.rows:,}-row file of 20 columns: median [min-max] of {args.repeat} runs",
        ["DELETE", "engine", "wall ms", "CPU ms (all threads)", "engine / ours-dv (wall, > 1 = DV faster)",
         "engine / ours-dv (CPU)"],
        rows,
    )  # fmt: skip
    one = {e: Stat.of(wall[("one row", e)]).median for e in ENGINES}
    vs_rewrite = ratio(one["ours-rewrite"], one["ours-dv"])
    vs_dl = ratio(one["deltalake"], one["ours-dv"])
    print_table(
        "Targets (one-row DELETE, speed-up of ours-dv: > 1 means the DV DELETE is faster)",
        ["target", "measured", "goal", "verdict"],
        [
            ["DV vs our rewrite", f"{vs_rewrite:.1f}x", f">= {TARGET_VS_REWRITE:.0f}x",
             verdict(vs_rewrite >= TARGET_VS_REWRITE)],
            ["DV vs deltalake", f"{vs_dl:.1f}x", f">= {TARGET_VS_DELTALAKE:.0f}x",
             verdict(vs_dl >= TARGET_VS_DELTALAKE)],
        ],
    )  # fmt: skip
    print(f"# end: {machine_note()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
