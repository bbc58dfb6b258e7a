"""Deletion vectors: byte layout per PROTOCOL.md, round trips, corruption, and delta-rs reads."""

from __future__ import annotations

import dataclasses
import os
import random
import struct
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap, BitMap64, FrozenBitMap64

from eventlog.errors import CorruptLogError, InvalidInputError
from eventlog.files.deletion_vectors import (
    MAGIC_NUMBER,
    deleted_mask,
    deserialize_bitmap,
    dv_file_path,
    inline_descriptor,
    read_deletion_vector,
    serialize_bitmap,
    write_deletion_vectors,
    z85_decode,
    z85_encode,
)
from eventlog.log.actions import (
    Action,
    AddFile,
    CommitInfo,
    DeletionVectorDescriptor,
    Metadata,
    Protocol,
    RemoveFile,
    encode_commit,
)

LOCAL = fsspec.filesystem("file")


# --------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [0],
        [1, 3, 7],
        list(range(70_000)),  # several containers, run-encoded
        [5, 2**32 - 1, 2**32, 2**32 + 7, 3 * 2**32 + 1, 2**63 - 1],  # several 32-bit buckets
    ],
    ids=["empty", "zero", "small", "range", "beyond-2**32"],
)
def test_round_trip(rows: list[int]) -> None:
    data = serialize_bitmap(rows)
    assert struct.unpack_from("<i", data) == (MAGIC_NUMBER,)
    back = deserialize_bitmap(data)
    assert list(back) == sorted(rows)
    assert isinstance(back, BitMap64)


def test_round_trip_one_million_random_rows() -> None:
    rng = np.random.default_rng(7)
    rows = np.unique(rng.integers(0, 50_000_000, 1_000_000, dtype=np.int64))
    data = serialize_bitmap(rows)
    back = deserialize_bitmap(data)
    assert len(back) == rows.size
    assert np.array_equal(np.frombuffer(back.to_array(), dtype=np.uint64), rows.astype(np.uint64))


def test_serialize_accepts_all_bitmap_kinds() -> None:
    expected = serialize_bitmap(BitMap64([1, 3, 7]))
    assert serialize_bitmap(BitMap([7, 3, 1])) == expected
    assert serialize_bitmap(FrozenBitMap64([7, 3, 1])) == expected
    assert serialize_bitmap(iter([7, 3, 1, 3])) == expected
    assert serialize_bitmap(np.array([7, 1, 3], dtype=np.int32)) == expected


@pytest.mark.parametrize("bad", [[-1], [2**63], np.array([-4], dtype=np.int64)])
def test_serialize_rejects_out_of_range_rows(bad: object) -> None:
    with pytest.raises(InvalidInputError):
        serialize_bitmap(bad)  # type: ignore[arg-type]


def test_portable_layout_is_the_roaring_spec() -> None:
    # PROTOCOL.md: magic (int32 LE), numBuckets (int64 LE), then per bucket key (uint32 LE)
    # and a standard 32-bit Roaring bitmap.
    data = serialize_bitmap([1, 3, 7, 2**32 + 5])
    assert data[:4] == (1681511377).to_bytes(4, "little")
    assert struct.unpack_from("<q", data, 4) == (2,)
    assert struct.unpack_from("<I", data, 12) == (0,)
    first = BitMap([1, 3, 7]).serialize()
    assert data[16 : 16 + len(first)] == first
    pos = 16 + len(first)
    assert struct.unpack_from("<I", data, pos) == (1,)
    assert data[pos + 4 :] == BitMap([5]).serialize()
    # 32-bit Roaring cookie: SERIAL_COOKIE_NO_RUNCONTAINER 12346 or SERIAL_COOKIE 12347.
    assert struct.unpack_from("<H", data, 16)[0] in (12346, 12347)


