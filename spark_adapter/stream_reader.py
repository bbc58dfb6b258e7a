"""Streaming reads: ``spark.readStream.format("eventlog").load(uri)``.

The change selection is engine-neutral (:class:`streaming.source.ChangeSource`); this
module maps it onto pyspark's Python streaming source API:

* ``initialOffset``, ``getDefaultReadLimit``, ``latestOffset(start, limit)``,
  ``partitions(start, end)``, ``commit`` and ``stop`` run in one long-lived Python worker
  per query run on the driver side, which keeps the :class:`ChangeSource` (its table handle
  and caches) for the whole run; ``prepareForTriggerAvailableNow`` fixes the last version
  an ``availableNow`` run reads.
* ``read(partition)`` runs in tasks on a *separately created* reader (Spark creates one in
  a planning worker and pickles it to the tasks), so a partition carries everything a task
  needs: the scan (table, schema, partition columns), its files with their positions, and
  ``failOnDataLoss``. Tasks read through :class:`spark_adapter.reader.EventlogReader`, one
  file at a time, deletion vectors applied, as Arrow batches of exactly Spark's schema.

Storage options (``storage.<name>``, ``storageOptions``; see :mod:`spark_adapter.datasource`)
come from the query's options on every run: the driver-side worker opens the table with
them and every input partition carries them (in its :class:`ScanSource`). Offsets hold no
location, so nothing of them reaches the checkpoint.

Admission: ``getDefaultReadLimit`` is ``ReadMaxFiles(maxFilesPerTrigger)`` (1000 when no
limit is set) or ``ReadMaxBytes(maxBytesPerTrigger)`` when only that is set; with both
set, the bytes limit is applied alongside the files limit. ``ReadAllAvailable`` (e.g.
``Trigger.Once``) takes everything. Offsets are :class:`streaming.offsets.SourceOffset` JSON.

The schema is the table's latest when the DataFrame was loaded (``DataSource.schema``
pins that version): files written before a column was added read it as null. A metadata
change committed after that version stops the query with
:class:`streaming.errors.SourceMetadataChangedError` (Spark wraps it in a
``StreamingQueryException``; :func:`streaming.errors.recover` gets it back); restart
the query from a fresh ``load()`` (or :func:`streaming.supervise`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from eventlog.log.actions import AddFile
from eventlog.table import Table
from spark_adapter.reader import (
    DEFAULT_MAX_PARTITION_BYTES,
    EventlogReader,
    FilesPartition,
    ScanSource,
    pack_files,
    split_bytes,
)
from spark_adapter.types import option, option_int, table_location
from streaming.source import Admission, ChangeSource, SourceFile, SourceOptions, lost_file

__all__ = ["EventlogStreamReader", "StreamFilesPartition", "admission_for", "default_read_limit"]

log = logging.getLogger("spark_adapter.stream_reader")


def default_read_limit(options: SourceOptions) -> ReadLimit:
    """The per-batch limit of a stream with ``options`` (see the module docstring)."""
    admission = options.default_admission()
    if admission.max_files is not None:
        return ReadMaxFiles(admission.max_files)
    assert admission.max_bytes is not None
    return ReadMaxBytes(admission.max_bytes)


def admission_for(limit: ReadLimit, options: SourceOptions) -> Admission:
    """What a batch may take under Spark's ``limit`` (the other of the two limits from
    ``options``; nothing for ``ReadAllAvailable``)."""
    if isinstance(limit, ReadAllAvailable):
        return Admission()
    if isinstance(limit, ReadMaxFiles):
        return Admission(max_files=limit.max_files, max_bytes=options.max_bytes_per_trigger)
    if isinstance(limit, ReadMaxBytes):
        return Admission(max_files=options.max_files_per_trigger, max_bytes=limit.max_bytes)
    log.info("read limit %r is not supported; using the source's options", limit)
    return options.default_admission()


class StreamFilesPartition(InputPartition):  # type: ignore[misc]
    """One task's slice of a micro-batch: consecutive files with their positions."""

    def __init__(self, scan: ScanSource, files: list[SourceFile], fail_on_data_loss: bool) -> None:
        super().__init__([(f.version, f.index, f.add.to_json()) for f in files])
        self.scan = scan
        self.fail_on_data_loss = fail_on_data_loss

    @property
    def files(self) -> list[SourceFile]:
        return [SourceFile(v, i, AddFile.from_json(add)) for v, i, add in self.value]


class EventlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """The ``eventlog`` streaming source; see the module docstring.

    ``read_version``: the version whose metadata the query reads with (the one
    ``DataSource.schema`` resolved), or None for the latest at the first use.
    """

    def __init__(
        self, options: Mapping[str, str], schema: StructType, read_version: int | None = None
    ) -> None:
        self.location = table_location(options)
        self.uri = self.location.uri
        self.slots = option(options, "slots")
        self.source_options = SourceOptions.parse(options)
        self.max_partition_bytes = (
            option_int(options, "maxPartitionBytes", minimum=1) or DEFAULT_MAX_PARTITION_BYTES
        )
        self.output = schema
        self.read_version = read_version
        self._table: Table | None = None
        self._source: ChangeSource | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_table"] = state["_source"] = None  # tasks read from their partitions only
        return state

    @property
    def source(self) -> ChangeSource:
        """The run's change selection (opened on first use, in the driver-side worker)."""
        if self._source is None:
            table = Table.open(self.uri, slots=self.slots, storage_options=self.location.storage_options)
            try:
                self._source = ChangeSource(table, self.source_options, read_version=self.read_version)
            except BaseException:
                table.close()
                raise
            self._table = table
        return self._source

    # ------------------------------------------------------------------ offsets (driver)

    def initialOffset(self) -> dict[str, Any]:
        return self.source.initial_offset().to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        return default_read_limit(self.source_options)

    def prepareForTriggerAvailableNow(self) -> None:
        self.source.prepare_available_now()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        source = self.source
        end = source.latest_offset(source.parse_offset(start), admission_for(limit, self.source_options))
        return end.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        source = self.source
        files = source.files_between(source.parse_offset(start), source.parse_offset(end))
        if not files:
            return []
        snap = source.read_snapshot
        scan = ScanSource(
            location=self.location,
            slots=self.slots,
            version=snap.version,
            schema_json=snap.metadata.schema_string,
            partition_columns=snap.partition_columns,
            max_partition_bytes=self.max_partition_bytes,
        )
        adds = [f.add for f in files]
        partitions: list[InputPartition] = []
        first = 0
        for group in pack_files(adds, split_bytes(adds, self.max_partition_bytes)):
            partitions.append(
                StreamFilesPartition(
                    scan, files[first : first + len(group)], self.source_options.fail_on_data_loss
                )
            )
            first += len(group)
        log.info(
            "micro-batch of %s from %s to %s: %d files in %d input partitions",
            self.uri, start, end, len(files), len(partitions),
        )  # fmt: skip
        return partitions

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("stream over %s committed up to %s", self.uri, end)

    def stop(self) -> None:
        table, self._table, self._source = self._table, None, None
        if table is not None:
            table.close()

    # ------------------------------------------------------------------ tasks

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, StreamFilesPartition):
            return iter(())
        return self._read(partition)

    def _read(self, partition: StreamFilesPartition) -> Iterator[pa.RecordBatch]:
        reader = EventlogReader(partition.scan, self.output)
        for f in partition.files:
            batches = reader.read(FilesPartition([f.add.to_json()]))
            try:
                first = next(batches, None)  # the file is opened here
            except FileNotFoundError:
                lost_file(self.uri, f, fail_on_data_loss=partition.fail_on_data_loss)
                continue
            if first is not None:
                yield first
                yield from batches
