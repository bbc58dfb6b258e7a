"""Tables on S3: the table API end to end against a real S3 API (moto's server on loopback),
and ``deltalake`` reading what we wrote there.

Slots come from an explicit in-memory store (one process); writers on many machines use
ZooKeeper slots (the multi-process tests).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table, write_table
from eventlog.cli import main
from eventlog.errors import InvalidInputError, SlotStoreRequiredError
from lockstore import InMemorySlotStore, LocalFileSlotStore, ObjectStoreSlotStore
from lockstore.registry import shared_slot_stores

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("s3fs")

SCHEMA = pa.schema([("id", pa.int64()), ("date", pa.string()), ("x", pa.int64())])


def _rows(ids: list[int], date: str) -> pa.Table:
    return pa.table({"id": ids, "date": [date] * len(ids), "x": [i * 10 for i in ids]}, schema=SCHEMA)


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.select(["id", "date", "x"]).to_pylist(), key=lambda r: r["id"])


def _theirs(uri: str, options: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
    """deltalake's version and rows of the table. Its Rust engine applies deletion vectors
    (``to_pyarrow_table`` refuses every table that has the feature)."""
    dt = deltalake.DeltaTable(uri, storage_options=options)
    batches = deltalake.QueryBuilder().register("t", dt).execute("SELECT id, date, x FROM t").read_all()
    return dt.version(), _sorted(pa.table(batches))


@pytest.mark.parametrize("dv", [False, True], ids=["rewrite", "deletion-vectors"])
def test_the_table_api_end_to_end_on_s3(
    s3_uri: str, s3_storage_options: dict[str, Any], deltalake_s3_options: dict[str, str], dv: bool
) -> None:
    slots = InMemorySlotStore()
    props = {"delta.checkpointInterval": "3"}
    if dv:
        props["delta.enableDeletionVectors"] = "true"
    t = Table.create(
        s3_uri, SCHEMA, partition_by=None if dv else ["date"], properties=props, slots=slots,
        storage_options=s3_storage_options,
    )  # fmt: skip
    t.append(_rows([1, 2, 3], "2024-01-01"))
    t.append(_rows([4, 5], "2024-01-02"))
    before_overwrite = int(time.time() * 1000)
    # Versions are dated by the commit file's LastModified, which S3 keeps in whole seconds:
    # the next commit must land in a later second to be told apart (as with Delta on S3).
    time.sleep(1.05 - (time.time() % 1))
    t.overwrite(_rows([6], "2024-01-02"), replace_where="date = '2024-01-02'")
    t.delete("id = 2")
    t.update("id = 3", set={"x": "x + 1"})
    source = pa.table({"id": [1, 7], "date": ["2024-01-01", "2024-01-03"], "x": [100, 70]}, schema=SCHEMA)
    t.merge(source, on="t.id = s.id", source_alias="s", target_alias="t").when_matched_update_all(
    ).when_not_matched_insert_all().execute()  # fmt: skip
    t.optimize()
    want = [
        {"id": 1, "date": "2024-01-01", "x": 100},
        {"id": 3, "date": "2024-01-01", "x": 31},
        {"id": 6, "date": "2024-01-02", "x": 60},
        {"id": 7, "date": "2024-01-03", "x": 70},
    ]
    assert _sorted(t.to_arrow()) == want

    # Checkpoints were written on S3 and a fresh handle opens from them.
    names = [p.rsplit("/", 1)[-1] for p in t.log.fs.ls(f"{t.log.root}/_delta_log")]
    assert any(n.endswith(".checkpoint.parquet") for n in names)
    reopened = Table.open(s3_uri, slots=slots, storage_options=s3_storage_options)
    assert reopened.version == t.version
    assert _sorted(reopened.to_arrow()) == want

    # Time travel by version and by timestamp.
    at_two = pa.concat_tables([_rows([1, 2, 3], "2024-01-01"), _rows([4, 5], "2024-01-02")])
    assert _sorted(t.to_arrow(version=2)) == _sorted(at_two)
    as_of = t.to_arrow(timestamp=before_overwrite)
    assert {r["id"] for r in as_of.to_pylist()} == {1, 2, 3, 4, 5}

    # deltalake reads the same table on the same server, row for row.
    assert _theirs(s3_uri, deltalake_s3_options) == (t.version, want)

    # RESTORE, then VACUUM of what no version within retention references.
    t.restore(2)
    assert {r["id"] for r in t.to_arrow().to_pylist()} == {1, 2, 3, 4, 5}
    deleted = t.vacuum(retention_hours=0, enforce_retention=False)
    assert deleted and all(p.startswith(s3_uri) for p in deleted)
    assert {r["id"] for r in t.to_arrow().to_pylist()} == {1, 2, 3, 4, 5}
    assert _theirs(s3_uri, deltalake_s3_options) == (t.version, _sorted(t.to_arrow()))


def test_vacuum_on_s3_reads_modification_times_from_the_store(
    s3_uri: str, s3_storage_options: dict[str, Any]
) -> None:
    """S3 has no directories and reports LastModified per object: files younger than the
    retention are kept, older ones (here: any, with a zero retention) are deleted, and
    abandoned staged commits go the same way."""
    t = Table.create(s3_uri, SCHEMA, slots=InMemorySlotStore(), storage_options=s3_storage_options)
    t.append(_rows([1, 2], "d"))
    t.overwrite(_rows([3], "d"))  # the first append's file is no longer referenced
    fs, root = t.log.fs, t.log.root
    fs.pipe_file(f"{root}/date=d/orphan.parquet", b"not referenced")
    fs.pipe_file(f"{root}/_eventlog/staged/abandoned.json", b"{}")
    fs.pipe_file(f"{root}/_delta_log/_staged_commits/older-release.json", b"{}")
    removed = t.snapshot(1).paths()
    assert t.vacuum(retention_hours=1, enforce_retention=False) == []  # all of it is new
    deleted = t.vacuum(retention_hours=0, enforce_retention=False)
    assert sorted(p.removeprefix(s3_uri + "/") for p in deleted) == sorted(
        [
            *removed,
            "date=d/orphan.parquet",
            "_eventlog/staged/abandoned.json",
            "_delta_log/_staged_commits/older-release.json",
        ]
    )
    fs.invalidate_cache()
    assert not any(fs.exists(f"{root}/{p}") for p in [*removed, "date=d/orphan.parquet"])
    assert _sorted(t.to_arrow()) == [{"id": 3, "date": "d", "x": 30}]


def test_write_table_on_s3_creates_then_appends(s3_uri: str, s3_storage_options: dict[str, Any]) -> None:
    slots = InMemorySlotStore()
    assert write_table(s3_uri, _rows([1], "d"), slots=slots, storage_options=s3_storage_options).version == 0
    assert write_table(s3_uri, _rows([2], "d"), slots=slots, storage_options=s3_storage_options).version == 1
    t = Table.open(s3_uri, slots=slots, storage_options=s3_storage_options)
    assert sorted(t.to_arrow().column("id").to_pylist()) == [1, 2]


def test_an_option_s3fs_does_not_take_is_an_invalid_input_error(
    s3_uri: str, s3_storage_options: dict[str, Any]
) -> None:
    with pytest.raises(InvalidInputError):
        Table.create(s3_uri, SCHEMA, slots=InMemorySlotStore(),
                     storage_options={**s3_storage_options, "no_such_option": 1})  # fmt: skip


def test_publishing_never_overwrites_a_commit_another_writer_put_there(
    s3_uri: str, s3_storage_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that does not use our slots (another Delta engine) took version 1 first: our
    put-if-absent (S3 If-None-Match) loses, and the other commit stays as it was."""
    slots = InMemorySlotStore()
    t = Table.create(s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options)
    log = t.log
    theirs = b'{"commitInfo":{"timestamp":1,"operation":"WRITE","txnId":"other"}}\n'
    log.fs.pipe_file(log.commit_path(1), theirs)
    with monkeypatch.context() as m:  # the other writer's put lands between our check and ours
        m.setattr(type(log.fs), "exists", lambda self, path, **kwargs: False)
        assert (
            log.publish(1, "never-staged", b'{"commitInfo":{"timestamp":2,"operation":"WRITE"}}\n') is False
        )
    log.fs.invalidate_cache()
    assert log.fs.cat_file(log.commit_path(1)) == theirs
    result = t.append(_rows([1], "d"))  # our next commit lands above it
    assert result.version == 2
    assert Table.open(s3_uri, slots=slots, storage_options=s3_storage_options).version == 2


