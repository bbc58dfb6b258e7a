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
