"""Streaming writes: ``df.writeStream.format("eventlog").option("checkpointLocation", c).start(uri)``.

The exactly-once commit itself is engine-neutral (:mod:`streaming.sink`); this module maps
it onto pyspark 4.3's Python streaming sink, which runs every micro-batch in three places
(observed; see the PySpark Data Source reference, sections 2 and 3(c)):

* **Planning**, once per micro-batch, in a pooled Python worker on the driver side
  (``write_into_data_source``): ``DataSource.streamWriter()`` -> :func:`create_stream_writer`
  plans the batch (:func:`streaming.plan.plan_batch`: table, schema, options; errors here fail
  the batch before any task runs) and checks the checkpoint's owner. The writer it returns
  is pickled to the tasks.
* **Tasks**: :meth:`EventlogStreamWriter.write` writes the rows (Arrow batches) as files named
  ``part-<queryId>-b<batchId>-t<partition>-...``. The query id, batch id and run id come from
  the task's local properties (``sql.streaming.queryId``, ``streaming.sql.batchId``, and
  ``spark.jobGroup.id``, which Structured Streaming sets to the run id). Each task returns
  an :class:`EventlogStreamCommitMessage` carrying its files and the batch's plan.
* **Commit**, once per micro-batch, in a *fresh* Python worker: Spark calls
  ``DataSource.streamWriter()`` again there and then ``commit(messages, batchId)`` on that new
  writer, so nothing but the messages and the options reaches the commit. The commit
  re-checks the checkpoint's owner and runs :func:`streaming.sink.commit_batch`;
  ``abort(messages, batchId)`` deletes the batch's files by their name prefix
  (:func:`streaming.batchfiles.abort_batch`, never a committed file). Which of the two calls
  this is is told by the pyspark worker module on the call stack: the commit-side call
  skips the planning work (a fallback to full planning is merely slower).

Checkpoint ownership (:mod:`streaming.ownership`). Where the lease handle lives: no Python
process of ours lives exactly as long as a query - planning workers are pooled, reused by
other queries and killed after a minute idle, commit workers live for one commit. The only
long-lived process is the Spark driver (the JVM). So the first planning of a query (before
its first batch's tasks run) starts a detached *holder process* that takes the lease for
the checkpoint location and keeps it until the driver JVM exits (it checks every half
second, pid plus start time). The lease names the application (host, driver pid and start
time), the query id (from ``<checkpointLocation>/metadata``) and the driver pid. Every later
planning and every commit checks that the lease belongs to this application:

* another application already running the query -> the new query fails at its first
  planning, before any task, with ``ConcurrentTransactionException`` naming the owner;
* a restart of the query in the *same* application (after ``stop()`` or a failure) finds
  its own application's lease and goes on (Spark itself refuses two active runs of one
  query in one application);
* the driver dies (even by SIGKILL) -> the holder releases within a second; a query in
  another application can then start.

What the early check covers, exactly: it runs in the first planning of the sink, which is
before any task runs and before anything reaches the table, but *after* Spark wrote the
batch's entry in the checkpoint's offset log (no code of a Python sink runs earlier: the
DataSource is not even constructed at ``start()``; observed). When the refused query had
found new input and the owner had not yet planned that batch, the owner's next batch then
fails on Spark's own check ("Concurrent update to the log. Multiple streaming jobs
detected"): neither query writes anything twice, but the owner stops too.

What this does not cover: an application that stopped the query but keeps running holds
the checkpoint until it exits (a lease cannot tell a stopped query from an idle one).
Without ``option("checkpointLocation", ...)`` (a session-wide
``spark.sql.streaming.checkpointLocation``) the sink cannot name the checkpoint and takes
no lease; neither does it with ``checkpointLease=false``. The commit-time check of
:mod:`streaming.sink` (another run wrote the query's app id) still applies in every case.
Finding the driver needs ``/proc`` or ``ps``; where neither works, no lease is taken (logged).

Output modes: ``append`` and ``complete`` (each batch replaces the table). Spark refuses
``update`` for every Python data source sink (``... does not support Update mode``); write
updates with ``foreachBatch`` and :meth:`spark_adapter.table.EventlogTable.merge` instead.

Options (case-insensitive; as for batch writes where they make sense):

==========================  =============================================================
``partitionBy``             partition columns of the table the first batch creates
``mergeSchema``             ``true``: new columns of the stream join the table schema
``userMetadata``            stored in every batch's ``commitInfo``
``slots``                   slot store URI (also where the checkpoint lease lives)
``groupCommit``             ``true``: a batch may share its version with concurrent appends
``txnAppId``                the ``txn`` app id instead of the query id
``autoCompact``             ``true``/``false``: overrides ``delta.autoOptimize.autoCompact``
``autoCompactMinNumFiles``  small files in a partition that trigger a compaction (50)
``checkpointLease``         ``false`` turns the start-of-query ownership check off
``durable``                 ``true``: every batch's files fsynced in its tasks, and its
                            commit, before the batch is acknowledged (as for batch writes)
``storage.<name>``          fsspec storage options of the table's file system (and
``storageOptions``          a JSON object of them), as for batch writes
==========================  =============================================================

Storage options: the table may live on an object store (``s3://``) while the checkpoint is
local. The options are parsed from the query's options in every planning and commit worker
(Spark hands the options over again on every restart) and travel to the tasks inside the
batch's plan; they are not written to the checkpoint or the table's log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from eventlog.errors import InvalidInputError
from eventlog.files.schema import from_spark_schema_json, to_spark_schema_json
from eventlog.log.commitlog import resolve_slots
from eventlog.log.location import TableLocation
from lockstore import LeaseOwner, SlotStore
from lockstore.registry import ENV_VAR
from spark_adapter.errors import typed_task_errors
from spark_adapter.types import option, option_bool, option_int, spark_to_arrow_schema, write_location
from streaming import ownership
from streaming.batchfiles import UNKNOWN, BatchFiles, abort_batch, write_batch_files
from streaming.compaction import DEFAULT_MIN_FILES, parse_auto_compact
from streaming.plan import BatchPlan, SinkOptions, plan_batch
from streaming.sink import commit_batch, latest_run

__all__ = [
    "EventlogStreamCommitMessage",
    "EventlogStreamWriter",
    "StreamSettings",
    "create_stream_writer",
]

log = logging.getLogger("spark_adapter.stream_writer")

_COMMIT_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"
_REFUSED = {
    "txnVersion": "the micro-batch id is the txn version of every streaming commit",
    "replaceWhere": "complete output mode replaces the whole table; append replaces nothing",
}


@dataclasses.dataclass(frozen=True)
class StreamSettings:
    """The query's options, parsed and checked (planning and commit parse the same ones)."""

    location: TableLocation
    checkpoint: str | None
    complete: bool
    sink: SinkOptions
    lease: bool
    schema_json: str  # the stream's schema as Spark hands it to the sink

    @staticmethod
    def parse(options: Mapping[str, str], schema: StructType, overwrite: bool) -> StreamSettings:
        for key, why in _REFUSED.items():
            if option(options, key) is not None:
                raise InvalidInputError(f"option {key} is not a streaming sink option: {why}")
        spec = option(options, "partitionBy")
        parts = None
        if spec is not None:
            parts = tuple(p.strip().strip("`") for p in spec.split(",") if p.strip().strip("`"))
        sink = SinkOptions(
            slots=option(options, "slots"),
            partition_by=parts,
            merge_schema=option_bool(options, "mergeSchema"),
            user_metadata=option(options, "userMetadata"),
            group_commit=option_bool(options, "groupCommit"),
            app_id=option(options, "txnAppId"),
            auto_compact=parse_auto_compact(option(options, "autoCompact"), "option autoCompact"),
            auto_compact_min_files=option_int(options, "autoCompactMinNumFiles", minimum=1)
            or DEFAULT_MIN_FILES,
        )
        data_schema = spark_to_arrow_schema(schema, nullable=True)
        return StreamSettings(
            location=write_location(options),
            checkpoint=option(options, "checkpointLocation"),
            complete=overwrite,
            sink=sink,
            lease=option_bool(options, "checkpointLease", default=True),
            schema_json=to_spark_schema_json(data_schema),
        )

    @property
    def uri(self) -> str:
        return self.location.uri

    @property
    def data_schema(self) -> pa.Schema:
        return from_spark_schema_json(self.schema_json)

    def plan(self) -> BatchPlan:
        return plan_batch(self.location, self.data_schema, complete=self.complete, options=self.sink)


