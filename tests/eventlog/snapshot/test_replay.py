"""Replay and diff: the fold of the events equals the table at every version, and the
differences between two versions are right for every kind of operation."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import ReplayMismatchError, Snapshot, Table
from eventlog.snapshot.loader import write_snapshot_checkpoint
from tests.conftest import SCHEMA, rows

DV = {"delta.enableDeletionVectors": "true"}


def _history_table(uri: str, **props: str) -> Table:
    t = Table.create(uri, SCHEMA, properties={"delta.checkpointInterval": "3", **props})
    t.append(rows([1, 2, 3]))  # 1
    t.append(rows([4, 5, 6], "2024-01-02"))  # 2
    t.delete("id = 2")  # 3 (checkpoint)
    t.update("id = 5", {"x": "x + 100"})  # 4
    t.merge(
        rows([6, 7]), "target.id = source.id"
    ).when_matched_update_all().when_not_matched_insert_all().execute()
    t.optimize()  # 6 (checkpoint)
    t.set_properties({"owner": "audit"})  # 7
    t.add_columns([pa.field("note", pa.string())])  # 8
    t.append(rows([8]).append_column("note", pa.array(["n"])), user_metadata="batch 8")  # 9
    return t


@pytest.mark.parametrize("props", [{}, DV], ids=["rewrite", "deletion-vectors"])
def test_replay_yields_every_version_and_equals_the_table(tmp_path: Path, props: dict[str, str]) -> None:
    t = _history_table(str(tmp_path / "t"), **props)
    r = t.replay()
    changes = list(r)
    assert (r.start_version, r.from_checkpoint) == (0, None)
    assert [c.version for c in changes] == list(range(10))
    history = {h["version"]: h for h in t.history()}
    assert [c.operation for c in changes] == [history[v]["operation"] for v in range(10)]
    assert r.final is not None and r.final.files == t.snapshot().files
    assert r.final.metadata == t.snapshot().metadata
    assert changes[0].metadata_changed and changes[7].metadata_changed and changes[8].metadata_changed
    assert not changes[1].metadata_changed
    assert changes[1].rows_added == 3 and changes[1].rows_removed == 0
    assert not changes[6].data_change and changes[6].operation == "OPTIMIZE"
    assert changes[9].user_metadata == "batch 8" and changes[9].read_version == 8
    assert changes[9].txn_ids and changes[9].isolation_level in ("WriteSerializable", "Serializable")


def test_rows_removed_by_a_deletion_vector_are_counted_exactly(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties=DV)
    t.append(rows([1, 2, 3, 4]))
    t.delete("id IN (2, 3)")
    change = list(t.replay())[-1]
    assert (change.rows_added, change.rows_removed, change.rows_deleted_by_dv) == (0, 2, 2)
    assert change.files_added == change.files_removed  # the same file, with a new vector


def test_rewriting_delete_counts_both_sides_from_statistics(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA)
    t.append(rows([1, 2, 3]))
    t.delete("id = 2")
    change = list(t.replay())[-1]
    assert (change.rows_added, change.rows_removed, change.rows_deleted_by_dv) == (2, 3, 0)


def test_replay_to_a_version_and_from_the_oldest_checkpoint(tmp_path: Path) -> None:
    t = _history_table(str(tmp_path / "t"))
    assert [c.version for c in t.replay(to_version=4)] == [0, 1, 2, 3, 4]
    for v in range(3):
        os.remove(tmp_path / "t" / "_delta_log" / f"{v:020d}.json")
    r = t.replay()
    assert (r.from_checkpoint, r.start_version) == (3, 4)
    assert [c.version for c in r] == list(range(4, 10))


def test_a_checkpoint_that_disagrees_with_the_events_is_named(tmp_path: Path) -> None:
    t = _history_table(str(tmp_path / "t"))
    good = t.snapshot(6)
    bad = Snapshot.from_state(t.uri, 6, good.protocol, good.metadata, list(good.add_files)[1:])
    write_snapshot_checkpoint(t.log, bad, tombstone_horizon_ms=0)
    with pytest.raises(ReplayMismatchError) as info:
        list(Table.open(t.uri).replay())
    assert info.value.version == 6 and info.value.differences[0].startswith("live files")


def _ids(table: pa.Table | None) -> list[int]:
    assert table is not None
    return sorted(table.column("id").to_pylist())


@pytest.mark.parametrize("props", [{}, DV], ids=["rewrite", "deletion-vectors"])
def test_diff_of_appends_deletes_merge_and_optimize(tmp_path: Path, props: dict[str, str]) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties=props)
    t.append(rows([1, 2, 3]))  # 1
    t.append(rows([4, 5]))  # 2
    d = t.diff(1, 2, rows=True)
    assert len(d.files_added) == 1 and d.files_removed == () and d.rows_added == 2
    assert _ids(d.added) == [4, 5] and _ids(d.removed) == []
    t.delete("id = 2")  # 3
    d = t.diff(2, 3, rows=True)
    assert (d.rows_added, d.rows_removed) == (0, 1) and _ids(d.removed) == [2]
    if props:
        assert list(d.dv_changed.values()) == [(0, 1)] and d.files_added == d.files_removed == ()
    t.merge(rows([3, 9], x=70), "target.id = source.id").when_matched_update(
        set={"x": "source.x"}
    ).when_not_matched_insert_all().execute()  # 4
    d = t.diff(3, 4, rows=True)
    assert _ids(d.added) == [3, 9] and _ids(d.removed) == [3]
    assert d.added is not None and sorted(d.added.column("x").to_pylist()) == [70, 70]
    t.optimize()  # 5
    d = t.diff(4, 5, rows=True)
    assert d.files_removed and d.files_added  # files were rewritten...
    assert (d.rows_added, d.rows_removed) == (0, 0)  # ...but no row changed
    cheap = t.diff(4, 5)
    assert cheap.rows_added == cheap.rows_removed and cheap.rows_added is not None and cheap.rows_added > 0
    whole = t.diff(0, 5, rows=True)
    assert _ids(whole.added) == [1, 3, 4, 5, 9] and _ids(whole.removed) == []
