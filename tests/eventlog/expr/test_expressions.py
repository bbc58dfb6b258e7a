"""Tests of eventlog.expr: parsing, evaluation, SQL rendering and data skipping."""

from __future__ import annotations

import datetime as dt
import random
import time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from eventlog.errors import PredicateError, UnknownColumnError
from eventlog.expr import (
    TRUE,
    Call,
    Column,
    Expr,
    Literal,
    conjoin,
    conjuncts,
    evaluate,
    evaluate_mask,
    may_match,
    parse_expression,
    parse_predicate,
    partition_predicate,
    referenced_columns,
    to_arrow,
    to_sql,
)

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


def _fields(info: pytest.ExceptionInfo[Exception]) -> Any:
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
T, F, N = True, False, None


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
    assert _fields(info).column == "nope"
    assert _fields(info).available == SCHEMA.names
    with pytest.raises(PredicateError) as err:
        evaluate(parse_expression("CAST(name AS INT)", SCHEMA), TABLE)
    assert _fields(err).expression == "CAST(name AS INT)"
    with pytest.raises(PredicateError) as err:
        evaluate(parse_expression("id * 9223372036854775807", SCHEMA), TABLE)
    assert _fields(err).expression == "id * 9223372036854775807"
    with pytest.raises(PredicateError):
        evaluate_mask(parse_expression("id + 1", SCHEMA), TABLE)


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("sql", "column_type", "literal"),
    [
        ("c < '2010-01-01'", pa.date32(), Literal(D(2010, 1, 1), pa.date32())),
        (
            "c = '2020-01-01 10:00:00'",
            pa.timestamp("us", "UTC"),
            Literal(dt.datetime(2020, 1, 1, 10, tzinfo=UTC)),
        ),
        (
            "c = '2020-01-01T12:00:00+02:00'",
            pa.timestamp("ns", "UTC"),
            Literal(dt.datetime(2020, 1, 1, 10, tzinfo=UTC)),
        ),
        ("c = '2020-01-01'", pa.timestamp("us"), Literal(dt.datetime(2020, 1, 1), pa.timestamp("us"))),
        ("c = '10.5'", pa.decimal128(10, 2), Literal(Decimal("10.50"), pa.decimal128(10, 2))),
        ("c = '10.555'", pa.decimal128(10, 2), Literal(Decimal("10.555"), pa.decimal128(5, 3))),
        ("c = 'true'", pa.bool_(), Literal(True, pa.bool_())),
        ("c = 'No'", pa.bool_(), Literal(False, pa.bool_())),
        ("c = ' 42 '", pa.int32(), Literal(42, pa.int32())),
        ("c = '42'", pa.uint32(), Literal(42, pa.int64())),
        ("c = '2.5'", pa.float64(), Literal(2.5, pa.float64())),
        ("c = 'abc'", pa.string(), Literal("abc", pa.string())),
        ("c = 42", pa.int32(), Literal(42, pa.int64())),
        ("c = 1.5", pa.float64(), Literal(Decimal("1.5"), pa.decimal128(2, 1))),
        ("c = 1e3", pa.float64(), Literal(1000.0, pa.float64())),
        ("c = -9223372036854775808", pa.int64(), Literal(-(2**63), pa.int64())),
        ("c = 9223372036854775808", pa.decimal128(20, 0), Literal(Decimal(2**63), pa.decimal128(19, 0))),
        ("c = DATE '2020-02-29'", pa.date32(), Literal(D(2020, 2, 29))),
        ("c = CAST('7' AS TINYINT)", pa.int8(), Literal(7, pa.int8())),
        (
            "c = CAST(1.005 AS DECIMAL(5,2))",
            pa.decimal128(5, 2),
            Literal(Decimal("1.01"), pa.decimal128(5, 2)),
        ),
        ("c = X'0aFF'", pa.binary(), Literal(b"\x0a\xff")),
    ],
)
def test_literal_coercion(sql: str, column_type: pa.DataType, literal: Literal) -> None:
    expr = parse_predicate(sql, pa.schema([("c", column_type)]))
    assert expr == Call("eq" if "<" not in sql else "lt", (Column("c"), literal))
    assert isinstance(expr, Call)
    got = expr.args[1]
    assert isinstance(got, Literal)
    assert got.type == literal.type