def test_z85_matches_the_protocol_examples() -> None:
    # PROTOCOL.md JSON Example 1: prefix "ab" plus the 20-character Z85 UUID.
    dv = DeletionVectorDescriptor("u", "ab^-aqEH.-t@S}K{vb[*k^", 40, 6, 4)
    assert dv_file_path("s3://mytable", dv) == (
        "s3://mytable/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )
    assert z85_encode(uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61").bytes) == "^-aqEH.-t@S}K{vb[*k^"
    # ZeroMQ RFC 32 test vector.
    assert z85_encode(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == "HelloWorld"
    # Example 3 (inline) decodes to a Roaring bitmap of rows 3, 4, 7, 11, 18, 29. (The example
    # uses Delta's older "native" magic, which delta-rs and we do not read, so only its
    # embedded 32-bit bitmap is checked: it proves the alphabet and block byte order.)
    raw = z85_decode("wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L")
    assert len(raw) == 40
    assert list(BitMap.deserialize(raw[12:])) == [3, 4, 7, 11, 18, 29]


def test_z85_pads_to_four_bytes_like_delta() -> None:
    for n in range(9):
        data = bytes(range(1, n + 1))
        text = z85_encode(data)
        assert len(text) == (n + 3) // 4 * 5
        decoded = z85_decode(text)
        assert decoded[:n] == data and decoded[n:] == bytes(len(decoded) - n)
    with pytest.raises(ValueError):
        z85_decode("abcd")
    with pytest.raises(ValueError):
        z85_decode("abc_e")  # "_" is RFC 1924 base85 but not Z85


def test_bad_magic_and_truncation_raise_corrupt_log_error() -> None:
    data = serialize_bitmap([1, 2, 3, 100_000])
    with pytest.raises(CorruptLogError, match="magic"):
        deserialize_bitmap(b"\x00\x00\x00\x00" + data[4:], uri="x")
    with pytest.raises(CorruptLogError, match="native"):
        deserialize_bitmap((1681511376).to_bytes(4, "little") + data[4:])
    for cut in (0, 3, 11, 20, len(data) - 1):
        with pytest.raises(CorruptLogError) as info:
            deserialize_bitmap(data[:cut], uri="memory://t")
        err: Any = info.value  # fields are set dynamically by EventlogError
        assert err.uri == "memory://t" and err.version is None


# --------------------------------------------------------------------------- files


def test_file_layout_offsets_size_and_crc(tmp_path: Path) -> None:
    root = str(tmp_path)
    sets = [[1, 3, 7], list(range(1000, 5000)), [], [2**40]]
    dvs = write_deletion_vectors(LOCAL, root, sets)
    assert len({dv.path_or_inline_dv for dv in dvs}) == 1
    path = dv_file_path(root, dvs[0])
    assert os.path.basename(path).startswith("deletion_vector_") and path.endswith(".bin")
    raw = Path(path).read_bytes()
    assert raw[0] == 1  # format version
    expected_offset = 1
    for rows, dv in zip(sets, dvs, strict=True):
        blob = serialize_bitmap(rows)
        assert dv.storage_type == "u" and len(dv.path_or_inline_dv) == 20
        assert dv.offset == expected_offset
        assert dv.size_in_bytes == len(blob) and dv.cardinality == len(rows)
        assert raw[dv.offset : dv.offset + 4] == len(blob).to_bytes(4, "big")
        assert raw[dv.offset + 4 : dv.offset + 4 + len(blob)] == blob
        crc = raw[dv.offset + 4 + len(blob) : dv.offset + 8 + len(blob)]
        assert crc == zlib.crc32(blob).to_bytes(4, "big")
        assert list(read_deletion_vector(LOCAL, root, dv)) == rows
        expected_offset += 8 + len(blob)
    assert len(raw) == expected_offset


def test_random_prefix_directory(tmp_path: Path) -> None:
    (dv,) = write_deletion_vectors(LOCAL, str(tmp_path), [[4]], prefix="x7")
    assert dv.path_or_inline_dv.startswith("x7") and len(dv.path_or_inline_dv) == 22
    assert dv_file_path(str(tmp_path), dv).startswith(f"{tmp_path}/x7/deletion_vector_")
    assert list(read_deletion_vector(LOCAL, str(tmp_path), dv)) == [4]
    with pytest.raises(InvalidInputError):
        write_deletion_vectors(LOCAL, str(tmp_path), [[4]], prefix="../a")


def test_memory_filesystem_and_absolute_path_dv() -> None:
    fs = fsspec.filesystem("memory")
    root = f"/dv-tests/{uuid.uuid4().hex}"
    try:
        (dv,) = write_deletion_vectors(fs, root, [[0, 9]])
        assert list(read_deletion_vector(fs, root, dv)) == [0, 9]
        absolute = dataclasses.replace(
            dv, storage_type="p", path_or_inline_dv=f"memory://{dv_file_path(root, dv)}"
        )
        assert list(read_deletion_vector(fs, "/elsewhere", absolute)) == [0, 9]
    finally:
        fs.rm(root, recursive=True)


def test_crc_mismatch_raises(tmp_path: Path) -> None:
    dv, other = write_deletion_vectors(LOCAL, str(tmp_path), [[1, 2, 3], [5]])
    path = Path(dv_file_path(str(tmp_path), dv))
    raw = bytearray(path.read_bytes())
    raw[dv.offset + 4 + 20] ^= 0x01  # type: ignore[operator]  # flip a bit inside the first bitmap
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptLogError, match="CRC"):
        read_deletion_vector(LOCAL, str(tmp_path), dv)
    assert list(read_deletion_vector(LOCAL, str(tmp_path), other)) == [5]  # its frame is intact


def test_size_version_cardinality_and_missing_file_checks(tmp_path: Path) -> None:
    root = str(tmp_path)
    (dv,) = write_deletion_vectors(LOCAL, root, [[1, 2, 3]])
    with pytest.raises(CorruptLogError, match="size mismatch"):
        read_deletion_vector(LOCAL, root, dataclasses.replace(dv, size_in_bytes=dv.size_in_bytes + 1))
    with pytest.raises(CorruptLogError, match="rows"):
        read_deletion_vector(LOCAL, root, dataclasses.replace(dv, cardinality=4))
    with pytest.raises(CorruptLogError, match="offset"):
        read_deletion_vector(LOCAL, root, dataclasses.replace(dv, offset=0))
    with pytest.raises(CorruptLogError, match="sizeInBytes"):
        read_deletion_vector(LOCAL, root, dataclasses.replace(dv, size_in_bytes=-8))
    path = Path(dv_file_path(root, dv))
    raw = path.read_bytes()
    path.write_bytes(raw[:-3])
    with pytest.raises(CorruptLogError, match="truncated"):
        read_deletion_vector(LOCAL, root, dv)
    path.write_bytes(b"\x02" + raw[1:])
    with pytest.raises(CorruptLogError, match="version"):
        read_deletion_vector(LOCAL, root, dv)
    path.unlink()
    with pytest.raises(CorruptLogError, match="missing"):
        read_deletion_vector(LOCAL, root, dv)
    escaping = dataclasses.replace(dv, path_or_inline_dv="../" + dv.path_or_inline_dv)
    with pytest.raises(CorruptLogError, match="prefix"):
        dv_file_path(root, escaping)


# --------------------------------------------------------------------------- inline


@pytest.mark.parametrize("rows", [[], [1, 3, 7], [2**33, 5], list(range(0, 300, 3))])
def test_inline_descriptor_round_trip(rows: list[int]) -> None:
    dv = inline_descriptor(rows)
    blob = serialize_bitmap(rows)
    assert dv.storage_type == "i" and dv.offset is None
    assert dv.size_in_bytes == len(blob) and dv.cardinality == len(rows)
    assert z85_decode(dv.path_or_inline_dv)[: len(blob)] == blob
    assert list(read_deletion_vector(LOCAL, "/unused", dv)) == sorted(rows)
    assert dv.unique_id == "i" + dv.path_or_inline_dv
    assert orjson.loads(orjson.dumps(dv.to_json())) == {
        "storageType": "i",
        "pathOrInlineDv": dv.path_or_inline_dv,
        "sizeInBytes": len(blob),
        "cardinality": len(rows),
    }


def test_inline_corruption_raises() -> None:
    dv = inline_descriptor([1, 3, 7])
    with pytest.raises(CorruptLogError):
        read_deletion_vector(
            LOCAL, "/t", dataclasses.replace(dv, path_or_inline_dv=dv.path_or_inline_dv[:-1])
        )
    with pytest.raises(CorruptLogError):
        read_deletion_vector(LOCAL, "/t", dataclasses.replace(dv, size_in_bytes=dv.size_in_bytes + 8))
    bad_magic = z85_encode(b"\x00" * 4 + serialize_bitmap([1])[4:])
    with pytest.raises(CorruptLogError, match="magic"):
        read_deletion_vector(
            LOCAL, "/t", dataclasses.replace(dv, path_or_inline_dv=bad_magic, size_in_bytes=34)
        )


# --------------------------------------------------------------------------- masks


def test_deleted_mask_marks_kept_rows() -> None:
    mask = deleted_mask(BitMap64([1, 3, 7]), 10)
    assert isinstance(mask, pa.BooleanArray) and mask.null_count == 0
    assert mask.to_pylist() == [i not in (1, 3, 7) for i in range(10)]
    assert deleted_mask(BitMap([0, 9]), 10).to_pylist() == [False] + [True] * 8 + [False]
    assert deleted_mask([], 3).to_pylist() == [True, True, True]
    assert len(deleted_mask(BitMap64(), 0)) == 0
    table = pa.table({"x": list(range(10))})
    assert table.filter(deleted_mask([0, 5], 10))["x"].to_pylist() == [1, 2, 3, 4, 6, 7, 8, 9]
    with pytest.raises(CorruptLogError, match="row 10"):
        deleted_mask([10], 10)


def test_deleted_mask_on_one_million_rows_is_fast() -> None:
    n = 1_000_000
    deleted = BitMap64(random.Random(3).sample(range(n), 100_000))
    timings = []
    for _ in range(3):  # best of three: the first call also pays for page faults
        start = time.perf_counter()
        mask = deleted_mask(deleted, n)
        timings.append(time.perf_counter() - start)
    elapsed = min(timings)
    expected = np.ones(n, dtype=bool)
    expected[np.frombuffer(deleted.to_array(), dtype=np.uint64)] = False
    assert np.array_equal(mask.to_numpy(zero_copy_only=False), expected)
    assert mask.true_count == n - 100_000
    assert elapsed < 0.01, f"deleted_mask took {elapsed * 1000:.1f} ms"


# --------------------------------------------------------------------------- delta-rs


SCHEMA_STRING = orjson.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "name", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
).decode()


def _dv_table(
    root: Path, make_dv: Callable[[list[int]], DeletionVectorDescriptor], deleted: list[int]
) -> None:
    """Version 0: one 10-row file; version 1: the same file re-added with a deletion vector."""
    data = pa.table({"id": pa.array(range(10), pa.int64()), "name": [f"n{i}" for i in range(10)]})
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(data, root / name)
    size = (root / name).stat().st_size
    stats = orjson.dumps({"numRecords": 10, "minValues": {"id": 0}, "maxValues": {"id": 9}}).decode()
    now = int(time.time() * 1000)
    add = AddFile(name, {}, size, now, True, stats)
    log = root / "_delta_log"
    log.mkdir()
    v0: list[Action] = [
        CommitInfo(now, "CREATE TABLE"),
        Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)),
        Metadata(
            str(uuid.uuid4()), SCHEMA_STRING, (), {"delta.enableDeletionVectors": "true"}, created_time=now
        ),
        add,
    ]
    (log / "00000000000000000000.json").write_bytes(encode_commit(v0))
    dv = make_dv(deleted)
    remove = RemoveFile(name, now + 1, True, True, {}, size, stats)
    v1: list[Action] = [
        CommitInfo(now + 1, "DELETE", read_version=0),
        remove,
        dataclasses.replace(add, deletion_vector=dv),
    ]
    (log / "00000000000000000001.json").write_bytes(encode_commit(v1))


