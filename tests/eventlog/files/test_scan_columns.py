"""DML reads only what it needs: the predicate's columns, of the row groups that can match.

A DELETE, UPDATE or MERGE first finds the rows it changes by reading only the columns its
predicate (or join) needs, of only the row groups whose Parquet statistics do not rule the
predicate out; full rows are read afterwards only where needed (the matched rows of an
UPDATE or MERGE on a deletion-vector table, every row of a file that is rewritten). Row
positions stay physical, as deletion vectors need.

The observable used here: the Parquet column chunks a statement must not need are
overwritten with garbage for the duration of the statement (so that decoding any of them
fails), then restored before the table is checked. The statement succeeds and gives the
right table only if it never decoded them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventlog import Table
from eventlog import expr as ex
from eventlog.files import datafiles
from eventlog.files.deletion_vectors import read_deletion_vector
from eventlog.files.reader import DataFileReader
from eventlog.log.actions import AddFile
from tests.conftest import SCHEMA, rows, sorted_ids

DV = {"delta.enableDeletionVectors": "true"}
GROUP_ROWS = 100  # rows per row group in the tables below
N = 1000  # ids 0..999 in one file of 10 row groups, in order: id i is physical row i


@pytest.fixture
def small_row_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our writer cuts row groups of about GROUP_ROWS rows of the standard schema."""
    row_bytes = rows(list(range(N))).nbytes // N
    monkeypatch.setattr(datafiles, "_MAX_ROW_GROUP_BYTES", GROUP_ROWS * row_bytes)


def _table(uri: str, properties: dict[str, str] | None = None, ids: range = range(N)) -> Table:
    t = Table.create(uri, SCHEMA, properties=properties)
    t.append(rows(list(ids)))
    return t


def _only_file(t: Table) -> Path:
    (path,) = t.files()
    return Path(t.uri) / path


def _group_of(path: Path, row: int) -> int:
    md = pq.ParquetFile(path).metadata
    start = 0
    for g in range(md.num_row_groups):
        start += md.row_group(g).num_rows
        if row < start:
            return g
    raise AssertionError(f"row {row} is beyond the file")


@contextlib.contextmanager
def garbled(path: Path, needed: Callable[[int, str], bool]) -> Iterator[None]:
    """Within the block, every column chunk (row group, column) of the Parquet file that
    ``needed`` rejects is garbage; the file's size and footer are unchanged."""
    original = path.read_bytes()
    md = pq.ParquetFile(path).metadata
    assert md.num_row_groups > 1
    data = bytearray(original)
    for g in range(md.num_row_groups):
        for j in range(md.num_columns):
            chunk = md.row_group(g).column(j)
            if needed(g, chunk.path_in_schema):
                continue
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                start = min(start, chunk.dictionary_page_offset)
            data[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(data))
    try:
        with pytest.raises(Exception):  # noqa: B017 -- whatever Arrow raises: the garbage is real
            pq.read_table(path)
        yield
    finally:
        path.write_bytes(original)


def _dv_rows(t: Table) -> dict[str, list[int]]:
    """Physical rows deleted by each live file's deletion vector."""
    return {
        a.path: sorted(read_deletion_vector(t.log.fs, t.log.root, a.deletion_vector))
        for a in t.snapshot().add_files
        if a.deletion_vector is not None
    }


def _by_id(t: Table) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in t.to_arrow().to_pylist()}


# --------------------------------------------------------------------------- DELETE


def test_dv_delete_reads_only_the_predicate_column_of_the_matching_row_group(
    local_uri: str, small_row_groups: None
) -> None:
    t = _table(local_uri, DV)
    path = _only_file(t)
    assert pq.ParquetFile(path).metadata.num_row_groups == N // GROUP_ROWS
    group = _group_of(path, 537)
    with garbled(path, lambda g, col: g == group and col == "id"):
        res = t.delete("id = 537")
    assert res.version == 2
    assert res.metrics["numDeletedRows"] == "1"
    assert sorted_ids(t) == [i for i in range(N) if i != 537]
    assert list(_dv_rows(t).values()) == [[537]]  # the physical position in the whole file


