"""eventlog.expr tree utilities: conjuncts, referenced columns, partition predicates."""

from __future__ import annotations

import pyarrow as pa
import pytest

from eventlog.expr import (
    TRUE,
    Call,
    Column,
    Literal,
    conjoin,
    conjuncts,
    evaluate_mask,
    parse_predicate,
    partition_predicate,
    referenced_columns,
    to_sql,
)
from tests.eventlog.expr.sample import SCHEMA, D

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
