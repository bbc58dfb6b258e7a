"""Planning a streaming micro-batch: the sink's options and the :class:`BatchPlan` every
task and the commit receive, decided once on the driver before any task runs.

The table is named by a :class:`~eventlog.log.location.TableLocation` (a URI and its fsspec
storage options), carried in the plan to the tasks and the commit, so a table on an object
store is reached with the query's options in every process. The options live in memory
only: the engine hands them over again (from the query's options) on every restart, and
nothing of the sink writes them into the table's log or the query's checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from eventlog.errors import (
    InvalidInputError,
    TableNotFoundError,
)
from eventlog.files.constraints import WriteRules
from eventlog.files.datafiles import DEFAULT_TARGET_FILE_SIZE
from eventlog.files.enforce import merge_schema
from eventlog.files.schema import canonical_schema, from_spark_schema_json, to_spark_schema_json
from eventlog.log.location import TableLocation
from eventlog.ops.alter import APPEND_ONLY_KEY, TARGET_FILE_SIZE_KEY
from eventlog.ops.columns import evolve_schema
from eventlog.snapshot.new_table import check_partition_by
from eventlog.table import Table
from eventlog.table.identity import check_identity_write
from eventlog.userinput import check_app_id, check_optional_text
from streaming.compaction import DEFAULT_MIN_FILES

__all__ = ["BatchPlan", "SinkOptions", "plan_batch"]


# --------------------------------------------------------------------------- options and plan


@dataclasses.dataclass(frozen=True)
class SinkOptions:
    """The sink's options (engine-neutral; the Spark glue parses them from strings).

    ``partition_by``: partition columns of a table the first batch creates (an existing
    table's must match). ``app_id``: the txn app id instead of the query id (Delta's
    ``txnAppId``). ``auto_compact``: overrides the table property
    ``delta.autoOptimize.autoCompact`` (None: the property decides); ``auto_compact_min_files``:
    the small-file count of a partition that triggers it.
    """

    slots: str | None = None
    partition_by: tuple[str, ...] | None = None
    merge_schema: bool = False
    user_metadata: str | None = None
    group_commit: bool = False
    app_id: str | None = None
    auto_compact: bool | None = None
    auto_compact_min_files: int = DEFAULT_MIN_FILES

    def __post_init__(self) -> None:
        object.__setattr__(self, "user_metadata", check_optional_text(self.user_metadata, "userMetadata"))
        if self.app_id is not None:
            object.__setattr__(self, "app_id", check_app_id(self.app_id))
        if self.auto_compact_min_files < 1:
            raise InvalidInputError(
                f"autoCompactMinNumFiles must be positive, got {self.auto_compact_min_files}"
            )


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """What the tasks and the commit of one micro-batch need, decided at planning."""

    location: TableLocation
    options: SinkOptions
    complete: bool
    read_version: int  # the latest version at planning; -1: no table yet (the commit creates it)
    schema_json: str  # the schema the batch's files are written with (after mergeSchema)
    partition_by: tuple[str, ...]
    target_file_size: int
    planned_ms: int = 0
    rules: WriteRules = dataclasses.field(default_factory=WriteRules)  # enforced in the tasks

    @property
    def uri(self) -> str:
        return self.location.uri

    def open_table(self, **options: Any) -> Table:
        """A handle on the table (the plan's slots, storage options and durable mode);
        TableNotFoundError."""
        return Table.open(
            self.location.uri,
            slots=self.options.slots,
            storage_options=self.location.storage_options,
            durable=self.location.durable,
            **options,
        )

    def table_exists(self) -> bool:
        return Table.exists(self.location.uri, storage_options=self.location.storage_options)

    @property
    def schema(self) -> pa.Schema:
        return from_spark_schema_json(self.schema_json)


def plan_batch(
    location: str | TableLocation, data_schema: pa.Schema, *, complete: bool, options: SinkOptions
) -> BatchPlan:
    """Open the table (if any) and check that a batch of ``data_schema`` can be written.
    ``location``: a URI, or a :class:`TableLocation` with storage options.

    Raises before any task runs: schema mismatches (naming every offending column),
    ``partitionBy`` differing from the table's, complete mode on an append-only table.
    """
    data_schema = canonical_schema(data_schema)
    location = TableLocation.of(location)
    uri = location.uri
    try:
        table: Table | None = Table.open(uri, slots=options.slots, storage_options=location.storage_options)
    except TableNotFoundError:
        table = None
    props: Mapping[str, str] = {}
    if table is None:
        read_version, schema = -1, data_schema
        parts = tuple(check_partition_by(_resolve(options.partition_by, schema), schema))
    else:
        try:
            snap = table.refresh()
        finally:
            table.close()
        read_version, props = snap.version, snap.properties
        parts = snap.partition_columns
        requested = _resolve(options.partition_by, snap.schema)
        if requested is not None and tuple(requested) != tuple(parts):
            raise InvalidInputError(
                f"partitionBy {requested} differs from the table's partition columns {list(parts)}"
            )
        schema = merge_schema(snap.schema, data_schema) if options.merge_schema else snap.schema
        # Column mapping: new columns get their physical names before any task writes them.
        schema, _ = evolve_schema(schema, props)
        if complete and props.get(APPEND_ONLY_KEY) == "true":
            raise InvalidInputError(
                f"complete output mode replaces the table, which {uri} forbids ({APPEND_ONLY_KEY} = true)"
            )
    rules = WriteRules.of(schema, props)  # enforced in the tasks (streaming.batchfiles)
    supplied = check_identity_write(schema, data_schema, f"streaming write to {uri}")  # identity columns
    rules.conform(supplied, schema, context=f"streaming write to {uri}")
    try:
        target = int(props.get(TARGET_FILE_SIZE_KEY, DEFAULT_TARGET_FILE_SIZE))
    except ValueError:
        target = DEFAULT_TARGET_FILE_SIZE
    return BatchPlan(
        location=location,
        options=options,
        complete=complete,
        read_version=read_version,
        schema_json=to_spark_schema_json(schema),
        partition_by=tuple(parts),
        target_file_size=target,
        planned_ms=int(time.time() * 1000),
        rules=rules,
    )


def _resolve(names: Sequence[str] | None, schema: pa.Schema) -> list[str] | None:
    """Column names as the schema spells them (an exact match first, then case-insensitively)."""
    if names is None:
        return None
    out = []
    for name in names:
        if name in schema.names:
            out.append(name)
            continue
        matches = [n for n in schema.names if n.lower() == name.lower()]
        out.append(matches[0] if len(matches) == 1 else name)  # unknown: check_partition_by names it
    return out
