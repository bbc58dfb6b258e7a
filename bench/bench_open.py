"""Opening tables and planning a scan (issue 14, columnar snapshot state): ours versus delta-rs.

Both libraries open the *same* directory; "open" is the work a reader does before it can
plan a scan:

* ours:      ``t = Table.open(path); t.version; len(t.files())``
* deltalake: ``dt = DeltaTable(path); dt.version(); len(dt.file_uris())``

Before any timing both must report the expected version and number of live files (else
ERROR, exit 1). Scenarios (``--only`` picks some; sizes in brackets are ``--quick``'s):

1. ``open-1k``: 1,000 [200] commits written through our append API (``Table.create`` then
   one-row appends through one handle; our default checkpoint interval writes checkpoints at
   100, 200, ...), or, when that would take over 30 s, the same log written synthetically plus
   ``Table.open(path).checkpoint()`` at the last multiple of 100. Target: ours <= 1.0x.
2. ``open-5k``: the same with 5,000 [500] commits. Target: ours <= 1.0x.
3. ``json-300k``: 300,000 [30,000] live files from JSON commits, no checkpoint, two shapes:
   one commit of 300,000 adds, and 30 commits of 10,000 [1,000]. Open time and peak
   memory, target ours <= 1.0x for both.
4. ``checkpoint-1m``: 1,000,000 [100,000] live files (10 JSON commits) with a checkpoint at
   the last version written by ours (``Table.open(path).checkpoint()`` in a child process;
   should it fail or take over 300 s, ``DeltaTable(path).create_checkpoint()`` instead, and
   the output says so). Open time and peak memory, target ours <= 1.0x for both.
5. ``flat``: 1,000, 10,000 and 100,000 [200, 2,000, 10,000] commits, each table with one
   checkpoint (plus ``_last_checkpoint``) at its last version written by
   ``Table.open(path).checkpoint()``. The live state does not grow with the log: version 1
   adds 1,000 files, every later version adds one file and removes the previous version's
   (1,001 live files; removes are dated 60 days back, past the 7-day tombstone retention,
   so the checkpoints hold no tombstones). Target: ours' open time at the longest log <=
   1.5x at the shortest; deltalake's times are shown for information. These opens take a
   few milliseconds, so each engine is timed 5 x ``--repeat`` times per table, all tables
   and both engines in one interleaved series.
6. ``plan``: on an opened table of 300,000 [30,000] files (scenario 3's 30-commit table,
   partitioned by ``part``, stats on every file), ``t.files(filter="part IN ('03', '42') AND
   id >= A AND id < B")``: partition pruning plus min/max skipping down to 200 [20] files.
   Target: <= 100 ms, judged on the first call after the open (it may build an index); a
   repeated call on the same handle is shown too. For information, deltalake's nearest
   equivalent: ``dt.file_uris(file_pruning_predicate=<the same SQL>)`` on an opened
   ``DeltaTable`` (delta-rs prunes partitions and min/max statistics the same way).

The run imports a copy of ``eventlog/`` and ``lockstore/`` taken at its start (in this
process and every child), so others' edits during the run change nothing. Tables other
than 1-2 are synthetic: :mod:`bench._tables` writes the ``_delta_log``
directly (realistic ``add`` actions with ~200-byte stats strings); the data files do not
exist, since neither library opens them to open a table or plan a scan. Tables are built
once per run under a temporary directory and deleted at the end.

Open time: in this process, 1 warm-up call per engine then ``--repeat`` timed calls
(default 5, or 3 with ``--quick``; interleaved, the first engine rotating, ``gc.collect()``
before each, the result dropped after the clock stops), median [min-max]. Peak memory
(scenarios 3-4): one fresh process per measurement (``--mem-repeat`` per engine, default
``--repeat``, or 1 with ``--quick``; alternating, the first engine rotating): it imports
both libraries, opens a tiny table with both (warm-up), records its baseline RSS
(``/proc/self/status`` VmRSS) and resets its high-water mark there (``/proc/self/clear_refs``,
else a fork+exec child's ``ru_maxrss`` starts at its parent's RSS), opens the table once and
reports ``ru_maxrss`` (VmHWM) minus the baseline ("peak"), the RSS still held with the table
open ("held"), and the wall and CPU time (user + sys, all threads) of that cold open.

Run: ``.venv/bin/python bench/bench_open.py [--quick] [--repeat N] [--mem-repeat N] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

from bench._common import machine_note, print_table
from bench._open_measure import CheckFailed, snapshot_code
from bench._open_scenarios import (
    FLAT_ROUNDS,
    Report,
    run_appended,
    run_big_checkpoint,
    run_flat,
    run_json,
    run_plan,
)
from bench._open_tables import FULL, QUICK, Tables

SCENARIOS = ("open-1k", "open-5k", "json-300k", "checkpoint-1m", "flat", "plan")


# --------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run (< 60 s)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs per measurement (default 5, or 3 with --quick); median and range reported",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SCENARIOS,
        metavar="NAME",
        help=f"run only these scenarios: {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--mem-repeat",
        type=int,
        default=None,
        help="fresh processes per engine for peak memory (default: --repeat, or 1 with --quick)",
    )
    args = parser.parse_args()
    if args.repeat is None:
        args.repeat = 3 if args.quick else 5
    if args.mem_repeat is None:
        args.mem_repeat = 1 if args.quick else args.repeat
    if args.repeat < 1 or args.mem_repeat < 1:
        parser.error("--repeat and --mem-repeat must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    sizes = QUICK if args.quick else FULL
    wanted = set(args.only or SCENARIOS)
    print(f"# bench_open ({'quick' if args.quick else 'full'}): {machine_note()}", flush=True)
    report = Report([], [], [], [])
    flat_rows: list[list[object]] = []
    plan_rows: list[list[object]] = []
    tables = Tables(sizes)
    started = time.perf_counter()
    try:
        try:
            snapshot_code(tables.code)
        except ImportError as exc:
            print(f"ERROR: eventlog does not import now (someone's edit in progress?); retry later: {exc!r}")
            return 1
        for scenario in SCENARIOS:
            if scenario not in wanted:
                continue
            print(f"- {scenario}", flush=True)
            if scenario == "open-1k":
                run_appended(tables, sizes.open_small, args.repeat, report)
            elif scenario == "open-5k":
                run_appended(tables, sizes.open_large, args.repeat, report)
            elif scenario == "json-300k":
                run_json(tables, (args.repeat, args.mem_repeat), report)
            elif scenario == "checkpoint-1m":
                run_big_checkpoint(tables, (args.repeat, args.mem_repeat), report)
            elif scenario == "flat":
                flat_rows = run_flat(tables, args.repeat, report)
            elif scenario == "plan":
                plan_rows = run_plan(tables, args.repeat, report)
    except CheckFailed as exc:
        print(f"ERROR: {exc}")
        return 1
    finally:
        tables.close()

    r = args.repeat
    for note in report.notes:
        print(f"note: {note}")
    if report.time_rows:
        print_table(
            f"Open time: ms, median [min-max] of {r} runs in this process",
            ["table", "engine", "ms", "ours / deltalake (< 1: ours faster)"],
            report.time_rows,
        )
    if report.mem_rows:
        print_table(
            f"Cold open, fresh process ({args.mem_repeat} per engine): peak RSS over baseline, held, time",
            [
                "table",
                "engine",
                "peak MiB",
                "ours / deltalake (< 1: ours smaller)",
                "held MiB",
                "wall ms",
                "CPU ms",
            ],
            report.mem_rows,
        )
    if flat_rows:
        print_table(
            f"Open time, checkpoint at the last version: ms, median [min-max] of {FLAT_ROUNDS * r} runs",
            [
                "commits",
                "ours ms",
                "deltalake ms",
                "ours / deltalake",
                "ours / shortest",
                "deltalake / shortest",
            ],
            flat_rows,
        )
    if plan_rows:
        print_table(
            f"Plan a filtered scan on an opened table: ms, median [min-max] of {r} runs",
            ["engine", "call", "first call after open", "repeated call"],
            plan_rows,
        )
    print_table("Targets (issue 14)", ["scenario", "metric", "target", "measured", "verdict"], report.summary)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
