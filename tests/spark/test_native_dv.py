"""Deletion vectors applied by ``spark_adapter.native_dv`` in native reads, checked against
the engine's own reader (``Table.to_arrow``) row for row."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.files.deletion_vectors import inline_descriptor
from eventlog.log.storage import normalize_uri
from spark_adapter import native_dv, read_table
from spark_adapter.jvm_reader import DV_READER_CONF
from spark_adapter.native import file_uri

pytestmark = pytest.mark.spark

DV = {"delta.enableDeletionVectors": "true"}
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def batch(ids: range) -> pa.Table:
    return pa.table({"id": list(ids), "name": [f"n{i % 7}" for i in ids]}, schema=SCHEMA)


def engine_rows(uri: str) -> list[tuple[int, str]]:
    t = Table.open(uri).to_arrow()
    return sorted(zip(t.column("id").to_pylist(), t.column("name").to_pylist(), strict=True))


def native_rows(spark: Any, uri: str) -> list[tuple[int, str]]:
    return sorted((r["id"], r["name"]) for r in read_table(spark, uri).collect())


def assert_same(spark: Any, uri: str) -> list[tuple[int, str]]:
    want = engine_rows(uri)
    assert native_rows(spark, uri) == want
    return want


def dv_files(uri: str) -> int:
    return sum(1 for f in Table.open(uri).snapshot().add_files if f.deletion_vector is not None)


def test_several_dv_files_in_one_scan(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "several")
    table = Table.create(uri, SCHEMA, properties=DV)
    spans = ((0, 1000), (1000, 130), (2000, 64), (3000, 1), (4000, 700))
    for start, n in spans:
        table.append(batch(range(start, start + n)))
    table.delete("id % 10 = 3 OR id = 4699 OR id = 2063 OR id = 3000")  # files' last rows
    table.delete("id = 0 OR id = 64 OR id = 1127")  # first row, a word's first bit
    assert dv_files(uri) == 4  # the one-row file is removed, not given a DV
    rows = assert_same(spark, uri)
    assert {i for i, _ in rows}.isdisjoint({3, 13, 4699, 2063, 0, 64, 1127})
    gone = {3000, 4699, 2063, 0, 64, 1127}
    want = [i for a, n in spans for i in range(a, a + n) if i % 10 != 3 and i not in gone]
    assert sorted(i for i, _ in rows) == sorted(want)


def test_files_of_equal_size_with_deletion_vectors(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "equal")
    table = Table.create(uri, SCHEMA, properties=DV)
    for _ in range(3):
        table.append(batch(range(200)))  # byte-identical files
    assert len({f.size for f in table.snapshot().add_files}) == 1
    table.update("id % 50 = 7", {"id": "id + 1000"})
    assert dv_files(uri) == 3
    fs, root, _ = normalize_uri(uri)
    assert len(native_dv.dv_scans(fs, root, Table.open(uri).snapshot().add_files)) == 3
    rows = assert_same(spark, uri)
    assert sum(1 for i, _ in rows if i >= 1000) == 12


def test_a_file_with_every_row_but_one_deleted(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "one-left")
    table = Table.create(uri, SCHEMA, properties=DV)
    table.append(batch(range(5000)))
    table.append(batch(range(10_000, 10_100)))
    table.delete("id < 5000 AND id <> 4321")
    table.delete("id = 10050")
    assert dv_files(uri) == 2
    rows = assert_same(spark, uri)
    assert [i for i, _ in rows if i < 5000] == [4321]
    assert len(rows) == 100


def test_a_dv_that_deletes_nothing_keeps_every_row(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "empty-dv")
    table = Table.create(uri, SCHEMA, properties=DV, data=batch(range(300)))
    fs, root, _ = normalize_uri(uri)
    (add,) = table.snapshot().add_files
    other = dataclasses.replace(add, size=add.size + 1, deletion_vector=inline_descriptor([1, 299]))
    files = [dataclasses.replace(add, deletion_vector=inline_descriptor([])), other]
    keep = native_dv.dv_filter(fs, root, files)
    path = file_uri("file:" + root, add.path)
    got = sorted(r.id for r in spark.read.parquet(path).where(keep).collect())
    assert got == list(range(300))


def test_a_file_size_the_scan_does_not_know_fails_the_query(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "wrong-size")
    table = Table.create(uri, SCHEMA, properties=DV, data=batch(range(10)))
    fs, root, _ = normalize_uri(uri)
    (add,) = table.snapshot().add_files
    wrong = dataclasses.replace(add, size=add.size + 1, deletion_vector=inline_descriptor([2]))
    keep = native_dv.dv_filter(fs, root, [wrong])
    df = spark.read.parquet(file_uri("file:" + root, add.path)).where(keep)
    with pytest.raises(Exception, match="is not a file with a deletion vector in this scan"):
        df.collect()


def test_the_fallback_array_literal_gives_the_same_rows(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "fallback")
    table = Table.create(uri, SCHEMA, properties=DV)
    table.append(batch(range(0, 777)))
    table.append(batch(range(1000, 1130)))
    table.delete("id % 3 = 1")
    want = engine_rows(uri)
    calls: list[int] = []
    unsafe = native_dv._unsafe_literal

    def counted(jvm: Any, words: Any) -> Any:
        calls.append(int(words.size))
        return unsafe(jvm, words)

    monkeypatch.setattr(native_dv, "_unsafe_literal", counted)
    spark.conf.set(DV_READER_CONF, "sql")  # this SQL filter, not the JVM reader
    try:
        assert native_rows(spark, uri) == want
        assert calls == [13 + 3]  # one scan: both files' words, through the JVM literal
        monkeypatch.setattr(native_dv, "_gateway_jvm", lambda: None)
        assert native_rows(spark, uri) == want
        assert len(calls) == 1
    finally:
        spark.conf.unset(DV_READER_CONF)
