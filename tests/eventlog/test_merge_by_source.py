"""MERGE ... WHEN NOT MATCHED BY SOURCE: target rows no source row matches, updated or
deleted, compared with deltalake's merge on the same data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pytest

from eventlog import ConcurrentAppendException, ConcurrentDeleteReadException, Table
from eventlog.errors import InvalidInputError

TARGET = pa.table(
    {"id": [1, 2, 3, 4, 5, 6], "v": [10, 20, 30, 40, 50, 60], "p": ["a", "a", "b", "b", "b", "c"]}
)
SOURCE = pa.table({"id": [2, 3, 9], "v": [0, 0, 90], "p": ["a", "b", "b"]})

CASES: list[tuple[str, list[tuple[str, Any, Any]]]] = [
    ("delete all unmatched", [("by_source_delete", None, None)]),
    (
        "conditional delete then update",
        [("by_source_delete", "target.v > 40", None), ("by_source_update", None, {"v": "target.v + 1"})],
    ),
    ("update only some", [("by_source_update", "target.p = 'a'", {"v": "-1", "p": "'z'"})]),
    (
        "with matched and inserts",
        [
            ("matched_update", None, {"v": "source.v"}),
            ("insert_all", None, None),
            ("by_source_delete", "target.p = 'c'", None),
        ],
    ),
]


def _ours(builder: Any, clauses: list[tuple[str, Any, Any]]) -> Any:
    for kind, cond, values in clauses:
        if kind == "by_source_delete":
            builder = builder.when_not_matched_by_source_delete(cond)
        elif kind == "by_source_update":
            builder = builder.when_not_matched_by_source_update(cond, values)
        elif kind == "matched_update":
            builder = builder.when_matched_update(cond, values)
        else:
            builder = builder.when_not_matched_insert_all(cond)
    return builder


def _theirs(builder: Any, clauses: list[tuple[str, Any, Any]]) -> Any:
    for kind, cond, values in clauses:
        if kind == "by_source_delete":
            builder = builder.when_not_matched_by_source_delete(cond)
        elif kind == "by_source_update":
            builder = builder.when_not_matched_by_source_update(values, cond)
        elif kind == "matched_update":
            builder = builder.when_matched_update(values, cond)
        else:
            builder = builder.when_not_matched_insert_all(predicate=cond)
    return builder


def _sorted(t: pa.Table) -> list[dict[str, Any]]:
    return sorted(t.select(["id", "v", "p"]).to_pylist(), key=lambda r: (r["id"], r["v"]))


@pytest.mark.parametrize("on", ["target.id = source.id", "target.id = source.id AND target.p = 'b'"])
@pytest.mark.parametrize("dv", [False, True])
@pytest.mark.parametrize(("name", "clauses"), CASES, ids=[c[0] for c in CASES])
def test_matches_deltalake(
    tmp_path: Path, name: str, clauses: list[tuple[str, Any, Any]], dv: bool, on: str
) -> None:
    ours = Table.create(
        str(tmp_path / "ours"), data=TARGET, partition_by=["p"],
        properties={"delta.enableDeletionVectors": str(dv).lower()},
    )  # fmt: skip
    result = _ours(ours.merge(SOURCE, on), clauses).execute()
    deltalake.write_deltalake(str(tmp_path / "theirs"), TARGET, partition_by=["p"])
    theirs = deltalake.DeltaTable(str(tmp_path / "theirs"))
    stats = _theirs(theirs.merge(SOURCE, on, source_alias="source", target_alias="target"), clauses).execute()
    assert _sorted(ours.to_arrow()) == _sorted(
        deltalake.DeltaTable(str(tmp_path / "theirs")).to_pyarrow_table()
    )
    m = {k: int(v) for k, v in result.metrics.items()}
    totals = (m["numTargetRowsUpdated"], m["numTargetRowsDeleted"], m["numTargetRowsInserted"])
    expected = (
        stats["num_target_rows_updated"],
        stats["num_target_rows_deleted"],
        stats["num_target_rows_inserted"],
    )
    assert totals == expected
    by_source = (m["numTargetRowsNotMatchedBySourceUpdated"], m["numTargetRowsNotMatchedBySourceDeleted"])
    if not any(kind == "matched_update" for kind, _, _ in clauses):
        assert by_source == totals[:2]  # every change was a BY SOURCE clause's
    params = ours.history(1)[0]["operationParameters"]
    assert "notMatchedBySourcePredicates" in params
    assert Table.open(ours.uri).verify().ok


@pytest.mark.parametrize("by_source", [False, True])
def test_reads_the_whole_target_so_a_change_anywhere_conflicts(tmp_path: Path, by_source: bool) -> None:
    """ON's ``target.p = 'b'`` limits what a MERGE reads, unless it has BY SOURCE clauses:
    then every target row may be unmatched, and a concurrent delete in partition c fails it."""
    t = Table.create(str(tmp_path / "t"), data=TARGET, partition_by=["p"])
    txn = t.transaction()
    merge = txn.merge(SOURCE, "target.id = source.id AND target.p = 'b'").when_matched_delete()
    if by_source:
        merge = merge.when_not_matched_by_source_delete("target.p = 'b'")
    merge.execute()
    Table.open(t.uri).delete("p = 'c' AND id = 6")
    if not by_source:
        assert txn.commit().version == 2
        return
    with pytest.raises(ConcurrentDeleteReadException):
        txn.commit()
    assert t.version == 1


def test_serializable_fails_on_an_append_anywhere(tmp_path: Path) -> None:
    t = Table.create(
        str(tmp_path / "t"),
        data=TARGET,
        partition_by=["p"],
        properties={"delta.isolationLevel": "Serializable"},
    )
    txn = t.transaction()
    txn.merge(SOURCE, "target.id = source.id AND target.p = 'b'").when_not_matched_by_source_delete(
        "target.p = 'b'"
    ).execute()
    Table.open(t.uri).append(pa.table({"id": [7], "v": [70], "p": ["c"]}))  # another partition
    with pytest.raises(ConcurrentAppendException):
        txn.commit()


def test_clauses_may_not_read_the_source(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), data=TARGET)
    version = t.version
    with pytest.raises(InvalidInputError, match="only read target columns"):
        t.merge(SOURCE, "target.id = source.id").when_not_matched_by_source_update(None, {"v": "source.v"})
    with pytest.raises(InvalidInputError, match="only read target columns"):
        t.merge(SOURCE, "target.id = source.id").when_not_matched_by_source_delete("source.v > 1")
    assert t.version == version


def test_refused_on_append_only_tables(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), data=TARGET, properties={"delta.appendOnly": "true"})
    with pytest.raises(InvalidInputError, match="append"):
        t.merge(SOURCE, "target.id = source.id").when_not_matched_by_source_delete().execute()
    assert t.to_arrow().num_rows == TARGET.num_rows


def test_row_tracking_keeps_ids_of_rows_updated_by_source_clauses(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), data=TARGET, properties={"delta.enableRowTracking": "true"})
    before = dict(zip(*t.to_arrow(row_ids=True).select(["id", "_row_id"]).to_pydict().values(), strict=True))
    t.merge(SOURCE, "target.id = source.id").when_not_matched_by_source_update(None, {"v": "0"}).execute()
    after = t.to_arrow(row_ids=True)
    got = dict(zip(after.column("id").to_pylist(), after.column("_row_id").to_pylist(), strict=True))
    assert got == before
    versions = dict(
        zip(after.column("id").to_pylist(), after.column("_row_commit_version").to_pylist(), strict=True)
    )
    assert {k for k, v in versions.items() if v == t.version} == {1, 4, 5, 6}
