"""Cost of the conflict check against a 1,000-file winning commit, versus a commit's latency.

Set-up (all through the public API, on local disk, default slot store): a table of
``id int64, value float64, date date32`` partitioned by ``date`` (30 days), with the
property ``delta.targetFileSize = 1`` so that every row is written as its own file (the
simplest way to make one ordinary append produce exactly 1,000 real files); it starts with
300 rows (10 per partition).

The *loser* is a DELETE of one partition (``date = '2024-01-05'``) planned at the current
version; its summary is built the way the commit loop builds it: ``txn._prepare()`` then
``txn.summary(level, is_blind_append)``. Then another handle commits a *winner* with 1,000
added files, none in the loser's partition (so no conflict is found and every check runs
to the end), and the winning ``Commit`` is read back from the log by a fresh handle.
Three winners, each checked against a fresh loser:

* A, blind append:   ``t.append(1,000 rows)`` in the 29 other January partitions -- under
                     WriteSerializable a blind append's adds are not checked at all
* B, not blind:      ``t.overwrite(1,000 rows, replace_where="date >= '2024-02-01'")`` into
                     29 new February partitions: 1,000 adds (isBlindAppend=false, no removes)
                     checked against the loser's partition predicate
* C, not blind, with removes: ``t.overwrite(1,000 rows, replace_where="date <> '2024-01-05'")``
                     over the 29 other January partitions: 1,000 adds plus the removes of
                     every file there, checked against the loser's predicate and read files

Timed: ``check_conflicts(summary, WinningCommit.of(commit))`` (what the commit loop runs per
winner), ``--iterations`` calls per run. Compared with the latency of full small commits on
the same table: ``t.append`` of 1 row, and ``t.delete`` of one partition (holding that row).
Each is ``--repeat`` runs; the median of each run's median is reported with the range.

Run: ``.venv/bin/python bench/bench_conflict_check.py [--quick] [--repeat N]``
"""

from __future__ import annotations

import datetime as dt
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa

from bench._common import Stat, machine_note, parse_args, print_table, verdict

SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.float64()), ("date", pa.date32())])
DAYS = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(30)]
LOSER_DAY = DAYS[4]
LOSER_PREDICATE = f"date = '{LOSER_DAY.isoformat()}'"
WINNER_FILES = 1000
TARGET_RATIO = 0.10  # check / commit latency


def rows(n: int, days: list[dt.date], start: int = 0) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "value": pa.array([i * 0.5 for i in range(n)], pa.float64()),
            "date": pa.array([days[i % len(days)] for i in range(n)], pa.date32()),
        },
        schema=SCHEMA,
    )


def median_of_medians(runs: list[list[float]]) -> Stat:
    return Stat.of([statistics.median(r) for r in runs])


