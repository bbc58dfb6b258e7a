"""Type widening (``Table.change_column_type``): the changes Delta allows, recorded in
``delta.typeChanges``; older files read as the wider type; every other change refused with a
``TypeChangeError`` that leaves the table as it was."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import MetadataChangedException, Table, TypeChangeError, UnknownColumnError

WIDENING = {"delta.enableTypeWidening": "true"}
SCHEMA = pa.schema(
    [
        pa.field("i8", pa.int8()),
        pa.field("i32", pa.int32()),
        pa.field("f", pa.float32()),
        pa.field("d", pa.date32()),
        pa.field("dec", pa.decimal128(5, 2)),
        pa.field("st", pa.struct([pa.field("a", pa.int16())])),
        pa.field("p", pa.int16()),
    ]
)


def _row(i: int, p: int) -> dict[str, object]:
    return {
        "i8": i, "i32": i * 10, "f": i + 0.5, "d": dt.date(2024, 1, i), "dec": decimal.Decimal(f"{i}.25"),
        "st": {"a": i}, "p": p,
    }  # fmt: skip


def _table(uri: str, properties: dict[str, str] | None = None) -> Table:
    t = Table.create(
        uri, SCHEMA, partition_by=["p"], properties=WIDENING if properties is None else properties
    )
    t.append(pa.Table.from_pylist([_row(1, 1), _row(2, 2)], SCHEMA))
    return t


def _logged_schema(uri: str, version: int) -> dict[str, dict[str, object]]:
    """The schema the commit at ``version`` wrote: field name -> its JSON."""
    for line in (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text().splitlines():
        action = json.loads(line)
        if "metaData" in action:
            return {f["name"]: f for f in json.loads(action["metaData"]["schemaString"])["fields"]}
    raise AssertionError(f"version {version} has no metaData")


CHANGES = [
    ("i8", pa.int16(), "byte", "short"),
    ("i8", pa.int64(), "byte", "long"),
    ("i8", pa.float64(), "byte", "double"),
    ("i8", pa.decimal128(3, 0), "byte", "decimal(3,0)"),
    ("i32", pa.int64(), "integer", "long"),
    ("i32", pa.float64(), "integer", "double"),
    ("i32", pa.decimal128(12, 2), "integer", "decimal(12,2)"),
    ("f", pa.float64(), "float", "double"),
    ("d", pa.timestamp("us"), "date", "timestamp_ntz"),
    ("dec", pa.decimal128(7, 2), "decimal(5,2)", "decimal(7,2)"),
    ("dec", pa.decimal128(8, 4), "decimal(5,2)", "decimal(8,4)"),
    ("p", pa.int64(), "short", "long"),
]


@pytest.mark.parametrize(("column", "new_type", "from_name", "to_name"), CHANGES)
def test_allowed_changes_widen_the_column_and_keep_older_files(
    local_uri: str, column: str, new_type: pa.DataType, from_name: str, to_name: str
) -> None:
    t = _table(local_uri)
    before = t.to_arrow().to_pylist()
    files = t.files()
    result = t.change_column_type(column, new_type)
    assert result.version == 2
    assert t.files() == files  # metadata only: no file rewritten
    assert t.schema.field(column).type == new_type
    field = _logged_schema(local_uri, 2)[column]
    assert field["metadata"] == {"delta.typeChanges": [{"fromType": from_name, "toType": to_name}]}
    assert t.history(1)[0]["operation"] == "CHANGE COLUMN"
    protocol = t.snapshot().protocol
    assert "typeWidening" in (protocol.reader_features or ()) and "typeWidening" in (
        protocol.writer_features or ()
    )
    after = t.to_arrow()
    assert after.schema.field(column).type == new_type
    cast = pa.array([r[column] for r in before], SCHEMA.field(column).type).cast(new_type).to_pylist()
    assert after.column(column).to_pylist() == cast
    assert [{k: v for k, v in r.items() if k != column} for r in after.to_pylist()] == [
        {k: v for k, v in r.items() if k != column} for r in before
    ]
    # A fresh handle reads the same, and the change is filtered on in the wider type.
    assert Table.open(local_uri).to_arrow().equals(after)


def test_wider_values_are_written_and_filters_skip_older_files(local_uri: str) -> None:
    t = _table(local_uri)
    t.change_column_type("i32", pa.int64())
    t.change_column_type("d", pa.timestamp("us"))
    t.change_column_type("p", pa.int64())
    big = {**_row(3, 3), "i32": 3_000_000_000, "d": dt.datetime(2024, 1, 3, 5, 6), "p": 5_000_000_000}
    t.append(pa.Table.from_pylist([big], t.schema))
    assert sorted(t.to_arrow().column("i32").to_pylist()) == [10, 20, 3_000_000_000]
    # Statistics of the older files (int32, date) still prune.
    assert len(t.files(filter="i32 > 2000000000")) == 1
    assert t.to_arrow(filter="i32 > 2000000000").column("p").to_pylist() == [5_000_000_000]
    assert len(t.files(filter="d = TIMESTAMP_NTZ'2024-01-01 00:00:00'")) == 1
    assert t.to_arrow(filter="d >= '2024-01-02'").column("i32").to_pylist() == [20, 3_000_000_000]
    assert t.to_arrow(filter="p = 2").column("i32").to_pylist() == [20]


def test_struct_fields_and_repeated_changes_are_recorded_in_order(local_uri: str) -> None:
    t = _table(local_uri)
    t.change_column_type("st.a", pa.int32())
    t.change_column_type("i8", pa.int16())
    t.change_column_type("I8", pa.int32())  # names match case-insensitively, as in Spark
    schema = _logged_schema(local_uri, t.version)
    assert schema["i8"]["metadata"] == {
        "delta.typeChanges": [
            {"fromType": "byte", "toType": "short"},
            {"fromType": "short", "toType": "integer"},
        ]
    }
    nested = schema["st"]["type"]["fields"][0]  # type: ignore[index]
    assert nested["type"] == "integer"
    assert nested["metadata"] == {"delta.typeChanges": [{"fromType": "short", "toType": "integer"}]}
    assert t.to_arrow().column("st").to_pylist() == [{"a": 1}, {"a": 2}]
    assert t.to_arrow().schema.field("st").type == pa.struct([pa.field("a", pa.int32())])


REFUSED = [
    ("i32", pa.int16(), "a wider type"),  # narrowing
    ("i32", pa.string(), "a wider type"),
    ("i32", pa.float32(), "a wider type"),
    ("f", pa.decimal128(10, 2), "a wider type"),
    ("dec", pa.decimal128(5, 1), "a wider type"),  # fewer digits after the point
    ("dec", pa.decimal128(6, 4), "a wider type"),  # scale up by more than precision
    ("i32", pa.decimal128(9, 0), "a wider type"),  # too few digits for an int
    ("d", pa.timestamp("us", tz="UTC"), "a wider type"),  # only timestamp_ntz
    ("i32", pa.int32(), "already has that type"),
    ("p", pa.float64(), "partition column"),
]


@pytest.mark.parametrize(("column", "new_type", "reason"), REFUSED)
def test_refused_changes_raise_and_leave_the_table_as_it_was(
    local_uri: str, column: str, new_type: pa.DataType, reason: str
) -> None:
    t = _table(local_uri)
    with pytest.raises(TypeChangeError) as info:
        t.change_column_type(column, new_type)
    assert info.value.column == column
    assert info.value.from_type and info.value.to_type
    assert reason in info.value.reason
    assert t.version == 1 and Table.open(local_uri).version == 1
    assert Table.open(local_uri).schema.equals(SCHEMA, check_metadata=True)


def test_without_the_property_nothing_changes(local_uri: str) -> None:
    t = _table(local_uri, properties={})
    with pytest.raises(TypeChangeError) as info:
        t.change_column_type("i32", pa.int64())
    assert "delta.enableTypeWidening" in info.value.reason
    assert (info.value.from_type, info.value.to_type) == ("integer", "long")
    assert t.version == 1
    assert "typeWidening" not in (t.snapshot().protocol.writer_features or ())
    t.set_properties(WIDENING)  # enabling it later adds the feature
    assert "typeWidening" in (Table.open(local_uri).snapshot().protocol.reader_features or ())
    t.change_column_type("i32", pa.int64())
    assert Table.open(local_uri).schema.field("i32").type == pa.int64()


def test_unknown_columns_and_bad_types(local_uri: str) -> None:
    t = _table(local_uri)
    with pytest.raises(UnknownColumnError) as info:
        t.change_column_type("nope", pa.int64())
    assert info.value.column == "nope"
    with pytest.raises(UnknownColumnError):
        t.change_column_type("i32.x", pa.int64())
    with pytest.raises(TypeError):
        t.change_column_type("i32", "bigint")  # type: ignore[arg-type]
    assert t.version == 1


def test_a_type_change_fails_a_concurrent_write(local_uri: str) -> None:
    t = _table(local_uri)
    writer = Table.open(local_uri).transaction()
    writer.append(pa.Table.from_pylist([_row(3, 3)], SCHEMA))
    t.change_column_type("i32", pa.int64())
    with pytest.raises(MetadataChangedException) as info:
        writer.commit()
    assert info.value.winning_version == 2
    assert Table.open(local_uri).version == 2
    assert len(Table.open(local_uri).to_arrow()) == 2


def test_columns_an_expression_reads_keep_their_type(local_uri: str) -> None:
    """As Delta (DELTA_CONSTRAINT_DEPENDENT_COLUMN_CHANGE): a CHECK constraint or a generated
    column that reads a column pins its type; other columns still widen."""
    t = _table(local_uri)
    t.add_constraint("positive", "i32 > 0")
    with pytest.raises(TypeChangeError) as info:
        t.change_column_type("i32", pa.int64())
    assert "positive" in info.value.reason and "i32 > 0" in info.value.reason
    assert Table.open(local_uri).schema.field("i32").type == pa.int32()
    t.change_column_type("i8", pa.int16())  # not referenced
    assert Table.open(local_uri).schema.field("i8").type == pa.int16()
    t.drop_constraint("positive")
    t.change_column_type("i32", pa.int64())
    assert Table.open(local_uri).schema.field("i32").type == pa.int64()