@dataclasses.dataclass
class EventlogStreamCommitMessage(WriterCommitMessage):  # type: ignore[misc]
    """What one task of a micro-batch wrote, and which query, run and batch it belongs to."""

    plan: BatchPlan
    query_id: str
    run_id: str
    batch_id: int
    task: int
    files: BatchFiles


def create_stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> EventlogStreamWriter:
    """``DataSource.streamWriter()``: plan the micro-batch and check the checkpoint's owner,
    or (in Spark's per-batch commit worker) just carry the options to the commit."""
    with typed_task_errors():  # a bad option reaches the caller recoverable (recover_error)
        settings = StreamSettings.parse(options, schema, overwrite)
    if _called_by(_COMMIT_RUNNER):
        return EventlogStreamWriter(settings, None, None)
    plan = settings.plan()
    query_id = _checkpoint_query_id(settings.checkpoint)
    _claim(settings, query_id)
    return EventlogStreamWriter(settings, plan, query_id)


class EventlogStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    """The pickled writer: ``write`` in tasks; ``commit``/``abort`` on a fresh copy per batch."""

    def __init__(self, settings: StreamSettings, plan: BatchPlan | None, query_id: str | None) -> None:
        self.settings = settings
        self.plan = plan
        self.query_id = query_id

    # ------------------------------------------------------------------ tasks

    def write(self, iterator: Iterator[pa.RecordBatch]) -> EventlogStreamCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        props = _task_properties(context)
        plan = self.plan if self.plan is not None else self.settings.plan()
        query_id = props.get("queryId") or self.query_id or UNKNOWN
        batch_id = int(props.get("batchId") or -1)
        if batch_id < 0:
            raise InvalidInputError("format('eventlog') streaming write outside a micro-batch (no batch id)")
        task = context.partitionId() if context is not None else 0
        with typed_task_errors():  # a ConstraintViolationError reaches the driver typed
            files = write_batch_files(plan, iterator, query_id=query_id, batch_id=batch_id, task=task)
        return EventlogStreamCommitMessage(
            plan=plan,
            query_id=query_id,
            run_id=props.get("runId") or UNKNOWN,
            batch_id=batch_id,
            task=task,
            files=files,
        )

    # ------------------------------------------------------------------ driver side

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, EventlogStreamCommitMessage)]
        settings = self.settings
        if done:
            first = done[0]
            plan, query_id, run_id = first.plan, first.query_id, first.run_id
            others = {(m.query_id, m.batch_id) for m in done} - {(query_id, batchId)}
            if others:
                raise InvalidInputError(f"batch {batchId}: commit messages of other batches {sorted(others)}")
        elif settings.complete:  # no task ran: complete mode still replaces the table (empty)
            plan = settings.plan()
            query_id = _checkpoint_query_id(settings.checkpoint) or UNKNOWN
            run_id = UNKNOWN
        else:
            return
        self._verify(query_id)
        result = commit_batch(
            plan, [m.files for m in done], query_id=query_id, run_id=run_id, batch_id=batchId
        )
        if result.compaction is not None and result.compaction.failed:
            log.warning(
                "batch %d committed; its auto-compaction failed: %s", batchId, result.compaction.error
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, EventlogStreamCommitMessage)]
        query_id = done[0].query_id if done else _checkpoint_query_id(self.settings.checkpoint)
        if query_id is None:
            log.warning(
                "abort of batch %d of %s: query id unknown; orphans left for VACUUM",
                batchId,
                self.settings.uri,
            )
            return
        deleted = abort_batch(
            self.settings.location,
            query_id=query_id,
            batch_id=batchId,
            files=[m.files for m in done],
            slots=self.settings.sink.slots,
        )
        log.info("abort of batch %d of %s: %d files deleted", batchId, self.settings.uri, len(deleted))

    def _verify(self, query_id: str) -> None:
        """The commit-side ownership check: the lease must be this application's (or free)."""
        settings = self.settings
        if not settings.lease or settings.checkpoint is None:
            return
        here = _application()
        if here is None:
            return
        store = _slot_store(settings)
        ownership.verify_checkpoint(
            store, settings.checkpoint, app=here[0], table=settings.uri, run_hint=_run_hint(settings)
        )