@pytest.mark.parametrize(
    ("sql", "column_type", "fragment"),
    [
        ("c < 'yesterday'", pa.date32(), "cannot convert 'yesterday' to DATE"),
        ("c = '2020-13-01 00:00'", pa.timestamp("us", "UTC"), "TIMESTAMP"),
        ("c = '2020-01-01T00:00+01:00'", pa.timestamp("us"), "TIMESTAMP_NTZ"),
        ("c = '1.5'", pa.int64(), "cannot convert '1.5' to BIGINT"),
        ("c = '300'", pa.int8(), "TINYINT"),
        ("c = 'maybe'", pa.bool_(), "BOOLEAN"),
        ("c IN ('2020-01-01', 'x')", pa.date32(), "'x'"),
        ("c BETWEEN '2020-01-01' AND 'x'", pa.date32(), "'x'"),
        ("c = 5", pa.string(), "cannot compare"),
        ("c = CAST('abc' AS INT)", pa.int32(), "cannot convert"),
    ],
)
def test_unconvertible_literals(sql: str, column_type: pa.DataType, fragment: str) -> None:
    with pytest.raises(PredicateError) as info:
        parse_predicate(sql, pa.schema([("c", column_type)]))
    assert _fields(info).expression == sql
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("ID = 1", Call("eq", (Column("id"), Literal(1)))),
        ("`iD` = 1", Call("eq", (Column("id"), Literal(1)))),
        ("day IS NULL", Call("is_null", (Column("Day"),))),
        ("S.INNER > 0", Call("gt", (Column("s.inner"), Literal(0)))),
        ("NOT Flag", Call("not", (Column("flag"),))),
    ],
)
def test_case_insensitive_names(sql: str, expected: Expr) -> None:
    assert parse_predicate(sql, SCHEMA) == expected


def test_exact_case_wins_and_ambiguous_case() -> None:
    schema = pa.schema([("ab", pa.int64()), ("AB", pa.int64()), ("b.c", pa.int64())])
    assert parse_predicate("AB = 1", schema) == Call("eq", (Column("AB"), Literal(1)))
    assert parse_predicate("ab = 1", schema) == Call("eq", (Column("ab"), Literal(1)))
    assert parse_predicate("`b.c` = 1", schema) == Call("eq", (Column("b.c"), Literal(1)))
    assert parse_predicate("B.C = 1", schema) == Call("eq", (Column("b.c"), Literal(1)))
    with pytest.raises(PredicateError) as info:
        parse_predicate("Ab = 1", schema)
    assert _fields(info).expression == "Ab = 1"
    assert "ambiguous column 'Ab'" in str(info.value)


