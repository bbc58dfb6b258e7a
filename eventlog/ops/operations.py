"""Write operations planned inside a transaction: what each reads, removes and adds.

Every function here runs *before* commit: it validates its input (raising a typed error
before any file is written), records its reads on the transaction (``txn.scan``), writes
new data files and stages the add/remove actions. Nothing is visible until
``txn.commit()``; on any error the transaction deletes the files it wrote.

Read sets follow Delta Spark, since they decide conflicts:

* append: reads nothing (a blind append);
* overwrite: reads the whole table (TRUE predicate) or the ``replace_where`` predicate;
* delete / update: the predicate (partition part for appends, pruned files for removes);
* optimize: the partition filter; its actions have ``dataChange = false``;
* property and schema changes: a metadata action, which conflicts with every concurrent write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import FrozenBitMap64

from eventlog import expr as ex
from eventlog.errors import (
    AppendOnlyViolationError,
    InvalidInputError,
    InvalidTablePropertyError,
    UnknownColumnError,
)
from eventlog.files.datafiles import DEFAULT_TARGET_FILE_SIZE, write_data_files
from eventlog.files.scan import FileScan, read_file_positions, read_live_rows
from eventlog.files.schema import canonical_schema, conform, merge_schema, to_spark_schema_json
from eventlog.log.actions import AddFile, Protocol
from eventlog.snapshot.isolation import ISOLATION_LEVEL_KEY, IsolationLevel
from eventlog.snapshot.protocol import DV_PROPERTY, upgrade
from eventlog.txn.rowlevel import CompactionSource, compaction_tag
from eventlog.txn.transaction import CoreTransaction as Transaction
from eventlog.userinput import check_string_map

APPEND_ONLY_KEY = "delta.appendOnly"
TARGET_FILE_SIZE_KEY = "delta.targetFileSize"
_BOOL_PROPERTIES = (APPEND_ONLY_KEY, DV_PROPERTY)
_INT_PROPERTIES = ("delta.checkpointInterval", TARGET_FILE_SIZE_KEY, "delta.dataSkippingNumIndexedCols")
DELETED_FILE_RETENTION_KEY = "delta.deletedFileRetentionDuration"
DEFAULT_DELETED_FILE_RETENTION = "interval 1 week"
_INTERVAL_PROPERTIES = ("delta.logRetentionDuration", DELETED_FILE_RETENTION_KEY)
_INTERVAL_UNITS_MS = {
    "millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
    "week": 7 * 86_400_000,
}  # fmt: skip


def parse_interval_ms(value: str) -> int:
    """Delta's ``interval <n> <unit>`` durations (``interval 1 week``) in milliseconds."""
    parts = value.strip().lower().split()
    if len(parts) == 3 and parts[0] == "interval" and parts[1].isdigit():
        unit = parts[2].removesuffix("s")
        if unit in _INTERVAL_UNITS_MS:
            return int(parts[1]) * _INTERVAL_UNITS_MS[unit]
    raise InvalidInputError(f"invalid interval {value!r}; expected e.g. 'interval 7 days'")


# Features whose write rules are not implemented (yet): enabling them is refused rather
# than silently producing tables other Delta writers would consider broken.
_UNSUPPORTED_TRUE = ("delta.enableChangeDataFeed", "delta.enableRowTracking")


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
        elif key in _UNSUPPORTED_TRUE:
            if value != "false":
                raise InvalidTablePropertyError(key, value, ["false (not supported yet)"])
        elif key in _INTERVAL_PROPERTIES:
            if not (value.isascii() and len(value) <= 100):
                raise InvalidTablePropertyError(key, value, ["an interval such as 'interval 7 days'"])
            parse_interval_ms(value)
        elif key.startswith("delta."):
            raise InvalidInputError(f"unknown Delta table property {key!r}")


def check_append_only(txn: Transaction, operation: str) -> None:
    if txn.metadata.configuration.get(APPEND_ONLY_KEY) == "true":
        raise AppendOnlyViolationError(
            f"{operation} is not allowed: table {txn.table.uri} has {APPEND_ONLY_KEY} = true"
        )


