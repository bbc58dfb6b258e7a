"""Schema codec, canonical types, write-time enforcement, partition values and stats parsing."""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from eventlog.errors import InvalidInputError, SchemaMismatchError
from eventlog.files.enforce import conform, merge_schema
from eventlog.files.schema import (
    canonical_schema,
    decode_partition_value,
    encode_partition_value,
    from_spark_schema_json,
    needs_timestamp_ntz,
    partition_values_table,
    stats_table,
    to_spark_schema_json,
)

UTC = dt.UTC

ALL_TYPES = pa.schema(
    [
        pa.field("i8", pa.int8()),
        pa.field("i16", pa.int16()),
        pa.field("i32", pa.int32(), nullable=False),
        pa.field("i64", pa.int64()),
        pa.field("f32", pa.float32()),
        pa.field("f64", pa.float64()),
        pa.field("b", pa.bool_()),
        pa.field("s", pa.string(), metadata={"comment": '"the name"', "delta.columnMapping.id": "7"}),
        pa.field("bin", pa.binary()),
        pa.field("d", pa.date32()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("ntz", pa.timestamp("us")),
        pa.field("dec", pa.decimal128(38, 9)),
        pa.field("arr", pa.list_(pa.field("item", pa.int32(), nullable=False))),
        pa.field("m", pa.map_(pa.string(), pa.field("value", pa.int64(), nullable=False))),
        pa.field(
            "st",
            pa.struct(
                [
                    pa.field("x", pa.int32(), nullable=False),
                    pa.field("inner", pa.struct([("deep", pa.timestamp("us"))])),
                    pa.field("tags", pa.list_(pa.struct([("k", pa.string()), ("v", pa.decimal128(5, 2))]))),
                ]
            ),
        ),
        pa.field("mm", pa.map_(pa.string(), pa.list_(pa.map_(pa.int32(), pa.string())))),
    ]
)


# --------------------------------------------------------------------------- Spark JSON


def test_spark_json_round_trip_every_type() -> None:
    text = to_spark_schema_json(ALL_TYPES)
    back = from_spark_schema_json(text)
    assert back.equals(ALL_TYPES, check_metadata=True)
    assert to_spark_schema_json(back) == text
    assert " " not in text.replace("the name", "")  # compact, like Spark
    doc = json.loads(text)
    by_name = {f["name"]: f for f in doc["fields"]}
    assert by_name["i8"]["type"] == "byte"
    assert by_name["i16"]["type"] == "short"
    assert by_name["i32"] == {"name": "i32", "type": "integer", "nullable": False, "metadata": {}}
    assert by_name["ts"]["type"] == "timestamp"
    assert by_name["ntz"]["type"] == "timestamp_ntz"
    assert by_name["dec"]["type"] == "decimal(38,9)"
    assert by_name["s"]["metadata"] == {"comment": "the name", "delta.columnMapping.id": 7}
    assert by_name["arr"]["type"] == {"type": "array", "elementType": "integer", "containsNull": False}
    assert by_name["m"]["type"] == {
        "type": "map",
        "keyType": "string",
        "valueType": "long",
        "valueContainsNull": False,
    }
    assert list(doc) == ["type", "fields"]
    assert list(by_name["st"]) == ["name", "type", "nullable", "metadata"]


def test_spark_json_string_round_trips_exactly() -> None:
    text = (
        '{"type":"struct","fields":[{"name":"a","type":"integer","nullable":false,"metadata":{}},'
        '{"name":"b","type":{"type":"struct","fields":[{"name":"d","type":"integer","nullable":false,'
        '"metadata":{"delta.generationExpression":"a + 1"}}]},"nullable":true,"metadata":{}},'
        '{"name":"c","type":{"type":"array","elementType":"integer","containsNull":false},'
        '"nullable":true,"metadata":{}},{"name":"e","type":{"type":"array","elementType":'
        '{"type":"struct","fields":[{"name":"d","type":"integer","nullable":false,"metadata":{}}]},'
        '"containsNull":true},"nullable":true,"metadata":{}},{"name":"f","type":{"type":"map",'
        '"keyType":"string","valueType":"string","valueContainsNull":true},"nullable":true,'
        '"metadata":{}},{"name":"g","type":"decimal(10,0)","nullable":true,"metadata":{}}]}'
    )
    assert to_spark_schema_json(from_spark_schema_json(text)) == text


def test_spark_json_aliases_and_errors() -> None:
    sch = from_spark_schema_json(
        '{"type":"struct","fields":[{"name":"a","type":"decimal","nullable":true,"metadata":{}},'
        '{"name":"b","type":"varchar(10)","nullable":true,"metadata":{}}]}'
    )
    assert sch.field("a").type == pa.decimal128(10, 0)
    assert sch.field("b").type == pa.string()
    with pytest.raises(InvalidInputError, match="'v'"):
        from_spark_schema_json('{"type":"struct","fields":[{"name":"v","type":"variant","nullable":true}]}')
    with pytest.raises(InvalidInputError):
        from_spark_schema_json("not json")


def _run_python(code: str) -> str:
    # delta-rs can abort the interpreter at exit, so it only ever runs in a child process.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_parses_schema_string_written_by_deltalake(tmp_path: Path) -> None:
    code = f"""
import datetime, decimal, os, sys
import pyarrow as pa, deltalake
t = pa.table({{
    "i8": pa.array([1], pa.int8()), "i16": pa.array([1], pa.int16()), "i32": pa.array([1], pa.int32()),
    "i64": pa.array([1], pa.int64()), "f32": pa.array([1.5], pa.float32()), "f64": [1.5], "b": [True],
    "s": ["x"], "bin": [b"x"], "d": [datetime.date(2024, 1, 1)],
    "ts": pa.array([datetime.datetime(2024, 1, 1)], pa.timestamp("us", "UTC")),
    "ntz": pa.array([datetime.datetime(2024, 1, 1)], pa.timestamp("us")),
    "dec": pa.array([decimal.Decimal("1.23")], pa.decimal128(10, 2)),
    "arr": pa.array([[1, None]], pa.list_(pa.int32())),
    "m": pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64())),
    "st": pa.array([{{"x": 1, "y": "a"}}], pa.struct([("x", pa.int32()), ("y", pa.string())])),
}})
deltalake.write_deltalake({str(tmp_path / "t")!r}, t, partition_by=["s"])
sys.stdout.flush()
os._exit(0)
"""
    _run_python(code)
    log = (tmp_path / "t" / "_delta_log" / "00000000000000000000.json").read_bytes()
    meta = next(orjson.loads(line)["metaData"] for line in log.splitlines() if b'"metaData"' in line)
    schema = from_spark_schema_json(meta["schemaString"])
    expected = {
        "i8": pa.int8(),
        "i16": pa.int16(),
        "i32": pa.int32(),
        "i64": pa.int64(),
        "f32": pa.float32(),
        "f64": pa.float64(),
        "b": pa.bool_(),
        "s": pa.string(),
        "bin": pa.binary(),
        "d": pa.date32(),
        "ts": pa.timestamp("us", tz="UTC"),
        "ntz": pa.timestamp("us"),
        "dec": pa.decimal128(10, 2),
        "arr": pa.list_(pa.int32()),
        "m": pa.map_(pa.string(), pa.int64()),
        "st": pa.struct([("x", pa.int32()), ("y", pa.string())]),
    }
    assert {f.name: f.type for f in schema} == expected
    assert orjson.loads(to_spark_schema_json(schema)) == orjson.loads(meta["schemaString"])
    assert needs_timestamp_ntz(schema)


# --------------------------------------------------------------------------- canonical types


def test_canonical_schema_maps_to_table_types() -> None:
    src = pa.schema(
        [
            ("ls", pa.large_string()),
            ("lb", pa.large_binary()),
            ("ns", pa.timestamp("ns", tz="Europe/Paris")),
            ("ms", pa.timestamp("ms")),
            ("ll", pa.large_list(pa.large_string())),
            ("dict", pa.dictionary(pa.int32(), pa.string())),
            ("u8", pa.uint8()),
            ("u32", pa.uint32()),
            ("d64", pa.date64()),
            ("st", pa.struct([("x", pa.large_string())])),
            ("m", pa.map_(pa.large_string(), pa.timestamp("s", tz="UTC"))),
        ]
    )
    got = canonical_schema(src)
    assert [f.type for f in got] == [
        pa.string(),
        pa.binary(),
        pa.timestamp("us", tz="UTC"),
        pa.timestamp("us"),
        pa.list_(pa.string()),
        pa.string(),
        pa.int16(),
        pa.int64(),
        pa.date32(),
        pa.struct([("x", pa.string())]),
        pa.map_(pa.string(), pa.timestamp("us", tz="UTC")),
    ]
    assert canonical_schema(ALL_TYPES).equals(ALL_TYPES, check_metadata=True)


@pytest.mark.parametrize(
    "bad",
    [pa.uint64(), pa.duration("s"), pa.null(), pa.time64("us"), pa.dense_union([pa.field("a", pa.int8())])],
)
def test_canonical_schema_rejects_unsupported_types(bad: pa.DataType) -> None:
    with pytest.raises(InvalidInputError, match="'col'"):
        canonical_schema(pa.schema([("ok", pa.int64()), ("col", bad)]))
    with pytest.raises(InvalidInputError, match=r"'s\.inner'"):
        canonical_schema(pa.schema([("s", pa.struct([("inner", bad)]))]))


def test_canonical_schema_rejects_case_insensitive_duplicates() -> None:
    with pytest.raises(InvalidInputError, match="duplicate"):
        canonical_schema(pa.schema([("a", pa.int64()), ("A", pa.int64())]))


def test_needs_timestamp_ntz_looks_into_nested_types() -> None:
    assert not needs_timestamp_ntz(pa.schema([("t", pa.timestamp("us", tz="UTC"))]))
    assert needs_timestamp_ntz(pa.schema([("l", pa.list_(pa.struct([("t", pa.timestamp("us"))])))]))
    assert needs_timestamp_ntz(pa.schema([("m", pa.map_(pa.string(), pa.timestamp("ms")))]))


# --------------------------------------------------------------------------- conform

TABLE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
    ]
)


