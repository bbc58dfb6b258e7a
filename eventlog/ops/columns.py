"""Column mapping's schema changes (Delta's ``ALTER TABLE RENAME COLUMN`` / ``DROP COLUMNS`` and
``SET TBLPROPERTIES ('delta.columnMapping.mode' = ...)``): metadata only, no file is rewritten.

Renames and drops need column mapping (:mod:`eventlog.files.column_mapping`): files store
physical names, so a rename changes the logical name alone and a dropped column's data stays
in the files, unread. Without mapping they are refused with :class:`ColumnMappingError`
naming ``delta.columnMapping.mode``, as Delta refuses them (DELTA_UNSUPPORTED_RENAME_COLUMN).
Each stages a metadata action, so every concurrent write fails with MetadataChangedException.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import orjson
import pyarrow as pa

from eventlog import expr as ex
from eventlog.errors import (
    ClusteringError,
    ColumnMappingError,
    EventlogError,
    InvalidInputError,
    InvalidTablePropertyError,
    UnknownColumnError,
)
from eventlog.files import column_mapping as cm
from eventlog.files.schema import canonical_schema, to_spark_schema_json
from eventlog.snapshot.clustering import clustering_columns
from eventlog.txn.plan import Plan, PlanBuilder
from eventlog.userinput import check_string_list, check_text

CONSTRAINT_PREFIX = "delta.constraints."
GENERATION_KEY = b"delta.generationExpression"

__all__ = ["drop_columns", "evolve_schema", "mapping_properties", "rename_column"]


def _require_mapping(plan: PlanBuilder, operation: str) -> str:
    mode = cm.mode_of(plan.metadata.configuration)
    if mode not in ("name", "id"):
        raise ColumnMappingError(
            f"{operation} needs column mapping: set the table property {cm.MODE_KEY!r} to 'name' "
            f"first (table {plan.table.uri} has mode {mode!r}; Delta: DELTA_UNSUPPORTED_RENAME_COLUMN)",
            operation=operation,
            reason="mapping required",
            mode=mode,
            property=cm.MODE_KEY,
        )
    return mode


def _path(name: str, schema: pa.Schema, context: str) -> list[str]:
    """A column path: a top-level column, or ``a.b`` for field ``b`` of struct ``a`` (a
    top-level name containing dots is taken whole)."""
    check_text(name, context, allow_empty=False)
    if name in schema.names:
        return [name]
    return name.split(".")


def dependent_expressions(plan: PlanBuilder, path: Sequence[str]) -> list[tuple[str, str]]:
    """``(what, sql)`` of each CHECK constraint and generated column whose expression reads the
    column (or struct field) at ``path``: Delta refuses to rename, drop or retype such a column
    (DELTA_CONSTRAINT_DEPENDENT_COLUMN_CHANGE, DELTA_GENERATED_COLUMNS_DEPENDENT_COLUMN_CHANGE)."""
    schema, target = plan.schema, ".".join(path).lower()
    sources = [(k, v) for k, v in plan.metadata.configuration.items() if k.startswith(CONSTRAINT_PREFIX)]
    for f in schema:
        meta = f.metadata or {}
        if GENERATION_KEY in meta:
            sources.append((f"generated column {f.name}", str(orjson.loads(meta[GENERATION_KEY]))))
    found: list[tuple[str, str]] = []
    for where, sql in sources:
        try:
            used = {c.name.lower() for c in ex.referenced_columns(ex.parse_expression(sql, schema))}
        except EventlogError:
            continue  # an expression we cannot parse names no column we can check
        if any(u == target or u.startswith(f"{target}.") or target.startswith(f"{u}.") for u in used):
            found.append((where, sql))
    return found


def _check_dependents(plan: PlanBuilder, path: Sequence[str], operation: str) -> None:
    """Refuse to rename or drop a column a CHECK constraint or a generated column's expression
    reads: the stored SQL names the column by its logical name."""
    for where, sql in dependent_expressions(plan, path)[:1]:
        raise ColumnMappingError(
            f"cannot {operation.lower()} {'.'.join(path)!r}: {where} ({sql!r}) uses it",
            operation=operation,
            reason="dependent expression",
            mode=cm.mode_of(plan.metadata.configuration),
            property=cm.MODE_KEY,
        )


def rename_column(plan: PlanBuilder, old: str, new: str) -> Plan:
    """Rename the column (or struct field, ``"a.b"``) ``old`` to ``new`` (a name, not a path)."""
    _require_mapping(plan, "RENAME COLUMN")
    schema = plan.schema
    path = _path(old, schema, "rename_column column")
    check_text(new, "rename_column new name", allow_empty=False)
    renamed = cm.rename(schema, path, new)
    if renamed is None:
        raise UnknownColumnError(old, list(schema.names), "rename_column")
    _check_dependents(plan, path, "RENAME COLUMN")
    canonical_schema(renamed)  # rejects a name clashing with a sibling (case-insensitively)
    parts = list(plan.metadata.partition_columns)
    if len(path) == 1 and path[0] in parts:  # partition values are keyed by physical names
        parts[parts.index(path[0])] = new
    new_path = ".".join([*path[:-1], new])
    plan.set_operation("RENAME COLUMN", {"oldColumnPath": old, "newColumnPath": new_path}, changes_data=False)
    plan.update_metadata(
        dataclasses.replace(
            plan.metadata, schema_string=to_spark_schema_json(renamed), partition_columns=tuple(parts)
        )
    )
    return plan.build()


def drop_columns(plan: PlanBuilder, names: Sequence[str]) -> Plan:
    """Drop columns (or struct fields, ``"a.b"``); their data stays in the files, unread."""
    _require_mapping(plan, "DROP COLUMNS")
    names = check_string_list(names, "drop_columns column")
    if not names:
        raise InvalidInputError("drop_columns needs at least one column")
    schema = plan.schema
    parts = set(plan.metadata.partition_columns)
    snap = plan.snapshot
    clustering = clustering_columns(snap.protocol, snap.domains, schema) if snap is not None else []
    for name in names:
        path = _path(name, schema, "drop_columns column")
        if any(c == ".".join(path) or c.startswith(".".join(path) + ".") for c in clustering):
            raise ClusteringError(
                f"dropping clustering column {name!r} is not allowed (Delta: "
                "DELTA_UNSUPPORTED_DROP_CLUSTERING_COLUMN); cluster by other columns first",
                columns=clustering,
                reason="drop clustering column",
            )
        if len(path) == 1 and path[0] in parts:
            raise ColumnMappingError(
                f"dropping partition columns ({name}) is not allowed "
                "(Delta: DELTA_UNSUPPORTED_DROP_PARTITION_COLUMN)",
                operation="DROP COLUMNS",
                reason="partition column",
                mode=cm.mode_of(plan.metadata.configuration),
                property=cm.MODE_KEY,
            )
        dropped = cm.drop(schema, path)
        if dropped is None:
            raise UnknownColumnError(name, list(schema.names), "drop_columns")
        _check_dependents(plan, path, "DROP COLUMNS")
        if any(pa.types.is_struct(t) and t.num_fields == 0 for t in _struct_types(dropped)):
            raise InvalidInputError(f"cannot drop {name!r}: it is the last field of its struct")
        schema = dropped
    if not [n for n in schema.names if n not in parts]:
        raise InvalidInputError(f"cannot drop {list(names)}: no data column would remain")
    plan.set_operation("DROP COLUMNS", {"columns": list(names)}, changes_data=False)
    plan.update_metadata(dataclasses.replace(plan.metadata, schema_string=to_spark_schema_json(schema)))
    return plan.build()


def _struct_types(schema: pa.Schema) -> list[pa.DataType]:
    out: list[pa.DataType] = []
    stack = [f.type for f in schema]
    while stack:
        t = stack.pop()
        if pa.types.is_struct(t):
            out.append(t)
            stack.extend(t.field(i).type for i in range(t.num_fields))
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            stack.append(t.value_type)
        elif pa.types.is_map(t):
            stack.extend((t.key_type, t.item_type))
    return out


def mapping_properties(
    schema: pa.Schema, old: Mapping[str, str], new: Mapping[str, str], *, new_table: bool
) -> tuple[pa.Schema, dict[str, str]]:
    """The schema and properties after a change of the table properties from ``old`` to
    ``new``, as Delta handles ``delta.columnMapping.mode``.

    Turning mapping on gives every field an id and a physical name: ``col-<uuid>`` on a new
    table, the column's current name on an existing one (its files store the columns under
    those names); ``maxColumnId`` follows. An existing table may only go from ``none`` to
    ``name``; any other change of mode is refused with :class:`ColumnMappingError`
    (DELTA_UNSUPPORTED_COLUMN_MAPPING_MODE_CHANGE). Other properties pass through.
    """
    config = dict(new)
    value = config.get(cm.MODE_KEY)
    if value is not None and value.lower() not in cm.MODES:
        raise InvalidTablePropertyError(cm.MODE_KEY, value, list(cm.MODES))
    before, after = cm.mode_of(old), cm.mode_of(config)
    if new_table:
        schema = cm.strip(schema)  # ids and physical names of another table mean nothing here
    elif after != before and not (before == "none" and after == "name"):
        raise ColumnMappingError(
            f"changing column mapping mode from {before!r} to {after!r} is not supported "
            "(Delta: DELTA_UNSUPPORTED_COLUMN_MAPPING_MODE_CHANGE)",
            operation="SET TBLPROPERTIES",
            reason="mode change",
            mode=before,
            property=cm.MODE_KEY,
        )
    if after == "none":
        return schema, config
    schema, top = cm.assign(schema, cm.max_id(config, schema), keep_names=not new_table and before == "none")
    config[cm.MAX_ID_KEY] = str(top)
    return schema, config


def evolve_schema(schema: pa.Schema, configuration: Mapping[str, str]) -> tuple[pa.Schema, dict[str, str]]:
    """A changed schema (columns added, by ADD COLUMNS or schema evolution) with ids and
    ``col-<uuid>`` physical names for its new fields when the table maps columns."""
    config = dict(configuration)
    if cm.mode_of(config) not in ("name", "id"):
        return schema, config
    schema, top = cm.assign(schema, cm.max_id(config, schema))
    config[cm.MAX_ID_KEY] = str(top)
    return schema, config