def set_properties(txn: Transaction, properties: Mapping[str, str]) -> None:
    validate_properties(properties)
    txn.set_operation("SET TBLPROPERTIES", {"properties": dict(properties)}, changes_data=False)
    config = {**txn.metadata.configuration, **properties}
    txn.update_metadata(dataclasses.replace(txn.metadata, configuration=config))
    current = _read_protocol(txn)
    upgraded = upgrade(current, txn.schema, config)
    if upgraded != current:  # e.g. enabling deletion vectors adds the table feature
        txn.update_protocol(upgraded)


def unset_properties(txn: Transaction, keys: Sequence[str]) -> None:
    missing = [k for k in keys if k not in txn.metadata.configuration]
    if missing:
        raise InvalidInputError(f"cannot unset table properties that are not set: {missing}")
    txn.set_operation(
        "UNSET TBLPROPERTIES", {"properties": list(keys), "ifExists": "false"}, changes_data=False
    )
    config = {k: v for k, v in txn.metadata.configuration.items() if k not in set(keys)}
    txn.update_metadata(dataclasses.replace(txn.metadata, configuration=config))


def add_columns(txn: Transaction, fields: Sequence[pa.Field]) -> None:
    schema = txn.schema
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
        new_fields.append(f)
    if not new_fields:
        raise InvalidInputError("add_columns needs at least one field")
    new_schema = canonical_schema(pa.schema([*schema, *new_fields]))
    txn.set_operation(
        "ADD COLUMNS", {"columns": [{"column": {"name": f.name, "type": str(f.type)}} for f in new_fields]},
        changes_data=False,
    )  # fmt: skip
    _change_schema(txn, new_schema)


def _change_schema(txn: Transaction, new_schema: pa.Schema) -> None:
    txn.update_metadata(dataclasses.replace(txn.metadata, schema_string=to_spark_schema_json(new_schema)))
    current = _read_protocol(txn)
    upgraded = upgrade(current, new_schema, txn.metadata.configuration)
    if upgraded != current:
        txn.update_protocol(upgraded)


def _read_protocol(txn: Transaction) -> Protocol:
    assert txn.snapshot is not None
    return txn.snapshot.protocol


# --------------------------------------------------------------------------- data writes


def to_arrow_table(data: Any) -> pa.Table:
    """Accept a pyarrow Table / RecordBatch / RecordBatchReader or a pandas DataFrame."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if type(data).__name__ == "DataFrame" and hasattr(data, "to_records"):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise InvalidInputError(f"expected a pyarrow Table or RecordBatch, got {type(data).__name__}")


def _target_size(txn: Transaction) -> int:
    return int(txn.metadata.configuration.get(TARGET_FILE_SIZE_KEY, DEFAULT_TARGET_FILE_SIZE))


def write_rows(txn: Transaction, data: pa.Table, *, data_change: bool = True) -> list[AddFile]:
    """Write conformed rows as new data files and stage their adds."""
    if data.num_rows == 0:
        return []
    adds = write_data_files(
        txn.table.log.fs,
        txn.table.log.root,
        data,
        partition_columns=txn.metadata.partition_columns,
        data_change=data_change,
        target_file_size=_target_size(txn),
    )
    txn.add_files(adds)
    return adds


def _prepare_data(txn: Transaction, data: Any, schema_mode: str | None, context: str) -> pa.Table:
    table = to_arrow_table(data)
    if schema_mode not in (None, "merge"):
        raise InvalidInputError(f"schema_mode must be None or 'merge', got {schema_mode!r}")
    schema = txn.schema
    if schema_mode == "merge":
        merged = merge_schema(schema, canonical_schema(table.schema))
        if not merged.equals(schema):
            _change_schema(txn, merged)
            schema = merged
    return conform(table, schema, context=context)


def append(txn: Transaction, data: Any, *, schema_mode: str | None = None) -> None:
    """Blind append: reads nothing, so it cannot conflict with concurrent data changes."""
    parts = list(txn.metadata.partition_columns)
    txn.set_operation("WRITE", {"mode": "Append", "partitionBy": parts})
    table = _prepare_data(txn, data, schema_mode, "append")
    adds = write_rows(txn, table)
    txn.add_metrics(
        numFiles=len(adds), numOutputRows=table.num_rows, numOutputBytes=sum(a.size for a in adds)
    )


def overwrite(
    txn: Transaction, data: Any, *, replace_where: str | None = None, schema_mode: str | None = None
) -> None:
    """Replace the table's rows (or the rows matching ``replace_where``) with ``data``."""
    params: dict[str, Any] = {"mode": "Overwrite", "partitionBy": list(txn.metadata.partition_columns)}
    if replace_where is not None:
        ex.check_sql_text(replace_where, "replace_where")
        params["predicate"] = [replace_where]
    txn.set_operation("WRITE", params)
    check_append_only(txn, "overwrite")
    table = _prepare_data(txn, data, schema_mode, "overwrite")
    pred = txn.parse_predicate(replace_where, "replace_where") if replace_where is not None else None
    if pred is not None:
        ok = ex.evaluate_mask(pred, table)
        if pc.sum(ok).as_py() != table.num_rows and table.num_rows:
            raise InvalidInputError(
                f"Data written out does not match replaceWhere '{replace_where}': "
                f"{table.num_rows - (pc.sum(ok).as_py() or 0)} rows fall outside it"
            )
    files = txn.scan(pred)
    removed, deleted_rows, copied = _remove_rows(txn, files, pred)
    adds = write_rows(txn, table)
    txn.add_metrics(
        numFiles=len(adds), numOutputRows=table.num_rows, numRemovedFiles=removed,
        numDeletedRows=deleted_rows, numCopiedRows=copied,
    )  # fmt: skip