def test_conform_keeps_matching_data_without_copying() -> None:
    data = pa.table({"id": [1, 2], "name": ["a", None], "score": [1.0, 2.0]}).cast(
        pa.schema([f for f in TABLE if f.name != "at"])
    )
    data = data.append_column("at", pa.array([0, 1], pa.timestamp("us", tz="UTC")))
    out = conform(data, TABLE)
    assert out.schema.equals(TABLE)
    for name in TABLE.names:
        assert (
            out.column(name).chunk(0).buffers()[1].address == data.column(name).chunk(0).buffers()[1].address
        )


def test_conform_reorders_and_fills_missing_nullable_columns() -> None:
    data = pa.table({"score": [0.5], "id": [7]})
    out = conform(data, TABLE)
    assert out.schema.equals(TABLE)
    assert out.to_pylist() == [{"id": 7, "name": None, "score": 0.5, "at": None}]


def test_conform_rejects_extra_columns() -> None:
    data = pa.table({"id": [1], "extra": [1], "more": ["x"]})
    with pytest.raises(SchemaMismatchError) as err:
        conform(data, TABLE)
    assert err.value.columns == ["extra", "more"]
    assert "merge" in str(err.value)


def test_conform_explains_case_only_differences() -> None:
    with pytest.raises(SchemaMismatchError) as err:
        conform(pa.table({"id": [1], "Name": ["x"]}), TABLE)
    assert err.value.columns == ["Name"]
    assert "only in case" in str(err.value) and "'name'" in str(err.value)


