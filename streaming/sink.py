"""The exactly-once micro-batch commit of a streaming sink, engine-neutral.

A streaming engine (Spark's Structured Streaming, through :mod:`spark_adapter.stream_writer`)
runs every micro-batch in three places, and this module gives each its function:

1. **Planning** (driver side, before any task): :func:`plan_batch` opens the table, checks
   the batch's schema against it (``mergeSchema`` lets new columns in) and the options, and
   returns a picklable :class:`BatchPlan` that travels to the tasks.
2. **Tasks**: :func:`write_batch_files` writes a task's rows as Parquet files named
   deterministically by query and batch, ``part-<queryId>-b<batchId>-t<task>-<n>-<uuid>
   .c000.snappy.parquet`` (:func:`batch_file_prefix`), and returns their add actions. The
   files are not visible to anyone until the commit.
3. **Commit** (driver side, once per batch): :func:`commit_batch` publishes every task's
   files in one table version, together with ``txn(appId = query id, version = batch id)``.

Exactly once. A batch whose id is not above the version recorded for the app id commits
nothing and deletes its files: the engine replays a batch whose commit it did not record
(a crash between the table commit and the engine's own checkpoint), and the replay must
not write its rows twice. The app id is the query id (stable across restarts), or the
``txnAppId`` option.

Provenance. The commit's ``commitInfo`` is Delta's ``STREAMING UPDATE`` (operation
parameters ``outputMode``, ``queryId``, ``epochId`` = batch id, plus ``runId``) and carries
``eventlog.streaming = {queryId, runId, batchId, appId}``, so ``Table.history()`` shows
which stream and which run wrote each version. (A group commit, ``groupCommit=true``,
keeps each member's operation parameters in its ``eventlog.groupCommit`` list but drops the
``eventlog.streaming`` field.)

Which version the commit reads, and why. The batch's transaction reads the version of
*this run's previous commit* (the latest commit of the app id at or before the planned
version, if its ``runId`` is this run's); the first batch of a run reads the version it
was planned at. Everything committed since is then checked before the batch publishes:

* a metadata or protocol change (schema, table property, protocol upgrade) fails the
  batch with :class:`~eventlog.errors.MetadataChangedException` and commits nothing (an
  explicit comparison of the two snapshots, so property changes Delta's conflict checker
  tolerates and pure protocol upgrades are caught too; the conflict checker covers the
  moment between that comparison and the commit). A restarted run reads the new metadata
  at its first batch and writes every pending row exactly once;
* a commit of the same app id by another run (two runs of one query sharing a
  checkpoint) fails it with :class:`~eventlog.errors.ConcurrentTransactionException`; so
  does finding the app id's version already *above* this batch (another run went
  further). This is the commit-time backstop of the checkpoint lease
  (:mod:`streaming.ownership`), which catches the same mistake before any batch runs.

Complete output mode replaces the whole table in every batch (an overwrite reading the
whole table: a concurrent append to the table fails it, as in Delta).

Orphans. Files of a batch whose commit failed are deleted by the commit (a conflict) or
by :func:`abort_batch`; files that tasks were still writing when the engine gave up are
recognisable by their name (:func:`parse_batch_file_name`) and unreferenced, so VACUUM
deletes them once they are older than the retention.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from eventlog import metrics
from eventlog.errors import (
    ConcurrentTransactionException,
    InvalidInputError,
    MetadataChangedException,
    ProtocolChangedException,
    TableNotFoundError,
)
from eventlog.files.datafiles import delete_files
from eventlog.files.enforce import merge_schema
from eventlog.files.schema import canonical_schema
from eventlog.log.actions import Action, AddFile, CommitInfo
from eventlog.log.commit import GROUP_FIELD, Commit
from eventlog.log.location import TableLocation
from eventlog.ops.alter import change_schema
from eventlog.ops.common import check_append_only
from eventlog.ops.rows import remove_rows
from eventlog.ops.transaction import Transaction
from eventlog.ops.write import stage_new_table
from eventlog.snapshot import Snapshot
from eventlog.snapshot.isolation import IsolationLevel
from eventlog.table import Table
from eventlog.txn.identity import IdentityRange, only_marks_changed
from eventlog.txn.plan import Plan, PlanBuilder
from streaming.batchfiles import (
    UNKNOWN,
    BatchFiles,
    abort_batch,
    write_batch_files,
)
from streaming.compaction import CompactionOutcome, auto_compact_enabled, maybe_compact
from streaming.plan import BatchPlan, SinkOptions, plan_batch

__all__ = [
    "STREAMING_FIELD",
    "STREAMING_OPERATION",
    "BatchCommit",
    "MicroBatchSink",
    "commit_batch",
    "latest_run",
]

log = logging.getLogger("streaming.sink")

STREAMING_FIELD = "eventlog.streaming"  # commitInfo field: {queryId, runId, batchId, appId}
STREAMING_OPERATION = "STREAMING UPDATE"  # Delta's operation name for streaming sink commits

# How far back the commit looks for this run's previous commit of the app id.
_PREVIOUS_COMMIT_SCAN = 10_000
_SCAN_CHUNK = 64
# A run's previous commit lies behind at most this many commits of the app id by other runs
# (two runs of one query interleave; a restarted run finds none of its own).
_OTHER_RUN_COMMITS = 20


# --------------------------------------------------------------------------- commit


@dataclasses.dataclass(frozen=True)
class BatchCommit:
    """The outcome of :func:`commit_batch`: the version committed (None when the batch was
    a replay and committed nothing), files, rows and the auto-compaction, if one ran."""

    batch_id: int
    version: int | None
    num_files: int
    num_rows: int
    read_version: int
    compaction: CompactionOutcome | None = None

    @property
    def skipped(self) -> bool:
        return self.version is None


class _SinkTransaction(Transaction):
    """A transaction whose commitInfo carries the :data:`STREAMING_FIELD` provenance."""

    def __init__(self, table: Table, snapshot: Snapshot | None, provenance: Mapping[str, Any]) -> None:
        super().__init__(table, snapshot)
        self._provenance = dict(provenance)

    def _prepare(self) -> tuple[list[Action], CommitInfo, IsolationLevel]:
        body, info, level = super()._prepare()
        info = dataclasses.replace(info, extra={**info.extra, STREAMING_FIELD: self._provenance})
        return body, info, level


def _stream_update(
    plan: PlanBuilder,
    adds: Sequence[AddFile],
    *,
    complete: bool,
    schema: pa.Schema | None,
    num_rows: int,
    parameters: Mapping[str, str],
) -> Plan:
    """Delta's STREAMING UPDATE: append the batch's files, or (complete mode) replace every
    live file with them."""
    plan.set_operation(STREAMING_OPERATION, parameters)
    if schema is not None:
        merged = merge_schema(plan.schema, canonical_schema(schema))
        if not merged.equals(plan.schema):
            change_schema(plan, merged)
    removed = 0
    if complete and plan.snapshot is not None:
        check_append_only(plan, "complete output mode")
        removed, _, _ = remove_rows(plan, plan.scan(None), None)
    plan.add_files(adds)
    plan.add_metrics(
        numAddedFiles=len(adds),
        numRemovedFiles=removed,
        numOutputRows=num_rows,
        numOutputBytes=sum(a.size for a in adds),
    )
    return plan.build()


def commit_run(commit: Commit, query_id: str) -> str | None:
    """The run id a streaming sink commit records for ``query_id`` (also inside a group
    commit's member list), or None."""
    info = commit.commit_info
    if info is None:
        return None
    field = info.extra.get(STREAMING_FIELD)
    if isinstance(field, Mapping) and field.get("queryId") == query_id:
        run = field.get("runId")
        return str(run) if run is not None else None
    entries = [dict(info.operation_parameters)]
    group = info.extra.get(GROUP_FIELD)
    if isinstance(group, list):
        entries += [dict(e.get("operationParameters") or {}) for e in group if isinstance(e, Mapping)]
    for params in entries:
        if params.get("queryId") == query_id and params.get("runId"):
            return str(params["runId"])
    return None


def app_commits(table: Table, app_id: str, upto: int) -> Iterator[Commit]:
    """The commits at or before ``upto`` that wrote a txn action for ``app_id``, newest first
    (within the last :data:`_PREVIOUS_COMMIT_SCAN` versions, while the log still holds them).
    Reads one commit first, then chunks doubling up to :data:`_SCAN_CHUNK`."""
    hi = upto
    floor = max(0, upto - _PREVIOUS_COMMIT_SCAN + 1)
    chunk = 1
    while hi >= floor:
        lo = max(floor, hi - chunk + 1)
        try:
            commits = table.commits_between(lo, hi)
        except Exception as exc:  # log cleanup removed old commits: stop looking
            log.debug("scan for app id %s stopped at %d..%d: %r", app_id, lo, hi, exc)
            return
        for commit in reversed(commits):
            if any(t.app_id == app_id for t in commit.txns):
                yield commit
        hi = lo - 1
        chunk = min(chunk * 2, _SCAN_CHUNK)


def last_app_commit(table: Table, app_id: str, upto: int) -> Commit | None:
    """The latest commit at or before ``upto`` that wrote ``app_id``, or None."""
    return next(app_commits(table, app_id, upto), None)


def previous_run_commit(table: Table, app_id: str, upto: int, *, query_id: str, run_id: str) -> Commit | None:
    """This run's latest commit of ``app_id`` at or before ``upto``, looking back past at
    most :data:`_OTHER_RUN_COMMITS` commits of the app id by other runs; or None (the run's
    first batch, or one whose earlier batches were all replays)."""
    for seen, commit in enumerate(app_commits(table, app_id, upto), start=1):
        if commit_run(commit, query_id) == run_id:
            return commit
        if seen >= _OTHER_RUN_COMMITS:
            return None
    return None


def latest_run(
    location: str | TableLocation, *, query_id: str, app_id: str | None = None, slots: str | None = None
) -> str | None:
    """The run id recorded by the latest sink commit of ``query_id`` (its app id), or None
    (no such commit, or the table cannot be read): names a checkpoint's owner in errors."""
    try:
        location = TableLocation.of(location)
        with Table.open(location.uri, slots=slots, storage_options=location.storage_options) as table:
            commit = last_app_commit(table, app_id or query_id, table.version)
            return commit_run(commit, query_id) if commit is not None else None
    except Exception as exc:
        log.debug("no run id of query %s in %s: %r", query_id, location, exc)
        return None


def _first_change(table: Table, base: Snapshot, latest: Snapshot) -> Commit | None:
    """The first commit after ``base`` that changed metadata or protocol."""
    for commit in table.commits_between(base.version + 1, latest.version):
        if commit.metadata is not None or commit.protocol is not None:
            return commit
    return None


def _metadata_changed(
    table: Table, base: Snapshot, latest: Snapshot, *, query_id: str, batch_id: int
) -> MetadataChangedException | None:
    if latest.version == base.version:
        return None
    if latest.metadata == base.metadata and latest.protocol == base.protocol:
        return None
    if latest.protocol == base.protocol and only_marks_changed(base.metadata, latest.metadata):
        return None  # concurrent inserts moved identity high-water marks: not a schema change
    commit = _first_change(table, base, latest)
    version = commit.version if commit is not None else latest.version
    info = commit.commit_info if commit is not None else None
    what = []
    if latest.metadata.schema_string != base.metadata.schema_string:
        what.append("schema")
    if latest.metadata.configuration != base.metadata.configuration:
        what.append("table properties")
    if latest.metadata.partition_columns != base.metadata.partition_columns:
        what.append("partition columns")
    if latest.protocol != base.protocol:
        what.append("protocol")
    operation = info.operation if info is not None else "UNKNOWN"
    winning = info.to_json() if info is not None else {}
    text = MetadataChangedException(
        winning_version=version, operation=operation, winning_commit_info=winning, table=table.uri
    ).message
    message = (
        f"{text}\nThe streaming query {query_id} wrote its batches with the table's metadata as of "
        f"version {base.version}; version {version} changed the {', '.join(what) or 'metadata'}. "
        f"Batch {batch_id} was not committed. Restart the query: it reads the new metadata and "
        "writes every pending row exactly once."
    )
    return MetadataChangedException(
        message, winning_version=version, operation=operation, winning_commit_info=winning, table=table.uri
    )


def _several_queries(
    exc: ConcurrentTransactionException | None,
    *,
    table: Table,
    query_id: str,
    run_id: str,
    batch_id: int,
    app_id: str,
    winner: Commit | None = None,
    recorded: int | None = None,
) -> ConcurrentTransactionException:
    """The backstop's error: another run of the query (same checkpoint) wrote the app id."""
    if exc is not None:
        version, operation, info = exc.winning_version, exc.operation, dict(exc.winning_commit_info)
    elif winner is not None:
        commit_info = winner.commit_info
        version = winner.version
        operation = commit_info.operation if commit_info is not None else "UNKNOWN"
        info = commit_info.to_json() if commit_info is not None else {}
    else:
        version, operation, info = -1, "UNKNOWN", {}
    other = info.get(STREAMING_FIELD) if isinstance(info.get(STREAMING_FIELD), Mapping) else {}
    other_run = (other or {}).get("runId") or (info.get("operationParameters") or {}).get("runId") or UNKNOWN
    went = f" has already committed batch {recorded}" if recorded is not None else " committed meanwhile"
    detail = (
        "ConcurrentTransactionException: several streaming queries are using the same checkpoint "
        f"to write into this table: app id {app_id!r} (query {query_id}){went} from another run "
        f"(runId {other_run}, version {version}) while run {run_id} was committing batch {batch_id}. "
        "Stop every other instance of the query; batch "
        f"{batch_id} of run {run_id} was not committed."
    )
    return ConcurrentTransactionException(
        winning_version=version,
        operation=operation,
        winning_commit_info=info,
        table=table.uri,
        detail=detail,
    )


def commit_batch(
    plan: BatchPlan,
    files: Sequence[BatchFiles],
    *,
    query_id: str,
    run_id: str,
    batch_id: int,
) -> BatchCommit:
    """Commit one micro-batch's files exactly once (see the module docstring).

    Raises :class:`MetadataChangedException` (the table's metadata or protocol changed since
    this run's previous commit, or since planning), :class:`ConcurrentTransactionException`
    (another run of the query wrote its app id), or any other commit failure; in every case
    nothing was committed and the batch's files are deleted, unless the outcome is unknown
    (:class:`~eventlog.errors.CommitStateUnknownError`: the files are kept).
    """
    if batch_id < 0:
        raise InvalidInputError(f"batch id must not be negative, got {batch_id}")
    options = plan.options
    app_id = options.app_id or query_id
    adds = [a for f in files for a in f.add_files]
    rows = sum(f.num_rows for f in files)
    table = _open(plan)
    try:
        identity = [IdentityRange(*r) for f in files for r in f.identity]  # reserved in the tasks
        return _commit(
            table, plan, adds, rows, app_id=app_id, query_id=query_id, run_id=run_id, batch_id=batch_id,
            identity=identity,
        )  # fmt: skip
    finally:
        table.close()


def _open(plan: BatchPlan) -> Table:
    options = plan.options
    try:
        return plan.open_table(group_commit=options.group_commit)
    except TableNotFoundError:
        if plan.read_version >= 0:
            raise
        location = plan.location
        return Table.handle(
            plan.uri, slots=options.slots, storage_options=location.storage_options, durable=location.durable
        )


def _commit(
    table: Table,
    plan: BatchPlan,
    adds: list[AddFile],
    rows: int,
    *,
    app_id: str,
    query_id: str,
    run_id: str,
    batch_id: int,
    identity: Sequence[IdentityRange] = (),
) -> BatchCommit:
    provenance = {"queryId": query_id, "runId": run_id, "batchId": batch_id, "appId": app_id}
    parameters = {
        "outputMode": "Complete" if plan.complete else "Append",
        "queryId": query_id,
        "epochId": str(batch_id),
        "runId": run_id,
    }
    fs, root = table.log.fs, table.log.root
    exists = plan.read_version >= 0 or plan.table_exists()
    if not exists:
        txn = _SinkTransaction(table, None, provenance)
        _stage_new_table(txn, plan)
        read_version = -1
        latest: Snapshot | None = None
    else:
        latest = table.refresh()
        read_version = _read_version(table, plan, latest, app_id=app_id, query_id=query_id, run_id=run_id)
        base = table.snapshot(read_version) if read_version >= 0 else None
        if base is None:  # planned before the table existed: someone created it meanwhile
            txn = _SinkTransaction(table, None, provenance)
            _stage_new_table(txn, plan)
        else:
            changed = _metadata_changed(table, base, latest, query_id=query_id, batch_id=batch_id)
            if changed is not None:
                delete_files(fs, root, [a.path for a in adds])
                raise changed
            recorded = latest.txn_version(app_id)
            if recorded > batch_id:
                delete_files(fs, root, [a.path for a in adds])
                raise _several_queries(
                    None, table=table, query_id=query_id, run_id=run_id, batch_id=batch_id,
                    app_id=app_id, winner=last_app_commit(table, app_id, latest.version), recorded=recorded,
                )  # fmt: skip
            txn = _SinkTransaction(table, base, provenance)
    txn.user_metadata = plan.options.user_metadata
    if not txn.idempotent(app_id, batch_id):
        txn.commit()  # a no-op: this batch was committed before (a replay)
        delete_files(fs, root, [a.path for a in adds])
        log.info(
            "batch %d of query %s (run %s) was already committed to %s: replay skipped, %d files deleted",
            batch_id, query_id, run_id, plan.uri, len(adds),
        )  # fmt: skip
        metrics.observe_streaming_batch("replay skipped")
        return BatchCommit(batch_id, None, 0, 0, read_version)
    if not adds and not plan.complete:
        txn.abort()
        log.debug("batch %d of query %s wrote no rows: nothing to commit", batch_id, query_id)
        return BatchCommit(batch_id, None, 0, 0, read_version)
    merged = plan.schema if plan.options.merge_schema else None
    txn.record_identity(identity)
    txn.run(
        lambda p: _stream_update(
            p, adds, complete=plan.complete, schema=merged, num_rows=rows, parameters=parameters
        )
    )
    try:
        result = txn.commit()
    except ConcurrentTransactionException as exc:
        raise _several_queries(
            exc, table=table, query_id=query_id, run_id=run_id, batch_id=batch_id, app_id=app_id
        ) from exc
    except ProtocolChangedException as exc:
        if not exists or txn.read_version < 0:
            raise  # two creators of one table: Delta's error, with its hint
        raise MetadataChangedException(
            winning_version=exc.winning_version,
            operation=exc.operation,
            winning_commit_info=exc.winning_commit_info,
            table=exc.table,
        ) from exc
    if not exists or txn.read_version < 0:
        table.bind_slots(txn.metadata.id)
    metrics.observe_streaming_batch("committed")
    log.info(
        "batch %d of query %s (run %s): %d files, %d rows committed to %s as version %d",
        batch_id, query_id, run_id, len(adds), rows, plan.uri, result.version,
    )  # fmt: skip
    compaction = None
    if not plan.complete and adds:
        compaction = _auto_compact(table, plan, adds)
    return BatchCommit(batch_id, result.version, len(adds), rows, txn.read_version, compaction)


def _read_version(
    table: Table, plan: BatchPlan, latest: Snapshot, *, app_id: str, query_id: str, run_id: str
) -> int:
    """This run's previous commit of ``app_id`` if there is one at or before the planned
    version; else the planned version (see the module docstring)."""
    planned = min(plan.read_version, latest.version)
    if planned < 0:
        return planned
    try:
        snap = table.snapshot(planned)
    except Exception:  # pragma: no cover - a version vanished: read the latest
        return latest.version
    if snap.txn_version(app_id) < 0:
        return planned
    previous = previous_run_commit(table, app_id, planned, query_id=query_id, run_id=run_id)
    return previous.version if previous is not None else planned


def _stage_new_table(txn: Transaction, plan: BatchPlan) -> None:
    """The first batch creates the table (version 0) with the planned schema and partitioning."""
    stage_new_table(txn, plan.schema, plan.schema_json, plan.partition_by)


def _auto_compact(table: Table, plan: BatchPlan, adds: Sequence[AddFile]) -> CompactionOutcome | None:
    try:
        snap = table.refresh()
    except Exception as exc:
        log.warning("auto-compaction check of %s skipped: %r", plan.uri, exc)
        return None
    if not auto_compact_enabled(snap.properties, plan.options.auto_compact):
        return None
    touched = list({tuple(sorted(a.partition_values.items())): a.partition_values for a in adds}.values())
    return maybe_compact(table, touched, min_files=plan.options.auto_compact_min_files, snapshot=snap)


# --------------------------------------------------------------------------- one-process driver


class MicroBatchSink:
    """A sink whose planning, tasks and commit run in one process (engines without
    distributed tasks, tests, benchmarks): ``sink.process(batch_id, table)`` per batch.

    ``query_id`` must be stable across restarts of the query (it is the txn app id);
    ``run_id`` must change on every restart. ``storage_options``: fsspec options of the
    table's file system (or pass a :class:`TableLocation` as ``uri``). ``durable``: every
    file and commit fsynced before a batch's commit returns (:mod:`eventlog.log.durable`).
    """

    def __init__(
        self,
        uri: str | TableLocation,
        *,
        query_id: str,
        run_id: str | None = None,
        complete: bool = False,
        options: SinkOptions | None = None,
        storage_options: Mapping[str, Any] | None = None,
        durable: bool = False,
    ) -> None:
        self.location = TableLocation.of(uri, storage_options, durable=durable)
        self.uri = self.location.uri
        self.query_id = query_id
        self.run_id = run_id or str(uuid.uuid4())
        self.complete = complete
        self.options = options or SinkOptions()

    def plan(self, schema: pa.Schema) -> BatchPlan:
        return plan_batch(self.location, schema, complete=self.complete, options=self.options)

    def write(self, plan: BatchPlan, batch_id: int, data: pa.Table, task: int = 0) -> BatchFiles:
        return write_batch_files(
            plan, data.to_batches(), query_id=self.query_id, batch_id=batch_id, task=task
        )

    def process(self, batch_id: int, data: pa.Table) -> BatchCommit:
        plan = self.plan(data.schema)
        files = self.write(plan, batch_id, data)
        try:
            return commit_batch(plan, [files], query_id=self.query_id, run_id=self.run_id, batch_id=batch_id)
        except BaseException:
            abort_batch(
                self.location,
                query_id=self.query_id,
                batch_id=batch_id,
                files=[files],
                slots=self.options.slots,
            )
            raise
