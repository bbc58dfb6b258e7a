"""eventlog.expr evaluation: predicates and expressions on rows, three-valued logic."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.errors import PredicateError, UnknownColumnError
from eventlog.expr import TRUE, Column, Literal, evaluate, evaluate_mask, parse_expression, parse_predicate
from tests.eventlog.expr.sample import SCHEMA, TABLE, F, N, T, error_fields, mask, values

# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("id = 2", [False, True, False, False, False]),
        ("id <> 2", [True, False, True, False, True]),
        ("id != 2", [True, False, True, False, True]),
        ("id < 3", [True, True, False, False, False]),
        ("id <= 3", [True, True, True, False, False]),
        ("id > 3", [False, False, False, False, True]),
        ("id >= 3", [False, False, True, False, True]),
        ("id <=> NULL", [False, False, False, True, False]),
        ("id <=> 3", [False, False, True, False, False]),
        ("NOT (id <=> 3)", [True, True, False, True, True]),
        ("id IS DISTINCT FROM 3", [True, True, False, True, True]),
        ("id IS NOT DISTINCT FROM NULL", [False, False, False, True, False]),
        ("id == 2", [False, True, False, False, False]),
        ("id IS NULL", [False, False, False, True, False]),
        ("id IS NOT NULL", [True, True, True, False, True]),
        ("id IN (1, 5)", [True, False, False, False, True]),
        ("id IN (1, 2.5, 5)", [True, False, False, False, True]),
        ("id NOT IN (1, 5)", [False, True, True, False, False]),
        ("id BETWEEN 2 AND 3", [False, True, True, False, False]),
        ("id NOT BETWEEN 2 AND 3", [True, False, False, False, True]),
        ("id BETWEEN SYMMETRIC 3 AND 2", [False, True, True, False, False]),
        ("name LIKE 'ap%'", [True, False, False, False, True]),
        ("name LIKE '_anana'", [False, True, False, False, False]),
        ("name NOT LIKE 'ap%'", [False, True, False, True, False]),
        ("id = 1 OR name = 'cherry'", [True, False, False, True, False]),
        ("id > 1 AND x >= 0", [False, False, True, False, True]),
        ("NOT flag", [False, True, False, False, True]),
        ("flag", [True, False, False, True, False]),
        ("flag IS TRUE", [True, False, False, True, False]),
        ("flag IS NOT FALSE", [True, False, True, True, False]),
        ("id + 1 = 3", [False, True, False, False, False]),
        ("id - 1 = 0", [True, False, False, False, False]),
        ("id * 2 = 6", [False, False, True, False, False]),
        ("id / 2 = 1.5", [False, False, True, False, False]),
        ("id % 2 = 1", [True, False, True, False, True]),
        ("-id = -5", [False, False, False, False, True]),
        ("(id + 1) * 2 = 8", [False, False, True, False, False]),
        ("CAST(id AS STRING) = '3'", [False, False, True, False, False]),
        ("COALESCE(id, 0) = 0", [False, False, False, True, False]),
        ("LOWER(name) = 'banana'", [False, True, False, False, False]),
        ("UPPER(name) = 'APPLE'", [True, False, False, False, False]),
        ("ABS(x) = 1", [False, False, False, True, False]),
        ("price > 2", [False, False, False, True, True]),
        ("price * 2 = 3", [True, False, False, False, False]),
        ("price = 1.5", [True, False, False, False, False]),
        ("x > price", [False, False, False, False, False]),
        ("small = id * 10", [True, True, True, False, False]),
        ("s.inner = 2", [False, True, False, False, False]),
        ("s.label = 'd'", [False, False, False, True, False]),
        ("Day >= DATE '2010-01-01'", [False, True, True, False, True]),
        ("ts >= DATE '2020-01-01'", [True, True, False, True, False]),
        ("ts < TIMESTAMP '2020-01-01 10:00:00'", [True, False, False, False, True]),
        ("ntz = TIMESTAMP_NTZ '2020-01-02 00:00:00'", [False, False, True, False, False]),
        ("TRUE", [True] * 5),
        ("FALSE", [False] * 5),
        ("NULL", [False] * 5),
    ],
)
def test_predicate_on_rows(sql: str, expected: list[bool]) -> None:
    assert mask(sql) == expected


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("id + 1", [2, 3, 4, None, 6]),
        ("id - small", [-9, -18, -27, None, None]),
        ("id * 3", [3, 6, 9, None, 15]),
        ("id / 2", [0.5, 1.0, 1.5, None, 2.5]),
        ("id / 0", [None, None, None, None, None]),
        ("id % 2", [1, 0, 1, None, 1]),
        ("-7 % id", [0, -1, -1, None, -2]),
        ("id % 0", [None, None, None, None, None]),
        ("-id", [-1, -2, -3, None, -5]),
        ("ABS(x)", [0.5, None, 2.5, 1.0, 0.0]),
        ("COALESCE(id, small, 0)", [1, 2, 3, 40, 5]),
        ("LOWER(name)", ["apple", "banana", None, "cherry", "apricot"]),
        ("UPPER(name)", ["APPLE", "BANANA", None, "CHERRY", "APRICOT"]),
        ("price + 1", [Decimal("2.50"), Decimal("3.00"), None, Decimal("11.25"), Decimal("4.00")]),
        ("price / 2", [Decimal("0.75"), Decimal("1"), None, Decimal("5.125"), Decimal("1.5")]),
        ("CAST(price AS DOUBLE)", [1.5, 2.0, None, 10.25, 3.0]),
        ("CAST(id AS DECIMAL(5,1))", [Decimal("1.0"), Decimal("2.0"), Decimal("3.0"), None, Decimal("5.0")]),
        ("CAST(small AS BIGINT) + id", [11, 22, 33, None, None]),
        ("id = 1", [True, False, False, None, False]),
        ("id IN (1, NULL)", [True, None, None, None, None]),
        ("id NOT IN (1, NULL)", [False, None, None, None, None]),
        ("id IN (1, 2, 3)", [True, True, True, None, False]),
        ("7", [7, 7, 7, 7, 7]),
        ("'k'", ["k", "k", "k", "k", "k"]),
        ("NULL", [None, None, None, None, None]),
    ],
)
def test_expression_values(sql: str, expected: list[Any]) -> None:
    got = values(sql)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert (g == e and type(g) is type(e)) or (isinstance(e, Decimal) and g == e)


THREE = pa.table(
    {
        "a": pa.array([True, True, True, False, False, False, None, None, None]),
        "b": pa.array([True, False, None, True, False, None, True, False, None]),
    }
)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("a AND b", [T, F, N, F, F, F, N, F, N]),
        ("a OR b", [T, T, T, T, F, N, T, N, N]),
        ("NOT a", [F, F, F, T, T, T, N, N, N]),
        ("NOT (a AND b)", [F, T, N, T, T, T, N, T, N]),
        ("a = b", [T, F, N, F, T, N, N, N, N]),
        ("a <=> b", [T, F, F, F, T, F, F, F, T]),
        ("a AND NULL", [N, N, N, F, F, F, N, N, N]),
        ("a OR NULL", [T, T, T, N, N, N, N, N, N]),
        ("a IS NULL OR b IS NULL", [F, F, T, F, F, T, T, T, T]),
    ],
)
def test_three_valued_logic(sql: str, expected: list[bool | None]) -> None:
    assert values(sql, THREE) == expected
    assert mask(sql, THREE) == [v is True for v in expected]


def test_evaluate_shapes() -> None:
    chunked = pa.concat_tables([TABLE.slice(0, 2), TABLE.slice(2)])
    assert chunked.column("id").num_chunks == 2
    out = evaluate_mask(parse_predicate("id >= 2", SCHEMA), chunked)
    assert isinstance(out, pa.BooleanArray)
    assert out.to_pylist() == [False, True, True, False, True]
    batch = TABLE.to_batches()[0]
    assert evaluate_mask(parse_predicate("id >= 2", SCHEMA), batch).to_pylist() == [F, T, T, F, T]
    empty = TABLE.slice(0, 0)
    assert evaluate_mask(parse_predicate("id >= 2", SCHEMA), empty).to_pylist() == []
    assert evaluate(TRUE, empty).to_pylist() == []
    assert evaluate(Literal(4), TABLE.slice(0, 3)).to_pylist() == [4, 4, 4]


def test_evaluate_with_resolve_for_qualified_columns() -> None:
    qualifiers = {"t": pa.schema([("id", pa.int64())]), "s": pa.schema([("id", pa.int64())])}
    expr = parse_predicate("t.id = s.id + 1", SCHEMA, qualifiers=qualifiers)
    joined = pa.table({"id": [1, 2, 3], "__s_id": [0, 5, None]})
    names = {Column("id", "t"): "id", Column("id", "s"): "__s_id"}
    assert evaluate_mask(expr, joined, names.__getitem__).to_pylist() == [True, False, False]


def test_evaluate_errors() -> None:
    with pytest.raises(UnknownColumnError) as info:
        evaluate(Column("nope"), TABLE)
    assert error_fields(info).column == "nope"
    assert error_fields(info).available == SCHEMA.names
    with pytest.raises(PredicateError) as err:
        evaluate(parse_expression("CAST(name AS INT)", SCHEMA), TABLE)
    assert error_fields(err).expression == "CAST(name AS INT)"
    with pytest.raises(PredicateError) as err:
        evaluate(parse_expression("id * 9223372036854775807", SCHEMA), TABLE)
    assert error_fields(err).expression == "id * 9223372036854775807"
    with pytest.raises(PredicateError):
        evaluate_mask(parse_expression("id + 1", SCHEMA), TABLE)


def test_a_timestamp_literal_compares_with_timestamp_ntz_as_spark_does_in_utc() -> None:
    """Spark compares a TIMESTAMP_NTZ value with a TIMESTAMP as instants, reading the NTZ in
    the session time zone (UTC here): the literal becomes the NTZ of its UTC wall clock."""
    schema = pa.schema([("ntz", pa.timestamp("us"))])
    table = pa.table({"ntz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 678903), dt.datetime(2024, 1, 2)])})
    cases = {
        "ntz = TIMESTAMP'2024-01-02 03:04:05.678903'": [True, False],
        "ntz = TIMESTAMP'2024-01-02T04:04:05.678903+01:00'": [True, False],
        "ntz < TIMESTAMP'2024-01-02 01:00:00'": [False, True],
        "ntz IN (TIMESTAMP'2024-01-02 00:00:00')": [False, True],
    }
    for sql, expected in cases.items():
        assert evaluate_mask(parse_predicate(sql, schema), table).to_pylist() == expected, sql


_CODES = {
    1: ["a", "b", "c", "~"],
    2: ["EU", "US", "é", "zz"],
    3: ["abc", "xyz", "€"],
    4: ["EUR_", "USD_", "😀"],
    8: ["12345678", "abcdefgh", "ééééé"[:4]],
}


@settings(max_examples=150, deadline=None)
@given(data=st.data(), width=st.sampled_from(sorted(_CODES)), odd=st.booleans())
def test_string_in_lists_agree_with_hashing_whatever_the_widths(data: Any, width: int, odd: bool) -> None:
    """``IN`` over strings of one byte width is compared as integers (a fast path): it must
    give exactly what hashing gives, for any widths, chunking and slicing, and when one
    value of another width makes the fast path step aside."""
    pool = [c for c in _CODES[width] if len(c.encode()) == width] or _CODES[width]
    rows = data.draw(st.lists(st.sampled_from(pool), max_size=40))
    if odd:
        rows.append("odd-width")
    wanted = data.draw(st.lists(st.sampled_from([*pool, "q" * width]), min_size=1, max_size=4))
    split = data.draw(st.integers(0, len(rows)))
    sliced = data.draw(st.integers(0, split))
    column = pa.chunked_array(
        [pa.array(rows[:split], pa.string()).slice(sliced), pa.array(rows[split:], pa.string())]
    )
    table = pa.table({"s": column})
    sql = "s IN (" + ", ".join(f"'{w}'" for w in wanted) + ")"
    got = evaluate(parse_predicate(sql, table.schema), table)
    expected = pc.is_in(table.column("s"), value_set=pa.array(wanted, pa.string()))
    assert got.to_pylist() == expected.to_pylist()
