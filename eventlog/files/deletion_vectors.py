"""Deletion vectors: Delta's soft-deleted row sets, byte-compatible with PROTOCOL.md.

A deletion vector (DV) is the set of 64-bit row indexes of one data file that no longer
belong to the table. It is serialised as Delta's ``RoaringBitmapArray`` in the "portable"
form: the magic number 1681511377 (int32, little endian) followed by a standard 64-bit
portable Roaring bitmap (bucket count as uint64, then per bucket its high-32-bit key and
a standard 32-bit Roaring bitmap; all little endian). pyroaring's ``BitMap64.serialize``
produces exactly that standard part.

Storage types of a :class:`DeletionVectorDescriptor`:

* ``u``: file ``<table>/<prefix>/deletion_vector_<uuid>.bin``; ``pathOrInlineDv`` is the
  prefix followed by the Z85 form of the UUID's 16 bytes (always 20 characters). The file
  is a version byte (1) then, per DV, a big-endian int32 size, the serialised bitmap and a
  big-endian CRC-32 of it; ``offset`` points at the size field.
* ``i``: inline; ``pathOrInlineDv`` is the Z85 form of the serialised bitmap, zero padded
  to a multiple of 4 bytes (``sizeInBytes`` gives the unpadded length).
* ``p``: an absolute, URI-encoded path to such a file (read support only).
"""

from __future__ import annotations

import base64
import struct
import uuid
import zlib
from collections.abc import Iterable, Sequence
from typing import TypeAlias
from urllib.parse import unquote, urlparse

import fsspec
import numpy as np
import pyarrow as pa

from eventlog.errors import CorruptLogError, InvalidInputError, storage_step
from eventlog.log.actions import DeletionVectorDescriptor
from eventlog.log.durable import sync_written

try:
    from pyroaring import AbstractBitMap, AbstractBitMap64, BitMap64
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("deletion vectors need pyroaring: pip install 'eventlog-tables[dv]'") from exc

__all__ = [
    "FORMAT_VERSION",
    "MAGIC_NUMBER",
    "deleted_mask",
    "deserialize_bitmap",
    "dv_file_path",
    "inline_descriptor",
    "read_deletion_vector",
    "serialize_bitmap",
    "write_deletion_vectors",
    "z85_decode",
    "z85_encode",
]

MAGIC_NUMBER = 1681511377  # portable RoaringBitmapArray
NATIVE_MAGIC_NUMBER = 1681511376  # Delta's older "native" layout; not read by delta-rs either
FORMAT_VERSION = 1  # first byte of a DV file
MAX_ROW_INDEX = 2**63 - 1  # the protocol requires the top bit of every 32-bit key to be 0
_INT32_MAX = 2**31 - 1  # offset and sizeInBytes are Java ints in the protocol
_UUID_CHARS = 20  # Z85 of 16 bytes
_MIN_SERIALIZED_SIZE = 12  # magic + bucket count

RowBitmap: TypeAlias = BitMap64
BitmapLike: TypeAlias = AbstractBitMap64 | AbstractBitMap | Iterable[int]

# Z85 (https://rfc.zeromq.org/spec/32/) and Python's RFC 1924 base85 use the same big-endian
# 4-byte-block arithmetic and differ only in the alphabet, so b85 plus a translation is Z85.
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_Z85_CHARS = frozenset(_Z85)
_TO_Z85 = str.maketrans(_B85, _Z85)
_FROM_Z85 = str.maketrans(_Z85, _B85)


def z85_encode(data: bytes) -> str:
    """Z85 text of ``data``, zero padded to a multiple of 4 bytes like Delta's Base85Codec."""
    if len(data) % 4:
        data = data + bytes(4 - len(data) % 4)
    return base64.b85encode(data).decode("ascii").translate(_TO_Z85)


