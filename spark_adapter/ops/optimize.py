"""OPTIMIZE in Spark jobs: bin-packing compaction, optionally Z-ordered, planned as
:func:`eventlog.ops.optimize.optimize` with its own helpers (``begin_optimize``,
``plan_bins``, ``zorder_permutation``); one Spark task compacts each bin. On row-level
(deletion-vector) tables a plain compaction records where each source's rows went. On
row-tracking tables the rewritten rows keep their stable ids (:func:`live_rows`)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec
import orjson
import pyarrow as pa
from pyspark.sql import SparkSession

from eventlog.files.scan import FileScan, file_deletes, read_file_positions, read_live_rows
from eventlog.log.actions import AddFile
from eventlog.ops.optimize import begin_optimize, plan_bins, zorder_permutation
from eventlog.ops.transaction import Transaction
from eventlog.txn.rowlevel import CompactionSource, compaction_tag
from spark_adapter.ops.jobs import (
    RESULT,
    JobContext,
    PendingCommit,
    Result,
    StagedFiles,
    TaskOutput,
    add_results,
    adds_of,
    parallelize,
    physical_rows,
    result_batch,
    run_planned,
    stage_adds,
)


def plan_optimize(
    spark: SparkSession, txn: Transaction, partition_filter: str | None, zorder_by: Sequence[str]
) -> PendingCommit:
    """Bin-packing compaction (optionally Z-ordered), planned as eventlog.ops.optimize.optimize."""
    zorder, pred = begin_optimize(txn, zorder_by, partition_filter)

    def plan(ctx: JobContext, staged: StagedFiles) -> None:
        files = txn.scan(pred)
        groups: dict[tuple[tuple[str, str | None], ...], list[AddFile]] = {}
        for f in files:
            groups.setdefault(tuple(sorted(f.partition_values.items())), []).append(f)
        bins = [
            b for g in groups.values() for b in plan_bins(g, ctx.target_file_size, rewrite_all=bool(zorder))
        ]
        # Same rule as eventlog: plain compactions on row-level tables record where rows went.
        mapped = not zorder and txn.deletion_vectors_enabled
        for bin_ in bins:
            txn.remove_files(bin_, data_change=False)
        results: list[Any] = []
        if bins:
            records = [(i, orjson.dumps([f.to_json() for f in b]).decode()) for i, b in enumerate(bins)]
            task = functools.partial(compact_task, ctx, zorder, mapped)
            results = parallelize(spark, records, one_per_task=True).mapInArrow(task, RESULT).collect()
        adds = adds_of(results)
        if mapped:
            adds = _tag_compactions(txn, bins, results)
        txn.add_metrics(numRemovedFiles=sum(len(b) for b in bins), numAddedFiles=len(adds))
        stage_adds(txn, staged, adds)

    return run_planned(spark, txn, "OPTIMIZE", plan)


def _tag_compactions(
    txn: Transaction, bins: Sequence[Sequence[AddFile]], results: Sequence[Any]
) -> list[AddFile]:
    """Compacted files with tags saying where each source's live rows went."""
    fs, root = txn.table.log.fs, txn.table.log.root
    live = {(r.fid, r.n1): r.n2 for r in results if r.kind == "source"}
    out: list[AddFile] = []
    for r in results:
        if r.kind != "add":
            continue
        add = AddFile.from_json(orjson.loads(r.payload))
        sources, offset = [], 0
        for i, f in enumerate(bins[r.fid]):
            sources.append(
                CompactionSource(
                    f.path, f.key[1], file_deletes(fs, root, f), physical_rows(txn, f), add.path, offset
                )
            )
            offset += live[(r.fid, i)]
        out.append(dataclasses.replace(add, tags={**(add.tags or {}), **compaction_tag(sources)}))
        txn.record_compaction(sources)
    return out


def compact_task(
    ctx: JobContext, zorder: list[str], mapped: bool, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    fs, root = ctx.location.files()
    schema = ctx.arrow_schema
    out = TaskOutput(ctx)
    try:
        for batch in batches:
            for bin_id, text in zip(
                batch.column("fid").to_pylist(), batch.column("payload").to_pylist(), strict=True
            ):
                sources = [AddFile.from_json(d) for d in orjson.loads(text)]
                results: list[Result] = []
                if mapped:
                    parts = []
                    for i, f in enumerate(sources):
                        rows, positions, _, _ = read_file_positions(
                            fs, root, f, schema, ctx.partition_columns
                        )
                        if ctx.hidden is not None:  # row tracking: the rows keep their stable ids
                            scan = FileScan(fs, root, f, schema, ctx.partition_columns)
                            rows = scan.tracked(rows, positions, ctx.hidden)
                        parts.append(rows)
                        results.append(("source", bin_id, None, i, rows.num_rows, None))
                    # Exactly one output file per bin: its tags map every source's rows.
                    adds = out.write(pa.concat_tables(parts), data_change=False, target_file_size=2**62)
                else:
                    rows = live_rows(ctx, fs, root, sources)
                    if zorder:
                        rows = rows.take(zorder_permutation(rows, zorder))
                    adds = out.write(rows, data_change=False)
                yield result_batch(results + add_results(bin_id, adds))
    except BaseException:
        out.discard()
        raise


def live_rows(
    ctx: JobContext,
    fs: fsspec.AbstractFileSystem,
    root: str,
    files: Sequence[AddFile],
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Live rows of ``files`` (deletion vectors applied), as :func:`eventlog.ops.rows.read_rows`
    reads them for a rewrite: on a row-tracking table (``ctx.hidden``, unless only some
    ``columns`` are asked for) with their stable row ids in the hidden columns."""
    schema, parts = ctx.arrow_schema, ctx.partition_columns
    if ctx.hidden is None or columns is not None or not files:
        return read_live_rows(fs, root, files, schema, parts, columns=columns)
    tracked = []
    for f in files:
        scan = FileScan(fs, root, f, schema, parts)
        rows, positions = scan.live_rows()
        tracked.append(scan.tracked(rows, positions, ctx.hidden))
    return pa.concat_tables(tracked)
