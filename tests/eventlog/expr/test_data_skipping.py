"""eventlog.expr data skipping: may_match on per-file min/max/null-count statistics."""

from __future__ import annotations

import datetime as dt
import time

import pyarrow as pa
import pytest

from eventlog.expr import may_match, parse_predicate
from tests.eventlog.expr.sample import SCHEMA, UTC, D, F, T

# --------------------------------------------------------------------------- data skipping


def _stats() -> pa.Table:
    # file 0: id 1..10; file 1: id 20..30 with 2 nulls; file 2: no min/max;
    # file 3: all 5 values NULL; file 4: every id is 7
    return pa.table(
        {
            "numRecords": pa.array([10, 12, 8, 5, 3], pa.int64()),
            "min.id": pa.array([1, 20, None, None, 7], pa.int64()),
            "max.id": pa.array([10, 30, None, None, 7], pa.int64()),
            "nullCount.id": pa.array([0, 2, None, 5, 0], pa.int64()),
            "min.name": pa.array(["apple", "kiwi", None, None, "zz"]),
            "max.name": pa.array(["banana", "lemon", None, None, "zz"]),
            "nullCount.name": pa.array([0, 0, None, 5, 0], pa.int64()),
            "min.Day": pa.array([D(2010, 1, 1), D(2011, 1, 1), None, None, D(2012, 1, 1)], pa.date32()),
            "max.Day": pa.array([D(2010, 12, 31), D(2011, 12, 31), None, None, D(2012, 1, 1)], pa.date32()),
        }
    )


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("id = 5", [T, F, T, F, F]),
        ("5 = id", [T, F, T, F, F]),
        ("id = 7", [T, F, T, F, T]),
        ("id < 20", [T, F, T, F, T]),
        ("id <= 20", [T, T, T, F, T]),
        ("id > 10", [F, T, T, F, F]),
        ("id >= 10", [T, T, T, F, F]),
        ("10 < id", [F, T, T, F, F]),
        ("id <> 7", [T, T, T, F, F]),
        ("id <=> 7", [T, F, T, F, T]),
        ("NOT (id <=> 7)", [T, T, T, T, F]),
        ("id <=> NULL", [F, T, T, T, F]),
        ("id IN (5, 25)", [T, T, T, F, F]),
        ("id IN (NULL)", [F, F, F, F, F]),
        ("id NOT IN (7)", [T, T, T, F, F]),
        ("id NOT IN (7, NULL)", [F, F, F, F, F]),
        ("id IS NULL", [F, T, T, T, F]),
        ("id IS NOT NULL", [T, T, T, F, T]),
        ("NOT (id IS NULL)", [T, T, T, F, T]),
        ("id BETWEEN 11 AND 19", [F, F, T, F, F]),
        ("NOT (id < 20)", [F, T, T, F, F]),
        ("NOT (id >= 20 AND id <= 30)", [T, F, T, F, T]),
        ("NOT (id = 5 OR id = 25)", [T, T, T, F, T]),
        ("id = 5 OR id = 25", [T, T, T, F, F]),
        ("id = 5 AND name = 'lemon'", [F, F, T, F, F]),
        ("id = 5 OR x = 1", [T, T, T, T, T]),
        ("id = 5 AND x = 1", [T, F, T, F, F]),
        ("id + 1 = 5", [T, T, T, T, T]),
        ("name LIKE 'ban%'", [T, F, T, F, F]),
        ("name LIKE 'l_m%'", [F, T, T, F, F]),
        ("name LIKE '%a'", [T, T, T, T, T]),
        ("name NOT LIKE 'ban%'", [T, T, T, T, T]),
        ("Day < '2011-01-01'", [T, F, T, T, F]),
        ("Day = DATE '2011-06-01'", [F, T, T, T, F]),
        ("id = NULL", [F, F, F, F, F]),
        ("FALSE", [F, F, F, F, F]),
        ("NOT FALSE", [T, T, T, T, T]),
        ("NULL", [F, F, F, F, F]),
        ("TRUE", [T, T, T, T, T]),
        ("small = 5", [T, T, T, T, T]),
        ("id = 5.5", [T, F, T, F, F]),
        ("id = s.inner", [T, T, T, T, T]),
    ],
)
def test_may_match(sql: str, expected: list[bool]) -> None:
    assert may_match(parse_predicate(sql, SCHEMA), _stats()) == expected


