"""CHECK constraints, column invariants and generated columns on write: :class:`WriteRules`.

A table's write rules come from its metadata: CHECK constraints are the table properties
``delta.constraints.<name>`` (Spark SQL boolean expressions), legacy column invariants the
field metadata ``delta.invariants`` (``{"expression": {"expression": "<sql>"}}``), generated
columns the field metadata ``delta.generationExpression`` (:mod:`eventlog.files.generated`);
NOT NULL is the schema's nullability, checked by :func:`eventlog.files.enforce.conform`.

:meth:`WriteRules.apply` is every write path's last step before data files are written (the
engine's writes, UPDATE and MERGE, and the Spark tasks and streaming sink, which ship the
rules in their plans: they hold only strings). A row satisfies a constraint only when the
expression is TRUE: FALSE *and NULL* violate it, as in Delta (``CheckDeltaInvariant``). An
expression this library cannot parse or evaluate refuses the write with
:class:`UnsupportedProtocolError` naming it: enforcement is never skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from eventlog import expr as ex
from eventlog.errors import (
    ConstraintViolationError,
    NotNullViolationError,
    PredicateError,
    UnknownColumnError,
    UnsupportedProtocolError,
)
from eventlog.files.enforce import conform
from eventlog.files.generated import SAMPLE_ROWS, compile_expression, fill_generated, generated_columns

__all__ = [
    "CONSTRAINT_PREFIX",
    "INVARIANTS_KEY",
    "PendingChecks",
    "Rule",
    "WriteRules",
    "check_rows",
    "constraint_key",
    "table_constraints",
]

CONSTRAINT_PREFIX = "delta.constraints."
INVARIANTS_KEY = "delta.invariants"


def constraint_key(name: str) -> str:
    """The table property of a CHECK constraint (Delta lower-cases the name)."""
    return CONSTRAINT_PREFIX + name.lower()


def table_constraints(configuration: Mapping[str, str]) -> dict[str, str]:
    """CHECK constraint name -> expression, from the table properties."""
    return {
        k[len(CONSTRAINT_PREFIX) :]: v for k, v in configuration.items() if k.startswith(CONSTRAINT_PREFIX)
    }


@dataclasses.dataclass(frozen=True)
class Rule:
    """One boolean rule every written row must satisfy: ``kind`` is "check" or "invariant"."""

    name: str
    sql: str
    kind: str = "check"


def _invariants(fields: list[pa.Field], parent: str) -> Iterator[Rule]:
    for f in fields:
        path = f"{parent}.{f.name}" if parent else f.name
        raw = (f.metadata or {}).get(INVARIANTS_KEY.encode())
        if raw is not None:
            yield Rule(path, _invariant_sql(raw, path), "invariant")
        if pa.types.is_struct(f.type):
            yield from _invariants([f.type.field(i) for i in range(f.type.num_fields)], path)


def _invariant_sql(raw: bytes, path: str) -> str:
    """The expression of ``{"expression": {"expression": sql}}`` (JSON inside a JSON string
    when it came from a Delta schema)."""
    try:
        value: Any = orjson.loads(raw)
        if isinstance(value, str):
            value = orjson.loads(value)
        sql = value["expression"]["expression"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise UnsupportedProtocolError(
            f"column {path!r} has an invariant this library cannot read: {raw.decode(errors='replace')}",
            features=["invariants"],
        ) from exc
    if not isinstance(sql, str):
        raise UnsupportedProtocolError(
            f"column {path!r} has an invariant without SQL", features=["invariants"]
        )
    return sql


@dataclasses.dataclass(frozen=True)
class WriteRules:
    """What a table asks of written rows beyond its schema (see the module docstring)."""

    checks: tuple[Rule, ...] = ()
    generated: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, schema: pa.Schema, configuration: Mapping[str, str]) -> WriteRules:
        checks = [Rule(name, sql) for name, sql in sorted(table_constraints(configuration).items())]
        checks.extend(_invariants(list(schema), ""))
        return cls(tuple(checks), tuple(generated_columns(schema).items()))

    def __bool__(self) -> bool:
        return bool(self.checks or self.generated)

    def compiled(self, schema: pa.Schema) -> list[tuple[Rule, ex.Expr]]:
        """Every rule parsed against ``schema``; UnsupportedProtocolError naming the first
        one this library cannot parse (writes must not go on without enforcing it)."""
        out = []
        for rule in self.checks:
            try:
                out.append((rule, _compile_rule(rule, schema)))
            except (PredicateError, UnknownColumnError) as exc:
                raise _unsupported(rule, exc) from exc
        for column, sql in self.generated:
            try:
                compile_expression(sql, schema, f"generation expression of {column}")
            except (PredicateError, UnknownColumnError) as exc:
                raise _unsupported(Rule(column, sql, "generated"), exc) from exc
        return out

    def conform(self, data: pa.Table | pa.RecordBatch, schema: pa.Schema, *, context: str) -> pa.Table:
        """``data`` cast to ``schema`` (:func:`conform`), generated columns computed or
        checked, every rule checked: ConstraintViolationError for the first one broken."""
        table = self.prepare(data, schema, context=context)
        self.start_checks(table, schema, threaded=False).wait()
        return table

    def prepare(self, data: pa.Table | pa.RecordBatch, schema: pa.Schema, *, context: str) -> pa.Table:
        """``data`` cast to ``schema`` with generated columns computed or checked, and NOT
        NULL enforced; the CHECK rules are left to :meth:`start_checks`. Every rule is
        compiled first, so an expression this library cannot evaluate refuses the write
        before anything is done."""
        if not self:
            return conform(data, schema, context=context)
        self.compiled(schema)
        names = data.schema.names
        missing = [c for c, _ in self.generated if c not in names]
        # a generated column left out is computed below: let conform fill it with nulls
        relaxed = pa.schema(
            [f.with_nullable(True) if f.name in missing else f for f in schema], metadata=schema.metadata
        )
        table = conform(data, relaxed, context=context)
        if self.generated:
            table = fill_generated(table, schema, dict(self.generated), missing)
            _check_generated_nulls(table, schema, missing, context)
            table = pa.Table.from_arrays(table.columns, schema=schema) if missing else table
        return table

    def start_checks(self, table: pa.Table, schema: pa.Schema, *, threaded: bool = True) -> PendingChecks:
        """The CHECK rules of ``table`` (as :meth:`prepare` returned it), evaluated on a
        worker thread while the caller writes the files when ``threaded`` and the table is
        large; :meth:`PendingChecks.wait` (or leaving its ``with`` block) raises the first
        violation. The caller must not commit before the wait."""
        rules = self.compiled(schema) if self.checks else []
        if not rules:
            return PendingChecks(None)
        if threaded and table.num_rows >= _PARALLEL_CHECK_ROWS:
            return PendingChecks(_CHECK_POOL.submit(_check_all, rules, table))
        _check_all(rules, table)
        return PendingChecks(None)


# CHECK rules of a large write are evaluated on this thread while Parquet encodes the rows
# (Arrow's kernels release the GIL), so they cost CPU but little wall time.
_CHECK_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eventlog-checks")
_PARALLEL_CHECK_ROWS = 65_536


def _check_all(rules: list[tuple[Rule, ex.Expr]], table: pa.Table) -> None:
    for rule, expression in rules:
        check_rows(rule, expression, table)


class PendingChecks:
    """CHECK rules being evaluated (:meth:`WriteRules.start_checks`). As a context manager
    around the write of the same rows: on leaving, it waits for the rules, and a violation
    is raised in place of whatever the write raised (the rows were never valid)."""

    def __init__(self, future: Future[None] | None) -> None:
        self._future = future

    def wait(self) -> None:
        """ConstraintViolationError if a rule is broken (else returns once all are checked)."""
        if self._future is not None:
            self._future.result()

    def __enter__(self) -> PendingChecks:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        if error is None:
            self.wait()
            return
        try:
            self.wait()
        except ConstraintViolationError as violation:
            raise violation from error


def _compile_rule(rule: Rule, schema: pa.Schema) -> ex.Expr:
    what = "CHECK constraint" if rule.kind == "check" else "invariant of"
    return compile_expression(rule.sql, schema, f"{what} {rule.name}")


def _unsupported(rule: Rule, exc: Exception) -> UnsupportedProtocolError:
    feature = {"check": "checkConstraints", "invariant": "invariants", "generated": "generatedColumns"}[
        rule.kind
    ]
    what = {"check": "CHECK constraint", "invariant": "invariant of column", "generated": "generated column"}[
        rule.kind
    ]
    return UnsupportedProtocolError(
        f"cannot write: the {what} {rule.name} ({rule.sql}) is not an expression this library can "
        f"evaluate, so it could not be enforced ({exc})",
        features=[feature],
    )


def _check_generated_nulls(table: pa.Table, schema: pa.Schema, missing: list[str], context: str) -> None:
    for column in missing:
        if not schema.field(column).nullable and table.column(column).null_count:
            count = int(table.column(column).null_count)
            raise NotNullViolationError(
                f"{context}: NOT NULL constraint violated for generated column {column} ({count} rows)",
                columns=[column],
                count=count,
            )


def check_rows(rule: Rule, expression: ex.Expr, table: pa.Table) -> None:
    """ConstraintViolationError unless ``expression`` is TRUE for every row of ``table``."""
    values = ex.evaluate(expression, table)
    if values.null_count == 0 and pa.types.is_boolean(values.type) and pc.all(values).as_py() is not False:
        return  # the common case, in one pass: no NULL and no FALSE
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    ok = pc.fill_null(values.cast(pa.bool_()), False)
    passed = int(pc.sum(ok).as_py() or 0)
    if passed == table.num_rows:
        return
    bad = table.num_rows - passed
    rows = table.filter(pc.invert(ok)).slice(0, SAMPLE_ROWS)
    names = sorted({c.name for c in ex.referenced_columns(expression)})
    sample = [{n: ex.evaluate(ex.Column(n), rows)[i].as_py() for n in names} for i in range(rows.num_rows)]
    shown = "".join(f"\n - {k} : {v!r}" for k, v in sample[0].items())
    label = f"CHECK constraint {rule.name}" if rule.kind == "check" else f"Invariant on column {rule.name}"
    raise ConstraintViolationError(
        f"{label} ({rule.sql}) violated by row with values:{shown}\n"
        f"({bad} of {table.num_rows} rows violate it)",
        constraint=rule.name,
        expression=rule.sql,
        sample=sample,
        count=bad,
    )


def check_existing(rule: Rule, schema: pa.Schema, batches: Iterator[pa.Table]) -> None:
    """A new CHECK constraint against the table's rows (ADD CONSTRAINT): ConstraintViolationError
    counting every violating row (of all ``batches``), with a sample from the first ones."""
    expression = _compile_rule(rule, schema)
    total = 0
    first: ConstraintViolationError | None = None
    for batch in batches:
        try:
            check_rows(rule, expression, batch)
        except ConstraintViolationError as exc:
            total += exc.count
            first = first or exc
    if first is not None:
        raise ConstraintViolationError(
            f"{total} rows in the table violate the new CHECK constraint {rule.name} ({rule.sql}); "
            f"first: {first.values}",
            constraint=rule.name,
            expression=rule.sql,
            sample=first.sample,
            count=total,
        )
