"""OPTIMIZE's bin planning on columns: the same bins, in the same order, as the per-file
planner (files in path order, grouped by partition, small files packed by size)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import expr as ex
from eventlog.log.actions import AddFile
from eventlog.log.filetable import adds_table
from eventlog.ops import optimize
from eventlog.ops.optimize import bin_rows, plan_bins
from eventlog.table import Table
from eventlog.txn.plan import PlanBuilder

TARGET = 100


def _reference_bins(files: Sequence[AddFile], target: int, rewrite_all: bool) -> list[list[str]]:
    """The per-file planner: group path-sorted files by their partition values, then pack."""
    groups: dict[tuple[tuple[str, str | None], ...], list[AddFile]] = {}
    for f in sorted(files, key=lambda f: f.path):
        groups.setdefault(tuple(sorted(f.partition_values.items())), []).append(f)
    out = []
    for group in groups.values():
        small = sorted((f for f in group if f.size < target), key=lambda f: f.size)
        if rewrite_all:
            bins = [list(group)]
        else:
            bins, current, size = [], [], 0
            for f in small:
                if current and size + f.size > target:
                    bins.append(current)
                    current, size = [], 0
                current.append(f)
                size += f.size
            if current:
                bins.append(current)
            bins = [b for b in bins if len(b) > 1]
        out += [[f.path for f in b] for b in bins]
    return out


_file = st.tuples(
    st.sampled_from(["a", "b", "", None]),
    st.sampled_from(["1", "2"]),
    st.integers(min_value=0, max_value=2 * TARGET),
)


@settings(max_examples=200, deadline=None)
@given(specs=st.lists(_file, max_size=40), rewrite_all=st.booleans(), shuffle=st.randoms())
def test_bins_match_the_per_file_planner(
    specs: list[tuple[str | None, str, int]], rewrite_all: bool, shuffle: object
) -> None:
    files = [
        AddFile(f"p{i * 7919 % 101:03d}-{i}", {"region": region, "day": day}, size, 1)
        for i, (region, day, size) in enumerate(specs)
    ]
    shuffle.shuffle(files)  # type: ignore[attr-defined]
    table = adds_table(files)
    got = [
        table.column("path").take(pa.array(rows)).to_pylist()
        for rows in bin_rows(table, ["region", "day"], TARGET, rewrite_all=rewrite_all)
    ]
    assert got == _reference_bins(files, TARGET, rewrite_all)


def test_plan_bins_over_values_is_unchanged() -> None:
    files = [AddFile(f"f{i}", {}, size, 1) for i, size in enumerate([45, 10, 30, 50, 200, 40, 10])]
    assert [[f.path for f in b] for b in plan_bins(files, TARGET, rewrite_all=False)] == [
        ["f1", "f6", "f2", "f5"],
        ["f0", "f3"],
    ]
    assert plan_bins(files[:1], TARGET, rewrite_all=True) == [files[:1]]
    assert plan_bins([], TARGET, rewrite_all=True) == []


def test_optimize_records_every_file_it_read(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("date", pa.string())])
    t = Table.create(str(tmp_path / "t"), schema, partition_by=["date"])
    for i in range(3):
        t.append(pa.table({"id": [i, i + 10], "date": ["2024-01-01", "2024-01-02"]}, schema=schema))
    snap = t.refresh()
    plan = optimize.optimize(PlanBuilder(t, snap), partition_filter="date = '2024-01-02'")
    read = {p for p, v in plan.read_files.items() if v == {"date": "2024-01-02"}}
    assert read == set(plan.read_files) and len(read) == 3
    assert {r.path for r in plan.removes} == read
    assert plan.metrics["numRemovedFiles"] == "3" and plan.metrics["numAddedFiles"] == "1"
    assert [ex.to_sql(p) for p in plan.partition_predicates] == ["date = '2024-01-02'"]
    assert plan.predicates == plan.partition_predicates
    assert t.version == 3  # nothing committed