def test_may_match_long_in_list_uses_its_range() -> None:
    # 40 values between 40 and 79: file 0 (1..10) is out of range, file 1 (20..30) too,
    # file 4 (all 7) too; the all-NULL file 3 never matches; unknown file 2 is kept
    pred = parse_predicate("id IN (" + ", ".join(str(v) for v in range(40, 80)) + ")", SCHEMA)
    assert may_match(pred, _stats()) == [F, F, T, F, F]
    wide = parse_predicate("id IN (" + ", ".join(str(v) for v in [*range(100, 140), 5]) + ")", SCHEMA)
    assert may_match(wide, _stats()) == [T, T, T, F, T]


def test_may_match_boolean_column_and_timestamps() -> None:
    stats = pa.table(
        {
            "numRecords": pa.array([4, 4, None], pa.int64()),
            "min.flag": pa.array([True, False, None]),
            "max.flag": pa.array([True, False, None]),
            "nullCount.flag": pa.array([0, 0, None], pa.int64()),
            # ms-truncated statistics, as Delta writes them
            "min.ts": pa.array([dt.datetime(2020, 1, 1, tzinfo=UTC)] * 3, pa.timestamp("ms", "UTC")),
            "max.ts": pa.array(
                [dt.datetime(2020, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)] * 3, pa.timestamp("ms", "UTC")
            ),
        }
    )
    assert may_match(parse_predicate("flag", SCHEMA), stats) == [True, False, True]
    assert may_match(parse_predicate("NOT flag", SCHEMA), stats) == [False, True, True]
    # the true max may be .123999: a max of .123 must not skip a search for .1235
    assert may_match(parse_predicate("ts >= '2020-01-01 00:00:00.1235'", SCHEMA), stats) == [True] * 3
    assert may_match(parse_predicate("ts >= '2020-01-01 00:00:00.125'", SCHEMA), stats) == [False] * 3
    assert may_match(parse_predicate("ts < '2020-01-01'", SCHEMA), stats) == [False] * 3


def test_may_match_unknown_statistics() -> None:
    pred = parse_predicate("id = 5 AND name IS NULL", SCHEMA)
    assert may_match(pred, pa.table({"numRecords": pa.array([1, 2], pa.int64())})) == [True, True]
    assert may_match(pred, pa.table({"other": pa.array([], pa.int64())})) == []
    mistyped = pa.table({"min.id": pa.array(["a"]), "max.id": pa.array(["b"])})
    assert may_match(parse_predicate("id = 5", SCHEMA), mistyped) == [True]


def test_may_match_is_fast() -> None:
    n = 10_000
    stats = pa.table(
        {
            "numRecords": pa.array([100] * n, pa.int64()),
            "min.id": pa.array(range(0, 10 * n, 10), pa.int64()),
            "max.id": pa.array(range(9, 10 * n, 10), pa.int64()),
            "nullCount.id": pa.array([0] * n, pa.int64()),
            "min.name": pa.array(["a"] * n),
            "max.name": pa.array(["m"] * n),
        }
    )
    pred = parse_predicate(
        "(id BETWEEN 500 AND 1500 OR id IN (7, 70000)) AND name LIKE 'b%' AND NOT (id IS NULL)", SCHEMA
    )
    may_match(pred, stats)  # warm up kernels
    start = time.perf_counter()
    result = may_match(pred, stats)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.05
    assert sum(result) == 103  # files 0, 50..150 and 7000
    assert result[0] and result[50] and result[150] and result[7000]
    assert not result[49] and not result[151]