def z85_decode(text: str) -> bytes:
    """Bytes of Z85 ``text`` (padding included). ValueError on malformed input."""
    if len(text) % 5:
        raise ValueError(f"Z85 text length {len(text)} is not a multiple of 5")
    # Checked first: b85decode would silently accept RFC 1924 characters that Z85 lacks.
    if not _Z85_CHARS.issuperset(text):
        raise ValueError(f"not Z85 text: {text[:40]!r}")
    return base64.b85decode(text.translate(_FROM_Z85))


# --------------------------------------------------------------------------- bitmaps


def _as_bitmap64(rows: BitmapLike) -> AbstractBitMap64:
    if isinstance(rows, AbstractBitMap64):  # BitMap64 and FrozenBitMap64
        bitmap = rows
    elif isinstance(rows, AbstractBitMap):
        bitmap = BitMap64(rows)
    elif isinstance(rows, np.ndarray):
        if rows.size and rows.dtype.kind == "i" and int(rows.min()) < 0:
            raise InvalidInputError(f"row indexes must not be negative, got {int(rows.min())}")
        bitmap = BitMap64(rows.astype(np.uint64, copy=False))
    else:
        try:
            bitmap = BitMap64(rows)
        except OverflowError as exc:
            raise InvalidInputError(f"row indexes must be in [0, 2**63): {exc}") from exc
    if len(bitmap) and bitmap.max() > MAX_ROW_INDEX:
        raise InvalidInputError(f"row index {bitmap.max()} exceeds the protocol's maximum 2**63-1")
    return bitmap


def serialize_bitmap(rows: BitmapLike) -> bytes:
    """Delta's portable ``RoaringBitmapArray`` bytes for a set of row indexes."""
    return struct.pack("<i", MAGIC_NUMBER) + _as_bitmap64(rows).serialize()


def deserialize_bitmap(data: bytes, *, uri: str = "") -> RowBitmap:
    """Parse :func:`serialize_bitmap` bytes. :class:`CorruptLogError` on anything malformed."""
    if len(data) < _MIN_SERIALIZED_SIZE:
        raise CorruptLogError(f"deletion vector truncated: {len(data)} bytes", uri=uri, version=None)
    (magic,) = struct.unpack_from("<i", data)
    if magic != MAGIC_NUMBER:
        kind = "native-format " if magic == NATIVE_MAGIC_NUMBER else ""
        raise CorruptLogError(
            f"unsupported {kind}deletion vector: magic number {magic}, expected {MAGIC_NUMBER}",
            uri=uri,
            version=None,
        )
    try:
        bitmap = BitMap64.deserialize(data[4:])
    except (ValueError, IndexError, OverflowError) as exc:
        raise CorruptLogError(f"malformed deletion vector bitmap: {exc}", uri=uri, version=None) from exc
    if len(bitmap) and bitmap.max() > MAX_ROW_INDEX:
        raise CorruptLogError("deletion vector holds a key with its top bit set", uri=uri, version=None)
    return bitmap


# --------------------------------------------------------------------------- descriptors


def inline_descriptor(bitmap: BitmapLike) -> DeletionVectorDescriptor:
    """A storage type ``i`` descriptor carrying the DV in the log itself."""
    rows = _as_bitmap64(bitmap)
    data = serialize_bitmap(rows)
    return DeletionVectorDescriptor("i", z85_encode(data), len(data), len(rows), None)


