"""Our streaming source over an identity-column table: every insert moves the high-water
mark in the schema's field metadata, which is not a schema change (Delta's source reads on
too); a real schema change still stops the stream."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import Table, identity_field
from streaming import ChangeSource, SourceMetadataChangedError, SourceOptions


def _drain(src: ChangeSource) -> list[str]:
    position, limit, out = src.initial_offset(), src.options.default_admission(), []
    for _ in range(100):
        end = src.latest_offset(position, limit)
        if end == position:
            return out
        out += src.read(src.files_between(position, end)).column("v").to_pylist()
        position = end
    raise AssertionError("the stream never caught up")


def test_inserts_moving_the_mark_do_not_stop_the_stream(tmp_path: Path) -> None:
    schema = pa.schema([identity_field("id"), ("v", pa.string())])
    table = Table.create(str(tmp_path), schema, data=pa.table({"v": ["a"]}))
    src = ChangeSource(Table.open(table.uri), SourceOptions.parse({}), read_version=0)
    table.append(pa.table({"v": ["b"]}))
    table.append(pa.table({"v": ["c", "d"]}))
    assert _drain(src) == ["a", "b", "c", "d"]
    table.add_columns([pa.field("w", pa.int64())])
    table.append(pa.table({"v": ["e"], "w": [1]}))
    with pytest.raises(SourceMetadataChangedError) as info:
        _drain(ChangeSource(Table.open(table.uri), SourceOptions.parse({}), read_version=0))
    assert info.value.changed == ["schema"]