@pytest.mark.parametrize(
    ("sql", "column"),
    [
        ("nope = 1", "nope"),
        ("id = 1 AND Other > 2", "Other"),
        ("s.missing = 1", "s.missing"),
        ("x.y = 1", "x.y"),
    ],
)
def test_unknown_column(sql: str, column: str) -> None:
    with pytest.raises(UnknownColumnError) as info:
        parse_predicate(sql, SCHEMA, context="DELETE")
    assert _fields(info).column == column
    assert _fields(info).available == SCHEMA.names
    assert _fields(info).context == "DELETE"
    assert "DELETE" in str(info.value)


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        ("", "expected exactly one expression"),
        ("id = 1; id = 2", "expected exactly one expression"),
        ("id =", "cannot parse"),
        ("id + 1", "not a boolean predicate"),
        ("name", "not a boolean predicate"),
        ("id IN (SELECT 1)", "subquery"),
        ("EXISTS (SELECT 1)", "subquery"),
        ("foo(id) = 1", "function FOO"),
        ("rand() > 0.5", "function RAND"),
        ("sum(id) > 1", "aggregate function SUM"),
        ("count(*) > 1", "aggregate function COUNT"),
        ("sum(id) OVER (PARTITION BY part) > 1", "window function"),
        ("id DIV 2 = 1", "unsupported"),
        ("name LIKE name", "LIKE needs a string literal pattern"),
        ("id LIKE 'a%'", "LIKE needs a string value"),
        ("name ILIKE 'a%'", "unsupported"),
        ("name LIKE 'a!%' ESCAPE '!'", "unsupported"),
        ("id AND flag", "is not a boolean expression"),
        ("name + 1 = 2", "needs a number"),
        ("-name = 'a'", "needs a number"),
        ("LOWER(id) = 'a'", "needs a string argument"),
        ("CAST(id AS ARRAY<INT>) IS NULL", "unsupported type"),
        ("Day = ts OR Day = 1", "cannot compare"),
        ("id IN (1, 'a')", "cannot convert 'a' to BIGINT"),
        ("COALESCE(id, name) IS NULL", "COALESCE mixes"),
        ("id = CURRENT_DATE", "function CURRENT_DATE"),
    ],
)
def test_predicate_errors(sql: str, fragment: str) -> None:
    with pytest.raises(PredicateError) as info:
        parse_predicate(sql, SCHEMA)
    assert _fields(info).expression == sql
    assert fragment.lower() in str(info.value).lower()


def test_parse_expression_types_and_errors() -> None:
    assert parse_expression("id + 1", SCHEMA) == Call("add", (Column("id"), Literal(1)))
    assert parse_expression("CAST(id AS INT)", SCHEMA) == Call(
        "cast", (Column("id"), Literal(None, pa.int32()))
    )
    assert parse_expression("CAST(NULL AS DATE)", SCHEMA) == Literal(None, pa.date32())
    assert parse_expression("'x'", SCHEMA) == Literal("x")
    with pytest.raises(PredicateError) as info:
        parse_expression("id +", SCHEMA, context="UPDATE SET")
    assert _fields(info).expression == "id +"
    assert "UPDATE SET" in str(info.value)


# --------------------------------------------------------------------------- MERGE qualifiers

TARGET = pa.schema([("id", pa.int64()), ("date", pa.date32()), ("value", pa.string())])
SOURCE = pa.schema([("id", pa.int64()), ("new_value", pa.string()), ("date", pa.date32())])
QUALIFIERS = {"t": TARGET, "s": SOURCE}


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("t.id = s.id", Call("eq", (Column("id", "t"), Column("id", "s")))),
        ("T.ID = S.Id", Call("eq", (Column("id", "t"), Column("id", "s")))),
        (
            "t.id = s.id AND t.date = '2024-01-01'",
            Call(
                "and",
                (
                    Call("eq", (Column("id", "t"), Column("id", "s"))),
                    Call("eq", (Column("date", "t"), Literal(D(2024, 1, 1)))),
                ),
            ),
        ),
        ("value = new_value", Call("eq", (Column("value", "t"), Column("new_value", "s")))),
    ],
)
def test_merge_qualifiers(sql: str, expected: Expr) -> None:
    assert parse_predicate(sql, TARGET, qualifiers=QUALIFIERS) == expected


def test_merge_ambiguous_and_unknown() -> None:
    with pytest.raises(PredicateError) as info:
        parse_predicate("id = 1", TARGET, qualifiers=QUALIFIERS, context="merge ON")
    assert "ambiguous" in str(info.value)
    assert _fields(info).expression == "id = 1"
    with pytest.raises(UnknownColumnError) as unknown:
        parse_predicate("t.new_value = 'a'", TARGET, qualifiers=QUALIFIERS)
    assert _fields(unknown).column == "t.new_value"
    assert _fields(unknown).available == [
        "t.id",
        "t.date",
        "t.value",
        "s.id",
        "s.new_value",
        "s.date",
    ]


# --------------------------------------------------------------------------- tree utilities


