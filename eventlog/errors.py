"""Typed errors of the table engine.

One root, :class:`EventlogError`. The conflict exceptions keep Delta Lake's names and
hierarchy (``DeltaConcurrentModificationException`` and its subclasses), carry structured
fields (winning version, the winner's operation and commitInfo, partition hint, isolation
level) and survive pickling: every class stores its constructor arguments and rebuilds
itself from them in ``__reduce__``.

Three kinds of failure are distinct types, so callers never have to parse messages:

* "definitely failed, nothing written": :class:`InvalidInputError` and subclasses,
  :class:`DeltaConcurrentModificationException` and subclasses, :class:`CommitFailedError`;
* "retry-safe": the conflict exceptions say the operation may be re-run on a fresh snapshot;
* "outcome unknown": :class:`CommitStateUnknownError`; staged files are kept.
"""

from __future__ import annotations

import json
from typing import Any

# The root classes and the table-feature errors live in modules of their own, re-exported here.
from eventlog.error_base import EventlogError as EventlogError
from eventlog.error_base import InvalidInputError as InvalidInputError
from eventlog.feature_errors import ChangeDataNotRecordedError as ChangeDataNotRecordedError
from eventlog.feature_errors import ChangeDataSchemaChangeError as ChangeDataSchemaChangeError
from eventlog.feature_errors import FeatureDropError as FeatureDropError
from eventlog.feature_errors import InvalidChangeRangeError as InvalidChangeRangeError
from eventlog.feature_errors import RowTrackingNotEnabledError as RowTrackingNotEnabledError
from eventlog.storage_errors import CorruptDataFileError as CorruptDataFileError
from eventlog.storage_errors import StorageError as StorageError
from eventlog.storage_errors import is_storage_failure as is_storage_failure
from eventlog.storage_errors import storage_error as storage_error
from eventlog.storage_errors import storage_step as storage_step

DOC_LINK = "https://docs.delta.io/latest/concurrency-control.html"


# --------------------------------------------------------------------------- table state


class TableNotFoundError(EventlogError):
    """No Delta log exists at the URI (``Table.open`` on an absent table)."""

    def __init__(self, uri: str) -> None:
        super().__init__(f"no table at {uri!r}: {uri}/_delta_log has no commits", uri=uri)


class TableAlreadyExistsError(EventlogError):
    """``Table.create`` on a URI that already holds a table."""

    def __init__(self, uri: str, version: int) -> None:
        super().__init__(
            f"a table already exists at {uri!r} (latest version {version})", uri=uri, version=version
        )


class CorruptLogError(EventlogError):
    """The commit log cannot be replayed: a gap in the versions or an unparseable line."""

    def __init__(self, message: str, *, uri: str, version: int | None, line: int | None = None) -> None:
        super().__init__(message, uri=uri, version=version, line=line)


class CommitLostError(CorruptLogError):
    """An acknowledged commit is gone from the log: its version slot was completed (or a
    later version was published after it), but neither ``<version>.json`` nor its staged
    file exists. It was removed from outside (by hand, a lifecycle rule, a lost object).

    Nothing resolves it automatically: restore the file from a backup, or accept the loss
    explicitly (``eventlog slots repair --accept-lost VERSION``), which ``verify`` then
    reports as ``lost``. Fields: ``uri``, ``version``, ``txn_id`` (the lost transaction)
    and ``anchored_digest`` (the content hash the slot store recorded for it, or None)."""

    def __init__(
        self, message: str, *, uri: str, version: int, txn_id: str, anchored_digest: str | None
    ) -> None:
        EventlogError.__init__(
            self, message, uri=uri, version=version, line=None, txn_id=txn_id, anchored_digest=anchored_digest
        )


class ReplayMismatchError(CorruptLogError):
    """Replaying the events does not give the table's snapshot at a version: a checkpoint
    (or the log) does not agree with the commits it stands for. Fields: ``uri``,
    ``version`` (the first version that differs), ``differences`` (what differs)."""

    def __init__(self, message: str, *, uri: str, version: int, differences: list[str]) -> None:
        EventlogError.__init__(self, message, uri=uri, version=version, line=None, differences=differences)


