"""The table-feature registry: one lookup per feature and operation; features we cannot
honour stop reads or writes by name, before anything is written."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from eventlog import Table
from eventlog.errors import UnsupportedProtocolError
from eventlog.log.actions import CommitInfo, Metadata, Protocol, encode_commit
from eventlog.snapshot.features import (
    FEATURES,
    Operation,
    Support,
    TableFeature,
    supported_features,
    unsupported,
)
from tests.conftest import SCHEMA, rows, sorted_ids


def _meta(
    configuration: dict[str, str] | None = None, field_metadata: dict[str, str] | None = None
) -> Metadata:
    field = {"name": "id", "type": "long", "nullable": True, "metadata": field_metadata or {}}
    schema = json.dumps({"type": "struct", "fields": [field]})
    return Metadata("t", schema, configuration=configuration or {})


def _features(*names: str) -> Protocol:
    readers = tuple(n for n in names if (n in FEATURES and FEATURES[n].reader_writer) or n.startswith("r:"))
    return Protocol(
        3,
        7,
        tuple(sorted(r.removeprefix("r:") for r in readers)),
        tuple(sorted(n.removeprefix("r:") for n in names)),
    )


def test_the_registry_is_consistent() -> None:
    for name, feature in FEATURES.items():
        assert feature.name == name
        assert all(required in FEATURES for required in feature.requires), name
        if not feature.reader_writer:
            assert feature.support(Operation.READ) is Support.FULL  # writer features ask nothing of readers
        if feature.read is Support.NONE:
            assert feature.write is Support.NONE, f"{name}: written but not read"


def test_legacy_versions_imply_their_features() -> None:
    assert supported_features(Protocol(1, 2)) == ["appendOnly", "invariants"]
    assert supported_features(Protocol(1, 4)) == [
        "appendOnly", "changeDataFeed", "checkConstraints", "generatedColumns", "invariants",
    ]  # fmt: skip
    assert "columnMapping" in supported_features(Protocol(2, 5))
    assert "identityColumns" in supported_features(Protocol(1, 6))
    # Explicit lists replace the legacy meaning of the version they stand for.
    assert supported_features(Protocol(1, 7, None, ("appendOnly",))) == ["appendOnly"]


def test_features_only_block_while_the_table_uses_them() -> None:
    # A writer feature supported only while inactive blocks writes once the table uses it.
    demo = TableFeature(
        "demo", False, Support.FULL, Support.INACTIVE_ONLY,
        active=lambda m: m is None or m.configuration.get("demo.on") == "true",
    )  # fmt: skip
    assert not demo.blocks(Operation.WRITE, _meta())
    assert demo.blocks(Operation.WRITE, _meta({"demo.on": "true"}))
    assert not demo.blocks(Operation.READ, _meta({"demo.on": "true"}))
    # The change data feed is written (eventlog.files.change_data): on or off, it never blocks.
    cdf = Protocol(1, 7, None, ("changeDataFeed",))
    assert unsupported(cdf, _meta({"delta.enableChangeDataFeed": "true"}), Operation.WRITE) == []
    # CHECK constraints, generated columns and invariants are enforced: they never block.
    checks = Protocol(1, 3)
    assert unsupported(checks, _meta({"delta.constraints.positive": "id > 0"}), Operation.WRITE) == []
    generated = Protocol(1, 4)
    assert (
        unsupported(
            generated, _meta(field_metadata={"delta.generationExpression": "id + 1"}), Operation.WRITE
        )
        == []
    )
    invariants = _meta(field_metadata={"delta.invariants": '{"expression": {"expression": "id > 0"}}'})
    assert unsupported(Protocol(1, 2), invariants, Operation.WRITE) == []
    identity = Protocol(1, 6)  # identity values are generated (eventlog.txn.identity)
    assert unsupported(identity, _meta(), Operation.WRITE) == []
    for op in Operation:
        assert unsupported(identity, _meta(field_metadata={"delta.identity.start": "1"}), op) == []
    mapping = Protocol(2, 5)
    assert unsupported(mapping, _meta({"delta.columnMapping.mode": "none"}), Operation.READ) == []
    for op in Operation:  # column mapping is implemented (eventlog.files.column_mapping)
        assert unsupported(mapping, _meta({"delta.columnMapping.mode": "name"}), op) == []
        assert unsupported(mapping, _meta({"delta.columnMapping.mode": "id"}), op) == []
        assert "columnMapping" not in unsupported(mapping, None, op)


def test_unknown_features_and_versions_are_named() -> None:
    writer_only = Protocol(1, 7, None, ("appendOnly", "someFutureWriterFeature"))
    assert unsupported(writer_only, _meta(), Operation.READ) == []
    assert unsupported(writer_only, _meta(), Operation.WRITE) == ["someFutureWriterFeature"]
    reader = Protocol(3, 7, ("someFutureReaderFeature",), ("someFutureReaderFeature",))
    assert unsupported(reader, _meta(), Operation.READ) == ["someFutureReaderFeature"]
    assert unsupported(Protocol(4, 8), _meta(), Operation.WRITE) == ["readerVersion4", "writerVersion8"]
    assert (
        unsupported(Protocol(3, 7, ("rowTracking",), ("rowTracking", "domainMetadata")), None, Operation.READ)
        == []
    )


def _relabel(t: Table, protocol: Protocol, configuration: dict[str, str] | None = None) -> None:
    """What another Delta writer does: a commit that changes the protocol (and properties)."""
    snap = t.refresh()
    info = CommitInfo(timestamp=int(time.time() * 1000), operation="SET TBLPROPERTIES", txn_id="other-engine")
    metadata = dataclasses.replace(
        snap.metadata, configuration={**snap.metadata.configuration, **(configuration or {})}
    )
    assert t.log.write_commit_unguarded(snap.version + 1, encode_commit([info, protocol, metadata]))


def _data_files(uri: str) -> list[str]:
    return sorted(
        str(p.relative_to(uri)) for p in Path(uri).rglob("*.parquet") if "_delta_log" not in p.parts
    )


@pytest.mark.parametrize(
    ("protocol", "configuration", "named"),
    [
        (
            Protocol(1, 7, None, ("allowColumnDefaults", "appendOnly", "invariants")),
            {},
            ["allowColumnDefaults"],
        ),
        # vacuumProtocolCheck: VACUUM checks the writer protocol, so it refuses too.
        (
            Protocol(3, 7, ("vacuumProtocolCheck",), ("appendOnly", "futureFeature", "vacuumProtocolCheck")),
            {},
            ["futureFeature"],
        ),
        (Protocol(1, 7, None, ("appendOnly", "futureFeature")), {}, ["futureFeature"]),
    ],
)
def test_a_write_to_a_table_with_a_feature_we_cannot_honour_is_refused_and_writes_nothing(
    local_uri: str, protocol: Protocol, configuration: dict[str, str], named: list[str]
) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    _relabel(t, protocol, configuration)
    reader = Table.open(local_uri)
    assert sorted_ids(reader) == [1]  # reads are fine: these ask nothing of readers we lack
    before = (_data_files(local_uri), sorted(os.listdir(Path(local_uri) / "_delta_log")))
    for write in (
        lambda: reader.append(rows([2])),
        lambda: reader.delete("id = 1"),
        lambda: reader.set_properties({"delta.appendOnly": "false"}),
        lambda: reader.checkpoint(),
        lambda: reader.vacuum(),
    ):
        with pytest.raises(UnsupportedProtocolError) as info:
            write()
        assert info.value.features == named
    assert (_data_files(local_uri), sorted(os.listdir(Path(local_uri) / "_delta_log"))) == before


def test_a_read_of_a_table_with_a_reader_feature_we_lack_is_refused_by_name(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    _relabel(t, Protocol(3, 7, ("variantType",), ("variantType",)))
    with pytest.raises(UnsupportedProtocolError) as info:
        Table.open(local_uri)
    assert info.value.features == ["variantType"]


def test_a_catalog_managed_table_is_refused_by_name_until_we_speak_the_catalog_protocol(
    local_uri: str,
) -> None:
    """catalogManaged (coordinated commits): a catalog may have ratified commits that are not
    in the log yet, so reading the log alone could miss them. Opening, reading and writing
    are refused, naming the feature, and nothing is written."""
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    _relabel(
        t,
        Protocol(3, 7, ("catalogManaged", "vacuumProtocolCheck"), ("catalogManaged", "vacuumProtocolCheck")),
    )
    before = sorted(os.listdir(Path(local_uri) / "_delta_log"))
    with pytest.raises(UnsupportedProtocolError) as info:
        Table.open(local_uri)
    assert info.value.features == ["catalogManaged"]
    assert "catalogManaged" in str(info.value)
    with pytest.raises(UnsupportedProtocolError) as info:
        t.append(rows([2]))
    assert info.value.features == ["catalogManaged"]
    assert sorted(os.listdir(Path(local_uri) / "_delta_log")) == before
