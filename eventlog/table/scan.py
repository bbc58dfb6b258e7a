"""The table API's streaming reads: :class:`TableScan` is a base of
:class:`~eventlog.table.Table`; the work is done by :mod:`eventlog.snapshot.stream`."""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from eventlog.log.storage import LogStore
from eventlog.snapshot.projection import Snapshot
from eventlog.snapshot.stream import scan_snapshot

__all__ = ["TableScan"]


class TableScan(abc.ABC):
    """Streaming reads of a table handle."""

    @abc.abstractmethod
    def snapshot(
        self, version: int | None = None, *, timestamp: dt.datetime | str | int | None = None
    ) -> Snapshot: ...

    @property
    @abc.abstractmethod
    def log(self) -> LogStore: ...

    def scan(
        self,
        filter: str | None = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        *,
        timestamp: dt.datetime | str | int | None = None,
        batch_size: int | None = None,
    ) -> pa.RecordBatchReader:
        """The table's rows (or a past version's) as a ``pyarrow.RecordBatchReader`` that
        reads one data file at a time: memory holds one file's matching rows, not the
        table. ``filter`` (a SQL predicate) prunes partitions, skips files by statistics and
        is pushed into the Parquet reads; deletion vectors are applied per file; batches
        hold at most ``batch_size`` rows (default 131,072). The version is fixed when the
        reader is made; nothing is read until it is iterated. DuckDB and Polars take the
        reader as it is (``duckdb.from_arrow(t.scan())``)."""
        snap = self.snapshot(version, timestamp=timestamp)
        return scan_snapshot(
            self.log.fs, self.log.root, snap, filter=filter, columns=columns, batch_size=batch_size
        )

    def to_pandas(
        self,
        filter: str | None = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        *,
        timestamp: dt.datetime | str | int | None = None,
    ) -> Any:
        """The rows as a pandas DataFrame, built from :meth:`scan` (pandas must be installed)."""
        try:
            import pandas  # noqa: F401  (the optional dependency; pyarrow converts)
        except ImportError as exc:
            raise ImportError("Table.to_pandas needs pandas: pip install pandas") from exc
        return self.scan(filter, columns, version, timestamp=timestamp).read_pandas()