def test_conform_rejects_missing_non_nullable_column() -> None:
    with pytest.raises(SchemaMismatchError) as err:
        conform(pa.table({"name": ["x"]}), TABLE)
    assert err.value.columns == ["id"]


def test_conform_names_every_bad_type() -> None:
    data = pa.table({"id": ["1"], "name": [1], "score": [1.0]})
    with pytest.raises(SchemaMismatchError) as err:
        conform(data, TABLE)
    assert err.value.columns == ["id", "name"]
    assert "string" in str(err.value) and "int64" in str(err.value)


def test_conform_rejects_nulls_in_non_nullable_column() -> None:
    with pytest.raises(SchemaMismatchError) as err:
        conform(pa.table({"id": pa.array([1, None], pa.int64())}), TABLE)
    assert err.value.columns == ["id"]


def test_conform_widening_casts() -> None:
    data = pa.table(
        {
            "id": pa.array([1, 2], pa.int8()),
            "name": pa.array(["a", "b"], pa.large_string()),
            "score": pa.array([1.5, 2.5], pa.float32()),
            # ns -> us truncates (documented), other zones are relabelled to UTC (same instant)
            "at": pa.array([1_000_001_999, 5_000], pa.timestamp("ns", tz="Europe/Paris")),
        }
    )
    out = conform(data, TABLE)
    assert out.schema.equals(TABLE)
    assert out.column("id").to_pylist() == [1, 2]
    assert out.column("at").cast(pa.int64()).to_pylist() == [1_000_001, 5]
    dict_data = pa.table({"id": [1], "name": pa.array(["x"]).dictionary_encode()})
    assert conform(dict_data, TABLE).column("name").to_pylist() == ["x"]


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (pa.int64(), pa.int32()),
        (pa.float64(), pa.float32()),
        (pa.int64(), pa.float64()),
        (pa.timestamp("us"), pa.timestamp("us", tz="UTC")),
        (pa.timestamp("us", tz="UTC"), pa.timestamp("us")),
        (pa.decimal128(10, 2), pa.decimal128(10, 3)),
        (pa.string(), pa.binary()),
    ],
)
def test_conform_rejects_lossy_casts(src: pa.DataType, dst: pa.DataType) -> None:
    with pytest.raises(SchemaMismatchError) as err:
        conform(pa.table({"c": pa.nulls(1, src)}), pa.schema([("c", dst)]))
    assert err.value.columns == ["c"]


