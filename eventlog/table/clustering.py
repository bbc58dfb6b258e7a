"""The table API's liquid clustering: ``CLUSTER BY`` on an existing table and its clustering
columns. :class:`ClusteredTable` is a base of :class:`~eventlog.table.Table`; the work is done
by :mod:`eventlog.ops.clustering` (``Table.create(..., cluster_by=...)`` for new tables)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence

from eventlog.ops import clustering
from eventlog.ops.transaction import Transaction
from eventlog.snapshot import Snapshot
from eventlog.snapshot.clustering import clustering_columns
from eventlog.txn.transaction import CommitResult

__all__ = ["ClusteredTable"]


class ClusteredTable(abc.ABC):
    """Liquid clustering on a table handle."""

    @abc.abstractmethod
    def _run(self, operation: Callable[[Transaction], object]) -> CommitResult: ...

    @abc.abstractmethod
    def refresh(self) -> Snapshot: ...

    def cluster_by(self, columns: Sequence[str] | None) -> CommitResult:
        """Cluster the table by ``columns`` (``ALTER TABLE CLUSTER BY``; ``None`` or ``[]``:
        ``CLUSTER BY NONE``). Adds the ``clustering`` and ``domainMetadata`` features;
        :class:`~eventlog.errors.ClusteringError` for a partitioned table or a column that
        cannot cluster. Metadata only: the next :meth:`optimize` clusters the files."""
        return self._run(lambda txn: txn.run(lambda plan: clustering.cluster_by(plan, columns)))

    def clustering_columns(self) -> list[str]:
        """The table's clustering columns at its latest version (empty when not clustered)."""
        snapshot = self.refresh()
        return clustering_columns(snapshot.protocol, snapshot.domains, snapshot.schema)