def _read_with_delta_rs(root: Path) -> tuple[list[int], list[list[bool]]]:
    """Surviving ids via delta-rs's DataFusion scan, plus its decoded selection vectors."""
    deltalake = pytest.importorskip("deltalake")
    dt = deltalake.DeltaTable(str(root))
    assert dt.version() == 1
    # deltalake 1.6's to_pyarrow_table()/to_pyarrow_dataset() refuse every table whose
    # protocol lists the deletionVectors reader feature (a Python-side allow-list check),
    # whatever the DV bytes; scan() and QueryBuilder go through the Rust engine, which applies DVs.
    with pytest.raises(deltalake.exceptions.DeltaProtocolError, match="deletionVectors"):
        dt.to_pyarrow_table()
    scanned = pa.table(dt.scan().read_all()).to_pylist()  # strings come back as string_view
    rows = sorted((r["id"], r["name"]) for r in scanned)
    assert [name for _, name in rows] == [f"n{i}" for i, _ in rows]
    ids = [i for i, _ in rows]
    sql = deltalake.QueryBuilder().register("t", dt).execute("SELECT id FROM t ORDER BY id")
    assert pa.table(sql.read_all())["id"].to_pylist() == ids
    selection = pa.table(dt.deletion_vectors().read_all())["selection_vector"].to_pylist()
    return ids, selection