class DataFileNotFoundError(EventlogError, FileNotFoundError):
    """A data file the snapshot names is gone, most often removed by VACUUM after the
    version was superseded (time travel past the retention). Fields: ``uri`` (the table),
    ``path`` (the missing file), ``version`` (the snapshot read, None when unknown)."""

    def __init__(self, uri: str, path: str, version: int | None) -> None:
        at = f" at version {version}" if version is not None else ""
        super().__init__(
            f"{uri}: data file {path} of the snapshot{at} does not exist "
            "(VACUUM deletes files older than the retention; time travel cannot reach them)",
            uri=uri,
            path=path,
            version=version,
        )


class VersionNotFoundError(EventlogError):
    """Time travel to a version or timestamp the log does not hold."""

    def __init__(self, message: str, *, requested: Any, earliest: int, latest: int) -> None:
        super().__init__(message, requested=requested, earliest=earliest, latest=latest)


class UnsupportedProtocolError(EventlogError):
    """The table needs a reader or writer feature this library does not implement."""

    def __init__(self, message: str, *, features: list[str]) -> None:
        super().__init__(message, features=features)


class DatasetUnsupportedError(EventlogError):
    """``Table.to_pyarrow_dataset`` on a snapshot that a plain ``pyarrow.dataset`` cannot
    express: live files with deletion vectors (a dataset would return their deleted rows)
    or column mapping (the files' physical column names are not the table's). ``scan()``
    reads such tables. Fields: ``uri``, ``version`` (the snapshot), ``reason``
    (``"deletion vectors"`` or ``"column mapping"``) and ``count`` (the live files with a
    deletion vector; 0 for column mapping)."""

    def __init__(self, *, uri: str, version: int, reason: str, count: int) -> None:
        what = f" ({count} live files have one)" if reason == "deletion vectors" else ""
        super().__init__(
            f"{uri}: version {version} cannot be read as a pyarrow dataset: it uses {reason}{what}, "
            "which a plain dataset cannot apply; read it with Table.scan() (a RecordBatchReader "
            "that DuckDB, Polars and pyarrow also take)",
            uri=uri,
            version=version,
            reason=reason,
            count=count,
        )


# --------------------------------------------------------------------------- bad input


class SchemaMismatchError(InvalidInputError):
    """Data whose schema does not match the table's; names the offending columns."""

    def __init__(self, message: str, *, columns: list[str]) -> None:
        EventlogError.__init__(self, message, columns=columns)


class UnknownColumnError(InvalidInputError):
    """A predicate, SET expression, partition column or Z-order column names no column."""

    def __init__(self, column: str, available: list[str], context: str = "") -> None:
        where = f" in {context}" if context else ""
        EventlogError.__init__(
            self,
            f"unknown column {column!r}{where}; the table has columns {available}",
            column=column,
            available=available,
            context=context,
        )


class PredicateError(InvalidInputError):
    """A SQL predicate or expression that cannot be parsed or is not supported."""

    def __init__(self, message: str, *, expression: str) -> None:
        EventlogError.__init__(self, message, expression=expression)


class InvalidTablePropertyError(InvalidInputError):
    """A table property with an invalid value (e.g. ``delta.isolationLevel``)."""

    def __init__(self, key: str, value: str, allowed: list[str]) -> None:
        EventlogError.__init__(
            self,
            f"invalid value {value!r} for table property {key!r}; allowed values: {allowed}",
            key=key,
            value=value,
            allowed=allowed,
        )


class InvalidTextError(InvalidInputError):
    """User text the table cannot store: not a string, not encodable as UTF-8 (a lone
    surrogate such as ``"\\ud800"``), empty where a name is needed, too long, or holding a
    character the destination cannot hold (NUL in a path). See :mod:`eventlog.userinput`.

    Fields: ``argument`` (which input, e.g. ``"table property key"``), ``reason`` and
    ``position`` (index of the offending character, or None).
    """

    def __init__(self, message: str, *, argument: str, reason: str, position: int | None = None) -> None:
        EventlogError.__init__(self, message, argument=argument, reason=reason, position=position)


class TransactionStateError(InvalidInputError):
    """Misuse of a transaction: a second operation, or use after commit."""


class MergeCardinalityError(InvalidInputError):
    """MERGE matched one target row with several source rows (Delta's cardinality rule)."""

    def __init__(self, message: str, *, rows: int) -> None:
        EventlogError.__init__(self, message, rows=rows)


