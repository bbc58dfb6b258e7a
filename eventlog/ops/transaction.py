"""The transaction users hold: every operation, staged on a :class:`CoreTransaction`.

``Table.transaction()`` returns a :class:`Transaction`. Its operation methods
(``txn.append``, ``txn.delete``, ``txn.merge(...)``, ...) follow one rule, as do the
one-shot methods of :class:`~eventlog.table.Table`: running an operation only *stages* it
(validates its input, records its reads, writes its new files, stages its actions);
``txn.commit()`` checks it against the commits that won meanwhile and publishes it. An
operation that fails aborts the transaction, deleting whatever files it wrote, so the
table is left exactly as it was. ``Table.delete(...)`` and the other one-shot methods are
a transaction, one staged operation and a commit.

The core it builds on (:mod:`eventlog.txn.transaction`) records reads and staged writes and
commits; it knows no operation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from eventlog.log.actions import AddFile
from eventlog.ops import (
    alter,
    columns,
    constraints,
    dml,
    drop_feature,
    identity_sync,
    optimize_clustered,
    reorg,
    restore,
    type_change,
    write,
)
from eventlog.ops.common import Rows
from eventlog.ops.merge import MergeBuilder
from eventlog.txn.transaction import CoreTransaction

__all__ = ["Transaction"]


class Transaction(CoreTransaction):
    """One atomic change to a table, with the operations users run on it."""

    def append(self, data: Rows, *, schema_mode: str | None = None) -> None:
        self.run(lambda plan: write.append(plan, data, schema_mode=schema_mode))

    def overwrite(
        self,
        data: Rows,
        *,
        replace_where: str | None = None,
        schema_mode: str | None = None,
    ) -> None:
        self.run(
            lambda plan: write.overwrite(plan, data, replace_where=replace_where, schema_mode=schema_mode)
        )

    def append_files(
        self, adds: Sequence[AddFile], *, schema: pa.Schema | None = None, num_rows: int | None = None
    ) -> None:
        """Append data files written elsewhere (e.g. by Spark tasks); see :mod:`eventlog.ops.write`."""
        self.run(lambda plan: write.append_files(plan, adds, schema=schema, num_rows=num_rows))

    def overwrite_files(
        self,
        adds: Sequence[AddFile],
        *,
        replace_where: str | None = None,
        schema: pa.Schema | None = None,
        num_rows: int | None = None,
    ) -> None:
        """Overwrite with data files written elsewhere; see :mod:`eventlog.ops.write`."""
        self.run(
            lambda plan: write.overwrite_files(
                plan, adds, replace_where=replace_where, schema=schema, num_rows=num_rows
            )
        )

    def delete(self, predicate: str | None = None) -> None:
        self.run(lambda plan: dml.delete(plan, predicate))

    def update(self, predicate: str | None = None, set: Mapping[str, str] | None = None) -> None:
        self.run(lambda plan: dml.update(plan, predicate, set or {}))

    def optimize(
        self, *, zorder_by: Sequence[str] | None = None, partition_filter: str | None = None,
        target_size: int | None = None,
    ) -> None:  # fmt: skip
        self.run(
            lambda plan: optimize_clustered.optimize_table(
                plan, zorder_by=zorder_by, partition_filter=partition_filter, target_size=target_size
            )
        )

    def reorg_purge(self, *, where: str | None = None, target_size: int | None = None) -> None:
        """REORG TABLE ... APPLY (PURGE): rewrite files with deletion vectors (:mod:`eventlog.ops.reorg`)."""
        self.run(lambda plan: reorg.reorg_purge(plan, where=where, target_size=target_size))

    def drop_feature_traces(self, changes: Mapping[str, str | None]) -> None:
        """DROP FEATURE's pre-downgrade property changes (:mod:`eventlog.ops.drop_feature`)."""
        self.run(lambda plan: drop_feature.remove_traces(plan, changes))

    def empty_commit(self) -> None:
        self.run(drop_feature.empty_commit)

    def drop_row_ids(self) -> None:
        """DROP FEATURE rowTracking's pre-downgrade: every file without its row ids."""
        self.run(drop_feature.drop_row_ids)

    def downgrade_protocol(self, name: str, *, truncate_history: bool, protect: bool) -> None:
        """DROP FEATURE's protocol downgrade (:mod:`eventlog.ops.drop_feature`)."""
        self.run(
            lambda plan: drop_feature.downgrade_protocol(
                plan, name, truncate_history=truncate_history, protect=protect
            )
        )

    def restore(self, version: int) -> None:
        self.run(lambda plan: restore.restore(plan, version))

    def set_properties(self, properties: Mapping[str, str]) -> None:
        self.run(lambda plan: alter.set_properties(plan, properties))

    def unset_properties(self, keys: Sequence[str]) -> None:
        self.run(lambda plan: alter.unset_properties(plan, keys))

    def add_columns(self, fields: Sequence[pa.Field]) -> None:
        self.run(lambda plan: alter.add_columns(plan, fields))

    def rename_column(self, old: str, new: str) -> None:
        self.run(lambda plan: columns.rename_column(plan, old, new))

    def drop_columns(self, names: Sequence[str]) -> None:
        self.run(lambda plan: columns.drop_columns(plan, names))

    def add_constraint(self, name: str, sql: str) -> None:
        self.run(lambda plan: constraints.add_constraint(plan, name, sql))

    def drop_constraint(self, name: str, *, if_exists: bool = False) -> None:
        self.run(lambda plan: constraints.drop_constraint(plan, name, if_exists=if_exists))

    def change_column_type(self, column: str, new_type: pa.DataType) -> None:
        self.run(lambda plan: type_change.change_column_type(plan, column, new_type))

    def sync_identity(self, column: str) -> None:
        self.run(lambda plan: identity_sync.sync_identity(plan, column))

    def merge(
        self, source: pa.Table, on: str, *, source_alias: str = "source", target_alias: str = "target"
    ) -> MergeBuilder:
        """Start a MERGE staged in this transaction: add clauses, then ``execute()`` stages it
        and ``commit()`` publishes it."""
        return MergeBuilder(self, source, on, source_alias=source_alias, target_alias=target_alias)