def test_without_a_slot_store_an_s3_table_reads_but_refuses_writes(
    s3_uri: str, s3_storage_options: dict[str, Any]
) -> None:
    """A lock on this machine cannot guard writers on others: no local default on S3."""
    with pytest.raises(SlotStoreRequiredError) as info:
        Table.create(s3_uri, SCHEMA, storage_options=s3_storage_options)
    assert info.value.uri == s3_uri
    assert not Table.exists(s3_uri, storage_options=s3_storage_options)

    slots = InMemorySlotStore()
    Table.create(s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options).append(_rows([1], "d"))
    reader = Table.open(s3_uri, storage_options=s3_storage_options)  # no slots: reading is fine
    assert reader.version == 1
    assert reader.to_arrow().column("id").to_pylist() == [1]
    objects = sorted(reader.log.fs.find(reader.log.root))
    with pytest.raises(SlotStoreRequiredError):
        reader.append(_rows([2], "d"))
    with pytest.raises(SlotStoreRequiredError):
        write_table(s3_uri, _rows([2], "d"), storage_options=s3_storage_options)
    reader.log.fs.invalidate_cache()
    assert sorted(reader.log.fs.find(reader.log.root)) == objects  # nothing written
    assert Table.open(s3_uri, slots=slots, storage_options=s3_storage_options).version == 1


