"""Engine-neutral incremental reads and idempotent writes over :mod:`eventlog` tables.

Not implemented yet (the Structured Streaming issue). The package exists so the
dependency contracts (``streaming`` imports ``eventlog`` only) are enforced from day one.
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
from streaming.sink import BatchCommit, MicroBatchSink, SinkOptions
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
