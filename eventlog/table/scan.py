"""The table API's streaming reads: :class:`TableScan` is a base of
:class:`~eventlog.table.Table`; the work is done by :mod:`eventlog.snapshot.stream` (the
record batch reader) and :mod:`eventlog.snapshot.dataset` (the lazy pyarrow dataset)."""

from __future__ import annotations

import abc
import datetime as dt
import importlib
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from eventlog.log.storage import LogStore
from eventlog.snapshot.dataset import snapshot_dataset
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
        reads one data file at a time and, within a file, one batch at a time: memory grows
        with ``batch_size`` and the row-group size, not with the file or the table.
        ``filter`` (a SQL predicate) prunes partitions and skips files and row groups by
        statistics, then applies to each batch; deletion vectors are applied per batch;
        batches hold at most ``batch_size`` rows (default 131,072). The version is fixed when the
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
        _optional("pandas", "to_pandas")  # pyarrow converts
        return self.scan(filter, columns, version, timestamp=timestamp).read_pandas()

    def to_polars(
        self,
        filter: str | None = None,
        columns: Sequence[str] | None = None,
        version: int | None = None,
        *,
        timestamp: dt.datetime | str | int | None = None,
    ) -> Any:
        """The rows as a polars DataFrame, built batch by batch from :meth:`scan` (polars
        must be installed)."""
        pl = _optional("polars", "to_polars")
        reader = self.scan(filter, columns, version, timestamp=timestamp)
        # A record batch converts to a DataFrame (zero-copy where Arrow allows).
        frames = [pl.from_arrow(batch) for batch in reader]
        if not frames:
            return pl.from_arrow(reader.schema.empty_table())
        return pl.concat(frames, rechunk=False)

    def to_pyarrow_dataset(
        self, version: int | None = None, *, timestamp: dt.datetime | str | int | None = None
    ) -> ds.Dataset:
        """The live rows of the table (or a past version) as a lazy ``pyarrow.dataset.Dataset``
        over its data files, with the table schema and partition columns, that DuckDB
        (``duckdb.from_arrow(ds)``), Polars (``pl.scan_pyarrow_dataset(ds)``) and pyarrow
        scan with filter and projection pushdown: only the files a filter admits (by
        partition values, and by the min/max of integer and date columns) are opened.
        Tables whose live files carry deletion vectors, and column-mapped tables, cannot be
        a plain dataset: :class:`~eventlog.errors.DatasetUnsupportedError` (read them with
        :meth:`scan`)."""
        snap = self.snapshot(version, timestamp=timestamp)
        return snapshot_dataset(self.log.fs, self.log.root, snap)


def _optional(module: str, method: str) -> Any:
    """The optional dependency ``module``; ImportError with the pip line when missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"Table.{method} needs {module}: pip install {module}") from exc
