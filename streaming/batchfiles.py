"""The files of one streaming micro-batch: writing them in tasks, naming them by query,
batch and task (``part-<queryId>-b<batchId>-t<task>-...``), and deleting an aborted batch's
files. Planning is in :mod:`streaming.plan`, whose plan (:class:`~streaming.plan.BatchPlan`)
the tasks receive."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

import fsspec
import pyarrow as pa

from eventlog.files.datafiles import delete_files, write_data_files
from eventlog.log.actions import AddFile
from eventlog.log.location import TableLocation
from eventlog.table import Table
from eventlog.table.identity import TaskIdentity
from streaming.plan import BatchPlan

__all__ = [
    "UNKNOWN",
    "BatchFiles",
    "abort_batch",
    "batch_file_prefix",
    "parse_batch_file_name",
    "write_batch_files",
]

log = logging.getLogger("streaming.sink")

UNKNOWN = "unknown"
# Arrow bytes a task buffers before writing them out (as the batch writer does).
_FLUSH_BYTES = 128 * 1024 * 1024
_FILE_NAME = re.compile(r"^part-(?P<query>[A-Za-z0-9_.-]+?)-b(?P<batch>\d+)-t(?P<task>\d+)-\d{5}-")


# --------------------------------------------------------------------------- tasks


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80] or UNKNOWN


def batch_file_prefix(query_id: str, batch_id: int, task: int | None = None) -> str:
    """``<queryId>-b<batchId>`` (and ``-t<task>``): the name prefix, after ``part-``, of the
    files one batch (one task of it) writes."""
    prefix = f"{_safe(query_id)}-b{int(batch_id)}"
    return prefix if task is None else f"{prefix}-t{int(task)}"


def parse_batch_file_name(path: str) -> tuple[str, int, int] | None:
    """(query id, batch id, task) of a file a streaming sink wrote, from its path; None for
    any other file."""
    m = _FILE_NAME.match(path.rsplit("/", 1)[-1])
    if m is None:
        return None
    return m.group("query"), int(m.group("batch")), int(m.group("task"))


@dataclasses.dataclass(frozen=True)
class BatchFiles:
    """What one task wrote: add actions (``AddFile.to_json`` dicts) and the row count."""

    adds: tuple[dict[str, Any], ...]
    num_rows: int
    identity: tuple[tuple[str, int, int], ...] = ()  # identity values reserved (column, first, last)

    @property
    def add_files(self) -> list[AddFile]:
        return [AddFile.from_json(d) for d in self.adds]


def write_batch_files(
    plan: BatchPlan,
    batches: Iterable[pa.RecordBatch],
    *,
    query_id: str,
    batch_id: int,
    task: int,
) -> BatchFiles:
    """Write one task's rows (conformed to the plan's schema) as the batch's data files.

    Buffers up to 128 MiB of Arrow data per write, like the batch writer. On any error the
    files written so far are deleted before the error propagates (the engine does not pass
    a failed task's files to ``abort``).
    """
    schema = plan.schema
    fs, root = plan.location.files()
    prefix = batch_file_prefix(query_id, batch_id, task)
    adds: list[AddFile] = []
    rows = 0
    buffered: list[pa.RecordBatch] = []
    size = 0
    ids = TaskIdentity(plan.uri, plan.options.slots, plan.location.storage_options)  # identity values

    def flush() -> int:
        context = f"streaming write to {plan.uri}"
        data = plan.rules.conform(
            ids.fill(pa.Table.from_batches(buffered), schema, context), schema, context=context
        )
        adds.extend(
            write_data_files(
                fs,
                root,
                data,
                partition_columns=plan.partition_by,
                target_file_size=plan.target_file_size,
                name_prefix=prefix,
            )
        )
        return int(data.num_rows)

    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            buffered.append(batch)
            size += batch.nbytes
            if size >= _FLUSH_BYTES:
                rows += flush()
                buffered, size = [], 0
        if buffered:
            rows += flush()
    except BaseException:
        delete_files(fs, root, [a.path for a in adds])
        raise
    finally:
        ids.close()
    identity = tuple((r.column, r.first, r.last) for r in ids.ranges)
    return BatchFiles(tuple(a.to_json() for a in adds), rows, identity)


# --------------------------------------------------------------------------- abort


def abort_batch(
    location: str | TableLocation,
    *,
    query_id: str,
    batch_id: int,
    files: Sequence[BatchFiles] = (),
    slots: str | None = None,
    sweep: bool = True,
) -> list[str]:
    """Delete a failed batch's files: those ``files`` name and, with ``sweep``, every file
    named with the batch's prefix (:func:`batch_file_prefix`, found by listing the table's
    directories), unless the latest snapshot references it (a commit whose outcome was
    unknown may have landed). Returns the deleted paths. Best effort: files that tasks are
    still writing while this runs stay behind for VACUUM. ``location``: a URI, or a
    :class:`TableLocation` with storage options.
    """
    location = TableLocation.of(location)
    uri, storage = location.uri, location.storage_options
    fs, root = location.files()
    paths = {a["path"] for f in files for a in f.adds}
    if sweep:
        paths |= set(_batch_files_on_disk(fs, root, query_id, batch_id))
    if not paths:
        return []
    try:
        if Table.exists(uri, storage_options=storage):
            with Table.open(uri, slots=slots, storage_options=storage) as table:
                live = {a.path for a in table.refresh().add_files}
            kept = paths & live
            if kept:
                log.warning(
                    "abort of batch %d of %s: %d files with its name prefix are committed; kept",
                    batch_id,
                    uri,
                    len(kept),
                )
            paths -= live
    except Exception as exc:  # cannot prove the files unused: keep them for VACUUM
        log.warning("abort of batch %d of %s: cannot read the log (%r); files kept", batch_id, uri, exc)
        return []
    delete_files(fs, root, sorted(paths))
    return sorted(paths)


def _batch_files_on_disk(fs: fsspec.AbstractFileSystem, root: str, query_id: str, batch_id: int) -> list[str]:
    """Table-relative paths (as ``add.path`` spells them) of the batch's files on disk."""
    from urllib.parse import quote

    prefix = f"part-{batch_file_prefix(query_id, batch_id)}-t"
    root = root.rstrip("/")
    out: list[str] = []
    try:
        found = fs.find(root, withdirs=False)
    except Exception as exc:
        log.warning("cannot list %s for orphans of batch %d: %r", root, batch_id, exc)
        return []
    for full in found:
        full = str(full)
        rel = full[len(root) + 1 :] if full.startswith(root + "/") else full
        if rel.startswith(("_", ".")):
            continue
        if rel.rsplit("/", 1)[-1].startswith(prefix):
            out.append(quote(rel, safe="/="))
    return out
