"""Column mapping (``delta.columnMapping.mode``): physical names in files, statistics and
partition values; rename_column/drop_columns change metadata only; enabling mapping on an
existing table; refusals leave the table as it was; every write path keeps physical names."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventlog import ColumnMappingError, MetadataChangedException, Table, UnknownColumnError
from eventlog.errors import InvalidTablePropertyError
from eventlog.expr import parse_predicate
from eventlog.files import column_mapping as cm
from eventlog.log.actions import Protocol

MODE = "delta.columnMapping.mode"


def _data() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "p": ["x", "y", "x", "y"],
            "s": [{"a": 1, "b": "q"}, None, {"a": 3, "b": "r"}, {"a": 4, "b": None}],
            "v": ["one", "two", "three", "four"],
        }
    )


def _mapped(uri: str, mode: str = "name", **props: str) -> Table:
    return Table.create(uri, data=_data(), partition_by=["p"], properties={MODE: mode, **props})


def _rows(t: Table, key: str = "id", **kw: object) -> list[dict[str, object]]:
    return t.to_arrow(**kw).sort_by(key).to_pylist()  # type: ignore[arg-type]


def _parquet_files(uri: str) -> list[str]:
    return sorted(glob.glob(f"{uri}/**/*.parquet", recursive=True))


def _adds(uri: str, version: int) -> list[dict[str, object]]:
    lines = Path(uri, "_delta_log", f"{version:020d}.json").read_text().splitlines()
    return [json.loads(line)["add"] for line in lines if '"add"' in line]


@pytest.mark.parametrize("mode", ["name", "id"])
def test_a_new_mapped_table_stores_physical_names_everywhere(local_uri: str, mode: str) -> None:
    t = _mapped(local_uri, mode)
    snap = t.snapshot()
    ids = [cm.field_id(f) for f in snap.schema]
    assert ids == [1, 2, 3, 6]  # depth first: s.a and s.b are 4 and 5
    assert [cm.field_id(f) for f in snap.schema.field("s").type] == [4, 5]
    assert snap.metadata.configuration["delta.columnMapping.maxColumnId"] == "6"
    physical = {f.name: cm.physical_name(f) for f in snap.schema}
    assert all(p.startswith("col-") and len(p) == 40 for p in physical.values())
    # Delta's protocol for column mapping alone: reader 2, writer 5 (no feature lists).
    assert snap.protocol == Protocol(2, 5)
    # Files: physical names and field ids; random two-character directories, not p=x.
    for path in _parquet_files(local_uri):
        rel = os.path.relpath(path, local_uri)
        assert len(rel.split("/")[0]) == 2 and "=" not in rel
        schema = pq.read_schema(path)
        assert schema.names == [physical["id"], physical["s"], physical["v"]]
        assert schema.field(physical["id"]).metadata[b"PARQUET:field_id"] == b"1"
    for add in _adds(local_uri, 0):
        assert set(add["partitionValues"]) == {physical["p"]}  # type: ignore[arg-type]
        stats = json.loads(add["stats"])  # type: ignore[arg-type]
        assert set(stats["nullCount"]) == {physical["id"], physical["s"], physical["v"]}
    assert _rows(t) == _data().sort_by("id").to_pylist()
    assert t.to_arrow().schema.names == ["id", "p", "s", "v"]
    assert all(f.metadata is None for f in t.to_arrow().schema)  # readers see no mapping metadata


def test_fields_are_numbered_depth_first(local_uri: str) -> None:
    t = _mapped(local_uri)
    ids = {f.name: cm.field_id(f) for f in t.schema}
    ids.update({f"s.{f.name}": cm.field_id(f) for f in t.schema.field("s").type})
    assert ids == {"id": 1, "p": 2, "s": 3, "s.a": 4, "s.b": 5, "v": 6}


def test_rename_and_drop_change_metadata_only(local_uri: str) -> None:
    t = _mapped(local_uri)
    files = _parquet_files(local_uri)
    t.rename_column("id", "ident")
    t.rename_column("s.a", "a2")
    t.rename_column("p", "part")  # a partition column: its values are keyed by physical name
    t.drop_columns(["v", "s.b"])
    assert t.version == 4
    assert _parquet_files(local_uri) == files  # no file written
    assert all(not _adds(local_uri, v) for v in range(1, 5))
    assert t.snapshot().partition_columns == ("part",)
    assert _rows(t, "ident") == [
        {"ident": 1, "part": "x", "s": {"a2": 1}},
        {"ident": 2, "part": "y", "s": None},
        {"ident": 3, "part": "x", "s": {"a2": 3}},
        {"ident": 4, "part": "y", "s": {"a2": 4}},
    ]
    # Partition pruning and statistics skipping resolve the physical names.
    assert _rows(t, "ident", filter="part = 'y' AND ident > 2") == [{"ident": 4, "part": "y", "s": {"a2": 4}}]
    snap = t.snapshot()
    _, kept = snap.select_files(parse_predicate("ident > 3", snap.schema))
    assert kept.num_rows == 1  # the x file (ids 1, 3) is skipped by its max
    history = t.history()
    assert [h["operation"] for h in history[:2]] == ["DROP COLUMNS", "RENAME COLUMN"]


def test_a_dropped_name_added_again_is_a_new_column(local_uri: str) -> None:
    t = _mapped(local_uri)
    old = t.schema.field("v")
    t.drop_columns(["v"])
    t.add_columns([pa.field("v", pa.string())])
    new = t.schema.field("v")
    assert cm.field_id(new) == 7 and cm.field_id(old) == 6
    assert cm.physical_name(new) != cm.physical_name(old)
    assert t.snapshot().metadata.configuration["delta.columnMapping.maxColumnId"] == "7"
    assert [r["v"] for r in _rows(t)] == [None] * 4  # the old data stays unread
    t.append(pa.table({"id": [9], "p": ["z"], "v": ["new"]}))
    assert _rows(t)[-1] == {"id": 9, "p": "z", "s": None, "v": "new"}


def test_refused_changes_name_the_property_and_leave_the_table_as_it_was(local_uri: str) -> None:
    plain = Table.create(local_uri, data=_data())
    with pytest.raises(ColumnMappingError) as info:
        plain.rename_column("v", "w")
    assert (info.value.operation, info.value.reason, info.value.mode) == (
        "RENAME COLUMN",
        "mapping required",
        "none",
    )
    assert info.value.property == MODE
    with pytest.raises(ColumnMappingError) as info:
        plain.drop_columns(["v"])
    assert info.value.operation == "DROP COLUMNS"
    assert plain.version == 0 and plain.schema.names == ["id", "p", "s", "v"]


def test_refusals_on_a_mapped_table(tmp_path: Path) -> None:
    t = _mapped(str(tmp_path / "t"))
    before = (t.version, t.snapshot().metadata)
    with pytest.raises(ColumnMappingError) as info:
        t.drop_columns(["p"])
    assert info.value.reason == "partition column"
    with pytest.raises(UnknownColumnError):
        t.rename_column("nope", "x")
    with pytest.raises(UnknownColumnError):
        t.drop_columns(["s.nope"])
    with pytest.raises(ColumnMappingError) as info:
        t.set_properties({MODE: "id"})
    assert (info.value.reason, info.value.mode) == ("mode change", "name")
    with pytest.raises(ColumnMappingError):
        t.set_properties({MODE: "none"})
    with pytest.raises(InvalidTablePropertyError):
        t.set_properties({MODE: "names"})
    with pytest.raises(Exception) as clash:  # a sibling of the same name (case-insensitive)
        t.rename_column("id", "V")
    assert "duplicate" in str(clash.value)
    assert (t.version, t.snapshot().metadata) == before


def test_enabling_mapping_keeps_old_files_readable(local_uri: str) -> None:
    t = Table.create(local_uri, data=_data(), partition_by=["p"])
    t.set_properties({MODE: "name"})
    snap = t.snapshot()
    assert [cm.physical_name(f) for f in snap.schema] == ["id", "p", "s", "v"]  # the names in the files
    assert [cm.field_id(f) for f in snap.schema] == [1, 2, 3, 6]
    assert snap.metadata.configuration["delta.columnMapping.maxColumnId"] == "6"
    assert snap.protocol == Protocol(2, 5)  # upgraded from (1, 2), as Delta does
    t.rename_column("v", "w")
    t.append(pa.table({"id": [5], "p": ["x"], "w": ["five"]}))
    assert [r["w"] for r in _rows(t)] == ["one", "two", "three", "four", "five"]
    # Old files keep Hive directories; new ones go to random prefixes.
    assert {os.path.relpath(p, local_uri).split("/")[0] for p in _parquet_files(local_uri)} >= {"p=x", "p=y"}
    with pytest.raises(ColumnMappingError):  # none -> id is refused, as in Delta
        Table.create(str(Path(local_uri).parent / "u"), data=_data()).set_properties({MODE: "id"})


def test_dml_merge_optimize_and_schema_evolution_keep_physical_names(local_uri: str) -> None:
    t = _mapped(local_uri, "id", **{"delta.enableDeletionVectors": "true"})
    protocol = t.snapshot().protocol  # with deletion vectors: table features, columnMapping listed
    assert "columnMapping" in (protocol.reader_features or ()) and "columnMapping" in (
        protocol.writer_features or ()
    )
    t.rename_column("v", "w")
    t.append(pa.table({"id": [5], "p": ["x"], "w": ["five"]}))
    t.delete("id = 2")
    t.update("id = 3", {"w": "'THREE'"})
    src = pa.table({"id": [4, 6], "w": ["FOUR", "six"], "p": ["y", "y"]})
    (
        t.merge(src, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update(set={"w": "s.w"})
        .when_not_matched_insert_all()
        .execute()
    )
    t.append(pa.table({"id": [7], "p": ["z"], "extra": [1.5]}), schema_mode="merge")
    t.optimize()
    assert [(r["id"], r["w"], r["extra"]) for r in _rows(t)] == [
        (1, "one", None), (3, "THREE", None), (4, "FOUR", None), (5, "five", None),
        (6, "six", None), (7, None, 1.5),
    ]  # fmt: skip
    extra = t.schema.field("extra")
    assert cm.field_id(extra) == 7 and cm.physical_name(extra).startswith("col-")
    physical = {cm.physical_name(f) for f in t.schema if f.name != "p"}
    for add in t.snapshot().add_files:
        names = set(pq.read_schema(f"{local_uri}/{add.path}").names)
        assert names <= physical  # the renamed column keeps its physical name
        assert set(add.partition_values) == {cm.physical_name(t.schema.field("p"))}


def test_rename_fails_a_concurrent_write(local_uri: str) -> None:
    t = _mapped(local_uri)
    writer = Table.open(local_uri).transaction()
    writer.append(pa.table({"id": [5], "p": ["x"], "s": [None], "v": ["five"]}))
    t.rename_column("v", "w")
    with pytest.raises(MetadataChangedException) as info:
        writer.commit()
    assert info.value.winning_version == 1
    assert Table.open(local_uri).version == 1
    assert len(Table.open(local_uri).to_arrow()) == 4


def test_columns_a_constraint_reads_cannot_be_renamed_or_dropped(local_uri: str) -> None:
    t = _mapped(local_uri)
    t.add_constraint("positive", "id > 0")
    t.add_constraint("short", "s.b IS NULL OR LENGTH(s.b) < 10")
    before = (t.version, t.snapshot().metadata)
    for change in (lambda: t.rename_column("id", "ident"), lambda: t.drop_columns(["s.b"])):
        with pytest.raises(ColumnMappingError) as info:
            change()
        assert info.value.reason == "dependent expression"
    with pytest.raises(ColumnMappingError):
        t.drop_columns(["s"])  # the struct holds the field the constraint reads
    assert (t.version, t.snapshot().metadata) == before
    t.rename_column("v", "w")  # a column no constraint reads
    assert t.schema.names == ["id", "p", "s", "w"]


def test_columns_taken_from_another_mapped_table_get_ids_of_their_own(tmp_path: Path) -> None:
    other = _mapped(str(tmp_path / "other"))
    t = _mapped(str(tmp_path / "t"))
    t.drop_columns(["v"])
    t.add_columns([other.schema.field("v").with_name("v2")])  # carries the other table's id 6
    added = t.schema.field("v2")
    assert cm.field_id(added) == 7
    assert cm.physical_name(added) not in {cm.physical_name(f) for f in other.schema}
    assert [r["v2"] for r in _rows(t)] == [None] * 4


def _rename_in_files(uri: str) -> None:
    """Rewrite every data file with other column names, keeping the Parquet field ids (as
    files written under an id-mode table's earlier names, or by Iceberg, hold them)."""
    for path in _parquet_files(uri):
        data = pq.read_table(path)
        fields = [f.with_name(f"legacy_{i}") for i, f in enumerate(data.schema)]
        pq.write_table(pa.Table.from_arrays(data.columns, schema=pa.schema(fields)), path)


def test_id_mode_resolves_columns_by_parquet_field_id(tmp_path: Path) -> None:
    by_id = _mapped(str(tmp_path / "id"), "id")
    by_name = _mapped(str(tmp_path / "name"), "name")
    for t in (by_id, by_name):
        _rename_in_files(t.uri)
    expected = _data().sort_by("id").to_pylist()
    assert _rows(by_id) == expected  # every column found by its field id
    assert [r["id"] for r in _rows(by_id, filter="v = 'three'")] == [3]
    # name mode resolves by physical name only: the renamed columns are absent (null)
    assert {r["v"] for r in by_name.to_arrow().to_pylist()} == {None}
    by_id.update("id = 3", {"v": "'THREE'"})  # DML reads the old file by field ids too
    by_id.delete("id = 1")
    assert [(r["id"], r["v"]) for r in _rows(by_id)] == [(2, "two"), (3, "THREE"), (4, "four")]
