"""Delta-Lake-compatible transactional tables with an event-sourced commit log.

from eventlog import Table, IsolationLevel
t = Table.create("/data/events", schema, partition_by=["date"])
t.append(batch)
t.delete("date < '2010-01-01'")
"""

from eventlog.errors import (
    AppendOnlyViolationError,
    ChangeDataNotRecordedError,
    ClusteringError,
    ColumnMappingError,
    CommitFailedError,
    CommitLostError,
    CommitStateUnknownError,
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    ConstraintViolationError,
    CorruptLogError,
    DataFileNotFoundError,
    DeltaConcurrentModificationException,
    EventlogError,
    FeatureDropError,
    IdentityColumnError,
    InvalidChangeRangeError,
    InvalidInputError,
    InvalidTablePropertyError,
    InvalidTextError,
    MergeCardinalityError,
    MetadataChangedException,
    NotNullViolationError,
    PredicateError,
    ProtocolChangedException,
    ReplayMismatchError,
    SchemaMismatchError,
    SlotStoreError,
    SlotStoreRequiredError,
    TableAlreadyExistsError,
    TableNotFoundError,
    TransactionStateError,
    TypeChangeError,
    UnknownColumnError,
    UnsupportedProtocolError,
    VersionNotFoundError,
)
from eventlog.files.identity import identity_field
from eventlog.log.verify import VerifyReport
from eventlog.ops.transaction import Transaction
from eventlog.snapshot import Snapshot
from eventlog.snapshot.isolation import IsolationLevel
from eventlog.snapshot.replay import Replay, TableDiff, VersionChange
from eventlog.table import Table, write_table
from eventlog.txn.retry import RetryPolicy
from eventlog.txn.transaction import CommitResult

__all__ = [
    "AppendOnlyViolationError",
    "ChangeDataNotRecordedError",
    "CommitFailedError",
    "CommitLostError",
    "CommitResult",
    "CommitStateUnknownError",
    "ConstraintViolationError",
    "ConcurrentAppendException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentDeleteReadException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "CorruptLogError",
    "DataFileNotFoundError",
    "DeltaConcurrentModificationException",
    "EventlogError",
    "FeatureDropError",
    "ClusteringError",
    "IdentityColumnError",
    "InvalidChangeRangeError",
    "InvalidInputError",
    "InvalidTablePropertyError",
    "InvalidTextError",
    "IsolationLevel",
    "MergeCardinalityError",
    "NotNullViolationError",
    "MetadataChangedException",
    "PredicateError",
    "ProtocolChangedException",
    "Replay",
    "ReplayMismatchError",
    "RetryPolicy",
    "SchemaMismatchError",
    "SlotStoreError",
    "SlotStoreRequiredError",
    "Snapshot",
    "Table",
    "TableAlreadyExistsError",
    "TableDiff",
    "TableNotFoundError",
    "Transaction",
    "TransactionStateError",
    "TypeChangeError",
    "ColumnMappingError",
    "UnknownColumnError",
    "UnsupportedProtocolError",
    "VerifyReport",
    "VersionChange",
    "VersionNotFoundError",
    "identity_field",
    "write_table",
]