def test_conform_nested_structs() -> None:
    table = pa.schema(
        [
            pa.field(
                "s",
                pa.struct([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())]),
            )
        ]
    )
    reordered = pa.table({"s": pa.array([{"a": 1}, None], pa.struct([("a", pa.int32())]))})
    assert conform(reordered, table).to_pylist() == [{"s": {"a": 1, "b": None}}, {"s": None}]
    extra = pa.table({"s": [{"a": 1, "z": 2}]})
    with pytest.raises(SchemaMismatchError) as err:
        conform(extra, table)
    assert err.value.columns == ["s.z"]
    null_child = pa.table(
        {"s": pa.array([{"a": None, "b": "x"}], pa.struct([("a", pa.int64()), ("b", pa.string())]))}
    )
    with pytest.raises(SchemaMismatchError) as err:
        conform(null_child, table)
    assert err.value.columns == ["s.a"]


def test_conform_checks_non_nullable_list_elements() -> None:
    table = pa.schema([("l", pa.list_(pa.field("item", pa.int64(), nullable=False)))])
    assert conform(pa.table({"l": [[1, 2], None]}), table).column("l").to_pylist() == [[1, 2], None]
    with pytest.raises(SchemaMismatchError) as err:
        conform(pa.table({"l": [[1, None]]}), table)
    assert err.value.columns == ["l.element"]


# --------------------------------------------------------------------------- merge_schema


def test_merge_schema_appends_new_columns_as_nullable() -> None:
    data = pa.schema(
        [
            pa.field("id", pa.int32()),
            pa.field("new", pa.large_string(), nullable=False),
            pa.field("name", pa.string()),
        ]
    )
    merged = merge_schema(TABLE, data)
    assert merged.names == [*TABLE.names, "new"]
    assert merged.field("id").type == pa.int64()  # the table type wins over a narrower one
    assert merged.field("new").type == pa.string() and merged.field("new").nullable


def test_merge_schema_merges_nested_structs() -> None:
    table = pa.schema([("s", pa.struct([("a", pa.int64())]))])
    data = pa.schema([("s", pa.struct([("b", pa.string()), ("a", pa.int64())]))])
    assert merge_schema(table, data).field("s").type == pa.struct([("a", pa.int64()), ("b", pa.string())])


def test_merge_schema_rejects_incompatible_columns() -> None:
    data = pa.schema([("id", pa.string()), ("score", pa.int64()), ("NAME", pa.string())])
    with pytest.raises(SchemaMismatchError) as err:
        merge_schema(TABLE, data)
    assert err.value.columns == ["id", "score", "NAME"]


# --------------------------------------------------------------------------- partition values

