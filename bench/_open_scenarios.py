"""bench_open's scenarios: open-1k/open-5k (appended), json-300k, checkpoint-1m, flat and plan,
each adding its rows to the :class:`Report`.
"""

from __future__ import annotations

import functools
import gc
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import _tables
from bench._common import Stat, ratio, rotated, verdict
from bench._open_measure import (
    ENGINES,
    OPENERS,
    CheckFailed,
    measure_children,
    require_same,
    time_calls,
    time_opens,
)
from bench._open_tables import Tables, build_appended, checkpoint_last, commits_text

TARGET_RATIO = 1.0  # ours / deltalake: open time and peak memory
TARGET_FLAT = 1.5  # ours' open time, longest log / shortest log
TARGET_PLAN_MS = 100.0
FLAT_ROUNDS = 5  # the flat opens take milliseconds: 5 x --repeat calls each, for a steadier median
PLAN_PARTS = ("03", "42")


@dataclass
class Report:
    """Printed tables and the summary's rows (name, metric, target, measured, verdict)."""

    time_rows: list[list[object]]
    mem_rows: list[list[object]]
    summary: list[list[object]]
    notes: list[str]


def _time_rows(label: str, stats: dict[str, Stat]) -> list[list[object]]:
    peer = stats["deltalake"].median
    return [[label, e, stats[e].fmt(".1f"), f"{ratio(stats[e].median, peer):.2f}x"] for e in ENGINES]


def _ratio_row(name: str, metric: str, ours: float, peer: float) -> list[object]:
    r = ratio(ours, peer)
    return [name, metric, f"<= {TARGET_RATIO:.1f}x deltalake", f"{r:.2f}x", verdict(r <= TARGET_RATIO)]


def run_appended(tables: Tables, commits: int, repeat: int, report: Report) -> None:
    name = f"open-{commits}"
    path = tables.get(name, lambda p: build_appended(p, commits))
    cps = _tables.log_files(path, "*.checkpoint.parquet")
    if not cps:
        raise CheckFailed(f"{path}: no checkpoint was written")
    report.notes.append(f"{name}: {len(cps)} checkpoint(s), the last {cps[-1].name}")
    require_same(path, commits - 1, commits - 1)
    stats = time_opens(path, repeat)
    report.time_rows += _time_rows(f"{commits:,} commits, checkpoints every 100", stats)
    report.summary.append(_ratio_row(name, "open time", stats["ours"].median, stats["deltalake"].median))


def _run_with_memory(
    label: str,
    name: str,
    path: str,
    tables: Tables,
    expect: tuple[int, int],
    repeat: tuple[int, int],
    report: Report,
) -> None:
    require_same(path, *expect)
    stats = time_opens(path, repeat[0])
    report.time_rows += _time_rows(label, stats)
    children = measure_children(path, tables.warm, repeat[1], expect)
    peer = children["deltalake"]
    for e in ENGINES:
        c = children[e]
        report.mem_rows.append(
            [
                label,
                e,
                c.peak.fmt(".0f"),
                f"{ratio(c.peak.median, peer.peak.median):.2f}x",
                c.held.fmt(".0f"),
                c.wall.fmt(".0f"),
                c.cpu.fmt(".0f"),
            ]
        )
    report.summary.append(_ratio_row(name, "open time", stats["ours"].median, stats["deltalake"].median))
    report.summary.append(_ratio_row(name, "peak memory", children["ours"].peak.median, peer.peak.median))


def run_json(tables: Tables, repeat: tuple[int, int], report: Report) -> None:
    n = tables.sizes.json_files
    for commits in (1, tables.sizes.json_commits):
        path = tables.json_table(commits)
        label = f"{n:,} files in {commits_text(commits)}"
        _run_with_memory(label, f"json {commits}x{n // commits}", path, tables, (commits, n), repeat, report)