@pytest.mark.parametrize("storage", ["u", "u-prefix", "i"])
def test_delta_rs_reads_our_deletion_vectors(tmp_path: Path, storage: str) -> None:
    root = tmp_path / "table"
    root.mkdir()

    def make_dv(rows: list[int]) -> DeletionVectorDescriptor:
        if storage == "i":
            dv = inline_descriptor(rows)
            assert dv.size_in_bytes % 4 != 0  # exercises the Z85 zero padding
            return dv
        prefix = "ab" if storage == "u-prefix" else ""
        # Two DVs in one file: the table's DV is the second, so its offset is not 1.
        dvs = write_deletion_vectors(LOCAL, str(root), [[0, 1, 2], rows], prefix=prefix)
        assert dvs[1].offset is not None and dvs[1].offset > 1
        return dvs[1]

    _dv_table(root, make_dv, [1, 3, 7])
    ids, selection = _read_with_delta_rs(root)
    assert ids == [0, 2, 4, 5, 6, 8, 9]
    assert selection == [[i not in (1, 3, 7) for i in range(10)]]
    assert selection[0] == deleted_mask([1, 3, 7], 10).to_pylist()


def test_delta_rs_reads_run_encoded_deletion_vector(tmp_path: Path) -> None:
    root = tmp_path / "table"
    root.mkdir()
    rows = list(range(2, 9))  # a contiguous range: stored as a Roaring run container
    assert struct.unpack_from("<H", serialize_bitmap(rows), 16)[0] == 12347

    def make_dv(deleted: list[int]) -> DeletionVectorDescriptor:
        return write_deletion_vectors(LOCAL, str(root), [deleted])[0]

    _dv_table(root, make_dv, rows)
    ids, _ = _read_with_delta_rs(root)
    assert ids == [0, 1, 9]