def test_tree_utilities() -> None:
    e = parse_predicate("part = 1 AND (year > 2019 AND name = 'a') AND id IS NULL", SCHEMA)
    assert [to_sql(c) for c in conjuncts(e)] == ["part = 1", "year > 2019", "name = 'a'", "id IS NULL"]
    assert referenced_columns(e) == {Column("part"), Column("year"), Column("name"), Column("id")}
    assert conjoin([]) == TRUE
    assert Literal(True, pa.bool_()) == TRUE
    assert conjoin([TRUE, Column("flag")]) == Column("flag")
    assert conjoin(conjuncts(e)) == parse_predicate(
        "part = 1 AND year > 2019 AND name = 'a' AND id IS NULL", SCHEMA
    )
    assert referenced_columns(TRUE) == set()


@pytest.mark.parametrize(
    ("sql", "partitions", "expected"),
    [
        ("part = 1 AND id > 2", ["part"], "part = 1"),
        ("part = 1 AND year > 2019 AND id > 2", ["part", "year"], "part = 1 AND year > 2019"),
        ("PART = 1 AND id > 2", ["Part"], "part = 1"),
        ("part = 1 OR year > 2019", ["part"], None),
        ("part = 1 OR year > 2019", ["part", "year"], "part = 1 OR year > 2019"),
        ("id > 2", ["part"], None),
        ("TRUE AND part IN (1, 2)", ["part"], "part IN (1, 2)"),
        ("NOT (part = 1) AND (part = 2 OR id = 1)", ["part"], "NOT (part = 1)"),
    ],
)
def test_partition_predicate(sql: str, partitions: list[str], expected: str | None) -> None:
    got = partition_predicate(parse_predicate(sql, SCHEMA), partitions)
    assert (None if got is None else to_sql(got)) == expected


def test_partition_predicate_on_partition_values() -> None:
    pred = partition_predicate(parse_predicate("Day < '2010-06-01' AND id = 3", SCHEMA), ["Day"])
    assert pred == Call("lt", (Column("Day"), Literal(D(2010, 6, 1))))
    partitions = pa.table({"Day": pa.array([D(2010, 1, 1), D(2010, 6, 1), None], pa.date32())})
    assert evaluate_mask(pred, partitions).to_pylist() == [True, False, False]


# --------------------------------------------------------------------------- SQL rendering

ROUND_TRIP = [
    "id = 1",
    r"""name = 'it\'s \\ "q" \n \t é' OR name = "dq" """,
    "price = '10.5' AND price > 1.234",
    "x = 1.5e-300 OR x = -0.0e0 OR x = CAST('Infinity' AS DOUBLE) OR x < CAST('-inf' AS FLOAT)",
    "Day BETWEEN '2010-01-01' AND DATE '2011-01-01'",
    "ts = '2020-01-01 10:00:00.123456' OR ts > '2020-01-01T00:00:00+05:30'",
    "ntz <= '2020-01-01 00:00:00'",
    "NOT (id IS NULL) AND NOT id IS NULL",
    "id IS NOT NULL OR NOT (name LIKE 'a\\\\%b_%')",
    "id IN (1, 2, NULL) AND id NOT IN (3)",
    "(id = 1) = (name = 'a')",
    "(id IS NULL) = flag",
    "id - (1 - 2) = 1 - 2 - 3",
    "-(-id) = - -3 AND -(id + 1) = -CAST(2 AS INT)",
    "id * (2 + 3) / 4 % 5 = 1",
    "id - -5 = 0",
    "CAST(id AS DECIMAL(20,3)) > CAST(NULL AS DECIMAL(5,1))",
    "CAST(CAST(id AS STRING) AS VARCHAR(3)) = 'a'",
    "COALESCE(id, small, -1) = ABS(-2) AND LOWER(UPPER(name)) <> 'x'",
    "flag <=> NULL OR flag IS TRUE OR flag IS NOT FALSE",
    "s.inner = 1 AND s.label LIKE '%'",
    "small = '7' AND x = '1e3' AND flag = 'yes'",
    "NULL AND TRUE OR FALSE",
    "price = 12345678901234567890.123 OR id = 99999999999999999999999",
    "X'00ff' IS NULL",
    "CAST(id AS TIMESTAMP) < CAST(Day AS TIMESTAMP_NTZ) OR CAST(id AS BOOLEAN)",
]