class AppendOnlyViolationError(InvalidInputError):
    """DELETE/UPDATE/overwrite on a table with ``delta.appendOnly = true``."""


class TypeChangeError(InvalidInputError):
    """A column type change that type widening does not allow (a narrowing, an unrelated
    type, a partition column's change whose values would be written differently), or any
    change on a table without ``delta.enableTypeWidening = true``.

    Fields: ``column``, ``from_type`` and ``to_type`` (Delta's type names), ``reason``.
    """

    def __init__(self, message: str, *, column: str, from_type: str, to_type: str, reason: str) -> None:
        EventlogError.__init__(
            self, message, column=column, from_type=from_type, to_type=to_type, reason=reason
        )


class ColumnMappingError(InvalidInputError):
    """A schema change that column mapping forbids or requires (Delta's
    ``DELTA_UNSUPPORTED_RENAME_COLUMN``/``DROP_COLUMN`` without mapping,
    ``DELTA_UNSUPPORTED_COLUMN_MAPPING_MODE_CHANGE``, ``DELTA_UNSUPPORTED_DROP_PARTITION_COLUMN``).

    Fields: ``operation`` (``RENAME COLUMN``, ``DROP COLUMNS``, ``SET TBLPROPERTIES``),
    ``reason`` (``mapping required``, ``mode change``, ``partition column``, ``dependent
    expression``: a CHECK constraint or generated column reads the column), ``mode`` (the
    table's column mapping mode) and ``property`` (``delta.columnMapping.mode``: the property
    to set, or the one whose change was refused).
    """

    def __init__(self, message: str, *, operation: str, reason: str, mode: str, property: str) -> None:
        EventlogError.__init__(
            self, message, operation=operation, reason=reason, mode=mode, property=property
        )


class ClusteringError(InvalidInputError):
    """Clustering columns Delta does not allow (``DELTA_CLUSTER_BY_*`` errors): a clustered
    table that is also partitioned, a column that does not exist, is repeated or nested, a
    column of a type without min/max statistics, or more columns than Delta's limit (4).
    Nothing was committed.

    Fields: ``columns`` (the clustering columns asked for) and ``reason`` (``partitioned``,
    ``unknown column``, ``duplicate``, ``type``, ``too many``; ``no statistics``: beyond the
    columns Delta keeps statistics for; ``zorder``: OPTIMIZE ZORDER BY on a clustered table;
    ``drop clustering column``: DROP COLUMNS of one; ``mismatch``: a Spark write's
    ``clusterBy`` option that differs from the table's clustering columns).
    """

    def __init__(self, message: str, *, columns: list[str], reason: str) -> None:
        EventlogError.__init__(self, message, columns=columns, reason=reason)


class IdentityColumnError(InvalidInputError):
    """A write or schema that breaks an identity column's rules (Delta's
    ``DELTA_IDENTITY_COLUMNS_*`` errors): values supplied for a ``GENERATED ALWAYS`` column,
    an UPDATE or MERGE that assigns an identity column, an identity column that is not
    BIGINT, has step 0, is a partition column or nested, or carries a generation expression.
    Nothing was committed and no data file is left behind.

    Fields: ``column``, ``reason`` (``explicit insert``, ``update``, ``type``, ``step``,
    ``partition column``, ``nested``, ``generated``, ``sync``) and ``operation`` (the write's
    context: ``append``, ``merge``, ``UPDATE``, ``create``...).
    """

    def __init__(self, message: str, *, column: str, reason: str, operation: str) -> None:
        EventlogError.__init__(self, message, column=column, reason=reason, operation=operation)


class ConstraintViolationError(InvalidInputError):
    """Rows that break a table constraint: a CHECK constraint (``delta.constraints.<name>``),
    a column invariant (``delta.invariants``), a generated column's expression, or NOT NULL.
    Nothing was committed and no data file is left behind.

    Fields: ``constraint`` (its name: the CHECK constraint's, ``"Generated Column <c>"``,
    ``"NOT NULL <column>"`` or ``"invariant <column>"``), ``expression`` (its SQL),
    ``values`` (the first failing row, column -> value, of the columns the expression reads),
    ``sample`` (up to 5 such rows) and ``count`` (failing rows in the data checked).
    """

    def __init__(
        self, message: str, *, constraint: str, expression: str, sample: list[dict[str, Any]], count: int
    ) -> None:
        EventlogError.__init__(
            self,
            message,
            constraint=constraint,
            expression=expression,
            sample=sample,
            values=sample[0] if sample else {},
            count=count,
        )


