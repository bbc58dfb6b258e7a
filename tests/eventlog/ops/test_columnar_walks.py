"""Whole-table walks on the snapshot's columns (VACUUM's reference set, ``describe``'s
totals, auto-compaction's small-file counts) give what the per-file walks gave."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import unquote, urlparse

import orjson
import pytest

from eventlog.cli.reads import file_totals
from eventlog.log.actions import AddFile, DeletionVectorDescriptor, RemoveFile
from eventlog.log.filetable import adds_table, removes_table
from eventlog.ops.vacuum import referenced_by
from eventlog.txn.plan import dv_relative_path
from streaming import compaction

_U = DeletionVectorDescriptor("u", "ab" + "x" * 20, size_in_bytes=40, cardinality=2, offset=1)
_U2 = DeletionVectorDescriptor("u", "y" * 20, size_in_bytes=40, cardinality=3)
_INLINE = DeletionVectorDescriptor("i", "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", 40, 1)
_ABSOLUTE = DeletionVectorDescriptor("p", "s3://b/dv.bin", size_in_bytes=40, cardinality=1)


def _keep(files: Sequence[AddFile | RemoveFile]) -> set[str]:
    """The per-file rule VACUUM used."""
    out = set()
    for f in files:
        if not urlparse(f.path).scheme:
            out.add(unquote(f.path))
        if f.deletion_vector is not None and f.deletion_vector.storage_type == "u":
            out.add(dv_relative_path(f.deletion_vector))
    return out


PATHS = [
    "date=2024-01-01/part-1.parquet",
    "date=2024%3A01/part%20two.parquet",
    "s3://bucket/elsewhere.parquet",
    "file:///tmp/x.parquet",
    "part-0:1.parquet",  # urlparse reads "part-0" as a scheme: not the table's file
    "x/a:b.parquet",
]


def test_vacuum_references_match_the_per_file_rule() -> None:
    dvs = [_U, None, _INLINE, _ABSOLUTE, _U2, None]
    adds = [AddFile(p, {}, 1, 1, deletion_vector=d) for p, d in zip(PATHS, dvs, strict=True)]
    assert referenced_by(adds_table(adds)) == _keep(adds)
    removes = [RemoveFile(p, 5, deletion_vector=d) for p, d in zip(PATHS, reversed(dvs), strict=True)]
    assert referenced_by(removes_table(removes)) == _keep(removes)
    assert referenced_by(adds_table([])) == set()
    plain = [AddFile(p, {}, 1, 1) for p in PATHS]
    assert referenced_by(adds_table(plain)) == _keep(plain)


def _stats(n: int | None) -> str | None:
    return None if n is None else orjson.dumps({"numRecords": n}).decode()


def test_describe_totals() -> None:
    adds = [
        AddFile("a", {}, 10, 1, stats=_stats(5), deletion_vector=_U),
        AddFile("b", {}, 20, 1, stats=_stats(7)),
        AddFile("c", {}, 30, 1, stats=_stats(1), deletion_vector=_U2),
    ]
    assert file_totals(adds_table(adds)) == (3, 60, 5 + 7 + 1 - 2 - 3)
    no_count = [*adds, AddFile("d", {}, 1, 1, stats=orjson.dumps({"minValues": {}}).decode())]
    assert file_totals(adds_table(no_count)) == (4, 61, None)
    assert file_totals(adds_table([AddFile("e", {}, 4, 1)])) == (1, 4, None)
    assert file_totals(adds_table([])) == (0, 0, 0)


class _Snap:
    def __init__(self, files: Sequence[AddFile], partition_columns: tuple[str, ...], target: int) -> None:
        self.live_files = adds_table(files)
        self.add_files = tuple(sorted(files, key=lambda f: f.path))
        self.partition_columns = partition_columns
        self.properties = {"delta.targetFileSize": str(target)}


def _reference(
    snap: _Snap, touched: Sequence[Mapping[str, str | None]], min_files: int
) -> list[dict[str, str | None]]:
    columns = snap.partition_columns
    wanted = {tuple(v.get(c) for c in columns) for v in touched}
    small: dict[tuple[str | None, ...], int] = {}
    for add in snap.add_files:
        key = tuple(add.partition_values.get(c) for c in columns)
        if key in wanted and add.size < int(snap.properties["delta.targetFileSize"]):
            small[key] = small.get(key, 0) + 1
    chosen = sorted((k for k, n in small.items() if n >= min_files), key=lambda k: -small[k])
    return [dict(zip(columns, k, strict=True)) for k in chosen[: compaction.MAX_PARTITIONS_PER_RUN]]


@pytest.mark.parametrize("min_files", [1, 2, 3])
def test_auto_compaction_candidates_match_the_per_file_count(min_files: int) -> None:
    spec = [
        ("z1", {"d": "1", "h": "a"}, 5),
        ("a1", {"d": "2", "h": "a"}, 5),
        ("a2", {"d": "2", "h": "a"}, 500),  # not small
        ("b1", {"d": "1", "h": "a"}, 5),
        ("c1", {"d": None, "h": "b"}, 5),
        ("c2", {"h": "b"}, 5),  # a missing key is null
        ("c3", {"d": "", "h": "b"}, 5),  # "" is its own raw value
        ("m1", {"d": "2", "h": "a"}, 5),
        ("n1", {"d": "3", "h": "c"}, 5),
    ]
    files = [AddFile(p, v, size, 1) for p, v, size in spec]
    snap = _Snap(files, ("d", "h"), 100)
    touched = [{"d": "1", "h": "a"}, {"d": "2", "h": "a"}, {"d": None, "h": "b"}, {"d": "", "h": "b"}]
    got = compaction.candidates(snap, touched, min_files=min_files)  # type: ignore[arg-type]
    assert got == _reference(snap, touched, min_files)
    assert len(got) == {1: 4, 2: 3, 3: 0}[min_files]


def test_auto_compaction_candidates_unpartitioned() -> None:
    snap = _Snap([AddFile(f"f{i}", {}, 5 if i % 2 else 500, 1) for i in range(7)], (), 100)
    assert compaction.candidates(snap, [{}], min_files=3) == [{}]  # type: ignore[arg-type]
    assert compaction.candidates(snap, [{}], min_files=4) == []  # type: ignore[arg-type]
    assert compaction.candidates(snap, [], min_files=1) == []  # type: ignore[arg-type]
