"""LENGTH, TO_DATE and the date parts (YEAR, MONTH, DAY, HOUR): parsed, type-checked,
evaluated on rows and as Arrow filters, rendered back to SQL."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from eventlog import PredicateError
from eventlog import expr as ex

UTC = dt.UTC
SCHEMA = pa.schema(
    [("s", pa.string()), ("ts", pa.timestamp("us", "UTC")), ("d", pa.date32()), ("n", pa.timestamp("us"))]
)
ROWS = pa.table(
    {
        "s": ["héllo", "", None],
        "ts": [dt.datetime(2024, 3, 5, 7, 30, tzinfo=UTC), dt.datetime(1999, 12, 31, 23, tzinfo=UTC), None],
        "d": [dt.date(2023, 1, 2), dt.date(2020, 2, 29), None],
        "n": [dt.datetime(2021, 6, 1, 5), None, dt.datetime(2022, 7, 2, 6)],
    },
    schema=SCHEMA,
)


@pytest.mark.parametrize(
    ("sql", "rendered", "values"),
    [
        ("length(s)", "LENGTH(s)", [5, 0, None]),
        ("char_length(s) > 0", "LENGTH(s) > 0", [True, False, None]),
        ("year(ts)", "YEAR(CAST(ts AS DATE))", [2024, 1999, None]),
        ("month(d)", "MONTH(d)", [1, 2, None]),
        ("day(ts)", "DAY(CAST(ts AS DATE))", [5, 31, None]),
        ("dayofmonth(d)", "DAY(d)", [2, 29, None]),
        ("hour(ts)", "HOUR(ts)", [7, 23, None]),
        ("hour(n)", "HOUR(n)", [5, None, 6]),
        ("to_date(ts)", "CAST(ts AS DATE)", [dt.date(2024, 3, 5), dt.date(1999, 12, 31), None]),
        ("to_date(d)", "d", [dt.date(2023, 1, 2), dt.date(2020, 2, 29), None]),
        ("year(to_date('2021-04-05'))", "YEAR(DATE '2021-04-05')", [2021, 2021, 2021]),
    ],
)
def test_functions_evaluate_like_spark(sql: str, rendered: str, values: list[object]) -> None:
    e = ex.parse_expression(sql, SCHEMA)
    assert ex.to_sql(e) == rendered
    assert ex.evaluate(e, ROWS).to_pylist() == values
    assert ex.parse_expression(ex.to_sql(e), SCHEMA) == e


def test_results_are_spark_ints_and_filter_through_arrow() -> None:
    assert ex.evaluate(ex.parse_expression("year(ts)", SCHEMA), ROWS).type == pa.int32()
    pred = ex.parse_predicate("year(ts) >= 2000 AND length(s) = 5", SCHEMA)
    assert ex.evaluate_mask(pred, ROWS).to_pylist() == [True, False, False]
    got = ds.dataset(ROWS).to_table(filter=ex.to_arrow(pred, schema=SCHEMA))
    assert got.column("s").to_pylist() == ["héllo"]


@pytest.mark.parametrize(
    "sql", ["length(d)", "year(true)", "hour(d)", "to_date(s, 'yyyy')", "to_date(1)", "month(1)"]
)
def test_wrong_arguments_are_predicate_errors(sql: str) -> None:
    with pytest.raises(PredicateError):
        ex.parse_expression(sql, SCHEMA)
