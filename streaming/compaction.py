"""Auto-compaction after a streaming sink's commit (Delta's ``delta.autoOptimize.autoCompact``).

A streaming sink writes a few small files per micro-batch, so a table written by a stream
for a day holds tens of thousands of them and every scan pays for each. With auto
compaction on (the table property ``delta.autoOptimize.autoCompact``, or the sink's
``autoCompact`` option, which wins), every committed batch is followed by a look at the
partitions it wrote to: when one of them holds at least ``min_files`` files smaller than
the table's target file size (``delta.targetFileSize``, 128 MiB by default), an OPTIMIZE
of exactly those partitions runs (:meth:`eventlog.Table.optimize` with a partition
filter). Its actions have ``dataChange = false``: it cannot conflict with blind appends
(other streams, batch appends), and stream readers skip it.

Failures never fail the batch: the batch is committed by then, and a compaction that
loses a conflict (a concurrent DELETE of a file it read) or fails for any other reason is
logged and tried again after a later batch.

Costs and limits (honest): the check reads the table's latest snapshot (already loaded by
the commit) and nothing else; the compaction reads and rewrites the small files of the
chosen partitions synchronously, inside the batch's commit, so the batch that triggers it
takes longer (measured in ``bench/RESULTS-streaming.md``). A file below the target size is
rewritten again by later compactions until it reaches the target (bin packing up to the
target, as OPTIMIZE does). At most :data:`MAX_PARTITIONS_PER_RUN` partitions are compacted
after one batch; the rest qualify again after the next.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from eventlog.errors import InvalidInputError
from eventlog.files.datafiles import DEFAULT_TARGET_FILE_SIZE
from eventlog.ops.alter import TARGET_FILE_SIZE_KEY
from eventlog.snapshot import Snapshot
from eventlog.table import Table

__all__ = [
    "AUTO_COMPACT_KEY",
    "DEFAULT_MIN_FILES",
    "MAX_PARTITIONS_PER_RUN",
    "CompactionOutcome",
    "auto_compact_enabled",
    "maybe_compact",
    "parse_auto_compact",
    "partition_filter",
]

log = logging.getLogger("streaming.compaction")

AUTO_COMPACT_KEY = "delta.autoOptimize.autoCompact"
DEFAULT_MIN_FILES = 50  # Delta's spark.databricks.delta.autoCompact.minNumFiles
MAX_PARTITIONS_PER_RUN = 32

_TRUE = ("true", "auto", "legacy")  # Delta accepts these for the property; all mean "on" here


def parse_auto_compact(value: str | None, what: str = AUTO_COMPACT_KEY) -> bool | None:
    """``true``/``auto``/``legacy`` -> True, ``false`` -> False, None -> None."""
    if value is None:
        return None
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v == "false":
        return False
    raise InvalidInputError(f"{what} must be true, false, auto or legacy, got {value!r}")


def auto_compact_enabled(properties: Mapping[str, str], override: bool | None) -> bool:
    """The sink option ``override`` if given, else the table property (off when absent or
    unparsable: a bad property value must not fail a batch)."""
    if override is not None:
        return override
    try:
        return bool(parse_auto_compact(properties.get(AUTO_COMPACT_KEY)))
    except InvalidInputError as exc:
        log.warning("ignoring the table property: %s", exc)
        return False


@dataclasses.dataclass(frozen=True)
class CompactionOutcome:
    """What one auto-compaction did: the partitions it compacted (encoded partition values;
    ``{}`` for an unpartitioned table), the version it committed (None when it failed),
    the file counts, its duration and the error text of a failure."""

    partitions: tuple[Mapping[str, str | None], ...]
    version: int | None
    removed_files: int
    added_files: int
    seconds: float
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


def _target_size(snapshot: Snapshot) -> int:
    try:
        return int(snapshot.properties.get(TARGET_FILE_SIZE_KEY, DEFAULT_TARGET_FILE_SIZE))
    except ValueError:
        return DEFAULT_TARGET_FILE_SIZE


def _key(values: Mapping[str, str | None], columns: Sequence[str]) -> tuple[str | None, ...]:
    return tuple(values.get(c) for c in columns)


def candidates(
    snapshot: Snapshot, touched: Sequence[Mapping[str, str | None]], *, min_files: int
) -> list[dict[str, str | None]]:
    """The touched partitions holding at least ``min_files`` files below the target size,
    those with the most small files first (at most :data:`MAX_PARTITIONS_PER_RUN`)."""
    columns = snapshot.partition_columns
    wanted = {_key(v, columns) for v in touched}
    if not wanted:
        return []
    target = _target_size(snapshot)
    files = snapshot.live_files
    files = files.filter(pc.less(pc.fill_null(files.column("size"), 0), target))
    if files.num_rows == 0:
        return []
    # Small files per partition (the raw values of its columns, a missing key being null),
    # counted on columns; the first small file by path breaks ties (the order files come in).
    counted: Iterable[tuple[tuple[str | None, ...], int, str]]
    if columns:
        values = files.column("partitionValues")
        # "last": a map holds each key once, and Arrow's "first" lookup is many times slower.
        keys = {f"k{i}": pc.map_lookup(values, pa.scalar(c), "last") for i, c in enumerate(columns)}
        table = pa.table({**keys, "path": files.column("path")})
        groups = table.group_by(list(keys), use_threads=False).aggregate([("path", "count"), ("path", "min")])
        counted = zip(
            zip(*(groups.column(k).to_pylist() for k in keys), strict=True),
            groups.column("path_count").to_pylist(),
            groups.column("path_min").to_pylist(),
            strict=True,
        )
    else:
        counted = iter([((), files.num_rows, pc.min(files.column("path")).as_py())])
    small = [(key, n, first) for key, n, first in counted if key in wanted and n >= min_files]
    chosen = sorted(small, key=lambda c: (-c[1], c[2]))
    return [dict(zip(columns, k, strict=True)) for k, _, _ in chosen[:MAX_PARTITIONS_PER_RUN]]


def _literal(value: str, type_: pa.DataType) -> str:
    """A SQL literal for an encoded partition value (numbers and booleans bare, the rest quoted)."""
    if (pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)) and (
        value.lstrip("-").replace(".", "", 1).isdigit()
    ):
        return value
    if pa.types.is_boolean(type_) and value in ("true", "false"):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"  # Spark SQL escapes


def partition_filter(schema: pa.Schema, partitions: Sequence[Mapping[str, str | None]]) -> str | None:
    """The SQL predicate selecting exactly ``partitions`` (None for an unpartitioned table)."""
    clauses = []
    for values in partitions:
        if not values:
            return None  # the unpartitioned table: everything
        terms = []
        for col, value in values.items():
            name = "`" + col.replace("`", "``") + "`"
            if value is None:
                terms.append(f"{name} IS NULL")
            else:
                terms.append(f"{name} = {_literal(value, schema.field(col).type)}")
        clauses.append("(" + " AND ".join(terms) + ")")
    return " OR ".join(clauses)


def maybe_compact(
    table: Table,
    touched: Sequence[Mapping[str, str | None]],
    *,
    min_files: int = DEFAULT_MIN_FILES,
    snapshot: Snapshot | None = None,
) -> CompactionOutcome | None:
    """Compact the ``touched`` partitions that passed the small-file threshold.

    Returns None when none did, else what was done. Never raises (but for
    ``KeyboardInterrupt`` and the like): a failure is logged and returned as the outcome's
    ``error``.
    """
    start = time.monotonic()
    chosen: list[dict[str, str | None]] = []
    try:
        snap = snapshot if snapshot is not None else table.refresh()
        chosen = candidates(snap, touched, min_files=min_files)
        if not chosen:
            return None
        predicate = partition_filter(snap.schema, chosen)
        result = table.optimize(partition_filter=predicate)
        metrics = result.metrics
        outcome = CompactionOutcome(
            partitions=tuple(chosen),
            version=result.version,
            removed_files=int(metrics.get("numRemovedFiles", 0)),
            added_files=int(metrics.get("numAddedFiles", 0)),
            seconds=time.monotonic() - start,
        )
        log.info(
            "auto-compaction of %s: %d partition(s), %d files into %d, version %d, %.3f s",
            table.uri,
            len(chosen),
            outcome.removed_files,
            outcome.added_files,
            result.version,
            outcome.seconds,
        )
        return outcome
    except Exception as exc:
        log.warning("auto-compaction of %s failed (the batch is committed): %r", table.uri, exc)
        return CompactionOutcome(
            partitions=tuple(chosen),
            version=None,
            removed_files=0,
            added_files=0,
            seconds=time.monotonic() - start,
            error=f"{type(exc).__name__}: {exc}",
        )
