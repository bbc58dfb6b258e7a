"""Which Delta protocol versions and table features this library reads and writes.

New tables get the lowest protocol that describes them: ``(1, 2)`` (legacy appendOnly and
invariants), or ``(3, 7)`` with the ``timestampNtz`` feature when the schema has naive
timestamps. What each feature needs, and what this library does with it, is the registry's
(:mod:`eventlog.snapshot.features`): a table whose protocol needs a feature this library
cannot honour for an operation is refused with :class:`UnsupportedProtocolError` naming the
feature, instead of being misread or corrupted.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from eventlog.errors import UnsupportedProtocolError
from eventlog.files.schema import needs_timestamp_ntz, to_spark_schema_json
from eventlog.log.actions import Metadata, Protocol
from eventlog.log.cleanup import CheckpointProtection, cleanup_expired_logs
from eventlog.log.storage import LogStore
from eventlog.snapshot.features import (
    FEATURES,
    TABLE_FEATURES_READER,
    TABLE_FEATURES_WRITER,
    Operation,
    needed_features,
    supported_features,
    unsupported,
)

MAX_READER_VERSION = TABLE_FEATURES_READER
MAX_WRITER_VERSION = TABLE_FEATURES_WRITER
DV_PROPERTY = "delta.enableDeletionVectors"


def reader_missing(protocol: Protocol, metadata: Metadata | None = None) -> list[str]:
    """The features that stop this library reading the table (empty when it can): see
    :mod:`eventlog.snapshot.features`. Without ``metadata`` every feature counts as active."""
    return unsupported(protocol, metadata, Operation.READ)


def writer_missing(protocol: Protocol, metadata: Metadata | None = None) -> list[str]:
    """The features that stop this library writing the table (empty when it can)."""
    return unsupported(protocol, metadata, Operation.WRITE)


def check_readable(protocol: Protocol, metadata: Metadata | None = None) -> None:
    missing = reader_missing(protocol, metadata)
    if missing:
        raise UnsupportedProtocolError(
            f"this table needs reader features {missing} that eventlog does not support",
            features=missing,
        )


def check_writable(protocol: Protocol, metadata: Metadata | None = None) -> None:
    """Raise :class:`UnsupportedProtocolError` unless this library can write a table with
    ``protocol`` and ``metadata`` (every write checks it before writing anything)."""
    missing = writer_missing(protocol, metadata)
    if missing:
        raise UnsupportedProtocolError(
            f"this table needs writer features {missing} that eventlog does not support",
            features=missing,
        )


def check_supported(protocol: Protocol, metadata: Metadata | None = None) -> None:
    """Raise unless this library can both read and write tables with ``protocol``."""
    check_readable(protocol, metadata)
    check_writable(protocol, metadata)


def features_of(protocol: Protocol) -> set[str]:
    """Every feature a protocol supports, legacy versions expanded to their features."""
    return set(supported_features(protocol))


def removed_features(old: Protocol, new: Protocol) -> set[str]:
    return features_of(old) - features_of(new)


def protocol_for(schema: pa.Schema, properties: Mapping[str, str]) -> Protocol:
    """The minimal protocol for a new table with this schema and these properties."""
    return upgrade(Protocol(1, 2), schema, properties)


def upgrade(protocol: Protocol, schema: pa.Schema, properties: Mapping[str, str]) -> Protocol:
    """``protocol`` with the features this schema and these properties need (unchanged
    when it already has them). Features that need one go to (3, 7) with explicit lists."""
    needed = needed_features(Metadata("", to_spark_schema_json(schema), (), dict(properties)))
    if needs_timestamp_ntz(schema):
        needed.add("timestampNtz")
    have = features_of(protocol)
    if needed <= have:
        return protocol
    legacy = _legacy_column_mapping(protocol, needed - have)
    if legacy is not None and needed <= features_of(legacy):
        return legacy
    legacy = _legacy_writer(protocol, needed - have)
    if legacy is not None and needed <= features_of(legacy):
        return legacy
    return _listed(protocol, have | needed)


def with_features(protocol: Protocol, names: set[str]) -> Protocol:
    """``protocol`` with the features ``names`` supported too (unchanged when it has them),
    listed explicitly as table features."""
    have = features_of(protocol)
    return protocol if names <= have else _listed(protocol, have | names)


def _listed(protocol: Protocol, wanted: set[str]) -> Protocol:
    """A table-features protocol (writer 7) listing ``wanted``."""
    features = wanted | {"appendOnly", "invariants"}
    readers = {f for f in features if f in FEATURES and FEATURES[f].reader_writer}
    listed = (
        set(protocol.reader_features or ()) if protocol.min_reader_version >= MAX_READER_VERSION else set()
    )
    if not (readers - _LEGACY_READER_FEATURES.get(protocol.min_reader_version, set())) and not listed:
        # Writer features only: the reader version stays (1, or 2 for column mapping), as Delta
        # writes (1, 7) for a table with, say, identity columns and nothing readers must know.
        return Protocol(
            protocol.min_reader_version, MAX_WRITER_VERSION, writer_features=tuple(sorted(features))
        )
    return Protocol(
        MAX_READER_VERSION,
        MAX_WRITER_VERSION,
        reader_features=tuple(sorted(readers | listed)),
        writer_features=tuple(sorted(features)),
    )


# What the legacy reader versions already make readers know.
_LEGACY_READER_FEATURES = {1: set(), 2: {"columnMapping"}}


_LAST_WRITER_ONLY_VERSION = 4  # writer 5 implies column mapping


def _legacy_writer(protocol: Protocol, missing: set[str]) -> Protocol | None:
    """Writer-only features of the legacy versions up to 4 on a legacy protocol raise only the
    writer version, as Delta does: a CHECK constraint needs writer 3, a generated column 4.
    (Versions 5 and 6 would imply column mapping; identity columns go to table features.)"""
    if protocol.min_writer_version >= MAX_WRITER_VERSION:
        return None
    versions = []
    for name in missing:
        feature = FEATURES.get(name)
        if feature is None or feature.reader_writer or feature.legacy_writer is None:
            return None
        if feature.legacy_writer > _LAST_WRITER_ONLY_VERSION:
            return None
        versions.append(feature.legacy_writer)
    return Protocol(protocol.min_reader_version, max(protocol.min_writer_version, *versions))


def _legacy_column_mapping(protocol: Protocol, missing: set[str]) -> Protocol | None:
    """Column mapping on a legacy protocol goes to reader 2, writer 5 (at least), as Delta
    upgrades it ("Column mapping requires at least protocol (2, 5)"); readers that know
    column mapping but not table features (delta-rs 1.x) can then still read the table."""
    if "columnMapping" not in missing or protocol.min_writer_version >= MAX_WRITER_VERSION:
        return None
    reader = max(protocol.min_reader_version, FEATURES["columnMapping"].legacy_reader or 2)
    writer = max(protocol.min_writer_version, FEATURES["columnMapping"].legacy_writer or 5)
    return Protocol(reader, writer)


_LEGACY_VERSIONS = ((1, 1), (1, 2), (1, 3), (1, 4), (2, 5), (2, 6))


def downgrade(protocol: Protocol, name: str, *, add: tuple[str, ...] = ()) -> Protocol:
    """``protocol`` without the feature ``name`` (and with the writer features ``add``), at the
    lowest versions that describe the rest, as Delta's ``removeFeature`` and ``normalized``:
    legacy versions when they imply exactly the remaining features ((1, 3) without
    checkConstraints is (1, 2)), else (1, 7) or (3, 7) with explicit lists."""
    remaining = (features_of(protocol) - {name}) | set(add)
    for reader, writer in _LEGACY_VERSIONS:
        legacy = Protocol(reader, writer)
        if features_of(legacy) == remaining:
            return legacy
    listed = (
        set(protocol.reader_features or ()) if protocol.min_reader_version >= MAX_READER_VERSION else set()
    )
    readers = {f for f in remaining if f in listed or (f in FEATURES and FEATURES[f].reader_writer)}
    if not readers or readers <= _LEGACY_READER_FEATURES[2]:
        reader = 2 if readers else 1
        return Protocol(reader, MAX_WRITER_VERSION, writer_features=tuple(sorted(remaining)))
    return Protocol(
        MAX_READER_VERSION,
        MAX_WRITER_VERSION,
        reader_features=tuple(sorted(readers)),
        writer_features=tuple(sorted(remaining)),
    )


def clean_log(
    log: LogStore, protocol: Protocol, properties: Mapping[str, str], checkpoint_version: int, cutoff_ms: int
) -> list[int]:
    """Log cleanup below ``checkpoint_version`` (a checkpoint of a table with ``protocol``
    and ``properties``) of the files older than ``cutoff_ms``, within its
    ``checkpointProtection`` (history is only dropped over protocols this library
    supports); the commit versions deleted."""

    def supported(protocol: Protocol, write: bool) -> bool:
        return not (writer_missing(protocol) if write else reader_missing(protocol))

    protection = CheckpointProtection.of(protocol, properties, supported)
    return LogStore.commit_versions(
        cleanup_expired_logs(log, checkpoint_version, cutoff_ms, protection=protection)
    )
