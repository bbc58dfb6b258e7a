"""The table API's schema and property changes (Delta's ALTER TABLE), each one operation in
its own transaction. :class:`AlterTable` is a base of :class:`~eventlog.table.Table`; the
work is done by :mod:`eventlog.ops` through :class:`~eventlog.ops.transaction.Transaction`."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa

from eventlog.ops.transaction import Transaction
from eventlog.txn.transaction import CommitResult

__all__ = ["AlterTable"]


class AlterTable(abc.ABC):
    """ALTER TABLE operations of a table handle (each commits one version)."""

    @abc.abstractmethod
    def _run(self, operation: Callable[[Transaction], object]) -> CommitResult:
        """Run ``operation`` in a transaction of its own and commit it."""

    def set_properties(self, properties: Mapping[str, str]) -> CommitResult:
        """Set table properties (``ALTER TABLE SET TBLPROPERTIES``)."""
        return self._run(lambda txn: txn.set_properties(properties))

    def unset_properties(self, keys: Sequence[str]) -> CommitResult:
        """Remove table properties (``ALTER TABLE UNSET TBLPROPERTIES``)."""
        return self._run(lambda txn: txn.unset_properties(keys))

    def add_columns(self, fields: Sequence[pa.Field]) -> CommitResult:
        """Add nullable columns at the end of the schema (``ALTER TABLE ADD COLUMNS``)."""
        return self._run(lambda txn: txn.add_columns(fields))

    def add_constraint(self, name: str, sql: str) -> CommitResult:
        """Add a CHECK constraint (``ALTER TABLE ADD CONSTRAINT name CHECK (sql)``), once every
        existing row satisfies it (else ConstraintViolationError, nothing committed)."""
        return self._run(lambda txn: txn.add_constraint(name, sql))

    def drop_constraint(self, name: str, *, if_exists: bool = False) -> CommitResult:
        """Drop a CHECK constraint (``ALTER TABLE DROP CONSTRAINT [IF EXISTS] name``)."""
        return self._run(lambda txn: txn.drop_constraint(name, if_exists=if_exists))

    def change_column_type(self, column: str, new_type: pa.DataType) -> CommitResult:
        """Widen a column's type (``ALTER TABLE ALTER COLUMN c TYPE t``; Delta's type widening,
        with ``delta.enableTypeWidening = 'true'``). Only metadata changes: older files are read
        as the new type. ``TypeChangeError`` for a change Delta does not allow."""
        return self._run(lambda txn: txn.change_column_type(column, new_type))

    def sync_identity(self, column: str) -> CommitResult:
        """ALTER COLUMN ... SYNC IDENTITY: the identity column's high-water mark from the values
        in the table (:mod:`eventlog.ops.identity_sync`)."""
        return self._run(lambda txn: txn.sync_identity(column))

    def rename_column(self, old: str, new: str) -> CommitResult:
        """Rename a column, or a struct field given as ``"a.b"`` (``ALTER TABLE RENAME COLUMN``);
        metadata only. Needs column mapping (:class:`~eventlog.errors.ColumnMappingError`)."""
        return self._run(lambda txn: txn.rename_column(old, new))

    def drop_columns(self, names: Sequence[str]) -> CommitResult:
        """Drop columns or struct fields (``ALTER TABLE DROP COLUMNS``); metadata only, the data
        stays in the files unread. Needs column mapping; partition columns cannot be dropped."""
        return self._run(lambda txn: txn.drop_columns(names))