def write_deletion_vectors(
    fs: fsspec.AbstractFileSystem, table_root: str, bitmaps: Sequence[BitmapLike], *, prefix: str = ""
) -> list[DeletionVectorDescriptor]:
    """Write all ``bitmaps`` into one new DV file; one ``u`` descriptor per bitmap, in order."""
    if prefix and not (prefix.isascii() and prefix.isalnum()):
        # The prefix is a directory name and precedes the Z85 UUID, whose alphabet contains
        # "/" and "."; Delta writers use random alphanumerics, so insist on that.
        raise InvalidInputError(f"deletion vector prefix must be ASCII alphanumeric, got {prefix!r}")
    if not bitmaps:
        return []
    file_id = uuid.uuid4()
    path_or_inline = prefix + z85_encode(file_id.bytes)
    buf = bytearray([FORMAT_VERSION])
    out: list[DeletionVectorDescriptor] = []
    for item in bitmaps:
        rows = _as_bitmap64(item)
        data = serialize_bitmap(rows)
        offset = len(buf)
        buf += struct.pack(">i", len(data))
        buf += data
        buf += struct.pack(">I", zlib.crc32(data))
        out.append(DeletionVectorDescriptor("u", path_or_inline, len(data), len(rows), offset))
    if len(buf) > _INT32_MAX:
        # Readers (Spark, delta-rs) hold offset and size as signed 32-bit ints.
        raise InvalidInputError(f"deletion vectors too large for one file: {len(buf)} bytes")
    path = dv_file_path(table_root, out[0])
    with storage_step(table_root, path.removeprefix(table_root.rstrip("/") + "/"), "deletion vector"):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        # A fresh UUID names the file and nothing references it until a commit lands, so a
        # plain (non-atomic) write cannot expose a partial file to readers.
        with fs.open(path, "wb") as f:
            f.write(bytes(buf))
        sync_written(fs, path)  # durable mode: before any commit names it
    return out


def dv_file_path(table_root: str, dv: DeletionVectorDescriptor) -> str:
    """Path of the file holding ``dv`` (``u``: under ``table_root``; ``p``: its decoded URI)."""
    if dv.storage_type == "p":
        return unquote(dv.path_or_inline_dv)
    if dv.storage_type != "u":
        raise InvalidInputError(f"a deletion vector of storage type {dv.storage_type!r} has no file")
    text = dv.path_or_inline_dv
    if len(text) < _UUID_CHARS:
        raise CorruptLogError(f"deletion vector path {text!r} is too short", uri=table_root, version=None)
    prefix, encoded = text[:-_UUID_CHARS], text[-_UUID_CHARS:]
    try:
        file_id = uuid.UUID(bytes=z85_decode(encoded))
    except ValueError as exc:
        raise CorruptLogError(
            f"bad deletion vector UUID {encoded!r}: {exc}", uri=table_root, version=None
        ) from exc
    if prefix.startswith("/") or ".." in prefix.split("/"):
        # The prefix comes from the log: never let it escape the table directory.
        raise CorruptLogError(f"bad deletion vector prefix {prefix!r}", uri=table_root, version=None)
    root = table_root.rstrip("/")
    name = f"deletion_vector_{file_id}.bin"
    return f"{root}/{prefix}/{name}" if prefix else f"{root}/{name}"


