"""The table API (the facade): create/open, write operations, reads, time travel and history.

A :class:`Table` is a handle: it caches the latest snapshot it has seen and the commits
it has read, and brings the snapshot up to date before every operation. Many handles (in
many threads or processes) may write one table at once; version slots come from a
:class:`lockstore.SlotStore` (by default a local-file store inside the table directory,
or a process-wide in-memory store for ``memory://`` tables). The work is done below:
operations by :mod:`eventlog.ops`, snapshots and checkpoints by :mod:`eventlog.snapshot`
(``loader``, ``timeline``, ``read``, ``new_table``), commits by :mod:`eventlog.log`.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

import fsspec
import pyarrow as pa

from eventlog import expr as ex
from eventlog.errors import InvalidInputError, TableAlreadyExistsError, VersionNotFoundError
from eventlog.files.identity import check_identity_schema
from eventlog.files.schema import canonical_schema
from eventlog.log.audit import audit_key_from_env
from eventlog.log.cleanup import cleanup_cutoff_ms
from eventlog.log.commit import Commit
from eventlog.log.commitlog import CommitLog, Published, SlotsSpec, acquire_slots, slots_reachable
from eventlog.log.storage import LogStore, open_log_store
from eventlog.log.storage_clock import retention_now_ms
from eventlog.log.verify import VerifyReport
from eventlog.log.verify import verify as verify_log
from eventlog.ops.alter import (
    DEFAULT_DELETED_FILE_RETENTION,
    DELETED_FILE_RETENTION_KEY,
    table_properties,
    validate_properties,
)
from eventlog.ops.clustering import stage_new_clustering
from eventlog.ops.common import Rows, input_rows
from eventlog.ops.merge import TableMergeBuilder
from eventlog.ops.transaction import Transaction
from eventlog.ops.vacuum import vacuum as vacuum_table
from eventlog.ops.write import write_input
from eventlog.snapshot import Snapshot
from eventlog.snapshot.loader import checkpoint_due, load_snapshot, write_snapshot_checkpoint
from eventlog.snapshot.new_table import check_partition_by, new_table_metadata
from eventlog.snapshot.protocol import check_writable, clean_log, protocol_for
from eventlog.snapshot.read import read_snapshot_rows
from eventlog.snapshot.replay import Replay, TableDiff, replay
from eventlog.snapshot.replay import diff as diff_snapshots
from eventlog.snapshot.timeline import commit_history, timestamp_ms, version_at
from eventlog.table.alter import AlterTable
from eventlog.table.changes import TableChanges
from eventlog.table.clustering import ClusteredTable
from eventlog.table.drop_feature import DropFeature
from eventlog.table.lookup import TableLookup
from eventlog.table.scan import TableScan
from eventlog.txn.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from eventlog.txn.transaction import CommitResult
from eventlog.userinput import (
    check_optional_text,
    parse_interval_ms,
)
from lockstore import SlotStore

_log = logging.getLogger(__name__)


class Table(AlterTable, TableChanges, TableScan, DropFeature, ClusteredTable, TableLookup):
    """A Delta-compatible table; see the module docstring."""

    def __init__(
        self,
        log: LogStore,
        slots: SlotStore,
        snapshot: Snapshot | None,
        *,
        retry_policy: RetryPolicy | None = None,
        app_id: str | None = None,
        group_commit: bool = False,
        audit_key: bytes | str | None = None,
    ) -> None:
        key = audit_key.encode() if isinstance(audit_key, str) else audit_key
        self.commitlog = CommitLog(
            log,
            slots,
            published=snapshot.version if snapshot is not None else -1,
            audit_key=key if key is not None else audit_key_from_env(),
        )
        self.retry_policy = retry_policy or DEFAULT_RETRY_POLICY
        self.app_id = app_id
        # Blind appends share version slots with concurrent ones (eventlog.txn.groupcommit).
        self.group_commit = group_commit
        self._snapshot = snapshot
        self._lock = threading.RLock()
        # The spec string the slot store was opened from (None: given as an object), so that
        # other processes working for this handle (Spark tasks) open the same store.
        self.slots_spec: str | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(
        cls,
        uri: str | os.PathLike[str],
        schema: pa.Schema | None = None,
        partition_by: Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        slots: SlotsSpec = None,
        *,
        data: Any = None,
        name: str | None = None,
        description: str | None = None,
        retry_policy: RetryPolicy | None = None,
        app_id: str | None = None,
        audit_key: bytes | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        filesystem: fsspec.AbstractFileSystem | None = None,
        cluster_by: Sequence[str] | None = None,
        durable: bool = False,
    ) -> Table:
        """Create a table as version 0, empty or holding ``data`` (CREATE TABLE AS SELECT).
        ``cluster_by``: liquid clustering columns (:mod:`eventlog.snapshot.clustering`).

        ``storage_options`` (credentials, endpoint... for the URI's scheme, passed to
        fsspec) or ``filesystem`` (an fsspec file system used as it is): see
        :func:`eventlog.log.storage.normalize_uri`. ``durable``: fsync every file and
        directory entry before a commit is acknowledged, so a power loss keeps every
        acknowledged commit (local disks; see :mod:`eventlog.log.durable`).

        ``audit_key`` (default ``$EVENTLOG_AUDIT_KEY``): HMAC every commit this handle
        writes (:mod:`eventlog.log.audit`); commits are hash-chained either way.

        ``schema`` defaults to ``data``'s. TableAlreadyExistsError if a table is there.
        Two concurrent creators (or writers to an empty path): one wins, the other gets
        ProtocolChangedException with the empty-directory hint (Delta's behaviour).
        Text arguments are validated first (:mod:`eventlog.userinput`).
        """
        log = open_log_store(uri, storage_options, filesystem, durable=durable)
        name = check_optional_text(name, "table name")
        description = check_optional_text(description, "table description")
        table = cls._with_slots(log, slots, retry_policy=retry_policy, app_id=app_id, audit_key=audit_key)
        latest = table.latest_version()
        if latest >= 0:
            table.close()
            raise TableAlreadyExistsError(log.uri, latest)
        rows = input_rows(data) if data is not None else None
        if schema is None:
            if rows is None or rows.schema is None:
                raise InvalidInputError("Table.create needs a schema or data")
            schema = rows.schema
        arrow_schema = canonical_schema(schema)
        parts = check_partition_by(partition_by, arrow_schema)
        check_identity_schema(arrow_schema, parts, "create")
        props = dict(properties or {})
        validate_properties(props)
        arrow_schema, props = table_properties(arrow_schema, {}, props, new_table=True)  # derived keys
        metadata = new_table_metadata(arrow_schema, parts, props, name=name, description=description)
        txn = Transaction(table, None)
        txn.set_operation(
            "CREATE TABLE" if rows is None else "CREATE TABLE AS SELECT",
            {"isManaged": "false", "description": description, "partitionBy": parts, "properties": props},
        )
        stage_new_clustering(txn, protocol_for(arrow_schema, props), arrow_schema, parts, cluster_by, props)
        txn.update_metadata(metadata)
        if rows is not None:
            try:
                adds, count = write_input(txn, rows, arrow_schema, "create")
            except BaseException:
                txn.abort()
                raise
            txn.add_metrics(numFiles=len(adds), numOutputRows=count)
        txn.commit()
        table.bind_slots(metadata.id)
        return table

    @classmethod
    def open(
        cls,
        uri: str | os.PathLike[str],
        slots: SlotsSpec = None,
        *,
        retry_policy: RetryPolicy | None = None,
        app_id: str | None = None,
        group_commit: bool = False,
        audit_key: bytes | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        filesystem: fsspec.AbstractFileSystem | None = None,
        durable: bool = False,
    ) -> Table:
        """Open an existing table at its latest version. TableNotFoundError if absent.

        ``storage_options``/``filesystem``/``durable``: as for :meth:`create`.

        ``audit_key`` (default ``$EVENTLOG_AUDIT_KEY``): HMAC every commit this handle
        writes, and check HMACs in :meth:`verify`.

        ``group_commit``: let this handle's blind appends share a version with concurrent
        ones (:mod:`eventlog.txn.groupcommit`; any slot store, best with one that notifies
        waiters: ZooKeeper or in-memory).
        """
        log = open_log_store(uri, storage_options, filesystem, durable=durable)
        table = cls._with_slots(
            log, slots, retry_policy=retry_policy, app_id=app_id, group_commit=group_commit,
            audit_key=audit_key,
        )  # fmt: skip
        try:
            table._snapshot = table._load(None)
        except BaseException:
            table.close()
            raise
        return table

    @classmethod
    def handle(
        cls,
        uri: str | os.PathLike[str],
        slots: SlotsSpec = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        filesystem: fsspec.AbstractFileSystem | None = None,
        durable: bool = False,
    ) -> Table:
        """A handle that has read nothing yet (no recovery runs until it is used).

        For operations tools (``slots status``, ``slots repair --dry-run``) that must look
        at the slots before anything acts on them. ``durable``: as for :meth:`create`.
        """
        return cls._with_slots(open_log_store(uri, storage_options, filesystem, durable=durable), slots)

    @classmethod
    def _with_slots(cls, log: LogStore, slots: SlotsSpec, **options: Any) -> Table:
        """A handle on ``log`` that owns the slot store it opens for ``slots`` (see :meth:`close`)."""
        store, release = acquire_slots(slots, log)
        table = cls(log, store, None, **options)
        table.slots_spec = slots if isinstance(slots, str) else None
        if release is not None:
            table.commitlog.own_slots(release)
        return table

    def close(self) -> None:
        """Give back the slot store this handle opened. Idempotent, safe from any thread.

        Tables of one process that name one slot store (``slots=`` spec or
        ``$EVENTLOG_SLOTS``) share it; the last of them to close (or to be garbage
        collected) closes it, and with it the ZooKeeper connection. A ``SlotStore`` passed
        in as ``slots=`` stays open: it is its owner's to close. Do not use the handle
        afterwards (with a closed ZooKeeper store, calls fail with ``SlotStoreClosedError``).
        """
        self.commitlog.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ properties

    @property
    def uri(self) -> str:
        return self.commitlog.uri

    @property
    def key(self) -> str:
        """The key of this table's version slots in the slot store."""
        return self.commitlog.key

    @property
    def version(self) -> int:
        """The latest committed version (refreshes the snapshot)."""
        return self.refresh().version

    @property
    def schema(self) -> pa.Schema:
        return self.refresh().schema

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return self.refresh().partition_columns

    @property
    def properties(self) -> Mapping[str, str]:
        return self.refresh().properties

    # ------------------------------------------------------------------ snapshots

    def refresh(self) -> Snapshot:
        """Bring the cached snapshot up to the latest version and return it."""
        with self._lock:
            latest = self.latest_version()
            snap = self._snapshot
            if snap is None:
                snap = self._load(None)
            elif latest > snap.version:
                snap = snap.advance(self.commits_between(snap.version + 1, latest))
            self._snapshot = snap
            return snap

    def snapshot(
        self, version: int | None = None, *, timestamp: dt.datetime | str | int | None = None
    ) -> Snapshot:
        """The snapshot at ``version`` or as of ``timestamp`` (latest when both are None)."""
        if version is not None and timestamp is not None:
            raise InvalidInputError("pass either version or timestamp, not both")
        current = self.refresh()
        if timestamp is not None:
            version = self.version_at(timestamp)
        if version is None or version == current.version:
            return current
        if version < 0 or version > current.version:
            raise VersionNotFoundError(
                f"{self.uri}: version {version} does not exist (latest is {current.version})",
                requested=version,
                earliest=0,
                latest=current.version,
            )
        return self._load(version)

    def version_at(self, timestamp: dt.datetime | str | int) -> int:
        """The latest version committed at or before ``timestamp`` (Delta's timestampAsOf)."""
        ts = timestamp_ms(timestamp)
        return version_at(self.commitlog, self.refresh(), ts, requested=timestamp)

    def _load(self, version: int | None) -> Snapshot:
        """Replay the log (from the newest usable checkpoint) up to ``version``/latest."""
        return load_snapshot(self.commitlog, version)

    # ------------------------------------------------------------------ the commit log

    @property
    def log(self) -> LogStore:
        return self.commitlog.log

    @property
    def slots(self) -> SlotStore:
        return self.commitlog.slots

    def latest_version(self, claimed: int | None = None, *, repair: bool = False) -> int:
        """Latest version (see :meth:`CommitLog.latest_version`; ``repair``: writers only)."""
        return self.commitlog.latest_version(claimed, repair=repair)

    def commits_between(self, first: int, last: int) -> list[Commit]:
        """Commits ``first..last`` (inclusive), from the log or the cache."""
        return self.commitlog.commits_between(first, last)

    def publish_claimed(self, version: int, staged_name: str, data: bytes, txn_id: str) -> Published:
        """Make a version this process claimed visible (see :meth:`CommitLog.publish_claimed`)."""
        return self.commitlog.publish_claimed(version, staged_name, data, txn_id)

    def repair_slots(
        self, *, dry_run: bool = False, limit: int = 100, accept_lost: Sequence[int] = ()
    ) -> list[dict[str, Any]]:
        """Finish or resolve slots without their commit (:mod:`eventlog.log.recovery`); an
        acknowledged commit that is gone only for the versions in ``accept_lost``."""
        actions = self.commitlog.repair_slots(dry_run=dry_run, limit=limit, accept_lost=accept_lost)
        if not dry_run and any(not a["action"].startswith(("skip", "lost")) for a in actions):
            self.refresh()
        return actions

    def _read_commit(self, version: int, *, required: bool) -> Commit | None:
        return self.commitlog.read_commit(version, required=required)

    def bind_slots(self, table_id: str) -> None:
        """Bind the version slots to ``table_id`` before this handle's first write (see
        :meth:`CommitLog.bind_once`); raises ``TableBindingError`` for another table's slots."""
        self.commitlog.bind_once(table_id)

    def note_committed(self, commit: Commit) -> None:
        """Fold this process's own commit into the cached snapshot; checkpoint if due."""
        self.commitlog.note_published(commit)
        with self._lock:
            snap = self._snapshot
            if snap is None and commit.version == 0:
                snap = Snapshot.from_commits(self.uri, [commit])
            elif snap is not None and snap.version == commit.version - 1:
                snap = snap.advance([commit])
            else:
                return
            self._snapshot = snap
        if checkpoint_due(snap):
            try:  # an optimization: the commit stands whatever storage says (Delta's postCommit)
                self.checkpoint(snap)
            except Exception as exc:
                _log.warning("%s: checkpoint of version %s failed: %s", self.uri, snap.version, exc)

    def checkpoint(self, snapshot: Snapshot | None = None) -> int:
        """Write a Delta checkpoint of ``snapshot`` (default: latest). Returns its version.

        Then, when ``eventlog.auditRetentionDuration`` is set, log files below the checkpoint
        older than both it and ``delta.logRetentionDuration`` are deleted
        (:mod:`eventlog.log.cleanup`); by default nothing is ever deleted."""
        snap = snapshot or self.refresh()
        check_writable(snap.protocol, snap.metadata)  # the protocol at that version (checkpointProtection)
        retention = parse_interval_ms(
            snap.properties.get(DELETED_FILE_RETENTION_KEY, DEFAULT_DELETED_FILE_RETENTION)
        )
        now = retention_now_ms(self.log)  # this machine's clock, bounded by the storage's
        horizon = now - retention
        head = self.commitlog.commit_digest(snap.version)
        version = write_snapshot_checkpoint(self.log, snap, tombstone_horizon_ms=horizon, chain_head=head)
        cutoff = cleanup_cutoff_ms(snap.properties, now)
        if cutoff is not None:
            self._clean_log(snap, version, cutoff)
        return version

    def _clean_log(self, snap: Snapshot, checkpoint_version: int, cutoff_ms: int) -> None:
        deleted = clean_log(self.log, snap.protocol, snap.properties, checkpoint_version, cutoff_ms)
        if deleted:
            self.commitlog.forget_through(deleted[-1])  # history() must not list them

    # ------------------------------------------------------------------ operations

    def transaction(self) -> Transaction:
        """A transaction reading the latest snapshot; run one operation, then ``commit()``."""
        return Transaction(self, self.refresh())

    def _run(
        self,
        operation: Callable[[Transaction], object],
        *,
        txn_app_id: str | None = None,
        txn_version: int | None = None,
        user_metadata: str | None = None,
    ) -> CommitResult:
        """One operation in its own transaction: refresh, (idempotency check,) run, commit."""
        txn = self.transaction()
        txn.user_metadata = user_metadata
        if txn.idempotent(txn_app_id, txn_version):
            operation(txn)
        return txn.commit()

    def append(
        self,
        data: Rows,
        *,
        schema_mode: str | None = None,
        txn_app_id: str | None = None,
        txn_version: int | None = None,
        user_metadata: str | None = None,
    ) -> CommitResult:
        """Blind append (no reads: cannot conflict with other writers' data changes).

        ``txn_app_id``/``txn_version``: an idempotent write (Delta's options of the same
        names): skipped, without a new version, when the app already committed that version.
        """
        return self._run(
            lambda txn: txn.append(data, schema_mode=schema_mode),
            txn_app_id=txn_app_id, txn_version=txn_version, user_metadata=user_metadata,
        )  # fmt: skip

    def overwrite(
        self,
        data: Rows,
        *,
        replace_where: str | None = None,
        schema_mode: str | None = None,
        txn_app_id: str | None = None,
        txn_version: int | None = None,
        user_metadata: str | None = None,
    ) -> CommitResult:
        """Replace all rows, or those matching ``replace_where``, with ``data``."""
        return self._run(
            lambda txn: txn.overwrite(data, replace_where=replace_where, schema_mode=schema_mode),
            txn_app_id=txn_app_id, txn_version=txn_version, user_metadata=user_metadata,
        )  # fmt: skip

    def delete(self, predicate: str | None = None) -> CommitResult:
        return self._run(lambda txn: txn.delete(predicate))

    def update(self, predicate: str | None = None, set: Mapping[str, str] | None = None) -> CommitResult:
        return self._run(lambda txn: txn.update(predicate, set))

    def merge(
        self, source: pa.Table, on: str, *, source_alias: str = "source", target_alias: str = "target"
    ) -> TableMergeBuilder:
        """Start a MERGE in its own transaction; add clauses, then ``execute()`` commits it."""
        return TableMergeBuilder(
            self.transaction(), source, on, source_alias=source_alias, target_alias=target_alias
        )

    def optimize(
        self,
        zorder_by: Sequence[str] | None = None,
        *,
        partition_filter: str | None = None,
        target_size: int | None = None,
    ) -> CommitResult:
        """Bin-packing compaction (``dataChange=false``), optionally Z-ordered."""
        return self._run(
            lambda txn: txn.optimize(
                zorder_by=zorder_by, partition_filter=partition_filter, target_size=target_size
            )
        )

    def reorg_purge(self, where: str | None = None, *, target_size: int | None = None) -> CommitResult:
        """REORG TABLE ... APPLY (PURGE): rewrite the files with deletion vectors (in the
        partitions ``where`` selects) so deleted rows are physically gone (``dataChange=false``)."""
        return self._run(lambda txn: txn.reorg_purge(where=where, target_size=target_size))

    def vacuum(
        self, retention_hours: float | None = None, *, dry_run: bool = False, enforce_retention: bool = True
    ) -> list[str]:
        """Delete data files no version within the retention references (see :mod:`vacuum`)."""
        return vacuum_table(self, retention_hours, dry_run=dry_run, enforce_retention=enforce_retention)

    def restore(self, version: int) -> CommitResult:
        """Make version ``version``'s files live again (Delta's RESTORE), as a new version."""
        return self._run(lambda txn: txn.restore(version))

    # ------------------------------------------------------------------ reads

    def files(self, version: int | None = None, *, filter: str | None = None) -> list[str]:
        """Relative paths of the live data files (sorted); with ``filter`` (a SQL predicate),
        only those that may hold matching rows after partition pruning and min/max
        statistics skipping (what a read with that filter opens)."""
        snap = self.snapshot(version)
        if filter is None:
            return snap.paths()
        _, selected = snap.select_files(ex.parse_predicate(filter, snap.schema, context="filter"))
        return sorted(selected.column("path").to_pylist())

    def to_arrow(
        self,
        filter: str | None = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        *,
        timestamp: dt.datetime | str | int | None = None,
        row_ids: bool = False,
    ) -> pa.Table:
        """Read the table (or a past version); ``filter`` is a SQL predicate. ``row_ids`` adds
        ``_row_id`` and ``_row_commit_version`` (row tracking tables)."""
        snap, fs = self.snapshot(version, timestamp=timestamp), self.log.fs
        return read_snapshot_rows(fs, self.log.root, snap, filter=filter, columns=columns, row_ids=row_ids)

    @property
    def audit_key(self) -> bytes | None:
        """The key this handle HMACs its commits with (None: hash chain only)."""
        return self.commitlog.audit_key

    def commit_digest(self, version: int) -> str | None:
        """SHA-256 of commit ``version``'s bytes: what the next commit chains to."""
        return self.commitlog.commit_digest(version)

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """commitInfo of each version, newest first (Delta's DESCRIBE HISTORY)."""
        return commit_history(self.commitlog, self.refresh(), limit)

    # ------------------------------------------------------------------ audits

    def replay(self, to_version: int | None = None) -> Replay:
        """Rebuild the table from its events, version by version (see
        :mod:`eventlog.snapshot.replay`): iterate it for one :class:`VersionChange` per
        version; ReplayMismatchError if the fold and the table's snapshot ever differ."""
        self.refresh()
        return replay(self.commitlog, to_version)

    def verify(
        self,
        key: bytes | str | None = None,
        *,
        progress: Callable[[int, int], None] | None = None,
        accept_lost: Sequence[int] = (),
        require_anchors: bool = False,
        allow_unguarded: bool = False,
    ) -> VerifyReport:
        """Check the log's hash chain, its slot anchors and (with a key: this handle's audit
        key or ``key``) its HMACs; the report names the first version that was edited,
        removed, inserted, reordered, lost or unguarded, or a truncated tail
        (:mod:`eventlog.log.verify`). :class:`SlotStoreError` when the slot store cannot be
        reached."""
        audit_key = key.encode() if isinstance(key, str) else key
        with slots_reachable(self.uri):
            return verify_log(
                self.commitlog,
                audit_key if audit_key is not None else self.audit_key,
                progress,
                accept_lost=accept_lost,
                require_anchors=require_anchors,
                allow_unguarded=allow_unguarded,
            )

    def diff(self, from_version: int, to_version: int | None = None, *, rows: bool = False) -> TableDiff:
        """Files (and with ``rows=True`` the rows) added and removed between two versions."""
        old = self.snapshot(from_version)
        new = self.snapshot(to_version)
        return diff_snapshots(self.log.fs, self.log.root, old, new, rows=rows)

    def __repr__(self) -> str:
        snap = self._snapshot
        return f"Table({self.uri!r}, version={snap.version if snap else None})"