def run_big_checkpoint(tables: Tables, repeat: tuple[int, int], report: Report) -> None:
    n, commits = tables.sizes.cp_files, tables.sizes.cp_commits

    def build(path: str) -> str:
        _tables.write_adds_table(path, [n // commits] * commits)
        return f"{commits} JSON commits of {n // commits:,} adds; " + checkpoint_last(path, commits)

    path = tables.get(f"checkpoint-{n}", build)
    cps = _tables.log_files(path, "*.checkpoint*.parquet")
    report.notes.append(
        f"checkpoint-{n}: {', '.join(p.name for p in cps)} "
        f"({sum(p.stat().st_size for p in cps) / 2**20:.0f} MiB)"
    )
    _run_with_memory(
        f"{n:,} files from a checkpoint", f"checkpoint {n}", path, tables, (commits, n), repeat, report
    )


def run_flat(tables: Tables, repeat: int, report: Report) -> list[list[object]]:
    base = tables.sizes.flat_base_files
    calls: dict[str, Callable[[], object]] = {}
    for commits in tables.sizes.flat:

        def build(path: str, commits: int = commits) -> str:
            last = _tables.write_replace_chain(path, commits, base)
            return f"replace chain, {base + 1} live files; " + checkpoint_last(path, last)

        path = tables.get(f"flat-{commits}", build)
        if not _tables.log_files(path, "_last_checkpoint"):
            raise CheckFailed(f"{path}: no _last_checkpoint")
        require_same(path, commits - 1, base + 1)
        for e in ENGINES:
            calls[f"{e} {commits}"] = functools.partial(OPENERS[e], path)
    # All tables and both engines in one interleaved series: the machine's noise hits each alike.
    timed = time_calls(calls, FLAT_ROUNDS * repeat)
    stats = {c: {e: timed[f"{e} {c}"] for e in ENGINES} for c in tables.sizes.flat}
    rows: list[list[object]] = []
    low, high = min(stats), max(stats)
    for commits, s in stats.items():
        rows.append(
            [
                f"{commits:,}",
                s["ours"].fmt(".1f"),
                s["deltalake"].fmt(".1f"),
                f"{ratio(s['ours'].median, s['deltalake'].median):.2f}x",
                f"{ratio(s['ours'].median, stats[low]['ours'].median):.2f}x",
                f"{ratio(s['deltalake'].median, stats[low]['deltalake'].median):.2f}x",
            ]
        )
    flat = ratio(stats[high]["ours"].median, stats[low]["ours"].median)
    report.summary.append(
        [
            "flat",
            f"ours open time, {high:,} / {low:,} commits",
            f"<= {TARGET_FLAT}x",
            f"{flat:.2f}x",
            verdict(flat <= TARGET_FLAT),
        ]
    )
    return rows


def plan_filter(n: int) -> tuple[str, int]:
    """The plan's predicate over ``n`` files, and how many files may match it."""
    first, count = n // 3, n // 30  # files [first, first + count) hold the id range
    lo, hi = first * _tables.ROWS_PER_FILE, (first + count) * _tables.ROWS_PER_FILE
    parts = ", ".join(f"'{p}'" for p in PLAN_PARTS)
    expected = sum(1 for i in range(first, first + count) if _tables.part_value(i) in PLAN_PARTS)
    return f"part IN ({parts}) AND id >= {lo} AND id < {hi}", expected


def run_plan(tables: Tables, repeat: int, report: Report) -> list[list[object]]:
    from deltalake import DeltaTable

    from eventlog.table import Table

    n = tables.sizes.json_files
    path = tables.json_table(tables.sizes.json_commits)
    predicate, expected = plan_filter(n)
    print(f"  plan: files(filter={predicate!r}) over {n:,} files; {expected} may match", flush=True)

    def ours_plan(t: Table) -> list[str]:
        return t.files(filter=predicate)

    def dl_plan(dt: DeltaTable) -> list[str]:
        return list(dt.file_uris(file_pruning_predicate=predicate))

    has_filter = "filter" in inspect.signature(Table.files).parameters
    planners: dict[str, tuple[Callable[[str], Any], Callable[[Any], list[str]]]] = {
        "deltalake": (DeltaTable, dl_plan)
    }
    if has_filter:
        planners["ours"] = (Table.open, ours_plan)
    else:
        report.notes.append("plan: Table.files has no filter= keyword yet (being added): ours not measured")
    for engine, (opener, plan) in planners.items():  # check, and warm up
        got = plan(opener(path))
        if len(got) != expected:
            msg = f"plan: {engine} selected {len(got)} files, {expected} expected"
            if engine == "ours":
                raise CheckFailed(msg)
            report.notes.append(msg)
    first: dict[str, list[float]] = {e: [] for e in planners}
    again: dict[str, list[float]] = {e: [] for e in planners}
    for rep in range(repeat):
        for engine in rotated(list(planners), rep):
            opener, plan = planners[engine]
            handle = opener(path)  # not timed: the table is open
            for out in (first, again):
                gc.collect()
                start = time.perf_counter()
                result = plan(handle)
                out[engine].append(1000 * (time.perf_counter() - start))
                del result
            del handle
    rows: list[list[object]] = []
    what = {"ours": "t.files(filter=...)", "deltalake": "dt.file_uris(file_pruning_predicate=...)"}
    for engine in ENGINES:
        if engine in planners:
            rows.append(
                [engine, what[engine], Stat.of(first[engine]).fmt(".1f"), Stat.of(again[engine]).fmt(".1f")]
            )
        else:
            rows.append([engine, "t.files(filter=...): not available yet", "n/a", "n/a"])
    if has_filter:
        ms = Stat.of(first["ours"]).median
        report.summary.append(
            [
                "plan",
                f"files(filter=) over {n:,} files, first call",
                f"<= {TARGET_PLAN_MS:.0f} ms",
                f"{ms:.1f} ms",
                verdict(ms <= TARGET_PLAN_MS),
            ]
        )
    else:
        report.summary.append(
            ["plan", f"files(filter=) over {n:,} files", f"<= {TARGET_PLAN_MS:.0f} ms", "n/a", "NOT RUN"]
        )
    return rows