def read_deletion_vector(
    fs: fsspec.AbstractFileSystem, table_root: str, dv: DeletionVectorDescriptor
) -> RowBitmap:
    """Load the row indexes of ``dv``, checking size, CRC-32 and cardinality."""
    if dv.size_in_bytes < _MIN_SERIALIZED_SIZE:
        raise CorruptLogError(
            f"bad deletion vector sizeInBytes {dv.size_in_bytes}", uri=table_root, version=None
        )
    if dv.storage_type == "i":
        try:
            padded = z85_decode(dv.path_or_inline_dv)
        except ValueError as exc:
            raise CorruptLogError(f"bad inline deletion vector: {exc}", uri=table_root, version=None) from exc
        if not 0 <= len(padded) - dv.size_in_bytes < 4:
            raise CorruptLogError(
                f"inline deletion vector decodes to {len(padded)} bytes, sizeInBytes is {dv.size_in_bytes}",
                uri=table_root,
                version=None,
            )
        bitmap = deserialize_bitmap(padded[: dv.size_in_bytes], uri=table_root)
        return _check_cardinality(bitmap, dv, table_root)
    if dv.storage_type not in ("u", "p"):
        raise CorruptLogError(
            f"unknown deletion vector storage type {dv.storage_type!r}", uri=table_root, version=None
        )
    path = dv_file_path(table_root, dv)
    if dv.storage_type == "p":
        path = _absolute_fs_path(fs, path)
    offset = 1 if dv.offset is None else dv.offset  # no offset: the file's only DV
    if offset < 1:
        raise CorruptLogError(f"bad deletion vector offset {offset}", uri=path, version=None)
    try:
        with fs.open(path, "rb") as f:
            head = f.read(1)
            f.seek(offset)
            # Read only this DV's frame: one file may hold the DVs of many data files.
            frame = f.read(dv.size_in_bytes + 8)
    except FileNotFoundError as exc:
        raise CorruptLogError(f"deletion vector file is missing: {path}", uri=path, version=None) from exc
    if head != bytes([FORMAT_VERSION]):
        raise CorruptLogError(f"unsupported deletion vector file version {head!r}", uri=path, version=None)
    if len(frame) < 4:
        raise CorruptLogError(f"deletion vector truncated at offset {offset}", uri=path, version=None)
    (size,) = struct.unpack_from(">i", frame)
    if size != dv.size_in_bytes:
        raise CorruptLogError(
            f"deletion vector size mismatch at offset {offset}: file says {size}, "
            f"log says {dv.size_in_bytes}",
            uri=path,
            version=None,
        )
    if len(frame) < size + 8:
        raise CorruptLogError(f"deletion vector truncated at offset {offset}", uri=path, version=None)
    data = frame[4 : 4 + size]
    (crc,) = struct.unpack_from(">I", frame, 4 + size)
    if crc != zlib.crc32(data):
        raise CorruptLogError(f"deletion vector CRC-32 mismatch at offset {offset}", uri=path, version=None)
    return _check_cardinality(deserialize_bitmap(data, uri=path), dv, path)


def _absolute_fs_path(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return str(fs._strip_protocol(path)) if urlparse(path).scheme else path


def _check_cardinality(bitmap: RowBitmap, dv: DeletionVectorDescriptor, uri: str) -> RowBitmap:
    if len(bitmap) != dv.cardinality:
        raise CorruptLogError(
            f"deletion vector holds {len(bitmap)} rows, its descriptor says {dv.cardinality}",
            uri=uri,
            version=None,
        )
    return bitmap


# --------------------------------------------------------------------------- applying


def _row_index_array(bitmap: BitmapLike) -> np.ndarray:
    if isinstance(bitmap, AbstractBitMap64):
        return np.frombuffer(bitmap.to_array(), dtype=np.uint64)
    if isinstance(bitmap, AbstractBitMap):
        return np.frombuffer(bitmap.to_array(), dtype=np.uint32)
    return np.frombuffer(_as_bitmap64(bitmap).to_array(), dtype=np.uint64)


def deleted_mask(bitmap: BitmapLike, num_rows: int, *, uri: str = "") -> pa.BooleanArray:
    """Selection mask for a file of ``num_rows`` rows: True for rows the DV keeps."""
    keep = np.ones(num_rows, dtype=np.bool_)
    deleted = _row_index_array(bitmap)
    if deleted.size:
        # to_array is ascending, so the last index is the largest.
        if int(deleted[-1]) >= num_rows:
            raise CorruptLogError(
                f"deletion vector deletes row {int(deleted[-1])} of a {num_rows}-row file",
                uri=uri,
                version=None,
            )
        keep[deleted] = False
    # pa.array() on a numpy bool array converts element by element (~200 ms per 1M rows);
    # packing the bits ourselves into Arrow's LSB-first validity layout takes well under 1 ms.
    bits = np.packbits(keep, bitorder="little")
    return pa.BooleanArray.from_buffers(pa.bool_(), num_rows, [None, pa.py_buffer(bits.tobytes())])
