"""What an operation decides: a :class:`Plan`, built by reading a snapshot.

An operation (:mod:`eventlog.ops`) is a function from a snapshot and its arguments to a
:class:`Plan`: what it read (partition predicates, the files it may rewrite, whole-table
reads, app ids), the actions it stages (adds, removes, metadata, protocol, ``txn`` and
domain actions), the data and deletion-vector files it wrote, and its metrics. It builds
the plan on a :class:`PlanBuilder`, which records reads as the operation scans
(:meth:`PlanBuilder.scan` prunes files the way the conflict checker later assumes) and
writes deletion vectors for the rows it deletes. The transaction then records the plan
(:meth:`eventlog.txn.transaction.CoreTransaction.record`); nothing calls back into it.

Read sets follow Delta Spark, since they decide conflicts: the partition-only part of a
predicate is what concurrent appends are checked against, and the scanned files are what
concurrent removes are checked against.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
from pyroaring import BitMap64, FrozenBitMap64

from eventlog import expr as ex
from eventlog.errors import InvalidInputError, InvalidTextError, TransactionStateError
from eventlog.files import row_tracking
from eventlog.files.change_data import ChangeParts, ChangeRecorder, cdf_enabled
from eventlog.files.column_mapping import with_mode
from eventlog.files.datafiles import delete_files
from eventlog.files.deletion_vectors import dv_file_path, write_deletion_vectors
from eventlog.files.pruning import prune_table
from eventlog.files.scan import read_live_rows
from eventlog.files.schema import from_spark_schema_json
from eventlog.log.actions import (
    AddCDCFile,
    AddFile,
    DeletionVectorDescriptor,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from eventlog.log.commitlog import require_writable
from eventlog.log.filetable import add_files
from eventlog.snapshot import Snapshot
from eventlog.snapshot.protocol import check_writable
from eventlog.txn.attempt import CommitTarget
from eventlog.txn.identity import IdentityRange, generate_identity, reserve
from eventlog.txn.rowlevel import CompactionSource, DvUpdate
from eventlog.userinput import check_app_id, check_json_text, check_text, check_txn_version

__all__ = ["DV_PROPERTY", "Plan", "PlanBuilder", "dv_relative_path"]

DV_PROPERTY = "delta.enableDeletionVectors"


def dv_relative_path(dv: DeletionVectorDescriptor) -> str:
    """Table-relative path of a ``u`` deletion vector file (for cleanup)."""
    return dv_file_path("", dv).lstrip("/")


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything one operation decided (see the module docstring)."""

    operation: str | None = None
    parameters: Mapping[str, str] = dataclasses.field(default_factory=dict)
    changes_data: bool = True
    # reads
    partition_predicates: tuple[ex.Expr, ...] = ()
    predicates: tuple[ex.Expr, ...] = ()
    read_files: Mapping[str, Mapping[str, str | None]] = dataclasses.field(default_factory=dict)
    whole_table: bool = False
    app_ids: frozenset[str] = frozenset()
    # writes
    adds: tuple[AddFile, ...] = ()
    removes: tuple[RemoveFile, ...] = ()
    cdc: tuple[AddCDCFile, ...] = ()  # change data files (eventlog.files.change_data)
    created: tuple[str, ...] = ()  # data, DV and change data files written (table-relative)
    metadata: Metadata | None = None
    protocol: Protocol | None = None
    txns: Mapping[str, SetTransaction] = dataclasses.field(default_factory=dict)
    domains: Mapping[str, DomainMetadata] = dataclasses.field(default_factory=dict)
    metrics: Mapping[str, str] = dataclasses.field(default_factory=dict)
    dv_updates: Mapping[str, DvUpdate] = dataclasses.field(default_factory=dict)
    compaction: tuple[CompactionSource, ...] = ()
    fail_on_any_winner: bool = False
    identity: tuple[IdentityRange, ...] = ()  # identity values generated (eventlog.txn.identity)


