"""eventlog.expr SQL rendering: to_sql round trips, quoting, canonical forms."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import pyarrow as pa
import pytest

from eventlog.errors import UnknownColumnError
from eventlog.expr import Column, Literal, parse_expression, parse_predicate, to_sql
from tests.eventlog.expr.sample import SCHEMA, mask

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
