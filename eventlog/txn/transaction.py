"""Transactions: record what was read, stage new files, validate and publish at commit.

A :class:`Transaction` pins the snapshot it reads (its *read version*). Each operation
records its reads (partition predicates, files, whole-table reads, app ids read through
:meth:`Transaction.txn_version`) and stages new data files; :meth:`commit` publishes one
new version through the commit pipeline::

    prepare actions (commitInfo first, isBlindAppend, effective isolation level)
      -> stage  _delta_log/_staged_commits/<txnId>.json
      -> loop:  latest = slots.latest()  (finishing any half-published slot first)
                conflict-check every commit in (checked, latest]   -- pure, no I/O inside
                claim slot latest+1 with (txnId, staged name, owner)
                  granted -> publish <N>.json (put-if-absent), mark slot complete, done
                  taken   -> back off (exponential, jittered), loop
      -> on a conflict or an exhausted budget: nothing was claimed, so the staged commit
         and the data files this transaction wrote are deleted before raising.

The loop lives in :mod:`eventlog.txn.commitloop`; with group commit, pure blind appends take
the queue of :mod:`eventlog.txn.groupcommit` instead.

The transaction id is stable across attempts. Only one operation per transaction, as in
Delta; the lower-level primitives (:meth:`scan`, :meth:`add_files`, :meth:`remove_files`,
:meth:`set_app_transaction`) let adapters (Spark, streaming) build commits of their own.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
from pyroaring import BitMap64, FrozenBitMap64

from eventlog import expr as ex
from eventlog.errors import (
    CommitStateUnknownError,
    InvalidInputError,
    InvalidTextError,
    TransactionStateError,
)
from eventlog.files.datafiles import delete_files
from eventlog.files.deletion_vectors import dv_file_path, write_deletion_vectors
from eventlog.files.pruning import data_schema, prune_files
from eventlog.files.schema import from_spark_schema_json
from eventlog.log.actions import (
    ENGINE_INFO,
    Action,
    AddFile,
    CommitInfo,
    DeletionVectorDescriptor,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    action_name,
    encode_action,
)
from eventlog.snapshot import Snapshot
from eventlog.snapshot.isolation import IsolationLevel, effective_isolation_level
from eventlog.txn.attempt import CommitAttempt, CommitResult, CommitTarget, PendingCommit
from eventlog.txn.commitloop import CommitLoop
from eventlog.txn.conflicts import ReadSet, TransactionSummary
from eventlog.txn.groupcommit import GroupCommitLoop, groupable
from eventlog.txn.rowlevel import CompactionSource, DvUpdate
from eventlog.userinput import (
    check_app_id,
    check_json_text,
    check_optional_text,
    check_text,
    check_txn_version,
)

__all__ = ["DV_PROPERTY", "CommitResult", "CoreTransaction", "dv_relative_path"]


DV_PROPERTY = "delta.enableDeletionVectors"


def dv_relative_path(dv: DeletionVectorDescriptor) -> str:
    """Table-relative path of a ``u`` deletion vector file (for cleanup)."""
    return dv_file_path("", dv).lstrip("/")


class CoreTransaction:
    """One atomic change to a table; see the module docstring."""

    def __init__(self, table: CommitTarget, snapshot: Snapshot | None) -> None:
        self.table = table
        self.snapshot = snapshot
        self.read_version = snapshot.version if snapshot is not None else -1
        self.txn_id = str(uuid.uuid4())
        self._predicates: list[ex.Expr] = []
        self._read_files: dict[str, Mapping[str, str | None]] = {}
        self._whole_table = False
        self._app_ids: set[str] = set()
        self._adds: list[AddFile] = []
        self._removes: list[RemoveFile] = []
        self._created: list[str] = []  # data files this transaction wrote (relative paths)
        self._metadata: Metadata | None = None
        self._protocol: Protocol | None = None
        self._txns: dict[str, SetTransaction] = {}
        self._domains: dict[str, DomainMetadata] = {}
        self._operation: str | None = None
        self._params: dict[str, str] = {}
        self._metrics: dict[str, str] = {}
        self._changes_data = True
        self._skip = False
        self._fail_on_any_winner = False
        self._full_predicates: list[ex.Expr] = []
        self._dv_updates: dict[str, DvUpdate] = {}
        self._pending_deletes: dict[str, tuple[AddFile, FrozenBitMap64, FrozenBitMap64, int]] = {}
        self._compaction: list[CompactionSource] = []
        self._user_metadata: str | None = None
        self._state = "open"

    # ------------------------------------------------------------------ state

    @property
    def metadata(self) -> Metadata:
        """The metadata this transaction writes against (its own change, or what it read)."""
        if self._metadata is not None:
            return self._metadata
        if self.snapshot is None:
            raise TransactionStateError("the table has no metadata yet")
        return self.snapshot.metadata

    @property
    def schema(self) -> pa.Schema:
        if self._metadata is not None:
            return from_spark_schema_json(self._metadata.schema_string)
        assert self.snapshot is not None
        return self.snapshot.schema

    @property
    def user_metadata(self) -> str | None:
        """Delta's ``userMetadata``: free text recorded in this commit's commitInfo."""
        return self._user_metadata

    @user_metadata.setter
    def user_metadata(self, value: str | None) -> None:
        self._user_metadata = check_optional_text(value, "userMetadata")

    def _require_open(self) -> None:
        if self._state != "open":
            raise TransactionStateError(f"transaction {self.txn_id} is already {self._state}")

    def set_operation(
        self, operation: str, parameters: Mapping[str, Any] | None = None, *, changes_data: bool = True
    ) -> None:
        """Name this transaction's single operation (Delta: one operation per commit)."""
        self._require_open()
        if self._operation is not None:
            raise TransactionStateError(
                f"transaction {self.txn_id} already runs {self._operation}; use one transaction per operation"
            )
        self._operation = operation
        self._params = {k: _param_json(operation, k, v) for k, v in (parameters or {}).items()}
        self._changes_data = changes_data

    def add_metrics(self, **metrics: int | str) -> None:
        for k, v in metrics.items():
            self._metrics[k] = str(v)

    # ------------------------------------------------------------------ reads

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
        files: list[AddFile] = list(self.snapshot.add_files)
        self._full_predicates.append(pred if pred is not None else ex.TRUE)
        if pred is None:
            self._predicates.append(ex.TRUE)
        else:
            part_pred, files = prune_files(files, pred, self.schema, self.metadata.partition_columns)
            self._predicates.append(part_pred if part_pred is not None else ex.TRUE)
        for f in files:
            self._read_files[f.path] = f.partition_values
        return files

    def parse_predicate(self, sql: str, context: str = "predicate") -> ex.Expr:
        return ex.parse_predicate(sql, self.schema, context=context)

    # ------------------------------------------------------------------ writes

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

    def idempotent(self, app_id: str | None, version: int | None) -> bool:
        """Delta's ``txnAppId``/``txnVersion``: False (and a no-op commit) if already applied.

        Both must be given, or neither. Reading the stored version registers ``app_id`` as
        read, so a concurrent writer of the same app id fails this one.
        """
        if app_id is None and version is None:
            return True
        if app_id is None or version is None:
            raise InvalidInputError("Both txnVersion and txnAppId must be specified for idempotent writes.")
        app_id = check_app_id(app_id)
        version = check_txn_version(version, "txnVersion")
        if self.txn_version(app_id) >= version:
            self._skip = True
            return False
        self.set_app_transaction(app_id, version)
        return True

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
                self._adds.append(
                    dataclasses.replace(add, deletion_vector=dv, data_change=True, modification_time=now)
                )
            self._dv_updates[add.path] = DvUpdate(add.path, num_rows, add.key[1], base, deleted)

    def record_compaction(self, sources: Sequence[CompactionSource]) -> None:
        """Declare where compacted files' rows went (lets row-level resolution remap them)."""
        self._compaction.extend(sources)

    def set_domain_metadata(self, domain: str, configuration: str, *, removed: bool = False) -> None:
        self._require_open()
        self._domains[domain] = DomainMetadata(domain, configuration, removed)

    # ------------------------------------------------------------------ staging
    #
    # One rule for every operation (see :mod:`eventlog.ops.transaction`): running it only
    # *stages* it; :meth:`commit` checks it against the commits that won meanwhile and
    # publishes it. An operation that fails aborts the transaction, deleting whatever files
    # it wrote, so the table is left exactly as it was.

    def stage(self, operation: Callable[[], object]) -> None:
        """Run ``operation`` (which stages actions on this transaction); on any error,
        abort the transaction (its written files are deleted) and re-raise."""
        self._require_open()
        try:
            operation()
        except BaseException:
            self.abort()
            raise

    def require_no_concurrent_commits(self) -> None:
        """Fail the commit with ConcurrentWriteException if any commit wins first."""
        self._fail_on_any_winner = True

    # ------------------------------------------------------------------ commit

    def abort(self) -> None:
        """Give up: delete the data files this transaction wrote. Idempotent."""
        if self._state == "open":
            self._state = "aborted"
        self._cleanup_data_files()

    def _cleanup_data_files(self) -> None:
        if self._created:
            delete_files(self.table.log.fs, self.table.log.root, self._created)
            self._created = []

    def _prepare(self) -> tuple[list[Action], CommitInfo, IsolationLevel]:
        if self._operation is None:
            raise TransactionStateError("nothing to commit: no operation was run in this transaction")
        body: list[Action] = []
        if self._protocol is not None:
            body.append(self._protocol)
        if self._metadata is not None:
            body.append(self._metadata)
        body.extend(self._txns.values())
        body.extend(self._domains.values())
        body.extend(self._removes)
        body.extend(self._adds)
        _reject_duplicate_files(self._adds, self._removes)
        _reject_unencodable(body)
        table_level = IsolationLevel.of_table(self.metadata.configuration)
        level = effective_isolation_level(table_level, body, changes_data=self._changes_data)
        depends = bool(self._predicates) or bool(self._read_files) or self._whole_table
        only_adds = not self._removes
        info = CommitInfo(
            timestamp=_now_ms(),
            operation=self._operation,
            operation_parameters=self._params,
            read_version=self.read_version if self.read_version >= 0 else None,
            isolation_level=level.value,
            is_blind_append=only_adds and not depends,
            txn_id=self.txn_id,
            engine_info=ENGINE_INFO,
            user_metadata=self.user_metadata,
            operation_metrics=self._metrics,
        )
        _reject_unencodable([info])
        return body, info, level

    def summary(self, level: IsolationLevel, is_blind_append: bool) -> TransactionSummary:
        snap = self.snapshot
        return TransactionSummary(
            table=self.table.uri,
            read_version=self.read_version,
            read_protocol=snap.protocol if snap is not None else None,
            read_metadata=snap.metadata if snap is not None else None,
            partition_schema=snap.partition_schema if snap is not None else pa.schema([]),
            read_set=ReadSet(
                partition_predicates=tuple(self._predicates),
                files=dict(self._read_files),
                whole_table=self._whole_table,
                app_ids=frozenset(self._app_ids),
                predicates=tuple(self._full_predicates),
            ),
            isolation_level=level,
            is_blind_append=is_blind_append,
            metadata=self._metadata,
            protocol=self._protocol,
            removes=tuple(self._removes),
            domains=tuple(self._domains.values()),
            adds=tuple(self._adds),
            row_level=self._row_level(),
            data_schema=data_schema(self.schema, self.metadata.partition_columns),
            dv_updates=dict(self._dv_updates),
            compaction=tuple(self._compaction),
            fail_on_any_winner=self._fail_on_any_winner,
        )

    def _row_level(self) -> bool:
        """Row-level concurrency applies to DV-enabled tables without partition columns."""
        snap = self.snapshot
        return (
            snap is not None
            and snap.metadata.configuration.get(DV_PROPERTY) == "true"
            and not snap.partition_columns
        )

    def pending(self) -> PendingCommit:
        """This transaction's prepared commit, as the commit loops take it (validates it)."""
        body, info, level = self._prepare()
        return PendingCommit(
            txn_id=self.txn_id,
            read_version=self.read_version,
            info=info,
            body=tuple(body),
            summary=self.summary(level, bool(info.is_blind_append)),
            created=tuple(self._created),
        )

    def commit(self) -> CommitResult:
        """Validate against every commit that won since the read version, then publish."""
        self._require_open()
        if self._skip:
            self._state = "committed"
            self._cleanup_data_files()
            return CommitResult(self.read_version, 0, self._operation or "", {}, self.txn_id, skipped=True)
        try:
            attempt = CommitAttempt(self.table, self.pending())
        except BaseException:
            self.abort()
            raise
        self._state = "committing"
        grouped = self.table.group_commit and groupable(attempt.summary, attempt.body)
        try:
            result = GroupCommitLoop(attempt).run() if grouped else CommitLoop(attempt).run()
        except CommitStateUnknownError:
            self._state = "unknown"  # keep every staged file: the commit may have landed
            raise
        except BaseException:
            self._state = "failed"
            if not attempt.may_still_land:
                self._cleanup_data_files()
            raise
        self._created = []  # the loop deleted those the final commit does not reference
        self._state = "committed"
        return result


def _reject_duplicate_files(adds: Sequence[AddFile], removes: Sequence[RemoveFile]) -> None:
    seen: set[tuple[str, str | None]] = set()
    for a in adds:
        if a.key in seen:
            raise InvalidInputError(f"file {a.path} is added twice in one commit")
        seen.add(a.key)
    gone: set[tuple[str, str | None]] = set()
    for r in removes:
        if r.key in gone or r.key in seen:
            raise InvalidInputError(f"file {r.path} is added or removed twice in one commit")
        gone.add(r.key)


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


def _reject_unencodable(actions: Sequence[Action]) -> None:
    """Backstop before staging: every action that carries user text (commitInfo, metadata,
    txn, domain metadata) must encode as JSON, so a commit never fails half-prepared.
    Data file actions are built by this library from Arrow (UTF-8) values and are skipped."""
    for action in actions:
        if isinstance(action, (AddFile, RemoveFile)):
            continue
        try:
            encode_action(action)
        except orjson.JSONEncodeError as exc:
            what = f"{action_name(action)} action"
            raise InvalidTextError(
                f"the {what} cannot be written to the log: {exc}", argument=what, reason=str(exc)
            ) from None


def _now_ms() -> int:
    return int(time.time() * 1000)
