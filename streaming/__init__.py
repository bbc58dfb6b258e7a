"""Engine-neutral Structured Streaming over :mod:`eventlog` tables (never imports pyspark).

* the source side: offsets (:mod:`streaming.offsets`), change selection with admission
  limits (:mod:`streaming.source`), typed errors (:mod:`streaming.errors`) and
  :func:`supervise`, which restarts a query on a metadata change;
* the sink side: planning (:mod:`streaming.plan`), the batch's files
  (:mod:`streaming.batchfiles`), idempotent micro-batch commits (:mod:`streaming.sink`), checkpoint
  ownership through a slot-store lease (:mod:`streaming.ownership`) and auto-compaction
  (:mod:`streaming.compaction`).

The Spark glue is in :mod:`spark_adapter.stream_reader` and :mod:`spark_adapter.stream_writer`.
"""

from streaming.errors import (
    ChangeCommitError,
    DataLossError,
    InvalidOffsetError,
    SourceMetadataChangedError,
    StreamingError,
    recover,
)
from streaming.offsets import SourceOffset
from streaming.plan import SinkOptions
from streaming.sink import BatchCommit, MicroBatchSink
from streaming.source import Admission, ChangeSource, SourceFile, SourceOptions
from streaming.supervise import supervise

__all__ = [
    "Admission",
    "BatchCommit",
    "ChangeCommitError",
    "ChangeSource",
    "DataLossError",
    "InvalidOffsetError",
    "MicroBatchSink",
    "SinkOptions",
    "SourceFile",
    "SourceMetadataChangedError",
    "SourceOffset",
    "SourceOptions",
    "StreamingError",
    "recover",
    "supervise",
]
