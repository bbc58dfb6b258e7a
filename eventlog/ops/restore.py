"""RESTORE: make a past version's files live again, as a new version."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc

from eventlog.log.filetable import add_files, file_keys
from eventlog.txn.plan import Plan, PlanBuilder


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def restore(plan: PlanBuilder, version: int) -> Plan:
    """Make the table's live files those of ``version`` again (Delta's RESTORE).

    The adds and removes are computed from the read version, so any concurrent commit
    fails it with ConcurrentWriteException (Delta Spark commits RESTORE with
    ``commitLarge``, which tolerates no concurrent commit).
    """
    current = plan.snapshot
    assert current is not None
    target = plan.table.snapshot(version)
    plan.set_operation("RESTORE", {"version": version, "timestamp": None})
    plan.require_no_concurrent_commits()
    plan.read_whole_table()
    if target.metadata != current.metadata:
        plan.update_metadata(dataclasses.replace(target.metadata))
    now, then = current.live_files, target.live_files
    now_keys, then_keys = file_keys(now), file_keys(then)
    # Values only for the files that change: the rest of a large table stays columns.
    to_remove = add_files(now.filter(pc.invert(pc.is_in(now_keys, value_set=_array(then_keys)))))
    to_add = [
        dataclasses.replace(f, data_change=True)
        for f in add_files(then.filter(pc.invert(pc.is_in(then_keys, value_set=_array(now_keys)))))
    ]
    plan.remove_files(sorted(to_remove, key=lambda f: f.path))
    plan.add_files(sorted(to_add, key=lambda f: f.path), created=False)
    plan.add_metrics(
        numRemovedFiles=len(to_remove), numRestoredFiles=len(to_add),
        tableSizeAfterRestore=pc.sum(then.column("size")).as_py() or 0,
    )  # fmt: skip
    return plan.build()
