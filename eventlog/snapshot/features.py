"""Delta table features: one registry, one entry per feature (as delta-kernel-rs keeps them).

Each :class:`TableFeature` says what the Delta protocol says of it (its name, whether readers
must know it or only writers, the legacy protocol versions that imply it, the features it
requires, the table property that turns it on) and what this library does with it per
operation: :class:`Support` for reading and for writing.

A protocol check is then one lookup per feature the table's protocol lists (or its legacy
versions imply): :func:`unsupported` returns the features that stop an operation, and an
unknown feature stops every operation through the same path, by its name. Features that
only oblige readers or writers while they are *active* (a CHECK constraint is defined, the
change data feed property is on, a column carries a generation expression...) say how to
tell from the table's metadata; a table that lists such a feature but does not use it can
still be read and written.

Adding a feature: add its entry here (and its logic in a module of its own); the protocol
checks, :func:`eventlog.snapshot.protocol.upgrade` and the README's feature table follow.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

from eventlog.log.actions import Metadata, Protocol

__all__ = [
    "FEATURES",
    "needed_features",
    "Operation",
    "Support",
    "TableFeature",
    "supported_features",
    "unsupported",
]


class Support(enum.Enum):
    """What this library does with a feature for one operation."""

    FULL = "full"  # implemented
    INACTIVE_ONLY = "inactive only"  # only while the table does not use the feature
    NONE = "none"  # refused


class Operation(enum.Enum):
    READ = "read"
    WRITE = "write"


def _property_true(key: str) -> Callable[[Metadata | None], bool]:
    def active(metadata: Metadata | None) -> bool:
        return metadata is None or str(metadata.configuration.get(key, "")).lower() == "true"

    return active


def _property_value(key: str, value: str) -> Callable[[Metadata | None], bool]:
    def active(metadata: Metadata | None) -> bool:
        return metadata is None or str(metadata.configuration.get(key, "")).lower() == value

    return active


def _property_prefix(prefix: str) -> Callable[[Metadata | None], bool]:
    def active(metadata: Metadata | None) -> bool:
        return metadata is None or any(k.startswith(prefix) for k in metadata.configuration)

    return active


def _field_metadata(*keys: str) -> Callable[[Metadata | None], bool]:
    """Active when a field of the schema (at any depth) carries one of the metadata ``keys``
    (or a key starting with one that ends in a dot)."""

    def active(metadata: Metadata | None) -> bool:
        if metadata is None:
            return True
        try:
            schema = orjson.loads(metadata.schema_string)
        except orjson.JSONDecodeError:
            return True  # unreadable: assume the worst
        return any(_has_key(meta, keys) for meta in _field_metadatas(schema))

    return active


def _has_key(meta: Mapping[str, Any], keys: tuple[str, ...]) -> bool:
    return any(k in meta or (k.endswith(".") and any(m.startswith(k) for m in meta)) for k in keys)


def _field_metadatas(node: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(node, dict):
        meta = node.get("metadata")
        if isinstance(meta, dict):
            yield meta
        for value in node.values():
            yield from _field_metadatas(value)
    elif isinstance(node, list):
        for value in node:
            yield from _field_metadatas(value)


def _column_mapping(metadata: Metadata | None) -> bool:
    if metadata is None:
        return True
    return str(metadata.configuration.get("delta.columnMapping.mode", "none")).lower() != "none"


def _always(metadata: Metadata | None) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class TableFeature:
    """One Delta table feature (see the module docstring).

    ``legacy_reader``/``legacy_writer``: the protocol versions below table features (reader
    3, writer 7) that imply this feature (None: only listed explicitly). ``active``: whether
    the table uses the feature, from its metadata (the obligations of ``INACTIVE_ONLY``
    support apply only then; without metadata every feature counts as used).
    ``enabled_by``: the table property that turns it on, if one does.
    """

    name: str
    reader_writer: bool
    read: Support
    write: Support
    legacy_reader: int | None = None
    legacy_writer: int | None = None
    requires: tuple[str, ...] = ()
    enabled_by: str | None = None
    active: Callable[[Metadata | None], bool] = _always
    note: str = ""
    # Whether a table whose metadata uses the feature (``active``) needs it in its protocol,
    # so that a schema or property change adds it (columnMapping, checkConstraints,
    # generatedColumns...); features turned on by ``enabled_by`` = "true" are added anyway.
    implied_by_metadata: bool = False
    # DROP FEATURE (eventlog.ops.drop_feature): whether Delta allows dropping it (Delta's
    # RemovableFeature) and whether this library implements the drop; ``disable`` are the
    # table properties the pre-downgrade step sets (a value) or removes (None).
    removable: bool = False
    droppable: bool = False
    disable: tuple[tuple[str, str | None], ...] = ()

    def needed_by(self, metadata: Metadata) -> bool:
        """Whether a table with ``metadata`` must list this feature in its protocol."""
        enabled = self.enabled_by is not None and metadata.configuration.get(self.enabled_by, "")
        if str(enabled).lower() == "true":
            return True
        return self.implied_by_metadata and self.active(metadata)

    def support(self, operation: Operation) -> Support:
        if operation is Operation.READ and not self.reader_writer:
            return Support.FULL  # a writer feature asks nothing of readers
        return self.read if operation is Operation.READ else self.write

    def blocks(self, operation: Operation, metadata: Metadata | None) -> bool:
        """Whether this feature stops ``operation`` on a table with ``metadata``."""
        support = self.support(operation)
        if support is Support.FULL:
            return False
        return support is Support.NONE or self.active(metadata)


_F = TableFeature
_S = Support
FEATURES: Mapping[str, TableFeature] = {
    f.name: f
    for f in (
        _F("appendOnly", False, _S.FULL, _S.FULL, legacy_writer=2, enabled_by="delta.appendOnly"),
        _F(
            "invariants",
            False,
            _S.FULL,
            _S.FULL,
            legacy_writer=2,
            active=_field_metadata("delta.invariants"),
            note="enforced on every write (eventlog.files.constraints)",
        ),
        _F(
            "checkConstraints",
            False,
            _S.FULL,
            _S.FULL,
            legacy_writer=3,
            active=_property_prefix("delta.constraints."),
            implied_by_metadata=True,
            removable=True,
            droppable=True,  # once no constraint remains
            note="enforced on every write (eventlog.files.constraints)",
        ),
        _F(
            "changeDataFeed",
            False,
            _S.FULL,
            _S.FULL,
            legacy_writer=4,
            enabled_by="delta.enableChangeDataFeed",
            active=_property_true("delta.enableChangeDataFeed"),
            note="row-level changes written as cdc actions and change files (eventlog.files.change_data)",
        ),
        _F(
            "generatedColumns",
            False,
            _S.FULL,
            _S.FULL,
            legacy_writer=4,
            active=_field_metadata("delta.generationExpression"),
            implied_by_metadata=True,
            note="computed or checked on every write (eventlog.files.generated)",
        ),
        _F(
            "columnMapping",
            True,
            _S.FULL,
            _S.FULL,
            legacy_reader=2,
            legacy_writer=5,
            enabled_by="delta.columnMapping.mode",
            active=_column_mapping,
            implied_by_metadata=True,
            removable=True,  # Delta rewrites every file to logical names first; not done here
            note="eventlog.files.column_mapping: physical names in files, stats and partition values",
        ),
        _F(
            "identityColumns",
            False,
            _S.FULL,
            _S.FULL,
            legacy_writer=6,
            active=_field_metadata("delta.identity."),
            implied_by_metadata=True,
            note="values reserved through the slot store on every write (eventlog.txn.identity)",
        ),
        _F(
            "deletionVectors",
            True,
            _S.FULL,
            _S.FULL,
            enabled_by="delta.enableDeletionVectors",
            removable=True,
            droppable=True,  # the property off, then REORG PURGE
            disable=(("delta.enableDeletionVectors", "false"),),
        ),
        _F("timestampNtz", True, _S.FULL, _S.FULL),
        _F("domainMetadata", False, _S.FULL, _S.FULL, removable=True),
        _F(
            "v2Checkpoint",
            True,
            _S.FULL,
            _S.FULL,
            enabled_by="delta.checkpointPolicy",
            active=_property_value("delta.checkpointPolicy", "v2"),
            implied_by_metadata=True,
            removable=True,
            droppable=True,  # the policy classic, then a classic checkpoint
            disable=(("delta.checkpointPolicy", "classic"),),
            note="every checkpoint kind is read; V2 ones with sidecars written (eventlog.log.checkpoint_v2)",
        ),
        _F(
            "vacuumProtocolCheck",
            True,
            _S.FULL,
            _S.FULL,
            note="asks only that VACUUM checks the writer protocol, which it does",
            removable=True,
            droppable=True,
        ),
        _F(
            "rowTracking",
            False,
            _S.FULL,
            _S.FULL,
            requires=("domainMetadata",),
            enabled_by="delta.enableRowTracking",
            removable=True,
            droppable=True,  # turned off and suspended, then every file's row ids dropped
            disable=(("delta.enableRowTracking", "false"), ("delta.rowTrackingSuspended", "true")),
            note="fresh row ids at commit, stable ids materialized through rewrites "
            "(eventlog.files.row_tracking)",
        ),
        _F(
            "inCommitTimestamp",
            False,
            _S.FULL,
            _S.FULL,
            enabled_by="delta.enableInCommitTimestamps",
            active=_property_true("delta.enableInCommitTimestamps"),
            removable=True,
            droppable=True,
            disable=(
                ("delta.enableInCommitTimestamps", "false"),
                ("delta.inCommitTimestampEnablementVersion", None),
                ("delta.inCommitTimestampEnablementTimestamp", None),
            ),
            note="commitInfo first with a monotonic inCommitTimestamp (eventlog.log.in_commit_timestamps)",
        ),
        _F(
            "clustering",
            False,
            _S.FULL,
            _S.FULL,
            requires=("domainMetadata",),
            note="the delta.clustering domain kept; OPTIMIZE clusters (eventlog.ops.optimize_clustered)",
        ),
        _F(
            "checkpointProtection",
            False,
            _S.FULL,
            _S.FULL,
            note="log cleanup keeps protected history (eventlog.log.cleanup)",
            removable=True,  # Delta: only with history truncation
        ),
        _F("typeWidening", True, _S.FULL, _S.FULL, enabled_by="delta.enableTypeWidening", removable=True),
        # The preview's tables (Delta 3.2) differ only in recording each change's tableVersion.
        _F("typeWidening-preview", True, _S.FULL, _S.FULL, removable=True),
        _F("variantType", True, _S.NONE, _S.NONE),
        _F("variantType-preview", True, _S.NONE, _S.NONE),
        _F("variantShredding-preview", True, _S.NONE, _S.NONE),
        _F("icebergCompatV1", False, _S.FULL, _S.NONE, requires=("columnMapping",)),
        _F("icebergCompatV2", False, _S.FULL, _S.NONE, requires=("columnMapping",)),
        _F("allowColumnDefaults", False, _S.FULL, _S.NONE),
        _F("catalogManaged", True, _S.NONE, _S.NONE, note="a catalog may ratify commits not yet published"),
        _F("catalogOwned-preview", True, _S.NONE, _S.NONE),
        _F("coordinatedCommits-preview", False, _S.NONE, _S.NONE, note="the log alone is not the table"),
    )
}

TABLE_FEATURES_READER = 3  # the protocol versions that list features explicitly
TABLE_FEATURES_WRITER = 7


def supported_features(protocol: Protocol) -> list[str]:
    """The features a protocol supports: its lists, or what its legacy versions imply."""
    names: set[str] = set()
    if protocol.min_reader_version >= TABLE_FEATURES_READER:
        names |= set(protocol.reader_features or ())
    if protocol.min_writer_version >= TABLE_FEATURES_WRITER:
        names |= set(protocol.writer_features or ())
    for feature in FEATURES.values():
        by_reader = feature.legacy_reader is not None and protocol.min_reader_version < TABLE_FEATURES_READER
        by_writer = feature.legacy_writer is not None and protocol.min_writer_version < TABLE_FEATURES_WRITER
        if (by_reader and protocol.min_reader_version >= (feature.legacy_reader or 0)) or (
            by_writer and protocol.min_writer_version >= (feature.legacy_writer or 0)
        ):
            names.add(feature.name)
    return sorted(names)


def unsupported(protocol: Protocol, metadata: Metadata | None, operation: Operation) -> list[str]:
    """The features of ``protocol`` that stop ``operation`` here, by name (sorted); an
    unknown feature, or a protocol version above the ones this library knows, stops it too."""
    out: set[str] = set()
    if protocol.min_reader_version > TABLE_FEATURES_READER:
        out.add(f"readerVersion{protocol.min_reader_version}")
    if operation is Operation.WRITE and protocol.min_writer_version > TABLE_FEATURES_WRITER:
        out.add(f"writerVersion{protocol.min_writer_version}")
    listed = protocol.min_reader_version >= TABLE_FEATURES_READER
    readers = set(protocol.reader_features or ()) if listed else set()
    for name in supported_features(protocol):
        feature = FEATURES.get(name)
        if feature is None:
            # Unknown: readers must refuse an unknown reader feature, writers any unknown one.
            if operation is Operation.WRITE or name in readers:
                out.add(name)
        elif feature.blocks(operation, metadata):
            out.add(name)
    return sorted(out)


def needed_features(metadata: Metadata) -> set[str]:
    """The features a table with ``metadata`` must list (the registry's ``needed_by``), and
    the features those require (rowTracking and clustering need domainMetadata)."""
    needed = {name for name, feature in FEATURES.items() if feature.needed_by(metadata)}
    pending = list(needed)
    while pending:
        for required in FEATURES[pending.pop()].requires:
            if required not in needed:
                needed.add(required)
                pending.append(required)
    return needed
