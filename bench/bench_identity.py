"""Identity columns under concurrency: 4 processes appending to an identity-column table versus
the same appends to a table without one.

Two configurations, each run ``--repeat`` times on a fresh table (alternating, with the
order rotating per repeat, so that drift in machine load hits both alike):

* identity -- schema ``(id BIGINT GENERATED ALWAYS AS IDENTITY, writer INT, payload STRING)``;
  each append leaves ``id`` out: the values are reserved through the slot store's counter,
  every commit moves the high-water mark (a metaData action) and concurrent commits rebase
  on each other's marks (Delta Spark would fail them with MetadataChangedException)
* plain    -- the same schema without identity metadata; each append supplies ``id``

Four writer processes (spawned; each opens its own handle, builds its batches, then waits on
a barrier) append 1-row batches to one table on the embedded (local-file) slot store.
Throughput = appends / (last writer's end - first writer's start); CPU = user + system
seconds of all writers per commit. Afterwards the table must be at version == appends, hold
one row per append and, with identity, unique values at or below the high-water mark; any
failed append fails the run.

Run: ``.venv/bin/python bench/bench_identity.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa

from bench._common import Stat, machine_note, parse_args, print_table, ratio, rotated, verdict
from bench._loops import AppendRun, run_writers, setup_failed, timed_appends

CONFIGS = ("identity", "plain")
WRITERS = 4
TARGET_RATIO = 0.8


def _schema(config: str) -> pa.Schema:
    from eventlog import identity_field

    first = identity_field("id") if config == "identity" else pa.field("id", pa.int64())
    return pa.schema([first, ("writer", pa.int32()), ("payload", pa.string())])


def _batch(config: str, writer: int, i: int) -> pa.Table:
    columns: dict[str, Any] = {"writer": pa.array([writer], pa.int32()), "payload": ["x" * 10]}
    if config == "plain":
        columns = {"id": pa.array([writer * 1_000_000 + i], pa.int64()), **columns}
    return pa.table(columns)


@dataclass
class RunResult(AppendRun):
    unique_ids: bool = False


def _worker(config: str, path: str, n: int, writer: int, barrier: Any, results: Any) -> None:
    try:
        from eventlog import Table

        table = Table.open(path)
        batches = [_batch(config, writer, i) for i in range(n)]
        barrier.wait()
        loop = timed_appends(batches, lambda b: table.append(b).attempts - 1)
        results.put((loop.start, loop.end, loop.ok, loop.errors, loop.retries, loop.cpu))
    except BaseException as exc:
        results.put((0.0, 0.0, 0, setup_failed(barrier, exc, n), 0, 0.0))


def run_config(config: str, per_writer: int) -> RunResult:
    from eventlog import Table
    from eventlog.files.identity import identity_columns

    tmp = tempfile.mkdtemp(prefix=f"bench-identity-{config}-")
    try:
        path = str(Path(tmp) / "table")
        Table.create(path, _schema(config)).close()
        rows = run_writers(_worker, (config, path, per_writer), WRITERS)
        errors: Counter[str] = Counter()
        for r in rows:
            errors.update(r[3])
        ok = sum(r[2] for r in rows)
        with Table.open(path) as t:
            data = t.to_arrow()
            ids = data.column("id").to_pylist()
            unique = len(set(ids)) == len(ids) and None not in ids
            if config == "identity":
                (column,) = identity_columns(t.refresh().schema)
                unique = unique and column.high_water_mark is not None and column.high_water_mark >= max(ids)
            version = t.version
        return RunResult(
            config,
            WRITERS,
            ok,
            WRITERS * per_writer - ok,
            max(r[1] for r in rows) - min(r[0] for r in rows),
            errors,
            version,
            data.num_rows,
            retries=sum(r[4] for r in rows),
            cpu=sum(r[5] for r in rows),
            unique_ids=unique,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "", quick_repeat=1)
    per_writer = 25 if args.quick else 150
    print(f"# bench_identity ({'quick' if args.quick else 'full'}): {machine_note()}")
    print(f"{WRITERS} processes x {per_writer} 1-row appends, embedded slot store; {args.repeat} runs each")
    results: dict[str, list[RunResult]] = {c: [] for c in CONFIGS}
    for rep in range(args.repeat):
        for config in rotated(CONFIGS, rep):
            r = run_config(config, per_writer)
            results[config].append(r)
            print(
                f"  run {rep + 1}: {config:8s} {r.commits_per_s:7.1f} commits/s, {r.ok} ok, {r.failed} failed"
                f"{' ' + str(dict(r.errors)) if r.errors else ''}, {r.retries} rebases, "
                f"CPU {1000 * r.cpu / max(1, r.ok):.2f} ms/commit -> version {r.version}, {r.rows} rows",
                flush=True,
            )
    table_rows = []
    for config in CONFIGS:
        runs = results[config]
        table_rows.append(
            [
                config,
                Stat.of([r.commits_per_s for r in runs]).fmt(".0f"),
                Stat.of([r.seconds for r in runs]).fmt(".2f", " s"),
                Stat.of([1000 * r.cpu / max(1, r.ok) for r in runs]).fmt(".2f"),
                f"{sum(r.failed for r in runs)} / {len(runs) * WRITERS * per_writer}",
                str(sum(r.retries for r in runs)),
            ]
        )
    print_table(
        "Appends by 4 processes: identity column versus none (median [min-max] over runs)",
        ["table", "commits/s", "wall", "CPU ms/commit", "failed (all runs)", "rebases (all runs)"],
        table_rows,
    )
    identity = Stat.of([r.commits_per_s for r in results["identity"]])
    plain = Stat.of([r.commits_per_s for r in results["plain"]])
    rt = ratio(identity.median, plain.median)
    print_table(
        "Ratio identity / plain (commits/s)",
        ["configuration", "identity / plain", "target", "verdict"],
        [["4 processes", f"{rt:.2f}x", f">= {TARGET_RATIO}x", verdict(rt >= TARGET_RATIO)]],
    )
    good = [
        r.failed == 0 and r.version == r.ok and r.rows == r.ok and r.unique_ids
        for runs in results.values()
        for r in runs
    ]
    print(
        f"verification: no failed append, version == appends, rows == appends, unique ids (identity: "
        f"at or below the mark) in {sum(good)}/{len(good)} runs -> {'OK' if all(good) else 'FAILED'}"
    )
    return 0 if all(good) else 1


if __name__ == "__main__":
    sys.exit(main())
