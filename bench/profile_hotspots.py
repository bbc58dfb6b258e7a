"""Profile our side of each benchmark with cProfile and list the hotspots in OUR code.

For every case the same workload as the benchmark script runs under ``cProfile``; the
output lists (1) the functions of ``eventlog``/``lockstore`` by cumulative time and (2) all
functions (C extensions and the standard library included) by own time, so that time
spent in pyarrow, in system calls or sleeping is visible as well. Multi-process cases
profile every writer process and merge the statistics.

Run: ``.venv/bin/python bench/profile_hotspots.py CASE [--quick] [--top N]`` with CASE one
of ``appends1``, ``appends4``, ``open``, ``open-checkpoint``, ``bulk-append``, ``scan``,
``conflict-blind``, ``conflict-new-partitions``, ``conflict-overwrite``, ``commits`` or ``all``
(the conflict cases are the scenarios A, B and C of ``bench_conflict_check.py``).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import multiprocessing as mp
import os
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa

REPO_ROOT = str(Path(__file__).resolve().parents[1])
OUR_PACKAGES = tuple(os.path.join(REPO_ROOT, p) + os.sep for p in ("eventlog", "lockstore"))


def _ours(filename: str) -> bool:
    return filename.startswith(OUR_PACKAGES)


def _label(key: tuple[str, int, str]) -> str:
    filename, line, func = key
    if filename.startswith(REPO_ROOT):
        filename = os.path.relpath(filename, REPO_ROOT)
    elif filename == "~":
        return func  # a C function, e.g. <built-in method posix.link>
    else:
        filename = "/".join(Path(filename).parts[-2:])
    return f"{filename}:{line}({func})"


def report(stats: pstats.Stats, wall: float, title: str, top: int) -> None:
    """Print the top functions of our code by cumulative time, then all by own time."""
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    print(f"\n## {title}: {wall:.3f} s wall under the profiler\n")
    ours = sorted(((k, v) for k, v in raw.items() if _ours(k[0])), key=lambda kv: kv[1][3], reverse=True)
    print("Our code by cumulative time:\n")
    print("| function | calls | cumulative s | own s |")
    print("|---|---|---|---|")
    for key, (_cc, nc, tt, ct, _callers) in ours[:top]:
        print(f"| {_label(key)} | {nc} | {ct:.3f} | {tt:.3f} |")
    print("\nAll functions by own time:\n")
    print("| function | calls | own s | cumulative s |")
    print("|---|---|---|---|")
    for key, (_cc, nc, tt, ct, _callers) in sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:top]:
        print(f"| {_label(key)} | {nc} | {tt:.3f} | {ct:.3f} |")


def profiled(fn: Callable[[], object]) -> tuple[pstats.Stats, float]:
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    fn()
    prof.disable()
    wall = time.perf_counter() - start
    return pstats.Stats(prof, stream=io.StringIO()), wall


# --------------------------------------------------------------------------- cases


def _append_worker(path: str, n: int, writer: int, barrier: Any, out_file: str) -> None:
    from bench.bench_small_appends import _batch
    from eventlog.table import Table

    table = Table.open(path)
    batches = [_batch(writer, i) for i in range(n)]
    barrier.wait()
    prof = cProfile.Profile()
    prof.enable()
    for b in batches:
        table.append(b)
    prof.disable()
    prof.dump_stats(out_file)


def case_appends(writers: int, quick: bool) -> tuple[pstats.Stats, float]:
    from bench.bench_small_appends import SCHEMA
    from eventlog.table import Table

    per_writer = (50 if writers == 1 else 25) if quick else (500 if writers == 1 else 250)
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="profile-appends-")
    try:
        path = str(Path(tmp) / "table")
        Table.create(path, SCHEMA)
        barrier = ctx.Barrier(writers)
        outs = [str(Path(tmp) / f"w{w}.prof") for w in range(writers)]
        procs = [
            ctx.Process(target=_append_worker, args=(path, per_writer, w, barrier, outs[w]))
            for w in range(writers)
        ]
        start = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        wall = time.perf_counter() - start
        stats = pstats.Stats(outs[0], stream=io.StringIO())
        for f in outs[1:]:
            stats.add(f)
        print(f"(stats summed over {writers} writer processes, {writers * per_writer} appends)")
        return stats, wall
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def case_open(checkpoint: bool, quick: bool) -> tuple[pstats.Stats, float]:
    from bench._open_tables import build_appended
    from eventlog.table import Table

    tmp = tempfile.mkdtemp(prefix="profile-open-")
    try:
        path = str(Path(tmp) / "table")
        build_appended(path, 500 if quick else 5000)
        if checkpoint:
            Table.open(path).checkpoint()
        Table.open(path)  # warm-up

        def run() -> None:
            for _ in range(5):
                _ = Table.open(path).version

        print("(5 opens)")
        return profiled(run)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def case_bulk(scan: bool, quick: bool) -> tuple[pstats.Stats, float]:
    from bench.bench_bulk import make_data
    from eventlog.table import Table

    data = make_data(200_000 if quick else 5_000_000)
    tmp = tempfile.mkdtemp(prefix="profile-bulk-")
    try:
        path = str(Path(tmp) / "table")
        t = Table.create(path, data.schema)
        if not scan:
            return profiled(lambda: t.append(data))
        t.append(data)
        t = Table.open(path)
        return profiled(t.to_arrow)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def case_conflict(scenario: str, quick: bool) -> tuple[pstats.Stats, float]:
    from bench.bench_conflict_check import DAYS, LOSER_DAY, LOSER_PREDICATE, SCHEMA, WINNER_FILES, rows
    from eventlog.table import Table
    from eventlog.txn.conflicts import WinningCommit, check_conflicts

    tmp = tempfile.mkdtemp(prefix="profile-conflict-")
    try:
        path = str(Path(tmp) / "table")
        t = Table.create(path, SCHEMA, partition_by=["date"], properties={"delta.targetFileSize": "1"})
        t.append(rows(300, DAYS))
        if scenario == "commits":
            t.append(rows(WINNER_FILES, [d for d in DAYS if d != LOSER_DAY], start=10_000))
            one = rows(1, [LOSER_DAY], start=99_999)
            n = 20 if quick else 200

            def commits() -> None:
                for _ in range(n):
                    t.append(one)
                    t.delete(LOSER_PREDICATE)  # keeps the table the same size

            print(
                f"({n} 1-row appends and {n} one-partition deletes, alternating; see table.py append/delete)"
            )
            return profiled(commits)
        loser = t.transaction()
        loser.delete(LOSER_PREDICATE)
        _body, info, level = loser._prepare()
        summary = loser.summary(level, bool(info.is_blind_append))
        winner_data = rows(WINNER_FILES, [d for d in DAYS if d != LOSER_DAY], start=10_000)
        w = Table.open(path)
        if scenario == "conflict-blind":
            result = w.append(winner_data)
        elif scenario == "conflict-new-partitions":
            feb = [dt.date(2024, 2, 1) + dt.timedelta(days=i) for i in range(29)]
            result = w.overwrite(rows(WINNER_FILES, feb, start=20_000), replace_where="date >= '2024-02-01'")
        else:
            result = w.overwrite(
                winner_data, replace_where=f"date <> '{LOSER_DAY.isoformat()}' AND date < '2024-02-01'"
            )
        commit = Table.open(path).commits_between(result.version, result.version)[0]
        n = 100 if quick else 1000

        def checks() -> None:
            for _ in range(n):
                check_conflicts(summary, WinningCommit.of(commit))

        print(f"({n} calls of check_conflicts(summary, WinningCommit.of(commit)))")
        return profiled(checks)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


CASES: dict[str, Callable[[bool], tuple[pstats.Stats, float]]] = {
    "appends1": lambda q: case_appends(1, q),
    "appends4": lambda q: case_appends(4, q),
    "open": lambda q: case_open(False, q),
    "open-checkpoint": lambda q: case_open(True, q),
    "bulk-append": lambda q: case_bulk(False, q),
    "scan": lambda q: case_bulk(True, q),
    "conflict-blind": lambda q: case_conflict("conflict-blind", q),
    "conflict-new-partitions": lambda q: case_conflict("conflict-new-partitions", q),
    "conflict-overwrite": lambda q: case_conflict("conflict-overwrite", q),
    "commits": lambda q: case_conflict("commits", q),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("case", choices=[*CASES, "all"])
    parser.add_argument("--quick", action="store_true", help="the benchmarks' --quick sizes")
    parser.add_argument("--top", type=int, default=15, help="rows per list (default 15)")
    args = parser.parse_args()
    names = list(CASES) if args.case == "all" else [args.case]
    print(f"pyarrow {pa.__version__}; sizes: {'quick' if args.quick else 'full'}")
    for name in names:
        stats, wall = CASES[name](args.quick)
        report(stats, wall, name, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