PARTITION_CASES: list[tuple[pa.DataType, Any, str]] = [
    (pa.int8(), -5, "-5"),
    (pa.int16(), 300, "300"),
    (pa.int32(), 2**31 - 1, "2147483647"),
    (pa.int64(), -(2**63), "-9223372036854775808"),
    (pa.float32(), 0.10000000149011612, "0.1"),
    (pa.float64(), 1.5, "1.5"),
    (pa.float64(), 1e20, "1e+20"),
    (pa.float64(), math.inf, "Infinity"),
    (pa.bool_(), True, "true"),
    (pa.bool_(), False, "false"),
    (pa.decimal128(10, 2), Decimal("1.50"), "1.50"),
    (pa.decimal128(38, 0), Decimal("-" + "9" * 38), "-" + "9" * 38),
    (pa.string(), "a b/c=d%e", "a b/c=d%e"),
    (pa.date32(), dt.date(2024, 2, 29), "2024-02-29"),
    (
        pa.timestamp("us", tz="UTC"),
        dt.datetime(2024, 1, 1, 1, 2, 3, 456789, tzinfo=UTC),
        "2024-01-01 01:02:03.456789",
    ),
    (pa.timestamp("us"), dt.datetime(1969, 12, 31, 23, 59, 59), "1969-12-31 23:59:59.000000"),
    (pa.binary(), b"\x00\x01\xff", "\x00\x01\xff"),
]


@pytest.mark.parametrize(("type_", "value", "text"), PARTITION_CASES)
def test_partition_value_round_trip(type_: pa.DataType, value: Any, text: str) -> None:
    assert encode_partition_value(value, type_) == text
    assert encode_partition_value(pa.scalar(value, type_), type_) == text
    assert decode_partition_value(text, type_) == value
    assert encode_partition_value(None, type_) is None
    assert decode_partition_value(None, type_) is None
    assert decode_partition_value("", type_) is None  # "" means null for every type


def test_partition_value_special_cases() -> None:
    assert encode_partition_value(float("nan"), pa.float64()) == "NaN"
    assert math.isnan(decode_partition_value("NaN", pa.float64()))
    assert encode_partition_value("", pa.string()) is None  # Delta/Spark store "" as null
    paris = dt.timezone(dt.timedelta(hours=2))
    aware = dt.datetime(2024, 6, 1, 12, tzinfo=paris)
    assert encode_partition_value(aware, pa.timestamp("us", tz="UTC")) == "2024-06-01 10:00:00.000000"
    assert decode_partition_value("2024-06-01T10:00:00Z", pa.timestamp("us", tz="UTC")) == aware
    assert decode_partition_value("2024-06-01 10:00:00", pa.timestamp("us")) == dt.datetime(2024, 6, 1, 10)
    assert decode_partition_value("TRUE", pa.bool_()) is True
    with pytest.raises(InvalidInputError):
        decode_partition_value("maybe", pa.bool_())
    with pytest.raises(InvalidInputError):
        encode_partition_value("x", pa.int64())
    with pytest.raises(InvalidInputError):
        encode_partition_value(Decimal("123.4"), pa.decimal128(3, 1))


