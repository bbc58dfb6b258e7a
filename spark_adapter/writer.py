"""Batch writes: ``df.write.format("eventlog").mode("append"|"overwrite").save(uri)``.

Three places, three processes (see the PySpark Data Source reference):

* :func:`plan_write` runs in ``DataSource.writer()`` on the driver side while Spark plans
  the job: it opens the table, enforces the schema and checks every option, so a bad
  write fails before any task runs. Its result (a picklable :class:`WritePlan`) travels
  inside the pickled :class:`EventlogWriter` to the tasks and to ``commit``/``abort``.
* :meth:`EventlogWriter.write` runs in each task: Arrow batches are conformed to the table
  schema, checked against ``replaceWhere`` and written as Parquet with
  :func:`eventlog.files.datafiles.write_data_files`; the task returns the add actions.
* :meth:`EventlogWriter.commit` runs once on the driver side: one eventlog transaction
  whose read version is the version planned, so the table's isolation level and conflict
  rules apply to everything committed since planning.

Durable mode (the ``durable`` option, :mod:`eventlog.log.durable`): the plan's location is
durable, so each task fsyncs the data files it wrote, and their directories, before it
returns its message (Spark's own Parquet writer never writes an eventlog table's files:
every file is written by these Python tasks), and the commit runs on a durable table
handle (staged commit, claim, publish). A write is acknowledged only after all of it.

Liquid clustering: the ``clusterBy`` option (comma-separated columns) makes a new table
clustered (``Table.create(..., cluster_by=...)``); on an existing table it must name the
table's clustering columns, else ``ClusteringError`` (reason ``mismatch``) naming both lists:
a write never changes the layout (``EventlogTable.clusterBy`` does). With partition columns
it is ``ClusteringError`` (reason ``partitioned``), as the engine refuses it. Spark's own
``DataFrameWriter.clusterBy(...)`` never reaches a Python data source: measured with pyspark
4.3, Spark refuses the write itself ("The provided partitioning or clustering columns do not
match the existing table's. - provided: cluster_by(id) - table: ", an
IllegalArgumentException), as it does for ``.partitionBy(...)``; hence the option.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from eventlog import expr as ex
from eventlog.errors import ClusteringError, InvalidInputError, TableNotFoundError
from eventlog.files.constraints import WriteRules
from eventlog.files.datafiles import DEFAULT_TARGET_FILE_SIZE, delete_files, write_data_files
from eventlog.files.enforce import merge_schema
from eventlog.files.schema import from_spark_schema_json, to_spark_schema_json
from eventlog.log.actions import AddFile
from eventlog.log.location import TableLocation
from eventlog.ops.alter import APPEND_ONLY_KEY, TARGET_FILE_SIZE_KEY
from eventlog.ops.clustering import stage_new_clustering
from eventlog.ops.columns import evolve_schema
from eventlog.ops.transaction import Transaction
from eventlog.ops.write import stage_new_table
from eventlog.snapshot.clustering import check_cluster_by, clustering_columns
from eventlog.snapshot.protocol import protocol_for
from eventlog.table import Table
from eventlog.table.identity import TaskIdentity, check_identity_write, ranges_from_json, ranges_to_json
from eventlog.userinput import check_app_id, check_optional_text
from spark_adapter.errors import typed_task_errors
from spark_adapter.types import option, option_bool, option_int, spark_to_arrow_schema, write_location

__all__ = ["EventlogCommitMessage", "EventlogWriter", "WritePlan", "plan_write"]

log = logging.getLogger("spark_adapter.writer")

# Arrow bytes a task buffers before writing them out: bounds a task's memory; each flush
# closes at least one file (one per partition value).
_FLUSH_BYTES = 128 * 1024 * 1024


@dataclasses.dataclass
class EventlogCommitMessage(WriterCommitMessage):  # type: ignore[misc]
    """What one task wrote: its add actions (``AddFile.to_json`` dicts) and row count."""

    adds: list[dict[str, Any]]
    num_rows: int
    identity: list[list[Any]] = dataclasses.field(default_factory=list)  # ranges the task reserved


@dataclasses.dataclass(frozen=True)
class WritePlan:
    """Everything the tasks and the commit need, decided once at planning (the location
    carries the storage options to the tasks and to the commit's worker)."""

    location: TableLocation
    slots: str | None
    overwrite: bool
    read_version: int  # -1: no table yet; the commit creates it as version 0
    schema_json: str  # the table schema the data is written with (after mergeSchema)
    partition_by: tuple[str, ...]
    merge_schema: bool
    replace_where: str | None
    app_id: str | None
    app_version: int | None
    user_metadata: str | None
    target_file_size: int
    skip: bool  # an idempotent write whose (txnAppId, txnVersion) is already committed
    group_commit: bool = False  # a blind append may share its version (eventlog.txn.groupcommit)
    rules: WriteRules = dataclasses.field(default_factory=WriteRules)  # enforced in the tasks
    cluster_by: tuple[str, ...] = ()  # a new table's clustering columns (the clusterBy option)

    @property
    def uri(self) -> str:
        return self.location.uri

    def open_table(self, **options: Any) -> Table:
        location = self.location
        return Table.open(
            location.uri,
            slots=self.slots,
            storage_options=location.storage_options,
            durable=location.durable,
            **options,
        )

    @property
    def schema(self) -> pa.Schema:
        return from_spark_schema_json(self.schema_json)


def plan_write(options: Any, spark_schema: StructType, overwrite: bool) -> WritePlan:
    """Open (or plan to create) the table and validate the write; raises before any task runs."""
    location = write_location(options)
    uri = location.uri
    slots = option(options, "slots")
    app_id, app_version = option(options, "txnAppId"), option_int(options, "txnVersion")
    if (app_id is None) != (app_version is None):
        raise InvalidInputError("Both txnVersion and txnAppId must be specified for idempotent writes.")
    if app_id is not None:
        check_app_id(app_id)
    user_metadata = check_optional_text(option(options, "userMetadata"), "userMetadata")
    replace_where = option(options, "replaceWhere")
    if replace_where is not None and not overwrite:
        raise InvalidInputError("replaceWhere needs mode('overwrite'); an append replaces nothing")
    merge = option_bool(options, "mergeSchema")
    data_schema = spark_to_arrow_schema(spark_schema, nullable=True)
    try:
        table: Table | None = Table.open(uri, slots=slots, storage_options=location.storage_options)
    except TableNotFoundError:
        table = None
    skip = False
    props: Mapping[str, str] = {}
    if table is None:
        read_version, schema = -1, data_schema
        parts = _partition_columns(option(options, "partitionBy"), schema) or ()
        clustered = _clustering(option(options, "clusterBy"), schema, parts, None)
    else:
        try:
            snap = table.refresh()
        finally:
            table.close()
        read_version, props = snap.version, snap.properties
        requested = _partition_columns(option(options, "partitionBy"), snap.schema)
        if requested is not None and requested != snap.partition_columns:
            raise InvalidInputError(
                f"partitionBy {list(requested)} differs from the table's partition columns "
                f"{list(snap.partition_columns)}"
            )
        parts = snap.partition_columns
        current = clustering_columns(snap.protocol, snap.domains, snap.schema)
        clustered = _clustering(option(options, "clusterBy"), snap.schema, parts, current, props)
        schema = merge_schema(snap.schema, data_schema) if merge else snap.schema
        # Column mapping: new columns get their physical names before any task writes them.
        schema, _ = evolve_schema(schema, props)
        if overwrite and props.get(APPEND_ONLY_KEY) == "true":
            raise InvalidInputError(f"overwrite is not allowed: table {uri} has {APPEND_ONLY_KEY} = true")
        if app_id is not None and app_version is not None:
            skip = snap.txn_version(app_id) >= app_version
    # Schema enforcement before any task runs: the error names every offending column.
    rules = WriteRules.of(schema, props)
    rules.conform(
        check_identity_write(schema, data_schema, f"write to {uri}"), schema, context=f"write to {uri}"
    )
    if replace_where is not None:
        ex.parse_predicate(replace_where, schema, context="replaceWhere")
    return WritePlan(
        location=location,
        slots=slots,
        overwrite=overwrite,
        read_version=read_version,
        schema_json=to_spark_schema_json(schema),
        partition_by=tuple(parts),
        merge_schema=merge,
        replace_where=replace_where,
        app_id=app_id,
        app_version=app_version,
        user_metadata=user_metadata,
        target_file_size=int(props.get(TARGET_FILE_SIZE_KEY, DEFAULT_TARGET_FILE_SIZE)),
        skip=skip,
        group_commit=option_bool(options, "groupCommit"),
        rules=rules,
        cluster_by=tuple(clustered) if read_version < 0 else (),
    )


def _clustering(
    spec: str | None,
    schema: pa.Schema,
    parts: Sequence[str],
    current: Sequence[str] | None,
    properties: Mapping[str, str] | None = None,
) -> list[str]:
    """The ``clusterBy`` option (comma-separated; names matched as ``partitionBy`` matches
    them) validated by the engine's rules (:func:`check_cluster_by`: ``ClusteringError``,
    reason ``partitioned`` with partition columns). On an existing table (``current``: its
    clustering columns) it must name them: ClusteringError ``mismatch`` otherwise."""
    if spec is None:
        return list(current or ())
    names = [raw.strip().strip("`") for raw in spec.split(",")]
    requested = [_resolve(name, schema) for name in names if name]
    clustered = check_cluster_by(requested, schema, parts, properties)
    if current is not None and clustered != list(current):
        raise ClusteringError(
            f"clusterBy {clustered} differs from the table's clustering columns {list(current)}: "
            "a write does not change the layout (EventlogTable.clusterBy does)",
            columns=clustered,
            reason="mismatch",
        )
    return clustered


def _resolve(name: str, schema: pa.Schema) -> str:
    """A column named in a write option: exact, else the one name equal ignoring case, else
    as given (check_cluster_by then refuses it: ClusteringError ``unknown column``)."""
    match = [n for n in schema.names if n.lower() == name.lower()]
    return name if name in schema.names or len(match) != 1 else str(match[0])


def _partition_columns(spec: str | None, schema: pa.Schema) -> tuple[str, ...] | None:
    """``partitionBy`` (comma-separated) resolved to the schema's names; None if not given."""
    if spec is None:
        return None
    by_lower: dict[str, list[str]] = {}
    for name in schema.names:
        by_lower.setdefault(name.lower(), []).append(name)
    out: list[str] = []
    for raw in spec.split(","):
        name = raw.strip().strip("`")
        if not name:
            continue
        match = [name] if name in schema.names else by_lower.get(name.lower(), [])
        if len(match) != 1:
            raise InvalidInputError(f"partitionBy column {name!r} is not in the schema {schema.names}")
        col = match[0]
        if pa.types.is_nested(schema.field(col).type):
            raise InvalidInputError(f"partitionBy column {col!r} has nested type {schema.field(col).type}")
        out.append(col)
    if len(set(out)) != len(out):
        raise InvalidInputError(f"partitionBy lists a column twice: {out}")
    if out and len(out) == len(schema):
        raise InvalidInputError("a table cannot be partitioned by all of its columns")
    return tuple(out)


class EventlogWriter(DataSourceArrowWriter):  # type: ignore[misc]
    """The pickled writer: ``write`` in tasks, ``commit``/``abort`` once on the driver side."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    # ------------------------------------------------------------------ tasks

    def write(self, iterator: Iterator[pa.RecordBatch]) -> EventlogCommitMessage:
        plan = self.plan
        if plan.skip:
            collections.deque(iterator, maxlen=0)  # drain: Spark feeds the task's input regardless
            return EventlogCommitMessage([], 0)
        schema = plan.schema
        pred = (
            ex.parse_predicate(plan.replace_where, schema, context="replaceWhere")
            if plan.replace_where is not None
            else None
        )
        fs, root = plan.location.files()
        adds: list[AddFile] = []
        rows = 0
        buffered: list[pa.RecordBatch] = []
        size = 0
        ids = TaskIdentity(plan.uri, plan.slots, plan.location.storage_options)  # identity values
        try:
            with typed_task_errors():
                for batch in iterator:
                    if batch.num_rows == 0:
                        continue
                    buffered.append(batch)
                    size += batch.nbytes
                    if size >= _FLUSH_BYTES:
                        rows += self._flush(fs, root, buffered, schema, pred, adds, ids)
                        buffered, size = [], 0
                if buffered:
                    rows += self._flush(fs, root, buffered, schema, pred, adds, ids)
        except BaseException:
            # A failed task's message never reaches abort(): clean up here.
            delete_files(fs, root, [a.path for a in adds])
            raise
        finally:
            ids.close()
        return EventlogCommitMessage([a.to_json() for a in adds], rows, ranges_to_json(ids.ranges))

    def _flush(
        self,
        fs: fsspec.AbstractFileSystem,
        root: str,
        batches: Sequence[pa.RecordBatch],
        schema: pa.Schema,
        pred: ex.Expr | None,
        adds: list[AddFile],
        ids: TaskIdentity,
    ) -> int:
        context = f"write to {self.plan.uri}"
        data = ids.fill(pa.Table.from_batches(batches), schema, context)
        data = self.plan.rules.conform(data, schema, context=context)
        if pred is not None:
            ok = ex.evaluate_mask(pred, data)
            bad = data.num_rows - (pc.sum(ok).as_py() or 0)
            if bad:
                raise InvalidInputError(
                    f"Data written out does not match replaceWhere '{self.plan.replace_where}': "
                    f"{bad} of {data.num_rows} rows of this task fall outside it"
                )
        adds.extend(
            write_data_files(
                fs,
                root,
                data,
                partition_columns=self.plan.partition_by,
                target_file_size=self.plan.target_file_size,
            )
        )
        return int(data.num_rows)

    # ------------------------------------------------------------------ driver side

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        plan = self.plan
        done = [m for m in messages if isinstance(m, EventlogCommitMessage)]
        adds = [AddFile.from_json(d) for m in done for d in m.adds]
        rows = sum(m.num_rows for m in done)
        if plan.skip:
            return
        table, txn = self._transaction()
        try:
            txn.record_identity(r for m in done for r in ranges_from_json(m.identity))
            self._commit(txn, adds, rows)
        finally:
            table.close()  # a ZooKeeper slot store's session with it

    def _commit(self, txn: Transaction, adds: list[AddFile], rows: int) -> None:
        plan = self.plan
        txn.user_metadata = plan.user_metadata
        if not txn.idempotent(plan.app_id, plan.app_version):
            txn.commit()  # a no-op, as in Delta: the version was committed meanwhile
            delete_files(txn.table.log.fs, txn.table.log.root, [a.path for a in adds])
            return
        merged = plan.schema if plan.merge_schema else None
        if plan.overwrite:
            txn.overwrite_files(adds, replace_where=plan.replace_where, schema=merged, num_rows=rows)
        else:
            txn.append_files(adds, schema=merged, num_rows=rows)
        result = txn.commit()
        if plan.read_version < 0:
            txn.table.bind_slots(txn.metadata.id)
        log.info(
            "committed %s of %d files, %d rows to %s as version %d (%d attempts)",
            "overwrite" if plan.overwrite else "append",
            len(adds),
            rows,
            plan.uri,
            result.version,
            result.attempts,
        )

    def _transaction(self) -> tuple[Table, Transaction]:
        """A transaction reading the planned version (a new table: creating version 0)."""
        plan = self.plan
        if plan.read_version >= 0:
            table = plan.open_table(group_commit=plan.group_commit)
            try:
                return table, Transaction(table, table.snapshot(plan.read_version))
            except BaseException:
                table.close()
                raise
        # The path held no table at planning: this commit creates it, with the data, as
        # version 0. A writer that created it meanwhile wins; we get ProtocolChangedException
        # from the conflict check (as Delta), and our files are deleted.
        location = plan.location
        handle = Table.handle(
            plan.uri, slots=plan.slots, storage_options=location.storage_options, durable=location.durable
        )
        txn = Transaction(handle, None)
        stage_new_table(txn, plan.schema, plan.schema_json, plan.partition_by)
        if plan.cluster_by:  # the clustering features and domain, as Table.create stages them
            stage_new_clustering(
                txn, protocol_for(plan.schema, {}), plan.schema, plan.partition_by, plan.cluster_by, {}
            )
        return handle, txn

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Delete the files the messages name, unless a commit references them.

        Spark also calls abort when ``commit`` raised, and a commit that raised
        CommitStateUnknownError may still have landed: files are deleted only when the
        log proves no commit since planning added them. Anything left is for VACUUM.
        """
        paths = [d["path"] for m in messages if isinstance(m, EventlogCommitMessage) for d in m.adds]
        if not paths:
            return
        fs, root = self.plan.location.files()
        try:
            if _referenced(self.plan, set(paths)):
                log.warning("abort of a write to %s: its files were committed; keeping them", self.plan.uri)
                return
        except Exception as exc:  # cannot prove the files unused: keep them
            log.warning("abort of a write to %s: cannot read the log (%s); files kept", self.plan.uri, exc)
            return
        delete_files(fs, root, paths)


def _referenced(plan: WritePlan, paths: set[str]) -> bool:
    """Did any commit after the planned version add one of ``paths``?"""
    if not Table.exists(plan.uri, storage_options=plan.location.storage_options):
        return False
    with plan.open_table() as table:
        latest = table.version
        first = max(plan.read_version + 1, 0)
        return any(a.path in paths for c in table.commits_between(first, latest) for a in c.adds)