@pytest.mark.parametrize("sql", ROUND_TRIP)
def test_to_sql_round_trip(sql: str) -> None:
    expr = parse_predicate(sql, SCHEMA)
    text = to_sql(expr)
    assert parse_predicate(text, SCHEMA) == expr
    assert to_sql(parse_predicate(text, SCHEMA)) == text
    assert mask(text) == mask(sql)


def test_to_sql_quotes_identifiers() -> None:
    schema = pa.schema(
        [("weird col", pa.int64()), ("select", pa.int64()), ("current_date", pa.int64()), ("a`b", pa.int64())]
    )
    expr = parse_predicate("`weird col` > 2 AND `select` = 1 AND `current_date` = 2 AND `a``b` = 3", schema)
    text = to_sql(expr)
    assert text == "`weird col` > 2 AND `select` = 1 AND `current_date` = 2 AND `a``b` = 3"
    assert parse_predicate(text, schema) == expr
    assert to_sql(Column("id", "t")) == "t.id"
    assert to_sql(Column("x y", "my alias")) == "`my alias`.`x y`"


@pytest.mark.parametrize(
    ("sql", "canonical"),
    [
        ("day < '2010-01-01'", "Day < DATE '2010-01-01'"),
        ("price > 2", "price > CAST(2 AS DECIMAL(1,0))"),
        ("ts >= '2020-01-01'", "ts >= TIMESTAMP '2020-01-01 00:00:00'"),
        ("price = '10.5'", "price = CAST(10.50 AS DECIMAL(10,2))"),
        ("small = '7'", "small = CAST(7 AS INT)"),
        ("id BETWEEN 1 AND 2", "id >= 1 AND id <= 2"),
        ("id NOT IN (1)", "NOT (id IN (1))"),
        ("NOT (a.b)", None),
    ],
)
def test_to_sql_canonical(sql: str, canonical: str | None) -> None:
    if canonical is None:
        with pytest.raises(UnknownColumnError):
            parse_predicate(sql, SCHEMA)
        return
    assert to_sql(parse_predicate(sql, SCHEMA)) == canonical


_ATOMS = ["id", "small", "x", "price", "1", "-2", "2.50", "1e2", "NULL", "CAST(id AS INT)", "ABS(x)"]
_BOOL_ATOMS = ["flag", "TRUE", "NULL", "name LIKE 'a%'", "Day > '2010-01-01'", "name IS NULL"]


def _random_number(rng: random.Random, depth: int) -> str:
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(_ATOMS)
    kind = rng.randrange(4)
    if kind == 0:
        return f"-({_random_number(rng, depth - 1)})"
    if kind == 1:
        return f"COALESCE({_random_number(rng, depth - 1)}, {_random_number(rng, depth - 1)})"
    op = rng.choice(["+", "-", "*", "/", "%"])
    return f"({_random_number(rng, depth - 1)} {op} {_random_number(rng, depth - 1)})"


def _random_predicate(rng: random.Random, depth: int) -> str:
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(_BOOL_ATOMS)
    kind = rng.randrange(6)
    if kind == 0:
        return f"NOT ({_random_predicate(rng, depth - 1)})"
    if kind == 1:
        op = rng.choice(["AND", "OR"])
        return f"({_random_predicate(rng, depth - 1)} {op} {_random_predicate(rng, depth - 1)})"
    if kind == 2:
        items = ", ".join(_random_number(rng, 1) for _ in range(rng.randint(1, 4)))
        return f"{_random_number(rng, depth - 1)} IN ({items})"
    if kind == 3:
        return f"({_random_number(rng, depth - 1)}) IS NOT NULL"
    if kind == 4:
        return f"({_random_predicate(rng, depth - 1)}) <=> ({_random_predicate(rng, depth - 1)})"
    op = rng.choice(["=", "<>", "<", "<=", ">", ">=", "<=>"])
    return f"{_random_number(rng, depth - 1)} {op} {_random_number(rng, depth - 1)}"