def _evolve_schema(txn: Transaction, written_schema: pa.Schema | None) -> None:
    """``mergeSchema`` for files written elsewhere: adopt their schema if it only adds columns."""
    if written_schema is None:
        return
    schema = txn.schema
    merged = merge_schema(schema, canonical_schema(written_schema))
    if not merged.equals(schema):
        _change_schema(txn, merged)


def append_files(
    txn: Transaction, adds: Sequence[AddFile], *, schema: pa.Schema | None = None, num_rows: int | None = None
) -> None:
    """A blind append of data files an engine (Spark tasks) already wrote and conformed.

    ``schema``: the written files' schema, when it may add columns (mergeSchema); the
    files are deleted if the commit fails.
    """
    txn.set_operation("WRITE", {"mode": "Append", "partitionBy": list(txn.metadata.partition_columns)})
    _evolve_schema(txn, schema)
    txn.add_files(adds)
    rows = num_rows if num_rows is not None else sum(a.num_records or 0 for a in adds)
    txn.add_metrics(numFiles=len(adds), numOutputRows=rows, numOutputBytes=sum(a.size for a in adds))


def overwrite_files(
    txn: Transaction,
    adds: Sequence[AddFile],
    *,
    replace_where: str | None = None,
    schema: pa.Schema | None = None,
    num_rows: int | None = None,
) -> None:
    """Replace the table's rows (or those matching ``replace_where``) with files already
    written. The writer must have checked that every new row satisfies ``replace_where``."""
    params: dict[str, Any] = {"mode": "Overwrite", "partitionBy": list(txn.metadata.partition_columns)}
    if replace_where is not None:
        ex.check_sql_text(replace_where, "replace_where")
        params["predicate"] = [replace_where]
    txn.set_operation("WRITE", params)
    check_append_only(txn, "overwrite")
    _evolve_schema(txn, schema)
    pred = txn.parse_predicate(replace_where, "replace_where") if replace_where is not None else None
    files = txn.scan(pred)
    removed, deleted_rows, copied = _remove_rows(txn, files, pred)
    txn.add_files(adds)
    rows = num_rows if num_rows is not None else sum(a.num_records or 0 for a in adds)
    txn.add_metrics(
        numFiles=len(adds), numOutputRows=rows, numRemovedFiles=removed, numDeletedRows=deleted_rows,
        numCopiedRows=copied,
    )  # fmt: skip


def delete(txn: Transaction, predicate: str | None) -> None:
    if predicate is not None:
        ex.check_sql_text(predicate)
    txn.set_operation("DELETE", {"predicate": [predicate] if predicate else []})
    check_append_only(txn, "DELETE")
    pred = txn.parse_predicate(predicate) if predicate is not None else None
    files = txn.scan(pred)
    removed, deleted, copied = _remove_rows(txn, files, pred)
    txn.add_metrics(numRemovedFiles=removed, numDeletedRows=deleted, numCopiedRows=copied)