def test_a_local_file_slot_store_is_refused_for_an_s3_table(
    s3_uri: str, s3_storage_options: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its locks guard one machine: named explicitly, by spec or through $EVENTLOG_SLOTS, it
    is refused at open with the same typed error, which says to use ZooKeeper slots."""
    for slots in (LocalFileSlotStore(tmp_path / "a"), f"file://{tmp_path / 'b'}", str(tmp_path / "c")):
        with pytest.raises(SlotStoreRequiredError, match="zk://") as info:
            Table.create(s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options)
        assert info.value.uri == s3_uri
    monkeypatch.setenv("EVENTLOG_SLOTS", str(tmp_path / "d"))
    with pytest.raises(SlotStoreRequiredError, match="local-file store"):
        write_table(s3_uri, _rows([1], "d"), storage_options=s3_storage_options)
    assert not Table.exists(s3_uri, storage_options=s3_storage_options)
    assert list(tmp_path.iterdir()) == []  # no local store wrote anything
    assert shared_slot_stores() == []  # the refused stores opened from specs were given back


def test_an_s3_slot_spec_reaches_the_store_with_the_tables_storage_options(
    s3_uri: str, s3_storage_options: dict[str, Any]
) -> None:
    """``slots="s3://bucket/slots"`` on an s3:// table: the slots go through the table's own
    file system (its endpoint and credentials); no AWS endpoint is in the environment."""
    bucket = s3_uri.removeprefix("s3://").split("/")[0]
    spec = f"s3://{bucket}/slots"
    with Table.create(s3_uri, SCHEMA, slots=spec, storage_options=s3_storage_options) as t:
        assert isinstance(t.slots, ObjectStoreSlotStore)
        assert t.slots.filesystem is t.log.fs
        t.append(_rows([1], "d"))
        with Table.open(s3_uri, slots=spec, storage_options=s3_storage_options) as other:
            assert other.slots is t.slots  # one store per spec and file system per process
            assert other.append(_rows([2], "d")).version == 2
        assert t.slots.latest(t.key) == 2
        assert t.refresh().version == 2
        claimed = t.slots.get(t.key, 1)
        assert claimed is not None and claimed.complete
    fs = t.log.fs
    fs.invalidate_cache()
    assert any(p.endswith(".slot") for p in fs.find(f"{bucket}/slots"))
    assert shared_slot_stores() == []


def test_the_cli_reads_an_s3_table_with_storage_options(
    s3_uri: str, s3_storage_options: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    Table.create(s3_uri, SCHEMA, slots=InMemorySlotStore(), storage_options=s3_storage_options).append(
        _rows([1, 2], "d")
    )
    options = [arg for k, v in s3_storage_options.items() for arg in ("--storage-option", f"{k}={v}")]
    assert main(["--json", *options, "history", s3_uri]) == 0
    history = json.loads(capsys.readouterr().out)
    assert history["table"] == s3_uri
    assert [h["version"] for h in history["history"]] == [1, 0]
    assert main(["--json", *options, "describe", s3_uri]) == 0
    described = json.loads(capsys.readouterr().out)
    assert (described["version"], described["num_files"], described["num_rows"]) == (1, 1, 2)
