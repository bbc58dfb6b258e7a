"""What a checkpoint holds: its Parquet schema and :class:`CheckpointState`.

The file actions of a state are Arrow tables (:data:`~eventlog.log.filetable.ADD_SCHEMA`,
:data:`~eventlog.log.filetable.REMOVE_SCHEMA`): a checkpoint of a million files is read
and written without a Python object per file. ``state.adds``/``state.removes`` still
offer them as :class:`~eventlog.log.actions.AddFile`/``RemoveFile`` sequences, built on
first use only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import pyarrow as pa

from eventlog.log.actions import AddFile, DomainMetadata, Metadata, Protocol, RemoveFile, SetTransaction
from eventlog.log.filetable import (
    ADD_STRUCT,
    REMOVE_STRUCT,
    AddFiles,
    RemoveFiles,
)

__all__ = [
    "CHECKPOINT_SCHEMA",
    "LAST_CHECKPOINT",
    "SIDECARS",
    "AddFiles",
    "CheckpointState",
    "RemoveFiles",
    "checkpoint_path",
]

LAST_CHECKPOINT = "_last_checkpoint"
SIDECARS = "_sidecars"  # the directory of V2 checkpoints' sidecar files, in _delta_log

# --------------------------------------------------------------------------- schema


def _f(name: str, typ: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable)


_STR = pa.string()
_LONG = pa.int64()
# format.options/configuration may not hold null values (partitionValues/tags may).
_MAP_NN = pa.map_(_STR, _f("value", _STR, False))
_LIST_NN = pa.list_(_f("element", _STR, False))

TXN_STRUCT = pa.struct([_f("appId", _STR, False), _f("version", _LONG, False), _f("lastUpdated", _LONG)])
METADATA_STRUCT = pa.struct([
    _f("id", _STR, False),
    _f("name", _STR),
    _f("description", _STR),
    _f("format", pa.struct([_f("provider", _STR, False), _f("options", _MAP_NN, False)]), False),
    _f("schemaString", _STR, False),
    _f("partitionColumns", _LIST_NN, False),
    _f("createdTime", _LONG),
    _f("configuration", _MAP_NN, False),
])  # fmt: skip
PROTOCOL_STRUCT = pa.struct([
    _f("minReaderVersion", pa.int32(), False),
    _f("minWriterVersion", pa.int32(), False),
    _f("readerFeatures", _LIST_NN),
    _f("writerFeatures", _LIST_NN),
])  # fmt: skip
DOMAIN_STRUCT = pa.struct([
    _f("domain", _STR, False), _f("configuration", _STR, False), _f("removed", pa.bool_(), False)
])  # fmt: skip

# What this library writes (the V1 spec): field names, types and nullability match what
# delta-rs (delta-kernel) writes. The add/remove structs are filetable's, so a checkpoint's
# file rows flattened are exactly ADD_SCHEMA/REMOVE_SCHEMA tables.
CHECKPOINT_SCHEMA = pa.schema([
    _f("txn", TXN_STRUCT),
    _f("add", ADD_STRUCT),
    _f("remove", REMOVE_STRUCT),
    _f("metaData", METADATA_STRUCT),
    _f("protocol", PROTOCOL_STRUCT),
    _f("domainMetadata", DOMAIN_STRUCT),
])  # fmt: skip

# V2-spec actions a reader also meets (PROTOCOL.md "Sidecar File Information").
_MAP = pa.map_(_STR, _STR)
CHECKPOINT_METADATA_STRUCT = pa.struct([_f("version", _LONG, False), _f("tags", _MAP)])
SIDECAR_STRUCT = pa.struct([
    _f("path", _STR, False), _f("sizeInBytes", _LONG, False), _f("modificationTime", _LONG, False),
    _f("tags", _MAP),
])  # fmt: skip


def checkpoint_path(log_dir: str, version: int) -> str:
    """Path of the classic single-file checkpoint for ``version`` in ``log_dir``."""
    return f"{log_dir.rstrip('/')}/{version:020d}.checkpoint.parquet"


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """The reconciled table state at ``version``: what a checkpoint stores.

    ``adds``/``removes`` may be given as sequences of :class:`AddFile`/:class:`RemoveFile`
    or as Arrow tables (conformed to ADD_SCHEMA/REMOVE_SCHEMA); either way they are kept
    as :class:`AddFiles`/:class:`RemoveFiles`, whose tables are :attr:`add_table` and
    :attr:`remove_table` and which materialize objects only when iterated.
    """

    version: int
    protocol: Protocol
    metadata: Metadata
    adds: Sequence[AddFile]
    removes: Sequence[RemoveFile]
    txns: Sequence[SetTransaction]
    domains: Sequence[DomainMetadata]
    # SHA-256 of commit ``version``'s bytes (the head of the tamper-evidence chain), kept in
    # the Parquet footer's key-value metadata, which Delta readers ignore; verification
    # continues from it after older commits are cleaned up (eventlog.log.verify).
    chain_head: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "adds", AddFiles.of(self.adds))
        object.__setattr__(self, "removes", RemoveFiles.of(self.removes))

    @property
    def add_table(self) -> pa.Table:
        """The live files, one row per ``add`` action (ADD_SCHEMA)."""
        return cast(AddFiles, self.adds).table

    @property
    def remove_table(self) -> pa.Table:
        """The tombstones, one row per ``remove`` action (REMOVE_SCHEMA)."""
        return cast(RemoveFiles, self.removes).table
