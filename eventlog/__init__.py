"""Delta-Lake-compatible transactional tables with an event-sourced commit log.

from eventlog import Table, IsolationLevel
t = Table.create("/data/events", schema, partition_by=["date"])
t.append(batch)
t.delete("date < '2010-01-01'")
"""

from eventlog.errors import (
    CommitFailedError,
    CommitLostError,
    CommitStateUnknownError,
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    CorruptLogError,
    DeltaConcurrentModificationException,
    EventlogError,
    InvalidInputError,
    InvalidTextError,
    MetadataChangedException,
    PredicateError,
    ProtocolChangedException,
    ReplayMismatchError,
    SchemaMismatchError,
    SlotStoreError,
    SlotStoreRequiredError,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnknownColumnError,
)
from eventlog.log.verify import VerifyReport
from eventlog.ops.transaction import Transaction
from eventlog.snapshot import Snapshot
from eventlog.snapshot.isolation import IsolationLevel
from eventlog.snapshot.replay import Replay, TableDiff, VersionChange
from eventlog.table import Table, write_table
from eventlog.txn.retry import RetryPolicy
from eventlog.txn.transaction import CommitResult

__all__ = [
    "CommitFailedError",
    "CommitResult",
    "CommitStateUnknownError",
    "ConcurrentAppendException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentDeleteReadException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "CommitLostError",
    "CorruptLogError",
    "DeltaConcurrentModificationException",
    "EventlogError",
    "InvalidInputError",
    "InvalidTextError",
    "IsolationLevel",
    "MetadataChangedException",
    "PredicateError",
    "ProtocolChangedException",
    "ReplayMismatchError",
    "RetryPolicy",
    "SchemaMismatchError",
    "SlotStoreError",
    "SlotStoreRequiredError",
    "Snapshot",
    "Replay",
    "Table",
    "TableDiff",
    "TableAlreadyExistsError",
    "TableNotFoundError",
    "Transaction",
    "UnknownColumnError",
    "VerifyReport",
    "VersionChange",
    "write_table",
]
