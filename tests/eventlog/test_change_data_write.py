"""Change data feed on write (``delta.enableChangeDataFeed``): which commits carry ``cdc``
actions and ``_change_data`` files, and what they hold, read back by ``deltalake``'s
``load_cdf`` (an independent reader of Delta's change data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from eventlog import ConstraintViolationError, InvalidTablePropertyError, Table
from eventlog.files.change_data import CHANGE_TYPE_COLUMN
from tests.support.change_data import delete_update_merge

CDF = {"delta.enableChangeDataFeed": "true"}
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("p", pa.string()), pa.field("v", pa.int64())])


def _rows(ids: list[int], p: str = "a", v: int | None = None) -> pa.Table:
    return pa.table(
        {"id": ids, "p": [p] * len(ids), "v": [v if v is not None else i * 10 for i in ids]}, schema=SCHEMA
    )


def _cdc_actions(uri: str, version: int) -> list[dict[str, Any]]:
    lines = (Path(uri) / "_delta_log" / f"{version:020d}.json").read_bytes().splitlines()
    return [a["cdc"] for a in map(orjson.loads, lines) if "cdc" in a]


def _changes(uri: str, start: int = 0) -> list[tuple[int, str, int, int]]:
    """(version, change type, id, v) per change row, as delta-rs reads them."""
    table = pa.table(DeltaTable(uri).load_cdf(starting_version=start).read_all())
    return sorted((r["_commit_version"], r["_change_type"], r["id"], r["v"]) for r in table.to_pylist())


def _table(uri: str, *, dv: bool, partitioned: bool = True, **props: str) -> Table:
    properties = {**CDF, "delta.enableDeletionVectors": str(dv).lower(), **props}
    t = Table.create(uri, SCHEMA, partition_by=["p"] if partitioned else None, properties=properties)
    t.append(pa.concat_tables([_rows([1, 2], "a"), _rows([3, 4], "b")]))
    return t


@pytest.mark.parametrize("dv", [False, True])
@pytest.mark.parametrize("partitioned", [True, False])
def test_delete_update_merge_write_change_data_that_delta_rs_reads(
    local_uri: str, dv: bool, partitioned: bool
) -> None:
    t = _table(local_uri, dv=dv, partitioned=partitioned)
    delete_update_merge(t)  # v2, v3, v4
    # a DELETE on a DV table is read from the DVs (Delta's writer does the same)
    assert [bool(_cdc_actions(local_uri, v)) for v in range(5)] == [False, False, not dv, True, True]
    for cdc in _cdc_actions(local_uri, 4):
        assert cdc["dataChange"] is False and cdc["path"].startswith("_change_data/")
        assert Path(local_uri, cdc["path"]).stat().st_size == cdc["size"]
    assert _changes(local_uri) == [
        (1, "insert", 1, 10), (1, "insert", 2, 20), (1, "insert", 3, 30), (1, "insert", 4, 40),
        (2, "delete", 1, 10),
        (3, "update_postimage", 3, 31), (3, "update_preimage", 3, 30),
        (4, "delete", 4, 40), (4, "insert", 5, 500),
        (4, "update_postimage", 2, 200), (4, "update_preimage", 2, 20),
    ]  # fmt: skip
    assert sorted(t.to_arrow().column("id").to_pylist()) == [2, 3, 5]
    assert t.verify().ok


def test_inserts_and_whole_file_deletes_are_left_to_the_adds_and_removes(local_uri: str) -> None:
    """As in Delta: no change file where readers infer the changes from the file actions."""
    t = _table(local_uri, dv=False)
    t.delete("p = 'b'")  # v2: whole files removed
    t.overwrite(_rows([7], "c"))  # v3: every file replaced
    assert [_cdc_actions(local_uri, v) for v in range(4)] == [[], [], [], []]
    assert not Path(local_uri, "_change_data").exists()
    assert _changes(local_uri, 2) == [
        (2, "delete", 3, 30), (2, "delete", 4, 40),
        (3, "delete", 1, 10), (3, "delete", 2, 20), (3, "insert", 7, 70),
    ]  # fmt: skip


def test_a_commit_with_any_row_level_change_records_all_its_changes(local_uri: str) -> None:
    """An overwrite that rewrites part of a file also records its inserts, and a partition
    delete of a file with a deletion vector records the file's live rows: readers use only
    the change files of such commits."""
    t = _table(local_uri, dv=False, partitioned=False)
    t.overwrite(_rows([1], "a", v=99), replace_where="id = 1")  # rewrites the file of 1..4
    assert _cdc_actions(local_uri, 2)
    assert _changes(local_uri, 2) == [(2, "delete", 1, 10), (2, "insert", 1, 99)]

    dv_uri = f"{local_uri}-dv"
    d = _table(dv_uri, dv=True)
    d.delete("id = 3")  # v2: a DV on the file of partition b
    d.delete("p = 'b'")  # v3: that file removed whole
    assert _cdc_actions(dv_uri, 3)
    assert _changes(dv_uri, 3) == [(3, "delete", 4, 40)]


def test_change_files_hold_physical_names_and_generated_values(local_uri: str) -> None:
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("p", pa.string()),
            pa.field("v", pa.int64()),
            pa.field("w", pa.int64(), metadata={"delta.generationExpression": "v * 2"}),
        ]
    )
    props = {**CDF, "delta.columnMapping.mode": "name"}
    t = Table.create(local_uri, schema, partition_by=["p"], properties=props)
    t.append(pa.table({"id": [1, 2], "p": ["a", "a"], "v": [1, 2]}))
    t.rename_column("id", "key")
    t.update("key = 2", {"v": "v + 5"})
    (cdc,) = _cdc_actions(local_uri, 3)
    physical = {f.name: orjson.loads(f.metadata[b"delta.columnMapping.physicalName"]) for f in t.schema}
    assert cdc["partitionValues"] == {physical["p"]: "a"}
    stored = pq.read_table(Path(local_uri, cdc["path"]))
    assert set(stored.column_names) == {physical["key"], physical["v"], physical["w"], CHANGE_TYPE_COLUMN}
    images = {r[CHANGE_TYPE_COLUMN]: (r[physical["v"]], r[physical["w"]]) for r in stored.to_pylist()}
    assert images == {"update_preimage": (2, 4), "update_postimage": (7, 14)}


def test_failed_writes_leave_no_change_files(local_uri: str) -> None:
    t = _table(local_uri, dv=False)
    t.add_constraint("small", "v < 100")
    before = t.version
    with pytest.raises(ConstraintViolationError):
        t.update("id = 1", {"v": "v + 1000"})
    assert t.refresh().version == before
    assert not list(Path(local_uri).glob("_change_data/**/*.parquet"))


def test_the_property_is_validated_and_off_writes_nothing(local_uri: str) -> None:
    with pytest.raises(InvalidTablePropertyError) as err:
        Table.create(local_uri, SCHEMA, properties={"delta.enableChangeDataFeed": "yes"})
    assert err.value.key == "delta.enableChangeDataFeed"
    t = Table.create(local_uri, SCHEMA)
    t.append(_rows([1, 2]))
    t.update("id = 1", {"v": "0"})
    assert _cdc_actions(local_uri, 2) == []
    t.set_properties(CDF)  # turned on later: the protocol gains the feature
    assert "changeDataFeed" in (t.snapshot().protocol.writer_features or ["changeDataFeed"]) or (
        t.snapshot().protocol.min_writer_version >= 4
    )
    t.update("id = 1", {"v": "1"})
    assert _changes(local_uri, t.version) == [
        (t.version, "update_postimage", 1, 1), (t.version, "update_preimage", 1, 0),
    ]  # fmt: skip


def test_a_rebased_commit_keeps_its_change_files(local_uri: str) -> None:
    """Row-level concurrency: two DELETEs of different rows of one DV file both commit, and
    each keeps its own change data."""
    t = _table(local_uri, dv=True, partitioned=False)
    other = Table.open(local_uri)
    txn = t.transaction()
    txn.delete("id = 1")
    other.delete("id = 2")  # wins first
    result = txn.commit()
    assert result.version == 3 and result.attempts == 2
    assert _changes(local_uri, 2) == [(2, "delete", 2, 20), (3, "delete", 1, 10)]
    assert sorted(t.to_arrow().column("id").to_pylist()) == [3, 4]


def test_overwrite_of_files_written_elsewhere_records_their_rows_when_needed(local_uri: str) -> None:
    """Spark's writer hands over finished files: a replaceWhere that rewrites part of a file
    records those files' rows as inserts, beside the deleted rows."""
    t = _table(local_uri, dv=False, partitioned=False)
    from eventlog.files.datafiles import write_data_files

    fs, root = t.log.fs, t.log.root
    adds = write_data_files(fs, root, _rows([2], "a", v=77), partition_columns=[])
    txn = t.transaction()
    txn.overwrite_files(adds, replace_where="id = 2")
    txn.commit()
    assert _changes(local_uri, 2) == [(2, "delete", 2, 20), (2, "insert", 2, 77)]


def test_vacuum_sweeps_change_files_older_than_the_retention(local_uri: str) -> None:
    """As Delta's VACUUM: ``_change_data`` is not hidden, and change files are never live."""
    t = _table(local_uri, dv=False, partitioned=False)
    t.delete("id = 1")
    (cdc,) = _cdc_actions(local_uri, 2)
    assert t.vacuum(dry_run=True) == []  # younger than a week
    deleted = t.vacuum(0, enforce_retention=False)
    assert any(p.endswith("/" + cdc["path"]) for p in deleted)
    assert not Path(local_uri, cdc["path"]).exists()
    assert sorted(t.to_arrow().column("id").to_pylist()) == [2, 3, 4]
