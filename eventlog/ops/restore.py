"""RESTORE: make a past version's files live again, as a new version."""

from __future__ import annotations

import dataclasses

from eventlog.txn.plan import Plan, PlanBuilder


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
    to_remove = [f for k, f in current.files.items() if k not in target.files]
    to_add = [
        dataclasses.replace(f, data_change=True) for k, f in target.files.items() if k not in current.files
    ]
    plan.remove_files(to_remove)
    plan.add_files(to_add, created=False)
    plan.add_metrics(
        numRemovedFiles=len(to_remove), numRestoredFiles=len(to_add), tableSizeAfterRestore=sum(
            f.size for f in target.files.values()
        ),
    )  # fmt: skip
    return plan.build()