def _read(txn: Transaction, files: Sequence[AddFile]) -> pa.Table:
    """Live rows of ``files`` (deletion vectors applied)."""
    return read_live_rows(
        txn.table.log.fs, txn.table.log.root, files, txn.schema, txn.metadata.partition_columns
    )


def _live_rows(f: AddFile) -> int:
    dv = f.deletion_vector.cardinality if f.deletion_vector is not None else 0
    return (f.num_records or 0) - dv


def _matching_files(
    txn: Transaction, files: Sequence[AddFile], pred: ex.Expr | None
) -> list[tuple[FileScan, np.ndarray]]:
    """Per file with at least one live row matching ``pred``: (the opened file, physical
    positions of its matching live rows). Reads only the predicate's columns, of only the
    row groups whose statistics allow a match; full rows are read later, where needed."""
    out = []
    for f in files:
        scan = FileScan(txn.table.log.fs, txn.table.log.root, f, txn.schema, txn.metadata.partition_columns)
        matched = scan.matching_positions(pred)
        if matched.size:
            out.append((scan, matched))
    return out


def removes_whole_files(txn: Transaction, pred: ex.Expr | None) -> bool:
    """Whether removing the rows matching ``pred`` removes whole files, unread: true for no
    predicate and for one on partition columns only (every row of a pruned file matches)."""
    parts = set(txn.metadata.partition_columns)
    return pred is None or {c.name for c in ex.referenced_columns(pred)} <= parts


def remove_whole_files(txn: Transaction, files: Sequence[AddFile]) -> tuple[int, int, int]:
    """Stage removes of ``files``; (files removed, live rows deleted, rows copied = 0)."""
    txn.remove_files(files)
    return len(files), sum(_live_rows(f) for f in files), 0


def _remove_rows(txn: Transaction, files: Sequence[AddFile], pred: ex.Expr | None) -> tuple[int, int, int]:
    """Remove the rows matching ``pred`` from ``files``: whole files when every row
    matches (always, for a partition-only predicate); otherwise mark the rows in deletion
    vectors (tables with DVs enabled) or rewrite the surviving rows.
    Returns (files changed, rows deleted, rows copied)."""
    if removes_whole_files(txn, pred):
        return remove_whole_files(txn, files)
    use_dv = txn.deletion_vectors_enabled
    touched: list[AddFile] = []
    survivors: list[pa.Table] = []
    deleted = 0
    for scan, matched in _matching_files(txn, files, pred):
        deleted += matched.size
        touched.append(scan.add)
        if use_dv:  # nothing more to read: the positions are the deletion vector
            txn.delete_rows(scan.add, matched, scan.deleted, scan.num_rows)
            continue
        rows, hit = scan.live_rows_marked(matched)
        survivors.append(rows.filter(pc.invert(hit)))
    if use_dv:
        txn.flush_deletes()
        return len(touched), deleted, 0
    txn.remove_files(touched)
    kept = pa.concat_tables(survivors) if survivors else None
    if kept is not None and kept.num_rows:
        write_rows(txn, kept)
    return len(touched), deleted, kept.num_rows if kept is not None else 0


def parse_assignments(txn: Transaction, assignments: Mapping[str, str], **kw: Any) -> dict[str, ex.Expr]:
    """SET column = expression pairs, the column names resolved case-insensitively."""
    schema = txn.schema
    by_lower = {n.lower(): n for n in schema.names}
    out: dict[str, ex.Expr] = {}
    for column, sql in assignments.items():
        name = by_lower.get(column.lower())
        if name is None:
            raise UnknownColumnError(column, list(schema.names), "SET")
        out[name] = ex.parse_expression(sql, schema, context=f"SET {name}", **kw)
    return out