class NotNullViolationError(ConstraintViolationError, SchemaMismatchError):
    """Nulls written to a non-nullable column or nested field: a :class:`ConstraintViolationError`
    (constraint ``"NOT NULL <path>"``) that is also a :class:`SchemaMismatchError` (``columns``:
    every offending path)."""

    def __init__(self, message: str, *, columns: list[str], count: int) -> None:
        EventlogError.__init__(
            self,
            message,
            constraint=f"NOT NULL {columns[0]}",
            expression=f"{columns[0]} IS NOT NULL",
            sample=[{columns[0]: None}],
            values={columns[0]: None},
            count=count,
            columns=columns,
        )


# --------------------------------------------------------------------------- commits


class CommitFailedError(EventlogError):
    """The commit definitely did not land: retry budget exhausted. The cause is chained."""

    def __init__(
        self,
        message: str,
        *,
        attempts: int,
        start_version: int,
        last_attempted_version: int,
        elapsed_ms: float,
        txn_id: str,
    ) -> None:
        super().__init__(
            message,
            attempts=attempts,
            start_version=start_version,
            last_attempted_version=last_attempted_version,
            elapsed_ms=elapsed_ms,
            txn_id=txn_id,
        )


class SlotStoreRequiredError(InvalidInputError):
    """A table on an object store (``s3://``...) without a slot store that can guard it.

    Writers on other machines reach the same table, and a lock on this machine cannot guard
    them. Raised by a write through a handle that names no slot store (reading needs none),
    and at open when the slot store named is a local-file one. Pass
    ``slots="zk://host:2181/chroot"`` (or set ``$EVENTLOG_SLOTS``). Raised before anything
    is written; field ``uri``.
    """

    def __init__(self, message: str, *, uri: str) -> None:
        EventlogError.__init__(self, message, uri=uri)


class SlotStoreError(EventlogError):
    """The version-slot store (ZooKeeper, ...) failed or stayed unreachable.

    Raised when nothing was committed: by reads (open, refresh) and by commits whose
    every claim had a definite outcome. The lockstore error is chained as the cause.
    """

    def __init__(self, message: str, *, uri: str) -> None:
        super().__init__(message, uri=uri)


class CommitStateUnknownError(EventlogError):
    """The slot store stayed unreachable: the commit may or may not have landed.

    Staged files are kept. ``txn_id`` identifies the commit in the log if it landed.
    """

    def __init__(self, message: str, *, txn_id: str, version: int | None) -> None:
        super().__init__(message, txn_id=txn_id, version=version)


# --------------------------------------------------------------------------- conflicts


class DeltaConcurrentModificationException(EventlogError):
    """Base of Delta's conflict exceptions: a concurrent commit conflicts with this one.

    Fields: ``winning_version``, ``operation`` (the winner's commitInfo.operation),
    ``winning_commit_info`` (dict), ``partition`` (hint such as ``"[date=2024-01-01]"`` or
    None), ``isolation_level`` (of the losing transaction), ``conflict_type`` (the class
    name without "Exception", as in Delta), ``table`` (URI).
    """

    error_class = "DELTA_CONCURRENT_MODIFICATION"
    sql_state = "2D521"

    def __init__(
        self,
        message: str | None = None,
        *,
        winning_version: int,
        operation: str,
        winning_commit_info: dict[str, Any] | None = None,
        partition: str | None = None,
        isolation_level: str | None = None,
        table: str = "",
        detail: str = "",
    ) -> None:
        fields = dict(
            winning_version=winning_version,
            operation=operation,
            winning_commit_info=winning_commit_info or {},
            partition=partition,
            isolation_level=isolation_level,
            table=table,
            detail=detail,
            conflict_type=type(self).__name__.removesuffix("Exception"),
        )
        if message is None:
            message = self._render(fields)
        super().__init__(message, **fields)

    def _render(self, f: dict[str, Any]) -> str:  # pragma: no cover - overridden
        return f"[{self.error_class}] {f['detail']}"

    @staticmethod
    def _conflicting_commit(f: dict[str, Any]) -> str:
        info = dict(f["winning_commit_info"])
        info["version"] = f["winning_version"]
        return "\nConflicting commit: " + json.dumps(info, sort_keys=True, default=str)


