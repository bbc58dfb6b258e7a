"""One history of row-level changes for the change data feed tests (ours read by delta-rs,
and by Delta Spark): on a table holding ids 1..4 (``id``, ``p``, ``v = 10 * id``), the
next three commits delete, update and merge."""

from __future__ import annotations

import pyarrow as pa

from eventlog import Table


def delete_update_merge(t: Table) -> None:
    """DELETE id 1; UPDATE id 3 (v + 1); MERGE: id 4 deleted, id 2 updated to 200, id 5
    inserted (v 500) in partition 'a'."""
    t.delete("id = 1")
    t.update("id = 3", {"v": "v + 1"})
    source = pa.table({"id": [2, 5, 4], "v": [200, 500, 0], "gone": [False, False, True]})
    (
        t.merge(source, "target.id = source.id")
        .when_matched_delete("source.gone")
        .when_matched_update(set={"v": "source.v"})
        .when_not_matched_insert(values={"id": "source.id", "p": "'a'", "v": "source.v"})
        .execute()
    )