def test_to_sql_round_trip_property() -> None:
    rng = random.Random(20240601)
    for _ in range(400):
        sql = _random_predicate(rng, 4)
        expr = parse_predicate(sql, SCHEMA)
        text = to_sql(expr)
        assert parse_predicate(text, SCHEMA) == expr, (sql, text)
        # the rendering means the same thing, row by row
        assert mask(text) == mask(sql), (sql, text)


def test_to_sql_of_constructed_literals() -> None:
    cases = {
        Literal(5, pa.int16()): "CAST(5 AS SMALLINT)",
        Literal(Decimal("1E+2")): "CAST(100 AS DECIMAL(3,0))",
        Literal(
            dt.datetime(2020, 1, 1, 3, tzinfo=dt.timezone(dt.timedelta(hours=3)))
        ): "TIMESTAMP '2020-01-01 00:00:00'",
        Literal(b"\x01"): "X'01'",
        Literal(None, pa.string()): "CAST(NULL AS STRING)",
        Literal(float("nan")): "CAST('NaN' AS DOUBLE)",
    }
    for lit, text in cases.items():
        assert to_sql(lit) == text
    schema = pa.schema([("c", pa.int64())])
    for lit in cases:
        if lit.value == lit.value:  # NaN never equals itself
            assert parse_expression(to_sql(lit), schema) == lit


# --------------------------------------------------------------------------- to_arrow


@pytest.mark.parametrize(
    "sql",
    [
        "id = 2",
        "id IN (1, 5) OR name LIKE 'ch%'",
        "NOT (id IN (1, NULL))",
        "id / 2 > 1 AND id % 2 = 1",
        "id / 0 IS NULL",
        "COALESCE(id, 0) = 0",
        "Day >= DATE '2010-01-01' AND ts < TIMESTAMP '2021-01-01 00:00:00'",
        "price > 2 AND flag IS NOT TRUE",
        "s.inner > 1",
        "UPPER(name) = 'APPLE' OR ABS(x) = 1",
        "-id < -2 AND CAST(id AS STRING) <> '5'",
        "TRUE",
    ],
)
def test_to_arrow_matches_evaluate(sql: str) -> None:
    expr = parse_predicate(sql, SCHEMA)
    filtered = TABLE.filter(to_arrow(expr))
    assert (
        filtered.column("year").to_pylist()
        == TABLE.filter(evaluate_mask(expr, TABLE)).column("year").to_pylist()
    )


@pytest.mark.parametrize(
    "sql",
    [
        "small * price > 20",
        "id % price > 0.5 OR COALESCE(NULL, id) = 1",
        "price IN (small, 2) AND id <=> NULL IS NOT NULL",
        "NULL",
        "NOT (NULL AND flag)",
        "s.inner + 1 > 2",
        "x IN (0, 2.5) OR small IN (10, 2199023255552)",
        "name NOT IN ('apple', NULL) OR NOT (id IN (1, 2))",
        "Day IN ('2010-01-01', DATE '2011-01-01') AND price IN (1.5, 3)",
    ],
)
def test_to_arrow_with_schema_matches_evaluate(sql: str) -> None:
    expr = parse_predicate(sql, SCHEMA)
    expected = TABLE.filter(evaluate_mask(expr, TABLE)).column("year").to_pylist()
    assert TABLE.filter(to_arrow(expr, schema=SCHEMA)).column("year").to_pylist() == expected


def test_to_arrow_with_resolve() -> None:
    expr = parse_predicate("t.id > 1", TARGET, qualifiers=QUALIFIERS)
    table = pa.table({"tid": [1, 2, 3]})
    assert table.filter(to_arrow(expr, lambda c: "tid")).column("tid").to_pylist() == [2, 3]
    assert isinstance(to_arrow(TRUE), pc.Expression)


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