class _FileConflict(DeltaConcurrentModificationException):
    _verb = ""
    _tail = ""

    def _render(self, f: dict[str, Any]) -> str:
        hint = f" in the partition {f['partition']}" if f["partition"] else ""
        cls = self.error_class + (".WITH_PARTITION_HINT" if f["partition"] else ".WITHOUT_HINT")
        return (
            f"[{cls}] Transaction conflict detected, a concurrent {f['operation']} {self._verb} "
            f"table delta.`{f['table']}` (committed at version {f['winning_version']}){self._tail}. "
            f"The concurrent operation modified data{hint} that {self._what}. "
            f"Please retry the operation. Refer to {DOC_LINK} for more information."
        )

    _what = "was read by this operation"


class ConcurrentAppendException(_FileConflict):
    """Files were added, by a commit that won, to a partition this transaction read."""

    error_class = "DELTA_CONCURRENT_APPEND"
    _verb = "added data to"
    _tail = ""
    _what = "should have been read by this operation"


class ConcurrentDeleteReadException(_FileConflict):
    """A commit that won removed a file this transaction read."""

    error_class = "DELTA_CONCURRENT_DELETE_READ"
    _verb = "deleted data from"
    _tail = " that this transaction read"


class ConcurrentDeleteDeleteException(_FileConflict):
    """A commit that won removed a file this transaction also removes."""

    error_class = "DELTA_CONCURRENT_DELETE_DELETE"
    _verb = "deleted data from"
    _tail = " that this transaction attempted to delete"


class MetadataChangedException(DeltaConcurrentModificationException):
    """A commit that won changed the table metadata (schema, properties, partitioning)."""

    error_class = "DELTA_METADATA_CHANGED"

    def _render(self, f: dict[str, Any]) -> str:
        return (
            f"[{self.error_class}] MetadataChangedException: The metadata of the Delta table "
            f"delta.`{f['table']}` has been changed by a concurrent update. Please try the "
            f"operation again.{self._conflicting_commit(f)}\nRefer to {DOC_LINK} for more details."
        )


class ProtocolChangedException(DeltaConcurrentModificationException):
    """The protocol changed concurrently, or two writers created the table at once."""

    error_class = "DELTA_PROTOCOL_CHANGED"

    def _render(self, f: dict[str, Any]) -> str:
        extra = ""
        if f["winning_version"] == 0:
            extra = (
                "This happens when multiple writers are writing to an empty directory. "
                "Creating the table ahead of time will avoid this conflict. "
            )
        return (
            f"[{self.error_class}] ProtocolChangedException: The protocol version of the Delta "
            f"table has been changed by a concurrent update. {extra}{f['detail']}"
            f"{self._conflicting_commit(f)}\nRefer to {DOC_LINK} for more details."
        )


class ConcurrentTransactionException(DeltaConcurrentModificationException):
    """A commit that won wrote an app id (txn action) this transaction read, or the same domain."""

    error_class = "DELTA_CONCURRENT_TRANSACTION"

    def _render(self, f: dict[str, Any]) -> str:
        if f["detail"]:
            return f"[{self.error_class}] {f['detail']}{self._conflicting_commit(f)}"
        return (
            f"[{self.error_class}] ConcurrentTransactionException: This error occurs when "
            "multiple streaming queries are using the same checkpoint to write into this "
            "table. Did you run multiple instances of the same streaming query at the same "
            f"time?{self._conflicting_commit(f)}\nRefer to {DOC_LINK} for more details."
        )


class ConcurrentWriteException(DeltaConcurrentModificationException):
    """A concurrent transaction wrote new data since this one read (generic conflict)."""

    error_class = "DELTA_CONCURRENT_WRITE"

    def _render(self, f: dict[str, Any]) -> str:
        return (
            f"[{self.error_class}] ConcurrentWriteException: A concurrent transaction has "
            "written new data since the current transaction read the table. Please try the "
            f"operation again.{f['detail']}{self._conflicting_commit(f)}\n"
            f"Refer to {DOC_LINK} for more details."
        )
