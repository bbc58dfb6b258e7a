"""Which Delta protocol versions and table features this library reads and writes.

New tables get the lowest protocol that describes them: ``(1, 2)`` (legacy appendOnly and
invariants), or ``(3, 7)`` with the ``timestampNtz`` feature when the schema has naive
timestamps. A table whose protocol needs a feature not listed here is refused with
:class:`UnsupportedProtocolError` instead of being misread or corrupted.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from eventlog.errors import UnsupportedProtocolError
from eventlog.files.schema import needs_timestamp_ntz
from eventlog.log.actions import Protocol

MAX_READER_VERSION = 3
MAX_WRITER_VERSION = 7
# v2Checkpoint: every checkpoint kind is read (eventlog.log.checkpoint_read); writers, which
# would have to write V2 checkpoints, still refuse it.
READER_FEATURES = frozenset({"timestampNtz", "deletionVectors", "v2Checkpoint"})
WRITER_FEATURES = frozenset({"appendOnly", "invariants", "timestampNtz", "domainMetadata", "deletionVectors"})
DV_PROPERTY = "delta.enableDeletionVectors"
# Legacy (pre-feature) writer versions 3..6 imply features (CHECK constraints, CDF,
# generated and identity columns, column mapping) whose write-side rules we do not
# implement, so writers refuse them; readers may still read them.
_LEGACY_WRITER_MAX = 2
_LEGACY_READER_MAX = 1


def reader_missing(protocol: Protocol) -> list[str]:
    """Missing reader features (empty when this library can read the table)."""
    if protocol.min_reader_version <= _LEGACY_READER_MAX:
        return []
    if protocol.min_reader_version == MAX_READER_VERSION:
        return sorted(set(protocol.reader_features or ()) - READER_FEATURES)
    return [f"readerVersion{protocol.min_reader_version}"]


def writer_missing(protocol: Protocol) -> list[str]:
    """Missing writer features (empty when this library can write the table)."""
    if protocol.min_writer_version <= _LEGACY_WRITER_MAX:
        return []
    if protocol.min_writer_version == MAX_WRITER_VERSION:
        return sorted(set(protocol.writer_features or ()) - WRITER_FEATURES)
    return [f"writerVersion{protocol.min_writer_version}"]


def check_readable(protocol: Protocol) -> None:
    missing = reader_missing(protocol)
    if missing:
        raise UnsupportedProtocolError(
            f"this table needs reader features {missing} that eventlog does not support",
            features=missing,
        )


def check_supported(protocol: Protocol) -> None:
    """Raise unless this library can both read and write tables with ``protocol``."""
    check_readable(protocol)
    missing = writer_missing(protocol)
    if missing:
        raise UnsupportedProtocolError(
            f"this table needs writer features {missing} that eventlog does not support",
            features=missing,
        )


def features_of(protocol: Protocol) -> set[str]:
    """Every feature a protocol enables, legacy versions expanded to their features."""
    if protocol.min_writer_version >= MAX_WRITER_VERSION:
        return set(protocol.writer_features or ()) | set(protocol.reader_features or ())
    legacy = {2: {"appendOnly", "invariants"}}
    out: set[str] = set()
    for version, feats in legacy.items():
        if protocol.min_writer_version >= version:
            out |= feats
    return out


def removed_features(old: Protocol, new: Protocol) -> set[str]:
    return features_of(old) - features_of(new)


def protocol_for(schema: pa.Schema, properties: Mapping[str, str]) -> Protocol:
    """The minimal protocol for a new table with this schema and these properties."""
    return upgrade(Protocol(1, 2), schema, properties)


def upgrade(protocol: Protocol, schema: pa.Schema, properties: Mapping[str, str]) -> Protocol:
    """``protocol`` with the features this schema and these properties need (unchanged
    when it already has them). Features that need one go to (3, 7) with explicit lists."""
    needed: set[str] = set()
    if needs_timestamp_ntz(schema):
        needed.add("timestampNtz")
    if properties.get(DV_PROPERTY) == "true":
        needed.add("deletionVectors")
    have = features_of(protocol)
    if needed <= have:
        return protocol
    features = have | needed | {"appendOnly", "invariants"}
    return Protocol(
        MAX_READER_VERSION,
        MAX_WRITER_VERSION,
        reader_features=tuple(sorted((features & READER_FEATURES) | set(protocol.reader_features or ()))),
        writer_features=tuple(sorted(features)),
    )
