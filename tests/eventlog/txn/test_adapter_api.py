"""The engine API adapters (Spark tasks) use: commit files written elsewhere."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import ConcurrentAppendException, MetadataChangedException, Table
from eventlog.files.datafiles import write_data_files
from tests.conftest import SCHEMA, rows, sorted_ids


def _written(t: Table, data: pa.Table) -> list:  # type: ignore[type-arg]
    return write_data_files(t.log.fs, t.log.root, data, partition_columns=t.partition_columns)


def test_append_and_overwrite_files_written_elsewhere(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, partition_by=["date"])
    txn = t.transaction()
    txn.append_files(_written(t, rows([1, 2], "2024-01-01")))
    assert txn.commit().version == 1
    info = t.history(1)[0]
    assert info["isBlindAppend"] is True and info["operationMetrics"]["numOutputRows"] == "2"
    txn = t.transaction()
    txn.overwrite_files(_written(t, rows([9], "2024-01-01")), replace_where="date = '2024-01-01'")
    txn.commit()
    assert sorted_ids(t) == [9]
    assert t.history(1)[0]["operationParameters"]["predicate"] == "[\"date = '2024-01-01'\"]"


def test_merge_schema_of_written_files_is_a_metadata_change(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    wider = rows([1]).append_column("note", pa.array(["n"]))
    concurrent = Table.open(local_uri).transaction()
    concurrent.append(rows([5]))
    txn = t.transaction()
    txn.append_files(write_data_files(t.log.fs, t.log.root, wider, partition_columns=()), schema=wider.schema)
    txn.commit()
    assert t.schema.names == [*SCHEMA.names, "note"]
    with pytest.raises(MetadataChangedException):
        concurrent.commit()


def test_files_of_a_conflicting_overwrite_are_deleted(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA, partition_by=["date"])
    t.append(rows([1], "2024-01-01"))
    loser = Table.open(local_uri).transaction()
    adds = _written(t, rows([7], "2024-01-01"))
    loser.overwrite_files(adds, replace_where="date = '2024-01-01'")
    t.overwrite(rows([8], "2024-01-01"), replace_where="date = '2024-01-01'")
    with pytest.raises(ConcurrentAppendException):
        loser.commit()
    assert not any(Path(local_uri, a.path).exists() for a in adds)
    assert sorted_ids(t) == [8]