# --------------------------------------------------------------------------- helpers


def _called_by(module: str) -> bool:
    """Whether ``module`` (imported by pyspark's daemon, or run as ``__main__``) is on the stack."""
    filename = module.rsplit(".", 1)[-1] + ".py"
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == module or frame.f_code.co_filename.endswith(filename):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _task_properties(context: Any) -> dict[str, str]:
    """Query id, batch id and run id of the micro-batch a task belongs to."""
    if context is None:
        return {}
    get = context.getLocalProperty
    props = {
        "queryId": get("sql.streaming.queryId") or "",
        "batchId": get("streaming.sql.batchId") or "",
        "runId": get("spark.jobGroup.id") or "",
    }
    description = get("spark.job.description") or ""
    for line in description.splitlines():  # "id = ...\nrunId = ...\nbatch = ..."
        key, _, value = line.partition(" = ")
        if key.strip() == "runId" and value.strip():
            props["runId"] = value.strip()
    return props


def _checkpoint_query_id(checkpoint: str | None) -> str | None:
    """The query id Spark keeps in ``<checkpointLocation>/metadata`` ({"id": ...})."""
    if checkpoint is None:
        return None
    try:
        fs, path = fsspec.core.url_to_fs(checkpoint)
        with fs.open(path.rstrip("/") + "/metadata", "rb") as f:
            value = json.loads(f.read().decode("utf-8").splitlines()[0]).get("id")
        return str(value) if value else None
    except Exception as exc:
        log.debug("no query id in %s/metadata: %r", checkpoint, exc)
        return None


