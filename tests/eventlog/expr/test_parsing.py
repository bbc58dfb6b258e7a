"""eventlog.expr parsing: literal coercion, column names, errors, MERGE qualifiers."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from eventlog.errors import PredicateError, UnknownColumnError
from eventlog.expr import Call, Column, Expr, Literal, parse_expression, parse_predicate
from tests.eventlog.expr.sample import QUALIFIERS, SCHEMA, TARGET, UTC, D, error_fields

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
    assert error_fields(info).expression == sql
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
    assert error_fields(info).expression == "Ab = 1"
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
    assert error_fields(info).column == column
    assert error_fields(info).available == SCHEMA.names
    assert error_fields(info).context == "DELETE"
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
    assert error_fields(info).expression == sql
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
    assert error_fields(info).expression == "id +"
    assert "UPDATE SET" in str(info.value)


# --------------------------------------------------------------------------- MERGE qualifiers


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
    assert error_fields(info).expression == "id = 1"
    with pytest.raises(UnknownColumnError) as unknown:
        parse_predicate("t.new_value = 'a'", TARGET, qualifiers=QUALIFIERS)
    assert error_fields(unknown).column == "t.new_value"
    assert error_fields(unknown).available == [
        "t.id",
        "t.date",
        "t.value",
        "s.id",
        "s.new_value",
        "s.date",
    ]