class PlanBuilder:
    """Builds a :class:`Plan` while an operation reads ``snapshot`` (see the module docstring).

    ``metadata``/``protocol``: changes already staged before the operation (a table being
    created has no snapshot yet, only the metadata its creator stages).
    """

    def __init__(
        self,
        table: CommitTarget,
        snapshot: Snapshot | None,
        *,
        metadata: Metadata | None = None,
        protocol: Protocol | None = None,
    ) -> None:
        require_writable(table.slots)  # before anything is staged or written
        if snapshot is not None:
            check_writable(snapshot.protocol, snapshot.metadata)  # features we cannot honour
            table.bind_slots(snapshot.table_id)  # refuse another table's slots before writing
        self.table = table
        self.snapshot = snapshot
        self._predicates: list[ex.Expr] = []
        self._full_predicates: list[ex.Expr] = []
        self._read_files: dict[str, Mapping[str, str | None]] = {}
        self._whole_table = False
        self._app_ids: set[str] = set()
        self._adds: list[AddFile] = []
        self._removes: list[RemoveFile] = []
        self._cdc: list[AddCDCFile] = []
        self._changes = ChangeRecorder(self._spill_changes)
        self._created: list[str] = []  # data files written (relative paths)
        self._metadata = metadata
        self._protocol = protocol
        self._txns: dict[str, SetTransaction] = {}
        self._domains: dict[str, DomainMetadata] = {}
        self._operation: str | None = None
        self._params: dict[str, str] = {}
        self._metrics: dict[str, str] = {}
        self._changes_data = True
        self._fail_on_any_winner = False
        self._dv_updates: dict[str, DvUpdate] = {}
        self._pending_deletes: dict[str, tuple[AddFile, FrozenBitMap64, FrozenBitMap64, int]] = {}
        self._compaction: list[CompactionSource] = []
        self._identity: list[IdentityRange] = []

    @property
    def _who(self) -> str:
        return "this operation"

    def _require_open(self) -> None:
        """Hook: a transaction refuses changes once it is no longer open."""

    @property
    def metadata(self) -> Metadata:
        """The metadata the plan writes against (its own change, or what it read)."""
        if self._metadata is not None:
            return self._metadata
        if self.snapshot is None:
            raise TransactionStateError("the table has no metadata yet")
        return self.snapshot.metadata

    @property
    def schema(self) -> pa.Schema:
        if self._metadata is not None:
            return with_mode(
                from_spark_schema_json(self._metadata.schema_string), self._metadata.configuration
            )
        assert self.snapshot is not None
        return self.snapshot.schema

    def set_operation(
        self, operation: str, parameters: Mapping[str, Any] | None = None, *, changes_data: bool = True
    ) -> None:
        """Name the single operation (Delta: one operation per commit)."""
        self._require_open()
        if self._operation is not None:
            raise TransactionStateError(
                f"{self._who} already runs {self._operation}; use one transaction per operation"
            )
        self._operation = operation
        self._params = {k: _param_json(operation, k, v) for k, v in (parameters or {}).items()}
        self._changes_data = changes_data

    def add_metrics(self, **metrics: int | str) -> None:
        for k, v in metrics.items():
            self._metrics[k] = str(v)

    def txn_version(self, app_id: str) -> int:
        """The latest committed version for ``app_id`` (-1 if none); records the read.

        A concurrent commit that writes this app id then fails this transaction with
        ConcurrentTransactionException.
        """
        self._require_open()
        self._app_ids.add(app_id)
        return self.snapshot.txn_version(app_id) if self.snapshot is not None else -1

    def read_whole_table(self) -> None:
        """Declare a dependency on the whole table (any concurrent add or remove conflicts)."""
        self._whole_table = True
        self._predicates.append(ex.TRUE)
        self._full_predicates.append(ex.TRUE)

    def scan(self, predicate: ex.Expr | str | None = None) -> list[AddFile]:
        """Live files that may hold rows matching ``predicate``; records the read.

        Files are pruned by partition values, then skipped by min/max statistics. The
        partition-only part of the predicate (TRUE if none) is what concurrent appends are
        checked against; the returned files are what concurrent removes are checked
        against.
        """
        self._require_open()
        if self.snapshot is None:
            return []
        pred = self.parse_predicate(predicate) if isinstance(predicate, str) else predicate
        self._full_predicates.append(pred if pred is not None else ex.TRUE)
        snap, parts = self.snapshot, self.metadata.partition_columns
        if pred is None or (self.schema.equals(snap.schema) and parts == snap.partition_columns):
            part_pred, selected = snap.select_files(pred)
        else:  # this transaction changed the schema before scanning
            part_pred, selected = prune_table(snap.live_files, pred, self.schema, parts)
        self._predicates.append(part_pred if part_pred is not None else ex.TRUE)
        files = sorted(add_files(selected), key=lambda a: a.path)
        for f in files:
            self._read_files[f.path] = f.partition_values
        return files

    def parse_predicate(self, sql: str, context: str = "predicate") -> ex.Expr:
        return ex.parse_predicate(sql, self.schema, context=context)

    def add_files(self, adds: Iterable[AddFile], *, created: bool = True) -> None:
        """Stage adds; ``created`` marks files this transaction wrote (deleted on failure)."""
        self._require_open()
        for a in adds:
            self._adds.append(a)
            if created:
                self._created.append(a.path)

    def remove_files(self, files: Iterable[AddFile], *, data_change: bool = True) -> None:
        self._require_open()
        now = _now_ms()
        self._removes.extend(f.remove(now, data_change=data_change) for f in files)

    def update_metadata(self, metadata: Metadata) -> None:
        self._require_open()
        self._metadata = metadata

    def update_protocol(self, protocol: Protocol) -> None:
        self._require_open()
        self._protocol = protocol

    def set_app_transaction(self, app_id: str, version: int) -> None:
        """Write ``txn(appId, version)`` with this commit (idempotent writes, streaming)."""
        self._require_open()
        app_id = check_app_id(app_id)
        version = check_txn_version(version)
        existing = self._txns.get(app_id)
        if existing is not None and existing.version != version:
            raise InvalidInputError(
                f"Two SetTransaction actions within the same transaction have the same appId "
                f"{app_id} but different versions {existing.version} and {version}."
            )
        self._txns[app_id] = SetTransaction(app_id, version, _now_ms())

    @property
    def deletion_vectors_enabled(self) -> bool:
        return self.metadata.configuration.get(DV_PROPERTY) == "true"

    def delete_rows(
        self, add: AddFile, positions: Iterable[int], current: FrozenBitMap64, num_rows: int
    ) -> None:
        """Mark physical rows of a live file deleted (written as a DV by :meth:`flush_deletes`)."""
        self._require_open()
        prior = self._pending_deletes.get(add.path)
        base = prior[1] if prior else current
        deleted = FrozenBitMap64((prior[2] if prior else current) | BitMap64(int(p) for p in positions))
        self._pending_deletes[add.path] = (add, base, deleted, num_rows)

    def flush_deletes(self) -> None:
        """Stage the pending row deletes: one DV file for the commit, remove+add per file.

        A file whose every row is deleted is simply removed.
        """
        pending = list(self._pending_deletes.values())
        self._pending_deletes.clear()
        now = _now_ms()
        partial = [p for p in pending if len(p[2]) < p[3]]
        descriptors = write_deletion_vectors(self.table.log.fs, self.table.log.root, [p[2] for p in partial])
        if descriptors:
            self._created.append(dv_relative_path(descriptors[0]))
        by_path = {p[0].path: d for p, d in zip(partial, descriptors, strict=True)}
        for add, base, deleted, num_rows in pending:
            self._removes.append(add.remove(now))
            dv = by_path.get(add.path)
            if dv is not None:
                self._adds.append(add.with_deletion_vector(dv, modification_time=now))
            self._dv_updates[add.path] = DvUpdate(add.path, num_rows, add.key[1], base, deleted)

    @property
    def row_id_columns(self) -> tuple[str, str] | None:
        """The hidden columns that keep rows' stable ids through rewrites (row tracking
        enabled), or None: rows read for a rewrite carry them to the files written."""
        protocol = self._protocol or (self.snapshot.protocol if self.snapshot is not None else None)
        if not row_tracking.enabled(protocol, self.metadata):
            return None
        return row_tracking.materialized_columns(self.metadata.configuration)

    @property
    def change_data_enabled(self) -> bool:
        """Whether the table records its changes (``delta.enableChangeDataFeed``): operations
        then report the rows they change (:meth:`record_changes`)."""
        return cdf_enabled(self.metadata.configuration)

    def record_changes(self, kind: str, rows: pa.Table) -> None:
        """Rows (the table's columns) this operation changed as ``kind`` (insert, delete,
        update_preimage, update_postimage); kept only when the table records changes."""
        if self.change_data_enabled:
            self._changes.rows(kind, row_tracking.split(rows, self.row_id_columns or ())[0])

    def record_changes_later(self, kind: str, rows: Callable[[], pa.Table]) -> None:
        """Rows changed as ``kind`` that readers can tell from the file actions (DV deletes):
        ``rows`` is read only if the commit writes change files for other changes."""
        if self.change_data_enabled:
            self._changes.rows_later(kind, rows)

    def record_removed_files(self, files: Sequence[AddFile]) -> None:
        """Whole files removed unread, for the change data (read only if it needs them)."""
        if self.change_data_enabled:
            self._changes.files_removed(files)

    def record_added_files(self, files: Sequence[AddFile]) -> None:
        """New files written elsewhere (Spark tasks), for the change data (read if needed)."""
        if self.change_data_enabled:
            self._changes.files_added(files)

    def add_change_files(self, cdc: Iterable[AddCDCFile]) -> None:
        """Stage change files written elsewhere (Spark tasks), deleted if the commit fails;
        they must hold every change of the commit (readers then ignore its adds and removes)."""
        self._require_open()
        for c in cdc:
            self._cdc.append(c)
            self._created.append(c.path)

    @property
    def change_files(self) -> tuple[AddCDCFile, ...]:
        """The change files staged so far."""
        return tuple(self._cdc)

    def _spill_changes(self, parts: ChangeParts) -> None:
        """Write a group of change rows as change files now (a large operation's change data
        is not kept until :meth:`build`); staged like the rest, deleted if the commit fails."""
        fs, root, parts_cols = self.table.log.fs, self.table.log.root, self.metadata.partition_columns
        self._stage_changes(ChangeRecorder.write_parts(fs, root, self.schema, parts_cols, parts))

    def _stage_changes(self, cdc: Sequence[AddCDCFile]) -> None:
        self._cdc.extend(cdc)
        self._created.extend(c.path for c in cdc)

    def _write_changes(self) -> None:
        """The change data files of the commit, if its changes need them."""
        if not self._changes.needs_files:
            return
        fs, root, parts = self.table.log.fs, self.table.log.root, self.metadata.partition_columns
        schema = self.schema
        cdc = self._changes.write(
            fs, root, schema, parts, lambda files: read_live_rows(fs, root, files, schema, parts)
        )
        self._changes = ChangeRecorder(self._spill_changes)
        self._stage_changes(cdc)

    def record_compaction(self, sources: Sequence[CompactionSource]) -> None:
        """Declare where compacted files' rows went (lets row-level resolution remap them)."""
        self._compaction.extend(sources)

    def set_domain_metadata(self, domain: str, configuration: str, *, removed: bool = False) -> None:
        self._require_open()
        self._domains[domain] = DomainMetadata(domain, configuration, removed)

    def generate_identity(self, data: pa.Table, schema: pa.Schema, operation: str) -> pa.Table:
        """``data`` with identity values reserved and filled for the identity columns it
        leaves out (:func:`eventlog.txn.identity.generate_identity`); the ranges are recorded."""
        slots, key = self.table.slots, self.table.key
        data, ranges = generate_identity(
            data, schema, lambda column, n: reserve(slots, key, column, n), operation=operation
        )
        self.record_identity(ranges)
        return data

    def record_identity(self, ranges: Iterable[IdentityRange]) -> None:
        """Record identity values written (by Spark tasks, say): the commit moves the marks."""
        self._require_open()
        self._identity.extend(ranges)

    def require_no_concurrent_commits(self) -> None:
        """Fail the commit with ConcurrentWriteException if any commit wins first."""
        self._fail_on_any_winner = True

    # ------------------------------------------------------------------ result

    def build(self) -> Plan:
        """The plan (pending row deletes are written as deletion vectors first)."""
        if self._pending_deletes:
            self.flush_deletes()
        self._write_changes()
        return Plan(
            operation=self._operation,
            parameters=dict(self._params),
            changes_data=self._changes_data,
            partition_predicates=tuple(self._predicates),
            predicates=tuple(self._full_predicates),
            read_files=dict(self._read_files),
            whole_table=self._whole_table,
            app_ids=frozenset(self._app_ids),
            adds=tuple(self._adds),
            removes=tuple(self._removes),
            cdc=tuple(self._cdc),
            created=tuple(self._created),
            metadata=self._metadata,
            protocol=self._protocol,
            txns=dict(self._txns),
            domains=dict(self._domains),
            metrics=dict(self._metrics),
            dv_updates=dict(self._dv_updates),
            compaction=tuple(self._compaction),
            fail_on_any_winner=self._fail_on_any_winner,
            identity=tuple(self._identity),
        )

    def discard_files(self) -> None:
        """Delete the files written so far (the operation failed). Idempotent."""
        if self._created:
            delete_files(self.table.log.fs, self.table.log.root, self._created)
            self._created = []


def _param_json(operation: str, key: str, value: Any) -> str:
    """An operationParameters value as commitInfo holds it (strings as is, others as JSON)."""
    what = f"{operation} parameter {key!r}"
    if isinstance(value, str):
        return check_text(value, what)
    check_json_text(value, what)
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:
        raise InvalidTextError(
            f"{what} cannot be written to the log: {exc}", argument=what, reason=str(exc)
        ) from None


def _now_ms() -> int:
    return int(time.time() * 1000)
