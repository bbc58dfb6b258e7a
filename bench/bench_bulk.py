"""Bulk append and full scan: ours versus delta-rs versus plain pyarrow.parquet.

One in-memory Arrow table (5,000,000 rows; ``--quick``: 200,000) with the columns
``id int64, value float64, name string (10 chars), ts timestamp[us, UTC], count int32``
(no partitioning) is written by each engine into a fresh directory, ``--repeat`` times,
interleaved (the engine that goes first rotates from run to run, and ``os.sync()`` runs
before each timed write and before the scans, so no engine pays for another's writeback):

* ours:      ``Table.create(path, schema).append(table)`` -- only the append is timed
* deltalake: ``deltalake.write_deltalake(path, table)`` (new table)
* pyarrow:   ``pyarrow.parquet.write_table(table, path)`` (snappy, the pyarrow default)

then each engine's own output is scanned in full: ours ``t.to_arrow()`` (handle opened
beforehand), ``pq.read_table(file)``, ``DeltaTable(path).to_pyarrow_table()`` (table object
created beforehand).

Peak memory: in a fresh "spawn" subprocess per run, the Arrow table is built, a 1,000-row
warm-up write is done with the same engine (the first Parquet write of a process costs a
fixed ~60-70 MiB whatever the size: code pages, allocator segments), the RSS
baseline is read (``/proc/self/status`` VmRSS), then the write runs and the peak is read
with ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (KiB on Linux). The kernel's VmHWM is
also reset just before the write (``/proc/self/clear_refs``, where permitted) as a
cross-check, and the peak of the write's Arrow allocations is reported (a
``pa.proxy_memory_pool`` over the default pool, installed after the build, so it counts
only the write). Result: (peak - baseline) / ``table.nbytes``.

Run: ``.venv/bin/python bench/bench_bulk.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench._common import Stat, cpu_seconds, machine_note, parse_args, print_table, ratio, rotated, verdict

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("value", pa.float64()),
        ("name", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("count", pa.int32()),
    ]
)
ENGINES = ("ours", "deltalake", "pyarrow")
CHUNK_ROWS = 1_000_000
TARGET_APPEND_VS_DELTALAKE = 1.0  # throughput ratio, ours / peer
TARGET_APPEND_VS_PYARROW = 0.9
TARGET_SCAN_VS_PYARROW = 0.9
TARGET_PEAK_MEMORY = 1.5  # (peak RSS - baseline) / table.nbytes


def make_data(rows: int, seed: int = 42) -> pa.Table:
    """The benchmark table, built chunk by chunk (so building it has a small transient peak)."""
    rng = np.random.default_rng(seed)
    base_us = 1_700_000_000_000_000
    batches = []
    for start in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - start)
        ids = np.arange(start, start + n, dtype=np.int64)
        digits = pc.utf8_lpad(pc.cast(pa.array(rng.integers(0, 10_000_000, n)), pa.string()), 7, "0")
        name = pc.binary_join_element_wise(pa.scalar("ev-"), digits, pa.scalar(""))
        ts = base_us + ids * 1000 + rng.integers(0, 1000, n)
        batches.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array(ids),
                    pa.array(rng.standard_normal(n)),
                    name,
                    pa.array(ts, pa.timestamp("us", tz="UTC")),
                    pa.array(rng.integers(0, 1000, n, dtype=np.int32)),
                ],
                schema=SCHEMA,
            )
        )
    return pa.Table.from_batches(batches, schema=SCHEMA)


def writer_for(engine: str, table: pa.Table, path: str) -> Callable[[], object]:
    """Set-up outside the timing (creating our empty table), then a callable doing the write."""
    if engine == "ours":
        from eventlog.table import Table

        t = Table.create(path, table.schema)
        return lambda: t.append(table)
    if engine == "deltalake":
        from deltalake import write_deltalake

        return lambda: write_deltalake(path, table)
    Path(path).mkdir(parents=True)
    file = str(Path(path) / "data.parquet")
    return lambda: pq.write_table(table, file)


def reader_for(engine: str, path: str) -> Callable[[], pa.Table]:
    if engine == "ours":
        from eventlog.table import Table

        t = Table.open(path)
        return t.to_arrow
    if engine == "deltalake":
        from deltalake import DeltaTable

        return DeltaTable(path).to_pyarrow_table
    file = str(Path(path) / "data.parquet")
    return lambda: pq.read_table(file)


# --------------------------------------------------------------------------- memory


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _memory_worker(engine: str, rows: int, root: str, out: Any) -> None:
    try:
        from eventlog.table import Table  # noqa: F401  -- imported before the baseline

        table = make_data(rows)
        # Warm-up: a 1,000-row write first. The first Parquet write of a process costs a
        # fixed ~60-70 MiB of RSS whatever the data size (library code pages, allocator
        # segments of the writer's threads), for every engine; that is not the write's data.
        writer_for(engine, table.slice(0, 1000), str(Path(root) / f"{engine}-warmup"))()
        path = str(Path(root) / engine)
        run = writer_for(engine, table, path)
        gc.collect()
        # A proxy over the default pool counts only the write's Arrow allocations.
        pool = pa.proxy_memory_pool(pa.default_memory_pool())
        pa.set_memory_pool(pool)
        pool_before = pool.bytes_allocated()
        pool_max_before = pool.max_memory()
        rss_before = _status_kib("VmRSS")
        maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        hwm_reset = _reset_hwm()
        run()
        maxrss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        hwm_after = _status_kib("VmHWM")
        out.put(
            {
                "engine": engine,
                "nbytes": table.nbytes,
                "rss_before": rss_before,
                "maxrss_before": maxrss_before,
                "maxrss_after": maxrss_after,
                "hwm_after": hwm_after if hwm_reset else -1,
                "pool_before": pool_before,
                "pool_max_before": pool_max_before,
                "pool_max_after": pool.max_memory(),
                "pool_backend": pa.default_memory_pool().backend_name,
            }
        )
    except BaseException as exc:
        out.put({"engine": engine, "error": f"{type(exc).__name__}: {exc}"})


def measure_memory(engine: str, rows: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="bench-bulk-mem-")
    try:
        out = ctx.Queue()
        proc = ctx.Process(target=_memory_worker, args=(engine, rows, tmp, out))
        proc.start()
        result: dict[str, Any] = out.get(timeout=900)
        proc.join()
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- main


def main() -> int:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "", quick_repeat=1)
    rows = 200_000 if args.quick else 5_000_000
    print(f"# bench_bulk ({'quick' if args.quick else 'full'}): {machine_note()}")
    # Memory first, while this parent process is small: a spawned child starts from a fork
    # of it, and Linux carries the fork-time RSS into the child's ru_maxrss across exec.
    print(f"parent RSS before the memory runs: {_status_kib('VmRSS') / 1024:.0f} MiB")
    mem: dict[str, list[dict[str, Any]]] = {e: [] for e in ENGINES}
    for _ in range(args.repeat):
        for engine in ENGINES:
            m = measure_memory(engine, rows)
            if "error" in m:
                print(f"ERROR: memory run of {engine}: {m['error']}")
                return 1
            mem[engine].append(m)

    table = make_data(rows)
    mb = table.nbytes / 1e6
    print(f"data: {rows:,} rows, {mb:.1f} MB in Arrow ({table.num_columns} columns); {args.repeat} runs each")

    write_s: dict[str, list[float]] = {e: [] for e in ENGINES}
    scan_s: dict[str, list[float]] = {e: [] for e in ENGINES}
    write_cpu: dict[str, list[float]] = {e: [] for e in ENGINES}  # CPU s, all threads
    scan_cpu: dict[str, list[float]] = {e: [] for e in ENGINES}
    sizes: dict[str, int] = {}
    files: dict[str, int] = {}
    expected_sum = pc.sum(table["id"]).as_py()
    tmp = tempfile.mkdtemp(prefix="bench-bulk-")
    try:
        for rep in range(args.repeat):
            for engine in rotated(ENGINES, rep):
                path = str(Path(tmp) / f"{engine}-{rep}")
                run = writer_for(engine, table, path)
                gc.collect()
                os.sync()  # no writeback of an earlier engine's files during this one's timing
                start, cpu = time.perf_counter(), cpu_seconds()
                run()
                write_s[engine].append(time.perf_counter() - start)
                write_cpu[engine].append(cpu_seconds() - cpu)
                parquet = [p for p in Path(path).rglob("*.parquet") if "_delta_log" not in p.parts]
                sizes[engine] = sum(p.stat().st_size for p in parquet)
                files[engine] = len(parquet)
            os.sync()
            for engine in rotated(ENGINES, rep):
                read = reader_for(engine, str(Path(tmp) / f"{engine}-{rep}"))
                gc.collect()
                start, cpu = time.perf_counter(), cpu_seconds()
                got = read()
                scan_s[engine].append(time.perf_counter() - start)
                scan_cpu[engine].append(cpu_seconds() - cpu)
                if got.num_rows != rows or pc.sum(got["id"]).as_py() != expected_sum:
                    print(f"ERROR: {engine} read back {got.num_rows} rows, expected {rows}")
                    return 1
                del got
            for engine in ENGINES:
                shutil.rmtree(Path(tmp) / f"{engine}-{rep}", ignore_errors=True)
            print(
                f"  run {rep + 1}: write "
                + ", ".join(f"{e} {write_s[e][-1]:.2f} s" for e in ENGINES)
                + "; scan "
                + ", ".join(f"{e} {scan_s[e][-1]:.2f} s" for e in ENGINES),
                flush=True,
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    w = {e: Stat.of(write_s[e]) for e in ENGINES}
    s = {e: Stat.of(scan_s[e]) for e in ENGINES}
    write_rows = []
    for e in ENGINES:
        write_rows.append(
            [
                "append/write",
                e,
                w[e].fmt(".2f"),
                f"{rows / w[e].median / 1e6:.2f}",
                f"{mb / w[e].median:.0f}",
                f"{ratio(w[e].median, w['ours'].median):.2f}x",
                Stat.of(write_cpu[e]).fmt(".2f"),
                f"{files[e]} / {sizes[e] / 1e6:.0f} MB",
            ]
        )
    for e in ENGINES:
        write_rows.append(
            [
                "full scan",
                e,
                s[e].fmt(".2f"),
                f"{rows / s[e].median / 1e6:.2f}",
                f"{mb / s[e].median:.0f}",
                f"{ratio(s[e].median, s['ours'].median):.2f}x",
                Stat.of(scan_cpu[e]).fmt(".2f"),
                "",
            ]
        )
    print_table(
        f"Bulk append and scan of {rows:,} rows ({mb:.0f} MB in Arrow): seconds, median [min-max] "
        f"of {args.repeat}",
        ["phase", "engine", "seconds", "M rows/s", "MB/s", "ours / engine (throughput, > 1 = ours faster)",
         "CPU s (all threads)", "files / on disk"],
        write_rows,
    )  # fmt: skip

    mem_rows = []
    peak_ratio: dict[str, Stat] = {}
    for e in ENGINES:
        ms = mem[e]
        peak_ratio[e] = Stat.of([(m["maxrss_after"] - m["rss_before"]) * 1024 / m["nbytes"] for m in ms])
        hwm = [(m["hwm_after"] - m["rss_before"]) * 1024 / m["nbytes"] for m in ms if m["hwm_after"] >= 0]
        pool = [(m["pool_max_after"] - m["pool_before"]) / m["nbytes"] for m in ms]
        mem_rows.append(
            [
                e,
                f"{statistics_median([m['rss_before'] for m in ms]) / 1024:.0f}",
                f"{statistics_median([m['maxrss_before'] for m in ms]) / 1024:.0f}",
                f"{statistics_median([m['maxrss_after'] for m in ms]) / 1024:.0f}",
                peak_ratio[e].fmt(".2f", "x"),
                Stat.of(hwm).fmt(".2f", "x") if hwm else "n/a",
                Stat.of(pool).fmt(".2f", "x"),
            ]
        )
    print_table(
        f"Peak memory of the write, fresh process per run ({args.repeat} runs; table.nbytes = {mb:.0f} MB)",
        ["engine", "baseline RSS MiB", "ru_maxrss before MiB", "peak RSS MiB (ru_maxrss after)",
         "(peak - baseline) / nbytes", "VmHWM after reset",
         f"Arrow pool growth / nbytes ({mem['ours'][0]['pool_backend']})"],
        mem_rows,
    )  # fmt: skip

    r_dl = ratio(w["deltalake"].median, w["ours"].median)
    r_pa = ratio(w["pyarrow"].median, w["ours"].median)
    r_scan = ratio(s["pyarrow"].median, s["ours"].median)
    r_scan_dl = ratio(s["deltalake"].median, s["ours"].median)
    peak = peak_ratio["ours"].median
    print_table(
        "Targets (throughput ratios ours / peer: > 1 means ours is faster)",
        ["target", "measured", "goal", "verdict"],
        [
            ["append vs deltalake", f"{r_dl:.2f}x", f">= {TARGET_APPEND_VS_DELTALAKE}x",
             verdict(r_dl >= TARGET_APPEND_VS_DELTALAKE)],
            ["append vs pq.write_table", f"{r_pa:.2f}x", f">= {TARGET_APPEND_VS_PYARROW}x",
             verdict(r_pa >= TARGET_APPEND_VS_PYARROW)],
            ["scan vs pq.read_table", f"{r_scan:.2f}x", f">= {TARGET_SCAN_VS_PYARROW}x",
             verdict(r_scan >= TARGET_SCAN_VS_PYARROW)],
            ["scan vs DeltaTable.to_pyarrow_table (info)", f"{r_scan_dl:.2f}x", "-", "-"],
            ["peak memory of our append", f"{peak:.2f}x table", f"<= {TARGET_PEAK_MEMORY}x",
             verdict(peak <= TARGET_PEAK_MEMORY)],
        ],
    )  # fmt: skip
    return 0


def statistics_median(values: list[int]) -> float:
    return Stat.of([float(v) for v in values]).median


if __name__ == "__main__":
    sys.exit(main())
