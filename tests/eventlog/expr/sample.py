"""The sample table and helpers shared by the tests of eventlog.expr (test_evaluation,
test_parsing, test_tree_utilities, test_to_sql, test_to_arrow, test_data_skipping)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from eventlog.expr import evaluate, evaluate_mask, parse_expression, parse_predicate

UTC = dt.UTC
D = dt.date
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("price", pa.decimal128(10, 2)),
        ("Day", pa.date32()),
        ("ts", pa.timestamp("us", "UTC")),
        ("ntz", pa.timestamp("us")),
        ("flag", pa.bool_()),
        ("x", pa.float64()),
        ("small", pa.int32()),
        ("part", pa.int32()),
        ("year", pa.int64()),
        ("s", pa.struct([("inner", pa.int32()), ("label", pa.string())])),
    ]
)
ROWS: dict[str, list[Any]] = {
    "id": [1, 2, 3, None, 5],
    "name": ["apple", "Banana", None, "cherry", "apricot"],
    "price": [Decimal("1.50"), Decimal("2.00"), None, Decimal("10.25"), Decimal("3.00")],
    "Day": [D(2009, 12, 31), D(2010, 1, 1), D(2010, 6, 1), None, D(2011, 1, 1)],
    "ts": [
        dt.datetime(2020, 1, 1, tzinfo=UTC),
        dt.datetime(2020, 1, 1, 10, 0, tzinfo=UTC),
        None,
        dt.datetime(2021, 1, 1, tzinfo=UTC),
        dt.datetime(2019, 6, 1, 12, 30, tzinfo=UTC),
    ],
    "ntz": [dt.datetime(2020, 1, 1), None, dt.datetime(2020, 1, 2), dt.datetime(2020, 1, 3), None],
    "flag": [True, False, None, True, False],
    "x": [0.5, None, 2.5, -1.0, 0.0],
    "small": [10, 20, 30, 40, None],
    "part": [1, 1, 2, 2, None],
    "year": [2018, 2019, 2020, 2021, 2022],
    "s": [
        {"inner": 1, "label": "a"},
        {"inner": 2, "label": "b"},
        None,
        {"inner": None, "label": "d"},
        {"inner": 5, "label": "e"},
    ],
}
TABLE = pa.Table.from_pydict(ROWS, schema=SCHEMA)


def error_fields(info: pytest.ExceptionInfo[Exception]) -> Any:
    """The raised error, whose structured fields (``.column``...) errors.py sets dynamically."""
    return info.value


def mask(sql: str, table: pa.Table = TABLE) -> list[bool]:
    result = evaluate_mask(parse_predicate(sql, table.schema), table)
    assert isinstance(result, pa.BooleanArray)
    assert len(result) == table.num_rows
    values: list[bool] = result.to_pylist()
    return values


def values(sql: str, table: pa.Table = TABLE) -> list[Any]:
    result: list[Any] = evaluate(parse_expression(sql, table.schema), table).to_pylist()
    return result


T, F, N = True, False, None  # three-valued results, short

# MERGE qualifiers: a target and a source schema, ``t`` and ``s``
TARGET = pa.schema([("id", pa.int64()), ("date", pa.date32()), ("value", pa.string())])
SOURCE = pa.schema([("id", pa.int64()), ("new_value", pa.string()), ("date", pa.date32())])
QUALIFIERS = {"t": TARGET, "s": SOURCE}
