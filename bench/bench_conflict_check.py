"""Cost of the conflict check against 1,000- and 10,000-file winning commits, versus a commit's latency.

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
* D, 10,000 files:   ``t.overwrite(10,000 rows, replace_where="date >= '2024-03-01'")`` into
                     29 new March partitions: 10,000 adds (isBlindAppend=false), checked
                     against the loser's partition predicate and read files (10 rows are
                     appended to the loser's partition first, which the latency runs emptied).
                     Issue 14: "conflict-check a winning commit of 10,000 files: at most 10%
                     of the commit's latency"

Timed: ``check_conflicts(summary, WinningCommit.of(commit))`` (what the commit loop runs per
winner), 500 calls per run (50 for D; quick: 50 and 10). Also shown, not included in the
check: reading the winning commit from the log on a fresh handle (``Table.handle(path)
.commits_between(v, v)``: what a loser in another process pays before checking). Compared
with the latency of full small commits on the same table: ``t.append`` of 1 row, and
``t.delete`` of one partition (holding that row), measured after A-C (~1,300 live files; the
denominator of A-C) and again after D (~11,300 live files; the denominator of D). Each is
``--repeat`` runs; the median of each run's median is reported with the range.

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
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa

from bench._common import Stat, machine_note, parse_args, print_table, verdict

if TYPE_CHECKING:
    from eventlog.table import Table
    from eventlog.txn.transaction import CommitResult

SCHEMA = pa.schema([("id", pa.int64()), ("value", pa.float64()), ("date", pa.date32())])
DAYS = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(30)]
LOSER_DAY = DAYS[4]
LOSER_PREDICATE = f"date = '{LOSER_DAY.isoformat()}'"
WINNER_FILES = 1000
BIG_WINNER_FILES = 10_000
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


def check_case(
    t: Table,
    path: str,
    name: str,
    commit_winner: Callable[[Table], CommitResult],
    expected_adds: int,
    n: int,
    repeat: int,
) -> tuple[Stat, Stat, Stat, str]:
    """A fresh loser, then ``commit_winner``: (check, WinningCommit.of, reading the winner from
    the log) in ms, and a description. Raises ValueError if the winner is not as expected."""
    from eventlog.table import Table
    from eventlog.txn.conflicts import WinningCommit, check_conflicts

    loser = t.transaction()
    loser.delete(LOSER_PREDICATE)
    _body, info, level = loser._prepare()
    summary = loser.summary(level, bool(info.is_blind_append))
    result = commit_winner(Table.open(path))
    commit = Table.open(path).commits_between(result.version, result.version)[0]
    winner = WinningCommit.of(commit)
    if len(winner.adds) != expected_adds:
        raise ValueError(f"the winner has {len(winner.adds)} added files, expected {expected_adds}")
    check_conflicts(summary, winner)  # must not raise: the loser's partition is untouched
    description = (
        f"winner v{commit.version}: {len(winner.adds)} adds, {len(winner.removes)} removes, "
        f"isBlindAppend={winner.is_blind_append}; loser: {level.value}, "
        f"{len(summary.read_set.files)} files read, {len(summary.removes)} removes"
    )
    runs = [time_each(lambda: check_conflicts(summary, WinningCommit.of(commit)), n) for _ in range(repeat)]
    check = median_of_medians([[1000 * x for x in r] for r in runs])
    of_runs = [time_each(lambda: WinningCommit.of(commit), n) for _ in range(repeat)]
    of = median_of_medians([[1000 * x for x in r] for r in of_runs])

    def read_cold() -> float:  # a handle with an empty commit cache, as another process has
        h = Table.handle(path)
        try:
            return time_each(lambda: h.commits_between(result.version, result.version), 1)[0]
        finally:
            h.close()

    reads = Stat.of([1000 * read_cold() for _ in range(max(3, repeat))])
    loser.abort()
    print(f"  {name}: {description}; check {check.fmt('.3f')} ms", flush=True)
    return check, of, reads, description


def commit_latency(t: Table, n: int, repeat: int) -> dict[str, Stat]:
    """Alternate a 1-row append into the loser's partition and a delete of that partition
    (which removes that row): ms, median of per-run medians."""
    one_row = rows(1, [LOSER_DAY], start=99_999)
    append_runs: list[list[float]] = []
    delete_runs: list[list[float]] = []
    t.append(one_row)
    t.delete(LOSER_PREDICATE)  # warm-up
    for _ in range(repeat):
        a_times: list[float] = []
        d_times: list[float] = []
        for _ in range(n):
            a_times += time_each(lambda: t.append(one_row), 1)
            d_times += time_each(lambda: t.delete(LOSER_PREDICATE), 1)
        append_runs.append([1000 * x for x in a_times])
        delete_runs.append([1000 * x for x in d_times])
    return {
        "append 1 row": median_of_medians(append_runs),
        "delete 1 partition": median_of_medians(delete_runs),
    }


def main() -> int:
    args = parse_args(__doc__.splitlines()[0] if __doc__ else "")
    checks_per_run = 50 if args.quick else 500
    big_checks_per_run = 10 if args.quick else 50
    commits_per_run = 15 if args.quick else 100
    print(f"# bench_conflict_check ({'quick' if args.quick else 'full'}): {machine_note()}")

    from eventlog.table import Table

    tmp = tempfile.mkdtemp(prefix="bench-conflict-")
    try:
        path = str(Path(tmp) / "table")
        t = Table.create(path, SCHEMA, partition_by=["date"], properties={"delta.targetFileSize": "1"})
        t.append(rows(300, DAYS))
        others = [d for d in DAYS if d != LOSER_DAY]
        winner_data = rows(WINNER_FILES, others, start=10_000)

        feb = [dt.date(2024, 2, 1) + dt.timedelta(days=i) for i in range(29)]
        feb_data = rows(WINNER_FILES, feb, start=20_000)
        scenarios: dict[str, Callable[[Table], CommitResult]] = {
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
        read_stats: dict[str, Stat] = {}  # reading the winner from the log (not included)
        calls: dict[str, int] = {}
        descriptions: dict[str, str] = {}
        for name, commit_winner in scenarios.items():
            check_stats[name], of_stats[name], read_stats[name], descriptions[name] = check_case(
                t, path, name, commit_winner, WINNER_FILES, checks_per_run, args.repeat
            )
            calls[name] = checks_per_run

        # Commit latency on the same table (now ~1,300 live files).
        latency = commit_latency(t, commits_per_run, args.repeat)
        latency_files = len(t.files())

        # D: 10,000 added files (isBlindAppend=false) into 29 new March partitions, then the
        # commit latency again on the table holding them (~11,300 live files).
        mar = [dt.date(2024, 3, 1) + dt.timedelta(days=i) for i in range(29)]
        mar_data = rows(BIG_WINNER_FILES, mar, start=30_000)
        t.append(rows(10, [LOSER_DAY], start=29_000))  # files for the loser to read again
        big = "D: overwrite, 10,000 files in new partitions"
        start = time.perf_counter()
        check_stats[big], of_stats[big], read_stats[big], descriptions[big] = check_case(
            t,
            path,
            big,
            lambda w: w.overwrite(mar_data, replace_where="date >= '2024-03-01'"),
            BIG_WINNER_FILES,
            big_checks_per_run,
            args.repeat,
        )
        calls[big] = big_checks_per_run
        descriptions[big] += f" (winner written in {time.perf_counter() - start:.1f} s)"
        big_latency = commit_latency(t, commits_per_run, args.repeat)
        final_version = t.version
        live_files = len(t.files())
    except ValueError as exc:
        print(f"ERROR: {exc}")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"table after the run: version {final_version}, {live_files} live files")
    rows_out: list[list[object]] = []
    for name, s in check_stats.items():
        rows_out.append(["check_conflicts", name, s.fmt(".3f"), f"{calls[name]} x {args.repeat}"])
        rows_out.append(
            [
                "  of which WinningCommit.of",
                name,
                of_stats[name].fmt(".3f"),
                f"{calls[name]} x {args.repeat}",
            ]
        )
        rows_out.append(
            [
                "  (not included) read winner from log",
                name,
                read_stats[name].fmt(".3f"),
                f"1 x {read_stats[name].n}",
            ]
        )
    for lname, s in latency.items():
        rows_out.append(
            [
                "commit latency",
                f"{lname}, {latency_files} files",
                s.fmt(".3f"),
                f"{commits_per_run} x {args.repeat}",
            ]
        )
    for lname, s in big_latency.items():
        rows_out.append(
            [
                "commit latency",
                f"{lname}, {live_files} files",
                s.fmt(".3f"),
                f"{commits_per_run} x {args.repeat}",
            ]
        )
    print_table(
        "Conflict check vs commit latency: ms, median [min-max] of per-run medians",
        ["what", "case", "ms", "calls"],
        rows_out,
    )
    ratio_rows = []
    for cname, cs in check_stats.items():
        for lname, ls in (big_latency if cname == big else latency).items():
            r = cs.median / ls.median
            ratio_rows.append(
                [cname, lname, f"{100 * r:.1f}%", f"<= {100 * TARGET_RATIO:.0f}%", verdict(r <= TARGET_RATIO)]
            )
    print_table(
        "Ratio check / commit latency (< 1 is better; target <= 10%; D against the latency after D)",
        ["winner", "commit", "check / commit", "target", "verdict"],
        ratio_rows,
    )
    for name, d in descriptions.items():
        print(f"{name}: {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