def test_dv_delete_with_an_existing_deletion_vector_keeps_positions_physical(
    local_uri: str, small_row_groups: None
) -> None:
    t = _table(local_uri, DV)
    t.delete("id IN (5, 250, 251, 999)")  # rows in row groups 0, 2 and 9
    # Every row of row group 3 deleted: that group is never read again.
    t.delete("id >= 300 AND id < 400")
    path = _only_file(t)
    # x is the id: rows 250..259 of group 2, minus the deleted 250 and 251.
    with garbled(path, lambda g, col: g == 2 and col == "x"):
        res = t.delete("x >= 250 AND x < 260")
    assert res.metrics["numDeletedRows"] == "8"  # 250 and 251 were already deleted
    gone = {5, 999, *range(250, 260), *range(300, 400)}
    assert sorted_ids(t) == [i for i in range(N) if i not in gone]
    assert list(_dv_rows(t).values()) == [sorted(gone)]


def test_delete_on_a_column_without_useful_statistics_reads_that_column_only(
    local_uri: str, small_row_groups: None
) -> None:
    t = _table(local_uri, DV)
    path = _only_file(t)
    with garbled(path, lambda g, col: col == "id"):
        res = t.delete("id % 100 = 7")  # the statistics rule out no row group
    assert res.metrics["numDeletedRows"] == "10"
    assert sorted_ids(t) == [i for i in range(N) if i % 100 != 7]
    assert list(_dv_rows(t).values()) == [list(range(7, N, 100))]