# Slot stores of this (pooled) Python worker, by spec: a ZooKeeper session stays open from
# one micro-batch to the next instead of being opened for every lease check.
_STORES: dict[tuple[str | None, str], SlotStore] = {}


def _slot_store(settings: StreamSettings) -> SlotStore:
    spec = settings.sink.slots or os.environ.get(ENV_VAR)
    key = (spec, "" if spec else settings.uri)
    store = _STORES.get(key)
    if store is None or store.closed:
        store = _STORES[key] = resolve_slots(spec, settings.location.log_store())
    return store


def _run_hint(settings: StreamSettings) -> Any:
    def hint(owner: LeaseOwner) -> str | None:
        query = owner.info.get("queryId")
        if not query:
            return None
        run = latest_run(
            settings.location, query_id=query, app_id=settings.sink.app_id, slots=settings.sink.slots
        )
        return f"{run} (of its latest committed batch)" if run else None

    return hint


def _claim(settings: StreamSettings, query_id: str | None) -> None:
    """The planning-side ownership check: take (or find) this application's lease."""
    if not settings.lease:
        return
    if settings.checkpoint is None:
        log.info("%s: no checkpointLocation option; the checkpoint lease is not taken", settings.uri)
        return
    here = _application()
    if here is None:
        log.warning("cannot find the Spark driver process: the checkpoint lease is not taken")
        return
    app, driver_pid, token = here
    store = _slot_store(settings)
    spec = settings.sink.slots or os.environ.get(ENV_VAR)
    locator = ownership.StoreLocator.of(store, spec)
    if locator is None:
        log.warning("%s: slot store %r cannot hold a lease across processes; not taken", settings.uri, store)
        return
    info = {"queryId": query_id or UNKNOWN, "driverPid": str(driver_pid)}
    ownership.claim_checkpoint(
        store,
        locator,
        settings.checkpoint,
        app=app,
        table=settings.uri,
        watch_pid=driver_pid,
        watch_token=token,
        info=info,
        run_hint=_run_hint(settings),
    )


def _application() -> tuple[str, int, str | None] | None:
    """(application token, driver pid, driver start token): the nearest ancestor process
    that is a JVM (the Spark driver; planning and commit workers are its descendants)."""
    pid = os.getpid()
    for _ in range(12):
        parent = _parent(pid)
        if parent is None:
            return None
        pid, name = parent
        if pid <= 1:
            return None
        if name == "java" or name.endswith("/java"):
            token = ownership.process_start_token(pid)
            return f"{socket.gethostname()}:{pid}:{token or ''}", pid, token
    return None


def _parent(pid: int) -> tuple[int, str] | None:
    """(parent pid, parent's command name) of ``pid``, from /proc or ``ps``."""
    # /proc first (Linux); without it, or when it cannot be parsed, fall back to ps.
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        with open(f"/proc/{ppid}/comm", "rb") as f:
            return ppid, f.read().decode("utf-8", "replace").strip()
    try:
        out = subprocess.run(
            ["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        ppid = int(out)
        name = subprocess.run(
            ["ps", "-o", "comm=", "-p", str(ppid)], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        return ppid, name
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