def apply_assignments(
    rows: pa.Table, mask: pa.Array | None, assignments: Mapping[str, ex.Expr], schema: pa.Schema,
    source: pa.Table | None = None, resolve: Any = None,
) -> pa.Table:  # fmt: skip
    """Rows with the assignments applied where ``mask`` is true (everywhere when None)."""
    env = rows if source is None else source
    out = rows
    for name, expr in assignments.items():
        field = schema.field(name)
        try:
            value = ex.evaluate(expr, env, resolve)
            value = pc.cast(value, field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise InvalidInputError(f"cannot assign to column {name!r} ({field.type}): {exc}") from exc
        if mask is not None:
            value = pc.if_else(mask, value, rows[name])
        out = out.set_column(out.schema.get_field_index(name), field, value)
    return out


def update(txn: Transaction, predicate: str | None, assignments: Mapping[str, str]) -> None:
    if predicate is not None:
        ex.check_sql_text(predicate)
    txn.set_operation("UPDATE", {"predicate": [predicate] if predicate else []})
    check_append_only(txn, "UPDATE")
    if not assignments:
        raise InvalidInputError("UPDATE needs at least one SET assignment")
    pred = txn.parse_predicate(predicate) if predicate is not None else None
    exprs = parse_assignments(txn, assignments)
    files = txn.scan(pred)
    use_dv = txn.deletion_vectors_enabled
    touched: list[AddFile] = []
    rewritten: list[pa.Table] = []
    updated = copied = 0
    for scan, matched in _matching_files(txn, files, pred):
        hits = matched.size
        touched.append(scan.add)
        updated += hits
        if use_dv:
            # The old images become DV-deleted rows; the new images go to a new file: only
            # the matched rows are read in full.
            txn.delete_rows(scan.add, matched, scan.deleted, scan.num_rows)
            rewritten.append(apply_assignments(scan.rows_at(matched), None, exprs, txn.schema))
        else:
            rows, hit = scan.live_rows_marked(matched)
            copied += rows.num_rows - hits
            rewritten.append(apply_assignments(rows, hit, exprs, txn.schema))
    if rewritten:
        new_rows = conform(pa.concat_tables(rewritten), txn.schema, context="update")
        if use_dv:
            txn.flush_deletes()
        else:
            txn.remove_files(touched)
        write_rows(txn, new_rows)
    txn.add_metrics(numRemovedFiles=len(touched), numUpdatedRows=updated, numCopiedRows=copied)


def restore(txn: Transaction, version: int) -> None:
    """Make the table's live files those of ``version`` again (Delta's RESTORE).

    The adds and removes are computed from the read version, so any concurrent commit
    fails it with ConcurrentWriteException (Delta Spark commits RESTORE with
    ``commitLarge``, which tolerates no concurrent commit).
    """
    current = txn.snapshot
    assert current is not None
    target = txn.table.snapshot(version)
    txn.set_operation("RESTORE", {"version": version, "timestamp": None})
    txn.require_no_concurrent_commits()
    txn.read_whole_table()
    if target.metadata != current.metadata:
        txn.update_metadata(dataclasses.replace(target.metadata))
    to_remove = [f for k, f in current.files.items() if k not in target.files]
    to_add = [
        dataclasses.replace(f, data_change=True) for k, f in target.files.items() if k not in current.files
    ]
    txn.remove_files(to_remove)
    txn.add_files(to_add, created=False)
    txn.add_metrics(
        numRemovedFiles=len(to_remove), numRestoredFiles=len(to_add), tableSizeAfterRestore=sum(
            f.size for f in target.files.values()
        ),
    )  # fmt: skip


# --------------------------------------------------------------------------- optimize


def begin_optimize(
    txn: Transaction, zorder_by: Sequence[str] | None, partition_filter: str | None
) -> tuple[list[str], ex.Expr | None]:
    """Validate an OPTIMIZE's arguments and name the operation; (Z-order columns, filter).

    Shared by every engine that runs OPTIMIZE (here and the Spark adapter), so they reject
    the same input and record the same operation.
    """
    zorder = list(zorder_by or [])
    schema = txn.schema
    parts = txn.metadata.partition_columns
    for col in zorder:
        if col not in schema.names:
            raise UnknownColumnError(col, list(schema.names), "zorder_by")
        if col in parts:
            raise InvalidInputError(f"cannot Z-order by partition column {col!r}")
    if partition_filter is not None:
        ex.check_sql_text(partition_filter, "partition_filter")
    txn.set_operation(
        "OPTIMIZE", {"predicate": [partition_filter] if partition_filter else [], "zOrderBy": zorder},
        changes_data=False,
    )  # fmt: skip
    pred = None
    if partition_filter is not None:
        pred = txn.parse_predicate(partition_filter, "partition_filter")
        outside = [c.name for c in ex.referenced_columns(pred) if c.name not in parts]
        if outside:
            raise InvalidInputError(f"OPTIMIZE's filter may only use partition columns, not {outside}")
    return zorder, pred


def optimize(
    txn: Transaction,
    *,
    zorder_by: Sequence[str] | None = None,
    partition_filter: str | None = None,
    target_size: int | None = None,
) -> None:
    """Compact small files per partition (bin packing), optionally Z-ordered.

    All actions carry ``dataChange = false``, so the commit runs at snapshot isolation:
    it survives concurrent appends but not a concurrent delete of a file it read.
    """
    zorder, pred = begin_optimize(txn, zorder_by, partition_filter)
    parts = txn.metadata.partition_columns
    target = target_size or _target_size(txn)
    files = txn.scan(pred)
    groups: dict[tuple[tuple[str, str | None], ...], list[AddFile]] = {}
    for f in files:
        groups.setdefault(tuple(sorted(f.partition_values.items())), []).append(f)
    removed = added = 0
    # On row-level-concurrency tables a plain compaction records where each source's rows
    # went, so concurrent DV deletes on its inputs can be carried over instead of failing
    # it; a Z-order permutes rows and keeps the file-level rules ("can conflict only when
    # ZORDER BY is used").
    mapped = not zorder and txn.deletion_vectors_enabled and not parts
    for group in groups.values():
        for bin_ in plan_bins(group, target, rewrite_all=bool(zorder)):
            txn.remove_files(bin_, data_change=False)
            removed += len(bin_)
            if mapped:
                _compact_mapped(txn, bin_)
                added += 1
                continue
            rows = _read(txn, bin_)
            if zorder:
                rows = rows.take(zorder_permutation(rows, zorder))
            added += len(write_rows(txn, rows, data_change=False))
    txn.add_metrics(numRemovedFiles=removed, numAddedFiles=added)


def _compact_mapped(txn: Transaction, sources: Sequence[AddFile]) -> None:
    """Compact ``sources`` into exactly one file whose tags say where each source's rows went."""
    fs, root = txn.table.log.fs, txn.table.log.root
    parts: list[pa.Table] = []
    records: list[tuple[AddFile, FrozenBitMap64, int, int]] = []
    offset = 0
    for f in sources:
        rows, _, current, physical = read_file_positions(
            fs, root, f, txn.schema, txn.metadata.partition_columns
        )
        records.append((f, current, physical, offset))
        parts.append(rows)
        offset += rows.num_rows
    (add,) = write_data_files(
        fs, root, pa.concat_tables(parts), partition_columns=(), data_change=False, target_file_size=2**62
    )
    compaction = [
        CompactionSource(f.path, f.key[1], current, physical, add.path, start)
        for f, current, physical, start in records
    ]
    txn.add_files([dataclasses.replace(add, tags={**(add.tags or {}), **compaction_tag(compaction)})])
    txn.record_compaction(compaction)


def plan_bins(files: Sequence[AddFile], target: int, *, rewrite_all: bool) -> list[list[AddFile]]:
    """OPTIMIZE's bins for one partition: small files packed up to ``target`` bytes
    (bins of one file are left alone), or every file when rewriting all (Z-order)."""
    if rewrite_all:
        return [list(files)] if files else []
    small = sorted((f for f in files if f.size < target), key=lambda f: f.size)
    bins: list[list[AddFile]] = []
    current: list[AddFile] = []
    size = 0
    for f in small:
        if current and size + f.size > target:
            bins.append(current)
            current, size = [], 0
        current.append(f)
        size += f.size
    if current:
        bins.append(current)
    return [b for b in bins if len(b) > 1]


def zorder_permutation(rows: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """Row order along a Z-order curve: interleave the bits of each column's dense rank."""
    k = len(columns)
    bits = max(1, 63 // k)
    z = np.zeros(rows.num_rows, dtype=np.uint64)
    for i, col in enumerate(columns):
        try:
            rank = pc.rank(rows[col], sort_keys="ascending", tiebreaker="dense")
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise InvalidInputError(f"cannot Z-order by column {col!r} of type {rows[col].type}") from exc
        r = rank.to_numpy().astype(np.uint64) - np.uint64(1)
        top = int(r.max()) if len(r) else 0
        shift = max(0, top.bit_length() - bits)
        r = r >> np.uint64(shift)
        for b in range(bits):
            z |= ((r >> np.uint64(b)) & np.uint64(1)) << np.uint64(b * k + i)
    return np.argsort(z, kind="stable")
