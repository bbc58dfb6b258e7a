"""eventlog.expr as Arrow compute expressions: to_arrow filters as evaluate does."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from eventlog.expr import TRUE, evaluate_mask, parse_predicate, to_arrow
from tests.eventlog.expr.sample import QUALIFIERS, SCHEMA, TABLE, TARGET

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
