"""Transactions: record what was read, stage new files, validate and publish at commit.

A :class:`Transaction` pins the snapshot it reads (its *read version*). Each operation
records its reads (partition predicates, files, whole-table reads, app ids read through
:meth:`Transaction.txn_version`) and stages new data files; :meth:`commit` publishes one
new version through the commit pipeline::

    prepare actions (commitInfo first, isBlindAppend, effective isolation level)
      -> stage  _eventlog/staged/<txnId>.json
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

import uuid
from collections.abc import Callable, Sequence

import orjson
import pyarrow as pa

from eventlog import metrics
from eventlog.errors import (
    CommitStateUnknownError,
    InvalidInputError,
    InvalidTextError,
    TransactionStateError,
)
from eventlog.files import row_tracking
from eventlog.files.datafiles import delete_files
from eventlog.files.pruning import data_schema
from eventlog.log.actions import (
    ENGINE_INFO,
    Action,
    AddFile,
    CommitInfo,
    RemoveFile,
    action_name,
    encode_action,
)
from eventlog.snapshot import Snapshot
from eventlog.snapshot.isolation import IsolationLevel, effective_isolation_level
from eventlog.txn.attempt import CommitAttempt, CommitResult, CommitTarget, PendingCommit
from eventlog.txn.commitloop import CommitLoop
from eventlog.txn.conflicts import ReadSet, TransactionSummary
from eventlog.txn.groupcommit import GroupCommitLoop, groupable
from eventlog.txn.identity import restage_metadata, stamp_commit_info
from eventlog.txn.plan import DV_PROPERTY, Plan, PlanBuilder, _now_ms, dv_relative_path
from eventlog.userinput import (
    check_app_id,
    check_optional_text,
    check_txn_version,
)

__all__ = ["DV_PROPERTY", "CommitResult", "CoreTransaction", "Plan", "PlanBuilder", "dv_relative_path"]


class CoreTransaction(PlanBuilder):
    """One atomic change to a table; see the module docstring.

    It is the :class:`~eventlog.txn.plan.PlanBuilder` of its own staged changes:
    adapters (Spark, streaming) stage files and reads through the same primitives an
    operation uses, and :meth:`run` records the plan an operation returns.
    """

    def __init__(self, table: CommitTarget, snapshot: Snapshot | None) -> None:
        super().__init__(table, snapshot)
        self.read_version = snapshot.version if snapshot is not None else -1
        self.txn_id = str(uuid.uuid4())
        self._skip = False
        self._user_metadata: str | None = None
        self._state = "open"

    @property
    def _who(self) -> str:
        return f"transaction {self.txn_id}"

    # ------------------------------------------------------------------ state

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

    # ------------------------------------------------------------------ reads

    # ------------------------------------------------------------------ writes

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

    # ------------------------------------------------------------------ staging
    #
    # One rule for every operation (see :mod:`eventlog.ops.transaction`): running it only
    # *stages* it; :meth:`commit` checks it against the commits that won meanwhile and
    # publishes it. An operation that fails aborts the transaction, deleting whatever files
    # it wrote, so the table is left exactly as it was.

    def run(self, operation: Callable[[PlanBuilder], Plan]) -> None:
        """Run ``operation`` on the snapshot this transaction reads and record the plan it
        returns. On any error the files the operation wrote are deleted, the transaction
        is aborted, and the error is re-raised."""
        self._require_open()
        if self._operation is not None:
            self.abort()
            raise TransactionStateError(
                f"{self._who} already runs {self._operation}; use one transaction per operation"
            )
        builder = PlanBuilder(self.table, self.snapshot, metadata=self._metadata, protocol=self._protocol)
        try:
            self.record(operation(builder))
        except BaseException:
            builder.discard_files()
            self.abort()
            raise

    def record(self, plan: Plan) -> None:
        """Add ``plan``'s reads and staged actions to this transaction."""
        self._require_open()
        if plan.operation is not None:
            if self._operation is not None:
                raise TransactionStateError(
                    f"{self._who} already runs {self._operation}; use one transaction per operation"
                )
            self._operation, self._params = plan.operation, dict(plan.parameters)
            self._changes_data = plan.changes_data
        self._predicates.extend(plan.partition_predicates)
        self._full_predicates.extend(plan.predicates)
        self._read_files.update(plan.read_files)
        self._whole_table = self._whole_table or plan.whole_table
        self._app_ids |= plan.app_ids
        self._adds.extend(plan.adds)
        self._removes.extend(plan.removes)
        self._cdc.extend(plan.cdc)
        self._created.extend(plan.created)
        if plan.metadata is not None:
            self._metadata = plan.metadata
        if plan.protocol is not None:
            self._protocol = plan.protocol
        for txn in plan.txns.values():
            self.set_app_transaction(txn.app_id, txn.version)
        self._domains.update(plan.domains)
        self._metrics.update(plan.metrics)
        self._dv_updates.update(plan.dv_updates)
        self._compaction.extend(plan.compaction)
        self._fail_on_any_winner = self._fail_on_any_winner or plan.fail_on_any_winner
        self._identity.extend(plan.identity)

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
        self._write_changes()  # change data recorded on the transaction itself (Spark jobs)
        body: list[Action] = []
        if self._protocol is not None:
            body.append(self._protocol)
        metadata = self._metadata
        if self._identity:  # identity values generated: move the high-water marks
            metadata = restage_metadata(self.metadata, self._identity)
        if metadata is not None:
            body.append(metadata)
        body.extend(self._txns.values())
        body.extend(self._domains.values())
        body.extend(self._removes)
        body.extend(self._adds)
        body.extend(self._cdc)
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
        info = stamp_commit_info(info, self._identity, only_marks=self._metadata is None)
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
            identity=tuple(self._identity),
        )

    def _row_level(self) -> bool:
        """Row-level concurrency applies to DV-enabled tables, partitioned or not (beyond
        the Databricks contract, which stops at unpartitioned tables)."""
        snap = self.snapshot
        return snap is not None and snap.metadata.configuration.get(DV_PROPERTY) == "true"

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
            row_id_mark=row_tracking.high_water_mark(self.snapshot.domains)
            if self.snapshot is not None
            else row_tracking.NO_HIGH_WATER_MARK,
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
        metrics.observe_commit(result.operation, result.attempts, result.timings)
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
