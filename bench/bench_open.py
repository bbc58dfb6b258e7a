"""Opening a table with a long log: ours versus delta-rs, without and with a checkpoint.

The table is built once with our library: ``Table.create`` (version 0) with
``delta.checkpointInterval = 1000000`` so that no checkpoint is written, then 1-row
appends through a single handle up to the wanted number of commits (versions
``0..N-1``). Both libraries then open the *same* directory:

* ours:      ``Table.open(path).version`` (replays the whole log into a snapshot);
             also ``len(Table.open(path).files())`` for the same work as the peer row
* deltalake: ``DeltaTable(path).version()`` plus ``DeltaTable.file_uris()`` so that the
             file list is really materialised (deltalake 1.x has no ``files()``)

Each measurement is 1 warm-up call then ``--repeat`` timed calls (default 5, interleaved,
the first call rotating, ``gc.collect()`` before each), reporting the median and range.
Then ``Table.open(path).checkpoint()`` writes a checkpoint at the last version and the same
timings are repeated.

Run: ``.venv/bin/python bench/bench_open.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import gc
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa

from bench._common import Stat, machine_note, parse_args, print_table, ratio, rotated, verdict

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
TARGET_RATIO = 0.25  # ours / deltalake open time


def build_table(path: str, commits: int) -> float:
    """Versions 0..commits-1 written by our library, no checkpoint. Returns seconds taken."""
    from eventlog.table import Table

    start = time.perf_counter()
    t = Table.create(path, SCHEMA, properties={"delta.checkpointInterval": "1000000"})
    for i in range(1, commits):
        t.append(pa.table({"id": pa.array([i], pa.int64()), "payload": [f"row-{i:06d}"]}, schema=SCHEMA))
    return time.perf_counter() - start


def log_files(path: str, pattern: str) -> list[Path]:
    return sorted((Path(path) / "_delta_log").glob(pattern))


def _ours_version(path: str) -> int:
    from eventlog.table import Table

    return Table.open(path).version


def _ours_files(path: str) -> int:
    from eventlog.table import Table

    t = Table.open(path)
    _ = t.version
    return len(t.files())


def _dl_version_files(path: str) -> int:
    from deltalake import DeltaTable

    dt = DeltaTable(path)
    _ = dt.version()
    return len(dt.file_uris())


def time_calls(calls: dict[str, Callable[[], object]], repeat: int) -> dict[str, Stat]:
    for fn in calls.values():  # warm-up: imports, page cache
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(repeat):
        for name in rotated(list(calls), rep):  # each call goes first in turn
            gc.collect()  # no call pays for collecting the previous one's garbage
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: Stat.of([1000 * t for t in v]) for name, v in times.items()}


def measure(path: str, repeat: int, label: str) -> tuple[list[list[object]], float]:
    calls: dict[str, Callable[[], object]] = {
        "ours: Table.open(path).version": lambda: _ours_version(path),
        "ours: Table.open(path).version + files()": lambda: _ours_files(path),
        "deltalake: DeltaTable(path).version() + file_uris()": lambda: _dl_version_files(path),
    }
    stats = time_calls(calls, repeat)
    names = list(calls)
    peer = stats[names[2]].median
    rows: list[list[object]] = []
    for name in names:
        s = stats[name]
        rows.append([label, name, s.fmt(".1f"), f"{ratio(s.median, peer):.2f}x"])
    return rows, ratio(stats[names[0]].median, peer)


def main() -> int:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "", default_repeat=5)
    commits = 500 if args.quick else 5000
    print(f"# bench_open ({'quick' if args.quick else 'full'}): {machine_note()}")
    tmp = tempfile.mkdtemp(prefix="bench-open-")
    try:
        from deltalake import DeltaTable

        from eventlog.table import Table

        path = str(Path(tmp) / "table")
        secs = build_table(path, commits)
        jsons = log_files(path, "*.json")
        cps = log_files(path, "*.checkpoint.parquet")
        print(
            f"built {len(jsons)} commits (versions 0..{commits - 1}) in {secs:.1f} s "
            f"({(commits - 1) / secs:.0f} appends/s, one handle); checkpoint files: {len(cps)}"
        )
        if cps or len(jsons) != commits:
            print("ERROR: the table must have exactly one JSON commit per version and no checkpoint")
            return 1
        if Table.open(path).version != commits - 1 or DeltaTable(path).version() != commits - 1:
            print("ERROR: both libraries must see the last version")
            return 1
        if {_ours_files(path), _dl_version_files(path)} != {commits - 1}:
            print("ERROR: both libraries must list one file per append")
            return 1

        rows, r_nocp = measure(path, args.repeat, "no checkpoint")
        Table.open(path).checkpoint()
        cps = log_files(path, "*.checkpoint.parquet")
        print(f"checkpoint written by ours: {[p.name for p in cps]}")
        if DeltaTable(path).version() != commits - 1 or _dl_version_files(path) != commits - 1:
            print("ERROR: deltalake must read the table after our checkpoint")
            return 1
        rows_cp, r_cp = measure(path, args.repeat, "checkpoint")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print_table(
        f"Open a table of {commits} commits: ms (median [min-max] of {args.repeat} runs)",
        ["log", "operation", "ms", "ours / deltalake (time: < 1 means ours is faster)"],
        rows + rows_cp,
    )
    print_table(
        "Target: ours open time <= 0.25x deltalake's",
        ["log", "ours / deltalake", "target", "verdict"],
        [
            ["no checkpoint", f"{r_nocp:.2f}x", f"<= {TARGET_RATIO}x", verdict(r_nocp <= TARGET_RATIO)],
            ["checkpoint", f"{r_cp:.2f}x", f"<= {TARGET_RATIO}x", verdict(r_cp <= TARGET_RATIO)],
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