def time_each(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> int:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    checks_per_run = 50 if args.quick else 500
    commits_per_run = 15 if args.quick else 100
    print(f"# bench_conflict_check ({'quick' if args.quick else 'full'}): {machine_note()}")

    from eventlog.table import Table
    from eventlog.txn.conflicts import WinningCommit, check_conflicts

    tmp = tempfile.mkdtemp(prefix="bench-conflict-")
    try:
        path = str(Path(tmp) / "table")
        t = Table.create(path, SCHEMA, partition_by=["date"], properties={"delta.targetFileSize": "1"})
        t.append(rows(300, DAYS))
        others = [d for d in DAYS if d != LOSER_DAY]
        winner_data = rows(WINNER_FILES, others, start=10_000)

        feb = [dt.date(2024, 2, 1) + dt.timedelta(days=i) for i in range(29)]
        feb_data = rows(WINNER_FILES, feb, start=20_000)
        scenarios = {
            "A: blind append": lambda w: w.append(winner_data),
            "B: overwrite, new partitions": lambda w: w.overwrite(
                feb_data, replace_where="date >= '2024-02-01'"
            ),
            "C: overwrite with removes": lambda w: w.overwrite(
                winner_data, replace_where=f"date <> '{LOSER_DAY.isoformat()}' AND date < '2024-02-01'"
            ),
        }
        check_stats: dict[str, Stat] = {}
        of_stats: dict[str, Stat] = {}  # the WinningCommit.of part alone (included in the check)
        descriptions: dict[str, str] = {}
        for name, commit_winner in scenarios.items():
            loser = t.transaction()
            loser.delete(LOSER_PREDICATE)
            _body, info, level = loser._prepare()
            summary = loser.summary(level, bool(info.is_blind_append))
            result = commit_winner(Table.open(path))
            commit = Table.open(path).commits_between(result.version, result.version)[0]
            winner = WinningCommit.of(commit)
            if len(winner.adds) != WINNER_FILES:
                print(f"ERROR: the winner has {len(winner.adds)} added files, expected {WINNER_FILES}")
                return 1
            check_conflicts(summary, winner)  # must not raise: the loser's partition is untouched
            descriptions[name] = (
                f"winner v{commit.version}: {len(winner.adds)} adds, {len(winner.removes)} removes, "
                f"isBlindAppend={winner.is_blind_append}; loser: {level.value}, "
                f"{len(summary.read_set.files)} files read, {len(summary.removes)} removes"
            )
            runs = [
                time_each(lambda s=summary, c=commit: check_conflicts(s, WinningCommit.of(c)), checks_per_run)
                for _ in range(args.repeat)
            ]
            check_stats[name] = median_of_medians([[1000 * x for x in r] for r in runs])
            of_runs = [
                time_each(lambda c=commit: WinningCommit.of(c), checks_per_run) for _ in range(args.repeat)
            ]
            of_stats[name] = median_of_medians([[1000 * x for x in r] for r in of_runs])
            loser.abort()
            print(f"  {name}: {descriptions[name]}; check {check_stats[name].fmt('.3f')} ms", flush=True)

        # Commit latency on the same table (now ~1,300 live files): alternate a 1-row append
        # into the loser's partition and a delete of that partition (which removes that row).
        one_row = rows(1, [LOSER_DAY], start=99_999)
        append_runs: list[list[float]] = []
        delete_runs: list[list[float]] = []
        t.append(one_row)
        t.delete(LOSER_PREDICATE)  # warm-up
        for _ in range(args.repeat):
            a_times: list[float] = []
            d_times: list[float] = []
            for _ in range(commits_per_run):
                a_times += time_each(lambda: t.append(one_row), 1)
                d_times += time_each(lambda: t.delete(LOSER_PREDICATE), 1)
            append_runs.append([1000 * x for x in a_times])
            delete_runs.append([1000 * x for x in d_times])
        latency = {
            "append 1 row": median_of_medians(append_runs),
            "delete 1 partition": median_of_medians(delete_runs),
        }
        final_version = t.version
        live_files = len(t.files())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"table after the run: version {final_version}, {live_files} live files")
    rows_out: list[list[object]] = []
    for name, s in check_stats.items():
        rows_out.append(["check_conflicts", name, s.fmt(".3f"), f"{checks_per_run} x {args.repeat}"])
        rows_out.append(
            [
                "  of which WinningCommit.of",
                name,
                of_stats[name].fmt(".3f"),
                f"{checks_per_run} x {args.repeat}",
            ]
        )
    for name, s in latency.items():
        rows_out.append(["commit latency", name, s.fmt(".3f"), f"{commits_per_run} x {args.repeat}"])
    print_table(
        "Conflict check vs commit latency: ms, median [min-max] of per-run medians",
        ["what", "case", "ms", "calls"],
        rows_out,
    )
    ratio_rows = []
    for cname, cs in check_stats.items():
        for lname, ls in latency.items():
            r = cs.median / ls.median
            ratio_rows.append(
                [cname, lname, f"{100 * r:.1f}%", f"<= {100 * TARGET_RATIO:.0f}%", verdict(r <= TARGET_RATIO)]
            )
    print_table(
        "Ratio check / commit latency (< 1 is better; target <= 10%)",
        ["winner", "commit", "check / commit", "target", "verdict"],
        ratio_rows,
    )
    for name, d in descriptions.items():
        print(f"{name}: {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
