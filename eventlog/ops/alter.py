"""ALTER TABLE: table properties (``SET``/``UNSET TBLPROPERTIES``, with the ``delta.*`` values
this library interprets validated) and new columns. Each stages a metadata action, which
conflicts with every concurrent write."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pyarrow as pa

from eventlog.errors import (
    InvalidInputError,
    InvalidTablePropertyError,
)
from eventlog.files import column_mapping as cm
from eventlog.files import row_tracking
from eventlog.files.change_data import CDF_PROPERTY
from eventlog.files.schema import canonical_schema, to_spark_schema_json
from eventlog.files.type_widening import TYPE_WIDENING_PROPERTY
from eventlog.log import in_commit_timestamps as ict
from eventlog.log.actions import Protocol
from eventlog.log.checkpoint_v2 import CHECKPOINT_POLICY_KEY
from eventlog.log.cleanup import AUDIT_RETENTION_KEY, PROTECTION_KEY, TRUNCATE_HISTORY_RETENTION_KEY
from eventlog.ops import columns
from eventlog.snapshot.isolation import ISOLATION_LEVEL_KEY, IsolationLevel
from eventlog.snapshot.protocol import DV_PROPERTY, upgrade
from eventlog.txn.plan import Plan, PlanBuilder
from eventlog.userinput import check_string_map, parse_interval_ms

APPEND_ONLY_KEY = "delta.appendOnly"
TARGET_FILE_SIZE_KEY = "delta.targetFileSize"
_BOOL_PROPERTIES = (
    APPEND_ONLY_KEY,
    DV_PROPERTY,
    TYPE_WIDENING_PROPERTY,
    ict.ENABLE_KEY,
    CDF_PROPERTY,
    row_tracking.ENABLE_KEY,
    row_tracking.SUSPENDED_KEY,
)
_INT_PROPERTIES = ("delta.checkpointInterval", TARGET_FILE_SIZE_KEY, "delta.dataSkippingNumIndexedCols")
DELETED_FILE_RETENTION_KEY = "delta.deletedFileRetentionDuration"
DEFAULT_DELETED_FILE_RETENTION = "interval 1 week"
_INTERVAL_PROPERTIES = (
    "delta.logRetentionDuration",
    DELETED_FILE_RETENTION_KEY,
    AUDIT_RETENTION_KEY,
    TRUNCATE_HISTORY_RETENTION_KEY,
)

# Interpreted by the streaming sink's auto-compaction (streaming.compaction).
AUTO_COMPACT_KEY = "delta.autoOptimize.autoCompact"


# --------------------------------------------------------------------------- properties


def validate_properties(properties: Mapping[str, str]) -> None:
    """Reject invalid values of the ``delta.*`` properties this library interprets, and keys
    or values the log cannot hold (not strings, empty keys, lone surrogates)."""
    for key, value in check_string_map(properties, "table property").items():
        if key == ISOLATION_LEVEL_KEY:
            IsolationLevel.parse(value)
        elif key in _BOOL_PROPERTIES:
            if value not in ("true", "false"):
                raise InvalidTablePropertyError(key, value, ["true", "false"])
        elif key in _INT_PROPERTIES:
            # ASCII digits only ("²".isdigit() is true), and few enough for int()
            if not (value.isascii() and value.isdigit() and len(value) <= 30) or int(value) <= 0:
                raise InvalidTablePropertyError(key, value, ["a positive integer"])
        elif key == AUTO_COMPACT_KEY:
            if value.strip().lower() not in ("true", "false", "auto", "legacy"):
                raise InvalidTablePropertyError(key, value, ["true", "false", "auto", "legacy"])
        elif key in _INTERVAL_PROPERTIES:
            if not (value.isascii() and len(value) <= 100):
                raise InvalidTablePropertyError(key, value, ["an interval such as 'interval 7 days'"])
            parse_interval_ms(value)
        elif key == CHECKPOINT_POLICY_KEY:  # v2 adds the v2Checkpoint feature (upgrade)
            if value not in ("classic", "v2"):
                raise InvalidTablePropertyError(key, value, ["classic", "v2"])
        elif key == PROTECTION_KEY:
            if not (value.isascii() and value.isdigit() and len(value) <= 18):
                raise InvalidTablePropertyError(key, value, ["a version (an integer >= 0)"])
        elif key == cm.MODE_KEY:
            if value.lower() not in cm.MODES:
                raise InvalidTablePropertyError(key, value, list(cm.MODES))
        elif key.startswith("delta."):
            raise InvalidInputError(f"unknown Delta table property {key!r}")


def table_properties(
    schema: pa.Schema, old: Mapping[str, str], new: Mapping[str, str], *, new_table: bool
) -> tuple[pa.Schema, dict[str, str]]:
    """The schema and properties after the table properties change from ``old`` to ``new``
    (already validated): column mapping's ids and physical names
    (:func:`eventlog.ops.columns.mapping_properties`), and the hidden row-tracking columns
    named when row tracking is turned on."""
    schema, config = columns.mapping_properties(schema, old, new, new_table=new_table)
    return schema, row_tracking.with_column_names(config, schema.names)


def set_properties(plan: PlanBuilder, properties: Mapping[str, str]) -> Plan:
    validate_properties(properties)
    plan.set_operation("SET TBLPROPERTIES", {"properties": dict(properties)}, changes_data=False)
    old = plan.metadata.configuration
    schema, config = table_properties(plan.schema, old, {**old, **properties}, new_table=False)
    metadata = dataclasses.replace(plan.metadata, configuration=config)
    if schema is not plan.schema:  # column mapping turned on: ids and physical names
        metadata = dataclasses.replace(metadata, schema_string=to_spark_schema_json(schema))
    plan.update_metadata(metadata)
    current = read_protocol(plan)
    upgraded = upgrade(current, schema, config)
    if upgraded != current:  # e.g. enabling deletion vectors adds the table feature
        plan.update_protocol(upgraded)
    assert plan.snapshot is not None
    if row_tracking.enabled(upgraded, metadata) and not row_tracking.enabled(current, plan.snapshot.metadata):
        backfill_row_ids(plan)
    return plan.build()


def backfill_row_ids(plan: PlanBuilder) -> None:
    """Row tracking turned on for an existing table: every live file without a ``baseRowId``
    is added again (``dataChange`` false) and gets one at commit, as the protocol asks of
    the version that enables it (Delta Spark does this in a separate backfill commit)."""
    assert plan.snapshot is not None
    missing = [f for f in plan.snapshot.add_files if f.base_row_id is None]
    plan.add_files([dataclasses.replace(f, data_change=False) for f in missing], created=False)
    plan.add_metrics(numBackfilledFiles=len(missing))


def unset_properties(plan: PlanBuilder, keys: Sequence[str]) -> Plan:
    missing = [k for k in keys if k not in plan.metadata.configuration]
    if missing:
        raise InvalidInputError(f"cannot unset table properties that are not set: {missing}")
    plan.set_operation(
        "UNSET TBLPROPERTIES", {"properties": list(keys), "ifExists": "false"}, changes_data=False
    )
    config = {k: v for k, v in plan.metadata.configuration.items() if k not in set(keys)}
    plan.update_metadata(dataclasses.replace(plan.metadata, configuration=config))
    return plan.build()


def add_columns(plan: PlanBuilder, fields: Sequence[pa.Field]) -> Plan:
    schema = plan.schema
    existing = {n.lower() for n in schema.names}
    new_fields = []
    for f in fields:
        if not isinstance(f, pa.Field):
            raise InvalidInputError(f"add_columns takes pyarrow fields, got {f!r}")
        if f.name.lower() in existing:
            raise InvalidInputError(f"column {f.name!r} already exists")
        if not f.nullable:
            raise InvalidInputError(f"added column {f.name!r} must be nullable (existing rows hold null)")
        existing.add(f.name.lower())
        new_fields.append(cm.strip(pa.schema([f])).field(0))  # ids of another table mean nothing here
    if not new_fields:
        raise InvalidInputError("add_columns needs at least one field")
    new_schema = canonical_schema(pa.schema([*schema, *new_fields]))
    plan.set_operation(
        "ADD COLUMNS", {"columns": [{"column": {"name": f.name, "type": str(f.type)}} for f in new_fields]},
        changes_data=False,
    )  # fmt: skip
    change_schema(plan, new_schema)
    return plan.build()


def change_schema(plan: PlanBuilder, new_schema: pa.Schema) -> None:
    # Column mapping: new fields get ids and physical names (maxColumnId follows).
    new_schema, config = columns.evolve_schema(new_schema, plan.metadata.configuration)
    schema_string = to_spark_schema_json(new_schema)
    metadata = dataclasses.replace(plan.metadata, schema_string=schema_string, configuration=config)
    plan.update_metadata(metadata)
    current = read_protocol(plan)
    upgraded = upgrade(current, new_schema, plan.metadata.configuration)
    if upgraded != current:
        plan.update_protocol(upgraded)


def read_protocol(plan: PlanBuilder) -> Protocol:
    assert plan.snapshot is not None
    return plan.snapshot.protocol
