"""``Table.changes`` across schema changes, as Delta's batch change data feed read
(``CDCReader.changesToDF``, schema mode ``endVersion``): rows come in the end version's
schema, and a range over a change that schema cannot read (a rename or drop under column
mapping) is refused with :class:`ChangeDataSchemaChangeError`; a range that ends before the
change or starts at it reads fine, and so does one over an added column."""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow as pa
import pytest

import eventlog
import eventlog.errors
from eventlog import ChangeDataNotRecordedError, ChangeDataSchemaChangeError, Table
from eventlog.errors import InvalidInputError

CDF = {"delta.enableChangeDataFeed": "true"}
MAPPED = {**CDF, "delta.columnMapping.mode": "name"}


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = table.drop_columns(["_commit_timestamp"]).to_pylist()
    return rows


def _mapped(uri: str) -> Table:
    """Version 0: ids 1, 2 with ``v``; version 1: id 3 appended."""
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"]})
    table = Table.create(uri, data=data, properties=MAPPED)
    table.append(pa.table({"id": pa.array([3], pa.int64()), "v": ["c"]}))
    return table


def test_a_range_over_a_rename_is_refused_and_either_side_reads(local_uri: str) -> None:
    table = _mapped(local_uri)
    table.rename_column("v", "w")  # version 2
    table.append(pa.table({"id": pa.array([4], pa.int64()), "w": ["d"]}))  # version 3
    with pytest.raises(ChangeDataSchemaChangeError) as err:
        table.changes(0)
    e = err.value
    assert (e.start, e.end, e.version, e.read_version) == (0, 3, 2, 3)
    assert e.reason == "data schema"  # the only change in the range is the end's schema
    assert e.delta_error_class == "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA"
    assert "from version 0 to 1, and from version 2 to 3" in str(e)
    with pytest.raises(ChangeDataSchemaChangeError) as err:
        table.changes(1, 2)
    assert (err.value.start, err.value.end, err.value.version) == (1, 2, 2)
    assert _rows(table.changes(0, 1)) == [
        {"id": 1, "v": "a", "_change_type": "insert", "_commit_version": 0},
        {"id": 2, "v": "b", "_change_type": "insert", "_commit_version": 0},
        {"id": 3, "v": "c", "_change_type": "insert", "_commit_version": 1},
    ]
    assert _rows(table.changes(2)) == [{"id": 4, "w": "d", "_change_type": "insert", "_commit_version": 3}]


def test_an_incompatible_schema_committed_within_the_range(local_uri: str) -> None:
    table = _mapped(local_uri)
    table.set_properties({"delta.logRetentionDuration": "interval 60 days"})  # 2: still ``v``
    table.rename_column("v", "w")  # 3
    table.add_columns([pa.field("x", pa.int64())])  # 4: read schema (w, x)
    with pytest.raises(ChangeDataSchemaChangeError) as err:
        table.changes(0)
    e = err.value
    # Delta meets version 2's schema first; the change to split the read at is the rename.
    assert (e.start, e.end, e.version, e.read_version, e.reason) == (0, 4, 3, 4, "schema change")
    assert e.delta_error_class == "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE"
    assert str(e).startswith("[DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE]")
    rows = table.changes(3)  # the rename at the start, then an added column: fine
    assert rows.column_names[:3] == ["id", "w", "x"]
    assert rows.num_rows == 0


def test_a_dropped_column_is_refused(local_uri: str) -> None:
    table = _mapped(local_uri)
    table.drop_columns(["v"])  # 2
    table.append(pa.table({"id": pa.array([4], pa.int64())}))  # 3
    with pytest.raises(ChangeDataSchemaChangeError) as err:
        table.changes(1)
    assert (err.value.start, err.value.end, err.value.version, err.value.reason) == (1, 3, 2, "data schema")
    assert _rows(table.changes(2)) == [{"id": 4, "_change_type": "insert", "_commit_version": 3}]


def test_an_added_column_reads_across(local_uri: str) -> None:
    for uri, props in ((f"{local_uri}/plain", CDF), (f"{local_uri}/mapped", MAPPED)):
        table = Table.create(uri, data=pa.table({"id": pa.array([1], pa.int64())}), properties=props)
        table.add_columns([pa.field("x", pa.string())])
        table.append(pa.table({"id": pa.array([2], pa.int64()), "x": ["b"]}))
        assert _rows(table.changes(0)) == [
            {"id": 1, "x": None, "_change_type": "insert", "_commit_version": 0},
            {"id": 2, "x": "b", "_change_type": "insert", "_commit_version": 2},
        ]


def test_the_schema_error_comes_before_a_later_feed_off(local_uri: str) -> None:
    table = _mapped(local_uri)
    table.rename_column("v", "w")  # 2
    table.set_properties({"delta.enableChangeDataFeed": "false"})  # 3: schema (w), feed off
    table.rename_column("w", "z")  # 4
    # Delta's loop meets version 2 (a schema the end's cannot read) before the feed is off at 3.
    with pytest.raises(ChangeDataSchemaChangeError) as err:
        table.changes(1)
    assert (err.value.version, err.value.reason) == (4, "schema change")
    with pytest.raises(ChangeDataNotRecordedError) as off:
        table.changes(1, 3)  # read schema (w): versions 2 and 3 read as it; 3 has no change data
    assert off.value.version == 3


def test_the_error_is_typed_exported_and_pickles(local_uri: str) -> None:
    assert eventlog.ChangeDataSchemaChangeError is ChangeDataSchemaChangeError
    assert eventlog.errors.ChangeDataSchemaChangeError is ChangeDataSchemaChangeError
    assert issubclass(ChangeDataSchemaChangeError, InvalidInputError)
    table = _mapped(local_uri)
    table.rename_column("v", "w")
    with pytest.raises(ChangeDataSchemaChangeError) as err:
        table.changes(0)
    copy = pickle.loads(pickle.dumps(err.value))
    assert (copy.start, copy.end, copy.version, copy.read_version, copy.reason) == (0, 2, 2, 2, "data schema")
