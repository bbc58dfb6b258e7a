"""ALTER TABLE ... ALTER COLUMN ... TYPE: widen a column's type (Delta's type widening, see
:mod:`eventlog.files.type_widening`). A metadata change only: no data file is rewritten, so
it conflicts with every concurrent write (``MetadataChangedException``)."""

from __future__ import annotations

import pyarrow as pa

from eventlog.errors import TypeChangeError, UnknownColumnError
from eventlog.files.schema import canonical_schema
from eventlog.files.type_widening import (
    TYPE_WIDENING_PROPERTY,
    delta_type_name,
    widening_allowed,
    with_type_change,
)
from eventlog.ops.alter import change_schema, read_protocol
from eventlog.ops.columns import dependent_expressions
from eventlog.snapshot.protocol import features_of
from eventlog.txn.plan import Plan, PlanBuilder

__all__ = ["change_column_type"]


def change_column_type(plan: PlanBuilder, column: str, new_type: pa.DataType) -> Plan:
    """Change ``column`` (a top-level column, or ``a.b`` for a struct's field) to ``new_type``."""
    if not isinstance(new_type, pa.DataType):
        raise TypeError(f"change_column_type takes a pyarrow type, got {new_type!r}")
    schema = plan.schema
    path = column.split(".")
    top = _index(schema.names, path[0], schema.names)
    field = schema.field(top)
    if len(path) > 1:
        field = _nested(field, path[1:], column)
    new_type = canonical_schema(pa.schema([pa.field("x", new_type)])).field(0).type
    old_name, new_name = delta_type_name(field.type), delta_type_name(new_type)

    def refuse(reason: str) -> TypeChangeError:
        return TypeChangeError(
            f"cannot change column {column!r} from {old_name} to {new_name}: {reason}",
            column=column, from_type=old_name, to_type=new_name, reason=reason,
        )  # fmt: skip

    if str(plan.metadata.configuration.get(TYPE_WIDENING_PROPERTY, "")).lower() != "true":
        raise refuse(
            f"type widening is not enabled (set the table property {TYPE_WIDENING_PROPERTY} = 'true')"
        )
    if field.type == new_type:
        raise refuse("the column already has that type")
    dependents = dependent_expressions(plan, path)
    if dependents:  # Delta: DELTA_CONSTRAINT_/DELTA_GENERATED_COLUMNS_DEPENDENT_COLUMN_CHANGE
        uses = "; ".join(f"{where} ({sql})" for where, sql in dependents)
        raise refuse(f"an expression depends on the column: {uses}")
    partition = len(path) == 1 and field.name in plan.metadata.partition_columns
    if not widening_allowed(field.type, new_type, partition_column=partition):
        if partition and widening_allowed(field.type, new_type):
            raise refuse("a partition column only widens from one integer type to a wider one")
        raise refuse("type widening allows only the changes Delta allows (a wider type of the same kind)")
    # The preview feature records the version of each change (which a metadata change cannot
    # be rebased over: it commits right after the version it read, or not at all).
    features = features_of(read_protocol(plan))
    preview = "typeWidening-preview" in features and "typeWidening" not in features
    assert plan.snapshot is not None
    changed = with_type_change(field, new_type, table_version=plan.snapshot.version + 1 if preview else None)
    new_schema = _replace(schema, top, path[1:], changed)
    plan.set_operation(
        "CHANGE COLUMN",
        {"column": {"name": column, "type": new_name, "nullable": field.nullable}},
        changes_data=False,
    )
    change_schema(plan, new_schema)
    return plan.build()


def _index(names: list[str], name: str, available: list[str]) -> int:
    """Position of ``name`` among ``names``, matched case-insensitively as Spark does."""
    exact = [i for i, n in enumerate(names) if n == name]
    folded = exact or [i for i, n in enumerate(names) if n.lower() == name.lower()]
    if len(folded) != 1:
        raise UnknownColumnError(name, available, "change_column_type")
    return folded[0]


def _nested(field: pa.Field, path: list[str], column: str) -> pa.Field:
    for name in path:
        if not pa.types.is_struct(field.type):
            raise UnknownColumnError(column, [], "change_column_type (only struct fields nest)")
        names = [field.type.field(i).name for i in range(field.type.num_fields)]
        field = field.type.field(_index(names, name, names))
    return field


def _replace(schema: pa.Schema, top: int, path: list[str], changed: pa.Field) -> pa.Schema:
    return schema.set(top, _replace_field(schema.field(top), path, changed))


def _replace_field(field: pa.Field, path: list[str], changed: pa.Field) -> pa.Field:
    if not path:
        return changed
    struct = field.type
    names = [struct.field(i).name for i in range(struct.num_fields)]
    i = _index(names, path[0], names)
    children = [struct.field(j) for j in range(struct.num_fields)]
    children[i] = _replace_field(children[i], path[1:], changed)
    return pa.field(field.name, pa.struct(children), nullable=field.nullable, metadata=field.metadata)
