"""Small blind appends: commits/s of 1-row appends, ours versus delta-rs.

Four configurations, each run ``--repeat`` times on a fresh table (configurations are
interleaved, and which engine goes first rotates, so that drift in machine load hits all of
them alike):

* ours, 1 writer      -- ``Table.open(path).append(batch)`` in a loop, default embedded slot store
* ours, 4 processes   -- four processes, each with its own handle on one shared table
* deltalake, 1 writer -- ``deltalake.write_deltalake(path, batch, mode="append")`` in a loop
* deltalake, 4 procs  -- four processes appending to one shared delta-rs table

Every writer runs in a process started with the "spawn" context, does its set-up (imports,
opening its handle, building its batch), then waits on a barrier so that all start together.
Throughput = successful appends / (last writer's end - first writer's start). Any exception
from an append counts as a failure (ours must have none). Afterwards our table must be at
version == appends and hold one row per append. CPU time per commit (user + system, all
threads, summed over the writers) is reported too: it is much less sensitive than wall time
to other jobs on the machine.

Run: ``.venv/bin/python bench/bench_small_appends.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa

from bench._common import (
    SMALL_SCHEMA,
    Stat,
    machine_note,
    parse_args,
    print_table,
    ratio,
    rotated,
    small_batch,
    verdict,
)
from bench._loops import (
    Append,
    AppendRun,
    deltalake_append,
    deltalake_notes,
    run_writers,
    setup_failed,
    timed_appends,
)

SCHEMA = SMALL_SCHEMA
TARGET_RATIO = 10.0
ENGINES = ("ours", "deltalake")


def _worker(engine: str, path: str, n: int, writer: int, barrier: Any, results: Any) -> None:
    """One writer process: set up, wait for the others, append ``n`` times."""
    try:
        batches = [small_batch(writer, i) for i in range(n)]
        append: Append
        if engine == "ours":
            from eventlog.table import Table

            table = Table.open(path)

            def ours(b: pa.RecordBatch) -> int:
                return table.append(b).attempts - 1  # slot claims lost before this commit

            append = ours
        else:
            append = deltalake_append(path)

        barrier.wait()
        loop = timed_appends(batches, append)
        results.put((writer, loop.start, loop.end, loop.ok, loop.errors, loop.retries, loop.cpu))
    except BaseException as exc:  # set-up failed: report it rather than hang the barrier
        results.put((writer, 0.0, 0.0, 0, setup_failed(barrier, exc, n), 0, 0.0))


def _create(engine: str, path: str) -> None:
    if engine == "ours":
        from eventlog.table import Table

        Table.create(path, SCHEMA)  # no slots argument: the embedded default store
    else:
        from deltalake import DeltaTable

        DeltaTable.create(path, schema=SCHEMA)


def _inspect(engine: str, path: str) -> tuple[int, int]:
    """(version, row count) of the table after the run."""
    if engine == "ours":
        from eventlog.table import Table

        t = Table.open(path)
        return t.version, t.to_arrow().num_rows
    from deltalake import DeltaTable

    dt = DeltaTable(path)
    return dt.version(), dt.to_pyarrow_table().num_rows


def run_config(engine: str, writers: int, per_writer: int) -> AppendRun:
    tmp = tempfile.mkdtemp(prefix=f"bench-appends-{engine}-")
    try:
        path = str(Path(tmp) / "table")
        _create(engine, path)
        rows = run_writers(_worker, (engine, path, per_writer), writers)
        errors: Counter[str] = Counter()
        for r in rows:
            errors.update(r[4])
        ok = sum(r[3] for r in rows)
        seconds = max(r[2] for r in rows) - min(r[1] for r in rows)
        version, nrows = _inspect(engine, path)
        retries = sum(r[5] for r in rows)
        cpu = sum(r[6] for r in rows)
        return AppendRun(
            engine, writers, ok, writers * per_writer - ok, seconds, errors, version, nrows, retries, cpu
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "", quick_repeat=1)
    sizes = {1: 50, 4: 25} if args.quick else {1: 500, 4: 250}
    print(f"# bench_small_appends ({'quick' if args.quick else 'full'}): {machine_note()}")
    print(f"sizes: 1 writer x {sizes[1]} appends, 4 processes x {sizes[4]} appends; {args.repeat} runs each")
    results: dict[tuple[str, int], list[AppendRun]] = {}
    for rep in range(args.repeat):
        for writers in (1, 4):
            for engine in rotated(ENGINES, rep):
                r = run_config(engine, writers, sizes[writers])
                results.setdefault((engine, writers), []).append(r)
                print(
                    f"  run {rep + 1}: {engine:9s} {writers} writer(s): {r.commits_per_s:8.1f} commits/s, "
                    f"{r.ok} ok, {r.failed} failed{' ' + str(dict(r.errors)) if r.errors else ''}"
                    + (f", {r.retries} lost slot claims" if engine == "ours" else "")
                    + f", CPU {1000 * r.cpu / max(1, r.ok):.2f} ms/commit"
                    + f" -> version {r.version}, {r.rows} rows",
                    flush=True,
                )

    ok_all = True
    table_rows = []
    for writers in (1, 4):
        for engine in ENGINES:
            runs = results[(engine, writers)]
            cps = Stat.of([r.commits_per_s for r in runs])
            ms = Stat.of([1000 * r.seconds / max(1, r.ok) * writers for r in runs])
            cpu_ms = Stat.of([1000 * r.cpu / max(1, r.ok) for r in runs])
            failed = sum(r.failed for r in runs)
            errs: Counter[str] = Counter()
            for r in runs:
                errs.update(r.errors)
            table_rows.append(
                [
                    engine,
                    writers,
                    writers * sizes[writers],
                    cps.fmt(".0f"),
                    ms.fmt(".2f"),
                    cpu_ms.fmt(".2f"),
                    f"{failed} / {len(runs) * writers * sizes[writers]}",
                    ", ".join(f"{k} x{v}" for k, v in errs.items()) or "-",
                    str(sum(r.retries for r in runs)) if engine == "ours" else "n/a",
                ]
            )
    print_table(
        "Small appends: commits/s (median [min-max] over runs)",
        [
            "engine",
            "writers",
            "appends/run",
            "commits/s",
            "ms/commit per writer",
            "CPU ms/commit",
            "failed (all runs)",
            "errors",
            "lost slot claims (all runs)",
        ],
        table_rows,
    )

    ratio_rows = []
    for writers in (1, 4):
        ours = Stat.of([r.commits_per_s for r in results[("ours", writers)]])
        peer = Stat.of([r.commits_per_s for r in results[("deltalake", writers)]])
        rt = ratio(ours.median, peer.median)
        ratio_rows.append(
            [f"{writers} writer(s)", f"{rt:.1f}x", f">= {TARGET_RATIO:.0f}x", verdict(rt >= TARGET_RATIO)]
        )
    print_table(
        "Ratio ours / deltalake (commits/s: > 1 means ours is faster)",
        ["configuration", "ours / deltalake", "target", "verdict"],
        ratio_rows,
    )

    checks = []
    for writers in (1, 4):
        for r in results[("ours", writers)]:
            good = r.failed == 0 and r.version == r.ok and r.rows == r.ok
            ok_all &= good
            checks.append(good)
    print(
        f"verification (ours): failures == 0, version == appends, rows == appends in "
        f"{sum(checks)}/{len(checks)} runs -> {'OK' if all(checks) else 'FAILED'}"
    )
    deltalake_notes(results)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
