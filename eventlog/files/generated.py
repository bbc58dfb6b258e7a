"""Generated columns (Delta's ``generatedColumns`` feature): a top-level column whose field
metadata ``delta.generationExpression`` holds a Spark SQL expression of the other columns.

On write (:func:`fill_generated`) a generated column absent from the data is computed, and
one supplied is checked: every value must equal the expression's null-safely (Delta checks
``col <=> expr`` as the CHECK constraint "Generated Column"). On read, a predicate on a
generated column's *source* implies one on the generated partition column
(:func:`derived_partition_filters`), which prunes files as Delta's
``OptimizablePartitionExpression`` does for date partitions.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.errors import ConstraintViolationError, PredicateError
from eventlog.expr.evaluate import ARROW_ERRORS

__all__ = [
    "GENERATION_KEY",
    "derived_partition_filters",
    "fill_generated",
    "generated_columns",
    "metadata_text",
]

GENERATION_KEY = "delta.generationExpression"
GENERATED_CONSTRAINT = "Generated Column"
SAMPLE_ROWS = 5


def metadata_text(field: pa.Field, key: str) -> str | None:
    """A field metadata value as text: Spark-schema values are JSON-encoded (see
    :mod:`eventlog.files.schema`), values set by users through pyarrow may be plain."""
    raw = (field.metadata or {}).get(key.encode())
    if raw is None:
        return None
    try:
        value: object = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return str(raw.decode())
    return value if isinstance(value, str) else str(raw.decode())


def generated_columns(schema: pa.Schema) -> dict[str, str]:
    """Top-level column -> its generation expression (Delta allows no nested ones)."""
    out: dict[str, str] = {}
    for f in schema:
        text = metadata_text(f, GENERATION_KEY)
        if text is not None:
            out[f.name] = text
    return out


@functools.lru_cache(maxsize=256)
def compile_expression(sql: str, schema: pa.Schema, context: str) -> ex.Expr:
    """The parsed expression (cached: writers call this once per batch)."""
    return ex.parse_expression(sql, schema, context=context)


def _value(expression: ex.Expr, data: pa.Table, field: pa.Field, column: str) -> pa.ChunkedArray:
    values = ex.evaluate(expression, data)
    try:
        out = pc.cast(values, field.type)
    except ARROW_ERRORS as exc:
        sql = ex.to_sql(expression)
        raise PredicateError(
            f"generated column {column!r}: {sql} does not give a {field.type}: {exc}", expression=sql
        ) from exc
    return out if isinstance(out, pa.ChunkedArray) else pa.chunked_array([out], field.type)


def fill_generated(
    data: pa.Table, schema: pa.Schema, generated: Mapping[str, str], missing: Sequence[str]
) -> pa.Table:
    """``data`` (conformed to ``schema``) with the ``missing`` generated columns computed and
    the others checked; ConstraintViolationError for a supplied value that differs."""
    for column, sql in generated.items():
        field = schema.field(column)
        expression = compile_expression(sql, schema, f"generation expression of {column}")
        computed = _value(expression, data, field, column)
        if column in missing:
            data = data.set_column(schema.get_field_index(column), field, computed)
            continue
        supplied = data.column(column)
        same = pc.or_kleene(
            pc.fill_null(pc.equal(supplied, computed), False),
            pc.and_(pc.is_null(supplied), pc.is_null(computed)),
        )
        bad = len(same) - int(pc.sum(same).as_py() or 0)
        if bad:
            _raise_mismatch(data, column, sql, expression, same, bad)
    return data


def _raise_mismatch(
    data: pa.Table, column: str, sql: str, expression: ex.Expr, same: pa.ChunkedArray, bad: int
) -> None:
    rows = data.filter(pc.invert(same)).slice(0, SAMPLE_ROWS)
    names = [column, *sorted({c.name for c in ex.referenced_columns(expression)} - {column})]
    sample = [{n: ex.evaluate(ex.Column(n), rows)[i].as_py() for n in names} for i in range(rows.num_rows)]
    shown = ", ".join(f"{k} : {v!r}" for k, v in sample[0].items())
    check = f"{column} <=> {sql}"
    raise ConstraintViolationError(
        f"CHECK constraint {GENERATED_CONSTRAINT} ({check}) violated by row with values: {shown} "
        f"({bad} rows: a generated column's value must equal its generation expression)",
        constraint=GENERATED_CONSTRAINT,
        expression=check,
        sample=sample,
        count=bad,
    )


# --------------------------------------------------------------------------- partition filters

_DATE_PARTS = ("year", "month", "day", "hour")


def derived_partition_filters(
    predicate: ex.Expr, schema: pa.Schema, partition_columns: Sequence[str]
) -> list[ex.Expr]:
    """Predicates on generated partition columns implied by ``predicate``'s conjuncts on
    their source columns: ``ts >= T`` gives ``d >= CAST(T AS DATE)`` for
    ``d = CAST(ts AS DATE)``, ``year(ts) ...`` patterns give bounds on ``y = YEAR(ts)``,
    and an identity ``c2 = c`` copies the comparison. Only monotone generation expressions
    are used and only comparisons (=, <, <=, >, >=) with literals, so every derived filter
    holds for every row ``predicate`` selects (a superset of the files is kept)."""
    generated = generated_columns(schema)
    parts = [p for p in partition_columns if p in generated]
    if not parts:
        return []
    out: list[ex.Expr] = []
    for conjunct in ex.conjuncts(predicate):
        cmp = _comparison(conjunct)
        if cmp is None:
            continue
        op, source, literal = cmp
        for part in parts:
            try:
                gen = compile_expression(generated[part], schema, f"generation expression of {part}")
            except PredicateError:
                continue
            derived = _derive(gen, op, source, literal, schema.field(part).type)
            if derived is not None:
                out.append(ex.Call(derived[0], (ex.Column(part), derived[1])))
    return out


_FLIP = {"eq": "eq", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _comparison(e: ex.Expr) -> tuple[str, ex.Column, ex.Literal] | None:
    if not (isinstance(e, ex.Call) and e.op in _FLIP and len(e.args) == 2):
        return None
    left, right = e.args
    if isinstance(left, ex.Literal) and isinstance(right, ex.Column):
        return _FLIP[e.op], right, left
    if isinstance(left, ex.Column) and isinstance(right, ex.Literal) and right.value is not None:
        return e.op, left, right
    return None


def _derive(
    gen: ex.Expr, op: str, source: ex.Column, literal: ex.Literal, part_type: pa.DataType
) -> tuple[str, ex.Literal] | None:
    """(operator, literal) of the filter on the partition column, or None."""
    if gen == ex.Column(source.name):  # identity: the partition column is a copy
        return op, literal
    if _is_date_of(gen, source):
        day = _as_date(literal.value)
        if day is None:
            return None
        # CAST is monotone but not injective: a strict bound on ts is a loose one on the day
        return {"eq": "eq", "lt": "le", "le": "le", "gt": "ge", "ge": "ge"}[op], ex.Literal(day, pa.date32())
    if isinstance(gen, ex.Call) and gen.op in _DATE_PARTS and len(gen.args) == 1:
        inner = gen.args[0]
        if not (inner == ex.Column(source.name) or _is_date_of(inner, source)):
            return None
        # only YEAR is monotone on its own; MONTH/DAY/HOUR repeat every year/month/day
        if gen.op != "year" or not pa.types.is_integer(part_type):
            return None
        when = _as_datetime(literal.value)
        if when is None:
            return None
        return {"eq": "eq", "lt": "le", "le": "le", "gt": "ge", "ge": "ge"}[op], ex.Literal(when.year)
    return None


def _is_date_of(gen: ex.Expr, source: ex.Column) -> bool:
    """``CAST(source AS DATE)`` (``to_date(source)`` parses to the same)."""
    return (
        isinstance(gen, ex.Call)
        and gen.op == "cast"
        and gen.args[0] == ex.Column(source.name)
        and isinstance(gen.args[1], ex.Literal)
        and gen.args[1].type is not None
        and pa.types.is_date32(gen.args[1].type)
    )


def _as_datetime(value: object) -> dt.datetime | dt.date | None:
    return value if isinstance(value, (dt.datetime, dt.date)) else None


def _as_date(value: object) -> dt.date | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:  # a UTC instant: Spark's session time zone is UTC here
            value = value.astimezone(dt.UTC)
        return value.date()
    return value if isinstance(value, dt.date) else None
