"""Generated columns (``delta.generationExpression`` field metadata): computed when the data
leaves them out, checked when it supplies them, recomputed by UPDATE and MERGE; partition
filters derived from predicates on their source column."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import ConstraintViolationError, NotNullViolationError, Table
from eventlog import expr as ex
from eventlog.files.generated import derived_partition_filters
from eventlog.files.pruning import prune_files
from eventlog.log.actions import Protocol
from eventlog.snapshot.protocol import features_of

UTC = dt.UTC
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("ts", pa.timestamp("us", "UTC")),
        pa.field("d", pa.date32(), metadata={"delta.generationExpression": "CAST(ts AS DATE)"}),
        pa.field("y", pa.int32(), nullable=False, metadata={"delta.generationExpression": "year(ts)"}),
        pa.field("id2", pa.int64(), metadata={"delta.generationExpression": "id * 2 + 1"}),
    ]
)


def _ts(day: int, hour: int = 12) -> dt.datetime:
    return dt.datetime(2024, 1, day, hour, tzinfo=UTC)


def _rows(ids: list[int], days: list[int], hour: int = 12) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "ts": pa.array([_ts(d, hour) for d in days], pa.timestamp("us", "UTC")),
        }
    )


def _files_on_disk(uri: str) -> list[str]:
    return sorted(
        str(p.relative_to(uri)) for p in Path(uri).rglob("*.parquet") if "_delta_log" not in p.parts
    )


def _table(uri: str) -> Table:
    return Table.create(uri, SCHEMA, partition_by=["d"])


def test_create_records_the_expressions_and_the_feature(local_uri: str) -> None:
    t = _table(local_uri)
    snap = t.refresh()
    assert snap.protocol == Protocol(1, 4)  # as Delta's legacy protocols have it
    assert "generatedColumns" in features_of(snap.protocol)
    field = snap.schema.field("d")
    assert field.metadata[b"delta.generationExpression"] == b'"CAST(ts AS DATE)"'


def test_missing_generated_columns_are_computed(local_uri: str) -> None:
    t = _table(local_uri)
    t.append(_rows([1, 2], [1, 2]))
    out = t.to_arrow().sort_by("id")
    assert out.column("d").to_pylist() == [dt.date(2024, 1, 1), dt.date(2024, 1, 2)]
    assert out.column("y").to_pylist() == [2024, 2024]
    assert out.column("id2").to_pylist() == [3, 5]
    assert sorted(f.split("/")[0] for f in t.files()) == ["d=2024-01-01", "d=2024-01-02"]


def test_supplied_values_must_match(local_uri: str) -> None:
    t = _table(local_uri)
    t.append(_rows([1], [1]))
    before = (t.refresh().version, t.files(), _files_on_disk(local_uri))
    good = _rows([2], [2]).append_column("d", pa.array([dt.date(2024, 1, 2)], pa.date32()))
    t.append(good)
    bad = _rows([3, 4], [3, 4]).append_column(
        "d", pa.array([dt.date(2024, 1, 3), dt.date(2020, 1, 1)], pa.date32())
    )
    before = (t.refresh().version, t.files(), _files_on_disk(local_uri))
    with pytest.raises(ConstraintViolationError) as err:
        t.append(bad)
    e = err.value
    assert (e.constraint, e.expression, e.count) == ("Generated Column", "d <=> CAST(ts AS DATE)", 1)
    assert e.values == {"d": dt.date(2020, 1, 1), "ts": _ts(4)}
    assert "CHECK constraint Generated Column (d <=> CAST(ts AS DATE)) violated" in str(e)
    assert (t.refresh().version, t.files(), _files_on_disk(local_uri)) == before


def test_a_non_nullable_generated_column_computed_as_null_is_refused(local_uri: str) -> None:
    t = _table(local_uri)
    with pytest.raises(NotNullViolationError) as err:
        t.append(pa.table({"id": [1], "ts": pa.array([None], pa.timestamp("us", "UTC"))}))
    assert err.value.columns == ["y"]
    assert t.refresh().version == 0 and t.files() == []


def test_update_and_merge_recompute_generated_columns(local_uri: str) -> None:
    t = _table(local_uri)
    t.append(_rows([1, 2], [1, 2]))
    t.update("id = 1", {"ts": "TIMESTAMP '2023-06-30 10:00:00'", "id": "10"})
    row = t.to_arrow(filter="id = 10").to_pylist()[0]
    assert (row["d"], row["y"], row["id2"]) == (dt.date(2023, 6, 30), 2023, 21)
    source = pa.table({"id": [2, 3], "ts": pa.array([_ts(20), _ts(21)], pa.timestamp("us", "UTC"))})
    (
        t.merge(source, "target.id = source.id")
        .when_matched_update(set={"ts": "source.ts"})
        .when_not_matched_insert(values={"id": "source.id", "ts": "source.ts"})
        .execute()
    )
    out = {r["id"]: (r["d"], r["id2"]) for r in t.to_arrow().to_pylist()}
    assert out == {10: (dt.date(2023, 6, 30), 21), 2: (dt.date(2024, 1, 20), 5), 3: (dt.date(2024, 1, 21), 7)}
    with pytest.raises(ConstraintViolationError):  # an explicit wrong value is still checked
        t.update("id = 2", {"id2": "0"})


def test_predicates_on_the_source_column_prune_generated_partitions(local_uri: str) -> None:
    t = _table(local_uri)
    for day in range(1, 6):
        t.append(_rows([day * 10, day * 10 + 1], [day, day], hour=0).combine_chunks())
        t.append(_rows([day * 10 + 2], [day], hour=23))
    pred = "ts >= TIMESTAMP '2024-01-03 10:00:00' AND ts < TIMESTAMP '2024-01-04 01:00:00'"
    assert sorted({f.split("/")[0] for f in t.files(filter=pred)}) == ["d=2024-01-03", "d=2024-01-04"]
    assert sorted(r["id"] for r in t.to_arrow(filter=pred).to_pylist()) == [32, 40, 41]
    snap = t.refresh()
    parsed = ex.parse_predicate(pred, snap.schema)
    derived = derived_partition_filters(parsed, snap.schema, ["d"])
    assert [ex.to_sql(e) for e in derived] == ["d >= DATE '2024-01-03'", "d <= DATE '2024-01-04'"]
    # the partition filter alone (statistics aside) keeps only those days' files
    part_pred, kept = prune_files(list(snap.files.values()), parsed, snap.schema, ["d"])
    assert (
        part_pred is not None and ex.to_sql(part_pred) == "d >= DATE '2024-01-03' AND d <= DATE '2024-01-04'"
    )
    assert sorted({a.partition_values["d"] for a in kept}) == ["2024-01-03", "2024-01-04"]


@pytest.mark.parametrize(
    ("generation", "part_type", "predicate", "expected"),
    [
        ("id", pa.int64(), "id2 = 5", []),  # a predicate on another column gives nothing
        ("id", pa.int64(), "id > 5", ["p > 5"]),  # identity copies the comparison
        ("to_date(ts)", pa.date32(), "ts < TIMESTAMP '2024-02-01 00:00:00'", ["p <= DATE '2024-02-01'"]),
        ("year(ts)", pa.int32(), "ts >= TIMESTAMP '2023-12-31 23:00:00'", ["p >= 2023"]),
        ("year(ts)", pa.int32(), "TIMESTAMP '2024-05-01 00:00:00' = ts", ["p = 2024"]),
        ("month(ts)", pa.int32(), "ts >= TIMESTAMP '2024-05-01 00:00:00'", []),  # not monotone
        ("CAST(ts AS DATE)", pa.date32(), "ts IS NULL", []),
    ],
)
def test_derivations(generation: str, part_type: pa.DataType, predicate: str, expected: list[str]) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("id2", pa.int64()),
            pa.field("ts", pa.timestamp("us", "UTC")),
            pa.field("p", part_type, metadata={"delta.generationExpression": generation}),
        ]
    )
    parsed = ex.parse_predicate(predicate, schema)
    assert [ex.to_sql(e) for e in derived_partition_filters(parsed, schema, ["p"])] == expected