def test_rewrite_delete_reads_files_without_matches_only_for_the_predicate(
    local_uri: str, small_row_groups: None
) -> None:
    # Without deletion vectors a file with matches is rewritten (read whole); the other
    # file, whose statistics cannot exclude the predicate, is only read for its column.
    t = Table.create(local_uri, SCHEMA)
    t.append(rows(list(range(0, N, 2))))  # even ids
    t.append(rows(list(range(1, N, 2))))  # odd ids
    odd = next(Path(t.uri) / p for p in t.files() if 1 in _file_ids(Path(t.uri) / p))
    with garbled(odd, lambda g, col: col == "id"):
        res = t.delete("id % 4 = 2")
    assert res.metrics["numDeletedRows"] == str(N // 4)
    assert res.metrics["numRemovedFiles"] == "1"
    assert str(odd.relative_to(t.uri)) in t.files()
    assert sorted_ids(t) == [i for i in range(N) if i % 4 != 2]


def _file_ids(path: Path) -> set[int]:
    return set(pq.read_table(path, columns=["id"])["id"].to_pylist())


@pytest.mark.parametrize("dv", [True, False], ids=["dv", "rewrite"])
def test_delete_on_a_partitioned_table_mixes_partition_and_data_columns(
    any_uri: str, small_row_groups: None, dv: bool
) -> None:
    t = Table.create(any_uri, SCHEMA, partition_by=["date"], properties=DV if dv else None)
    t.append(rows(list(range(N)), date="2024-01-01"))
    t.append(rows(list(range(N, 2 * N)), date="2024-01-02"))
    t.delete("id % 10 = 0")
    res = t.delete("date = '2024-01-02' OR id < 20")  # the conjunct needs the partition column
    gone = {*range(0, 2 * N, 10), *range(20), *range(N, 2 * N)}
    assert res.metrics["numDeletedRows"] == str(len(gone) - len(range(0, 2 * N, 10)))
    got = t.to_arrow()
    assert sorted(got["id"].to_pylist()) == [i for i in range(2 * N) if i not in gone]
    assert set(got["date"].to_pylist()) == {"2024-01-01"}


@pytest.mark.parametrize("dv", [True, False], ids=["dv", "rewrite"])
def test_predicate_on_a_column_older_files_lack(any_uri: str, small_row_groups: None, dv: bool) -> None:
    t = _table(any_uri, DV if dv else None)
    t.add_columns([pa.field("z", pa.int64())])
    new = rows(list(range(N, N + 10))).append_column("z", pa.array(range(10), pa.int64()))
    t.append(new)
    t.delete("z = 3")  # the old file holds only nulls: every row group excluded
    assert sorted_ids(t) == [i for i in range(N + 10) if i != N + 3]
    t.delete("z IS NULL")
    assert sorted_ids(t) == [i for i in range(N, N + 10) if i != N + 3]


# --------------------------------------------------------------------------- UPDATE


def test_dv_update_reads_full_rows_of_the_matching_row_group_only(
    local_uri: str, small_row_groups: None
) -> None:
    t = _table(local_uri, DV)
    t.delete("id = 431")  # an existing DV inside the group the update reads
    path = _only_file(t)
    group = _group_of(path, 437)
    before = _by_id(t)
    with garbled(path, lambda g, col: g == group):
        res = t.update("id >= 430 AND id < 440", set={"x": "x * 1000", "date": "'2030-01-01'"})
    assert res.metrics["numUpdatedRows"] == "9"
    after = _by_id(t)
    assert set(after) == set(before)
    for i, row in after.items():
        if 430 <= i < 440:
            assert row == {"id": i, "date": "2030-01-01", "x": i * 1000, "y": float(i)}
        else:
            assert row == before[i]
    assert list(_dv_rows(t).values()) == [list(range(430, 440))]  # 431 was deleted before


def test_update_without_deletion_vectors_rewrites_whole_rows(any_uri: str, small_row_groups: None) -> None:
    t = _table(any_uri)
    t.delete("id = 3")
    t.update("id % 250 = 1", set={"y": "y + 0.5"})
    got = _by_id(t)
    assert sorted(got) == [i for i in range(N) if i != 3]
    for i, row in got.items():
        assert row == {"id": i, "date": "2024-01-01", "x": i, "y": i + (0.5 if i % 250 == 1 else 0.0)}


# --------------------------------------------------------------------------- MERGE


def test_dv_merge_reads_the_key_then_full_rows_of_matched_row_groups(
    local_uri: str, small_row_groups: None
) -> None:
    t = _table(local_uri, DV)
    path = _only_file(t)
    source = rows([612, 5000], x=-1)
    group = _group_of(path, 612)
    with garbled(path, lambda g, col: col == "id" or g == group):
        res = (
            t.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update(set={"x": "s.x"})
            .when_not_matched_insert_all()
            .execute()
        )
    assert (res.metrics["numTargetRowsUpdated"], res.metrics["numTargetRowsInserted"]) == ("1", "1")
    got = _by_id(t)
    assert sorted(got) == [*range(N), 5000]
    assert got[612] == {"id": 612, "date": "2024-01-01", "x": -1, "y": 612.0}
    assert got[5000]["x"] == -1
    assert all(got[i]["x"] == i for i in range(N) if i != 612)
    assert list(_dv_rows(t).values()) == [[612]]


def test_dv_merge_delete_with_a_target_predicate_skips_row_groups(
    local_uri: str, small_row_groups: None
) -> None:
    t = _table(local_uri, DV)
    t.delete("id = 901")
    path = _only_file(t)
    source = rows([5, 901, 902, 950])
    # The target-only conjunct excludes row groups 0..8 by their statistics.
    with garbled(path, lambda g, col: g == 9 and col == "id"):
        res = (
            t.merge(source, "t.id = s.id AND t.id >= 900", source_alias="s", target_alias="t")
            .when_matched_delete()
            .execute()
        )
    assert res.metrics["numTargetRowsDeleted"] == "2"  # 901 was already deleted; 5 is excluded
    assert sorted_ids(t) == [i for i in range(N) if i not in (901, 902, 950)]
    assert list(_dv_rows(t).values()) == [[901, 902, 950]]


@pytest.mark.parametrize("dv", [True, False], ids=["dv", "rewrite"])
def test_merge_update_and_delete_clauses_on_several_row_groups(
    any_uri: str, small_row_groups: None, dv: bool
) -> None:
    t = _table(any_uri, DV if dv else None)
    t.delete("id = 150")
    source = pa.table(
        {
            "id": pa.array([10, 150, 420, 421, 999, 2000], pa.int64()),
            "x": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        }
    )
    (
        t.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_delete("s.x = 4")
        .when_matched_update(set={"y": "t.y + s.x", "date": "'2030-01-01'"})
        .when_not_matched_insert(values={"id": "s.id", "x": "s.x"})
        .execute()
    )
    got = _by_id(t)
    assert sorted(got) == [*(i for i in range(N) if i != 421), 2000]
    assert got[150] == {"id": 150, "date": None, "x": 2, "y": None}  # deleted before: inserted
    assert got[2000] == {"id": 2000, "date": None, "x": 6, "y": None}
    for i, add in ((10, 1), (420, 3), (999, 5)):
        assert got[i] == {"id": i, "date": "2030-01-01", "x": i, "y": float(i + add)}
    assert all(got[i] == {"id": i, "date": "2024-01-01", "x": i, "y": float(i)} for i in (0, 11, 419, 998))


# --------------------------------------------------------------------------- row-group statistics


def test_row_group_statistics_in_the_skipping_layout(tmp_path: Path) -> None:
    schema = pa.schema(
        [
            ("i", pa.int64()),
            ("f", pa.float64()),
            ("s", pa.string()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("st", pa.struct([("a", pa.int64())])),
            ("p", pa.string()),
            ("later", pa.int32()),
        ]
    )
    day = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    data = pa.table(
        {
            "i": pa.array([1, 2, None, 4], pa.int64()),
            "f": pa.array([0.5, float("nan"), -1.0, 2.0]),
            "s": ["b", "a", "d", "c"],
            "ts": pa.array([day, day, day + dt.timedelta(days=1), None], pa.timestamp("us", tz="UTC")),
            "st": [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}],
        }
    )
    pq.write_table(data, tmp_path / "f.parquet", row_group_size=2)
    add = AddFile("f.parquet", {"p": "x"}, 0, 0, True, None)
    reader = DataFileReader(fsspec.filesystem("file"), str(tmp_path), add, schema, ["p"])
    assert reader.row_group_starts == [0, 2, 4]
    stats = reader.row_group_stats(["i", "f", "s", "ts", "st", "p", "later", "st.a"]).to_pydict()
    assert stats == {
        "numRecords": [2, 2],
        "nullCount.i": [0, 1],
        "min.i": [1, 4],
        "max.i": [2, 4],
        "nullCount.f": [0, 0],
        "min.f": [0.5, -1.0],  # no max: NaN is left out of Parquet's, and sorts above numbers
        "nullCount.s": [0, 0],
        "min.s": ["a", "c"],
        "max.s": ["b", "d"],
        "nullCount.ts": [0, 1],
        "min.ts": [day, day + dt.timedelta(days=1)],
        "max.ts": [day, day + dt.timedelta(days=1)],
        "nullCount.later": [2, 2],  # absent from the file: all null
        "min.later": [None, None],
        "max.later": [None, None],
    }
    table = pa.table(stats)
    assert ex.may_match(ex.parse_predicate("i = 4", schema), table) == [False, True]
    assert ex.may_match(ex.parse_predicate("f > 100", schema), table) == [True, True]
    assert ex.may_match(ex.parse_predicate("later = 1", schema), table) == [False, False]
    assert ex.may_match(ex.parse_predicate("later IS NOT NULL", schema), table) == [False, False]
    assert ex.may_match(ex.parse_predicate("s < 'b'", schema), table) == [True, False]
    assert reader.read(["i", "p"], [1]).to_pydict() == {"i": [None, 4], "p": ["x", "x"]}


def test_read_of_row_groups_on_a_memory_filesystem(memory_uri: str, small_row_groups: None) -> None:
    t = _table(memory_uri, DV)
    add = t.snapshot().add_files[0]
    reader = DataFileReader(t.log.fs, t.log.root, add, SCHEMA, [])
    assert reader.num_row_groups == N // GROUP_ROWS
    got = reader.read(["x"], [1, 3])
    assert got["x"].to_pylist() == [*range(100, 200), *range(300, 400)]
    t.delete("id = 345")
    t.update("id = 346", set={"x": "0"})
    assert _by_id(t)[346]["x"] == 0
    assert sorted_ids(t) == [i for i in range(N) if i != 345]
    assert list(_dv_rows(t).values()) == [[345, 346]]