def test_partition_values_table_is_typed() -> None:
    schema = pa.schema(
        [
            ("i", pa.int64()),
            ("d", pa.date32()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("s", pa.string()),
            ("b", pa.binary()),
            ("f", pa.float64()),
        ]
    )
    values: list[dict[str, str | None]] = [
        {"i": "1", "d": "2024-01-01", "ts": "2024-01-01 00:00:00.000001", "s": "x", "b": "\x00", "f": "NaN"},
        {"i": None, "d": "", "ts": None, "s": "", "b": None, "f": "-Infinity"},
        {},
    ]
    got = partition_values_table(values, schema)
    assert got.schema.equals(schema)
    rows = got.to_pylist()
    assert rows[0]["i"] == 1 and rows[0]["d"] == dt.date(2024, 1, 1) and rows[0]["b"] == b"\x00"
    assert rows[0]["ts"] == dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
    assert math.isnan(rows[0]["f"])
    assert rows[1] == {"i": None, "d": None, "ts": None, "s": None, "b": None, "f": -math.inf}
    assert rows[2] == dict.fromkeys(schema.names)
    iso = partition_values_table([{"ts": "2024-01-01T00:00:00Z"}], pa.schema([schema.field("ts")]))
    assert iso.column("ts").to_pylist() == [dt.datetime(2024, 1, 1, tzinfo=UTC)]


# --------------------------------------------------------------------------- stats_table

STATS_SCHEMA = pa.schema(
    [
        ("id", pa.int32()),
        ("x", pa.float32()),
        ("name", pa.string()),
        ("d", pa.date32()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("ntz", pa.timestamp("us")),
        ("dec", pa.decimal128(38, 9)),
        ("flag", pa.bool_()),
        ("bin", pa.binary()),
        ("l", pa.list_(pa.int64())),
        ("s", pa.struct([("a", pa.int64()), ("t", pa.struct([("u", pa.string())]))])),
    ]
)
SPARK_STATS = orjson.dumps(
    {
        "numRecords": 10,
        "minValues": {
            "id": 1,
            "x": 0.5,
            "name": "alice",
            "d": "2024-01-01",
            "ts": "2024-01-01T00:00:00.001+01:00",
            "ntz": "2024-01-01 01:02:03.456",
            "dec": orjson.Fragment(b"12345678901234567890.123456789"),
            "flag": False,
            "s": {"a": -3, "t": {"u": "k"}},
        },
        "maxValues": {"id": 9, "ts": "2024-01-02T00:00:00.000Z", "s": {"a": 4}},
        "nullCount": {"id": 0, "name": 2, "bin": 1, "l": 3, "s": {"a": 1, "t": {"u": 5}}},
        "tightBounds": True,
    }
).decode()


def _check_spark_stats_row(row: dict[str, Any]) -> None:
    assert row["numRecords"] == 10
    assert row["min.id"] == 1 and row["max.id"] == 9
    assert row["min.x"] == 0.5 and row["max.x"] is None
    assert row["min.name"] == "alice"
    assert row["min.d"] == dt.date(2024, 1, 1)
    assert row["min.ts"] == dt.datetime(2023, 12, 31, 23, 0, 0, 1000, tzinfo=UTC)
    assert row["max.ts"] == dt.datetime(2024, 1, 2, tzinfo=UTC)
    assert row["min.ntz"] == dt.datetime(2024, 1, 1, 1, 2, 3, 456000)
    assert row["min.dec"] == Decimal("12345678901234567890.123456789")
    assert row["min.flag"] is False
    assert row["min.s.a"] == -3 and row["max.s.a"] == 4 and row["min.s.t.u"] == "k"
    assert row["nullCount.name"] == 2 and row["nullCount.bin"] == 1 and row["nullCount.l"] == 3
    assert row["nullCount.s.a"] == 1 and row["nullCount.s.t.u"] == 5 and row["nullCount.x"] is None


def test_stats_table_parses_delta_stats() -> None:
    got = stats_table([SPARK_STATS, None, "{}"], STATS_SCHEMA)
    assert got.num_rows == 3
    assert "min.bin" not in got.column_names and "min.l" not in got.column_names
    assert got.schema.field("min.ts").type == pa.timestamp("us", tz="UTC")
    assert got.schema.field("min.s.t.u").type == pa.string()
    assert got.schema.field("nullCount.s.t.u").type == pa.int64()
    rows = got.to_pylist()
    _check_spark_stats_row(rows[0])
    assert all(v is None for v in rows[1].values())
    assert all(v is None for v in rows[2].values())


def test_stats_table_survives_malformed_stats() -> None:
    odd = '{"numRecords": 4, "minValues": {"id": "not a number", "dec": 1.5}, "nullCount": {"id": 0}}'
    got = stats_table([SPARK_STATS, odd, "{broken", None], STATS_SCHEMA, num_files=5)
    rows = got.to_pylist()
    assert len(rows) == 5
    _check_spark_stats_row(rows[0])
    assert rows[1]["numRecords"] == 4 and rows[1]["min.id"] is None and rows[1]["nullCount.id"] == 0
    assert rows[1]["min.dec"] == Decimal("1.5")
    assert rows[2]["numRecords"] is None and rows[4]["numRecords"] is None


def test_stats_table_empty_and_fast() -> None:
    assert stats_table([], STATS_SCHEMA).num_rows == 0
    stats = [SPARK_STATS] * 10_000
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        got = stats_table(stats, STATS_SCHEMA)
        best = min(best, time.perf_counter() - start)
    assert got.num_rows == 10_000
    # Typically ~40 ms; the bound is loose for busy CI machines but excludes per-value Python parsing.
    assert best < 0.25, f"stats_table took {best * 1000:.0f} ms for 10k files"
