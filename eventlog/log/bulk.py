"""Commits decoded column-wise: many commit files' add and remove actions as Arrow tables.

Folding a snapshot needs every file action since the checkpoint, and those can number in
the hundreds of thousands. :func:`decode_file_actions` sends the ``add`` and ``remove``
lines of a whole range of commits, batched, through Arrow's multi-threaded JSON reader with
an explicit schema; only the few other lines (commitInfo, metaData, protocol, txn, ...)
become Python values, through the exact per-line codec of :mod:`eventlog.log.actions`.

Lines are routed by their first bytes (``{"add":`` / ``{"remove":``, as every Delta writer
lays them out); any other spelling takes the per-line path, as does a whole batch the Arrow
reader refuses (a ``stats`` object instead of a string, a number written as a string...).
So the result is always what the per-line codec gives, and a malformed commit raises the
same :class:`~eventlog.log.actions.ActionDecodeError` naming its line.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from eventlog.log.actions import Action, ActionDecodeError, AddFile, Metadata, RemoveFile, decode_commit
from eventlog.log.filetable import (
    ADD_SCHEMA,
    ADD_STRUCT,
    DV_STRUCT,
    REMOVE_SCHEMA,
    REMOVE_STRUCT,
    FileActions,
    conform,
    map_from_struct,
)

__all__ = ["CommitHeader", "decode_file_actions"]

logger = logging.getLogger(__name__)

_ADD_PREFIX = b'{"add":'
_REMOVE_PREFIX = b'{"remove":'
_METADATA_PREFIX = b'{"metaData":'
_BATCH_BYTES = 16 << 20  # file lines parsed per Arrow call (bounds the temporary copies)
_BLOCK_BYTES = 16 << 20  # Arrow's JSON block: the longest line it can take


@dataclasses.dataclass(frozen=True)
class CommitHeader:
    """One commit's actions other than add and remove, in file order."""

    version: int
    actions: tuple[Action, ...]


# --------------------------------------------------------------------------- parsing


_DV_LINES = pa.struct([f.with_nullable(True) for f in DV_STRUCT])  # a missing DV: a null struct


def _line_schema(name: str, struct: pa.StructType, partition_columns: Sequence[str]) -> pa.Schema:
    """The explicit schema of one action kind's lines.

    ``partitionValues`` is a struct of the known partition columns (as strings: Arrow's
    inference would read ``"2024-01-01"`` as a timestamp); ``tags`` (free keys) is
    inferred. Both are turned into maps after parsing, and any inferred value that is not
    a string sends the batch to the exact per-line codec.
    """
    fields = []
    for f in struct:
        if f.name == "tags":
            continue
        if f.name == "partitionValues":
            fields.append(pa.field(f.name, pa.struct([pa.field(c, pa.string()) for c in partition_columns])))
        elif f.name == "deletionVector":
            fields.append(pa.field(f.name, _DV_LINES))
        else:
            fields.append(f.with_nullable(True))
    if name == "remove":
        fields.append(pa.field("stats", pa.string()))  # parsed (to keep it a string), dropped
    return pa.schema([pa.field(name, pa.struct(fields))])


_FREE = ("partitionValues", "tags")


def _parse_lines(body: bytes | memoryview, name: str, partition_columns: Sequence[str]) -> pa.Table:
    """Parse a buffer of ``{"add": ...}`` (or remove) lines into the flattened table."""
    struct, target = (ADD_STRUCT, ADD_SCHEMA) if name == "add" else (REMOVE_STRUCT, REMOVE_SCHEMA)
    parsed = pajson.read_json(
        pa.BufferReader(body),
        read_options=pajson.ReadOptions(block_size=_BLOCK_BYTES),
        parse_options=pajson.ParseOptions(
            explicit_schema=_line_schema(name, struct, partition_columns), unexpected_field_behavior="infer"
        ),
    )
    col = parsed.column(name).combine_chunks()
    if col.null_count:
        raise ValueError(f"a {name} line holds null")
    inner = col.type
    names = [inner.field(i).name for i in range(inner.num_fields)]
    columns: dict[str, pa.Array] = dict(zip(names, col.flatten(), strict=True))
    for free in _FREE:
        value = columns.get(free)
        if value is None:
            continue
        if pa.types.is_null(value.type):
            value = pa.array([{}] * len(value), pa.struct([]))
        if not pa.types.is_struct(value.type) or not all(
            pa.types.is_string(t.type) or pa.types.is_null(t.type) for t in value.type
        ):
            raise ValueError(f"{name}.{free} is not an object of strings")
        columns[free] = map_from_struct(value, keep_nulls=free == "partitionValues")
    if name == "add" and "partitionValues" not in columns:
        columns["partitionValues"] = map_from_struct(pa.array([{}] * len(col), pa.struct([])))
    table = pa.table({k: v for k, v in columns.items() if k in target.names})
    return conform(table, target)


class _Batch:
    """File lines gathered from many commits, parsed in one Arrow call per kind."""

    def __init__(self, partition_columns: Sequence[str]) -> None:
        self.partition_columns: list[str] = list(partition_columns)
        self.lines: dict[str, list[bytes]] = {"add": [], "remove": []}
        self.versions: dict[str, list[tuple[int, int]]] = {"add": [], "remove": []}  # (version, count)
        self.nbytes = 0
        self.parts: list[FileActions] = []

    def add(self, version: int, kind: str, lines: list[bytes]) -> None:
        if lines:
            self.lines[kind] += lines
            self.versions[kind].append((version, len(lines)))
            self.nbytes += sum(map(len, lines))
        if self.nbytes >= _BATCH_BYTES:
            self.flush()

    def add_block(self, version: int, kind: str, body: memoryview, count: int) -> None:
        """A block of one commit that holds only ``kind`` lines: parsed without copying."""
        self.flush()
        self.parts.append(_part(kind, _parse_lines(body, kind, self.partition_columns), [(version, count)]))

    def flush(self) -> None:
        for kind in ("add", "remove"):
            lines = self.lines[kind]
            if lines:
                table = _parse_lines(b"\n".join(lines), kind, self.partition_columns)
                self.parts.append(_part(kind, table, self.versions[kind]))
            self.lines[kind] = []
            self.versions[kind] = []
        self.nbytes = 0


def _part(kind: str, table: pa.Table, counts: list[tuple[int, int]]) -> FileActions:
    versions = np.repeat(
        np.array([v for v, _ in counts], dtype=np.int64), np.array([c for _, c in counts], dtype=np.int64)
    )
    if len(versions) != table.num_rows:
        raise ValueError(f"{table.num_rows} {kind} rows parsed from {len(versions)} lines")
    none = np.zeros(0, dtype=np.int64)
    if kind == "add":
        return FileActions(table, versions, REMOVE_SCHEMA.empty_table(), none)
    return FileActions(ADD_SCHEMA.empty_table(), none, table, versions)


def _split(data: bytes) -> tuple[list[bytes], list[bytes], list[bytes]]:
    adds: list[bytes] = []
    removes: list[bytes] = []
    others: list[bytes] = []
    for line in data.split(b"\n"):
        if line.startswith(_ADD_PREFIX):
            adds.append(line)
        elif line.startswith(_REMOVE_PREFIX):
            removes.append(line)
        elif line.strip():
            others.append(line)
    return adds, removes, others


def _decode_fast(
    items: Sequence[tuple[int, bytes]], partition_columns: Sequence[str]
) -> tuple[list[CommitHeader], FileActions]:
    batch = _Batch(partition_columns)
    headers: list[CommitHeader] = []
    slow: list[FileActions] = []
    for version, data in items:
        rest = _bulk_blocks(batch, version, data) if len(data) > _BATCH_BYTES else data
        adds, removes, others = _split(rest)
        actions = tuple(decode_commit(b"\n".join(others))) if others else ()
        for action in actions:  # a new metaData may name new partition columns
            if isinstance(action, Metadata):
                batch.partition_columns += [
                    c for c in action.partition_columns if c not in batch.partition_columns
                ]
        batch.add(version, "add", adds)
        batch.add(version, "remove", removes)
        odd = [a for a in actions if isinstance(a, AddFile | RemoveFile)]
        if odd:  # file actions spelled unusually: decoded as values above
            slow.append(
                FileActions.of(
                    version,
                    [a for a in odd if isinstance(a, AddFile)],
                    [a for a in odd if isinstance(a, RemoveFile)],
                )
            )
            actions = tuple(a for a in actions if not isinstance(a, AddFile | RemoveFile))
        headers.append(CommitHeader(version, actions))
    batch.flush()
    return headers, FileActions.concat([*batch.parts, *slow])


def _bulk_blocks(batch: _Batch, version: int, data: bytes) -> bytes:
    """Parse the long runs of add lines of a big commit in place (no split, no copy), and
    return what is left for the line-by-line split: the commit's head (commitInfo,
    metaData... before the first add line) and whatever follows the last pure block."""
    start = data.find(b"\n" + _ADD_PREFIX)
    if start < 0:
        return data
    start += 1
    view = memoryview(data)
    pos, end = start, len(data)
    while pos < end:
        stop = data.find(b"\n", min(pos + _BATCH_BYTES, end))
        stop = end if stop < 0 else stop
        lines = data.count(b"\n", pos, stop) + 1
        if data.count(b"\n" + _ADD_PREFIX, pos, stop) != lines - 1:
            break  # the block mixes in other lines: split from here on
        batch.add_block(version, "add", view[pos:stop], lines)
        pos = stop + 1
    return data[:start] + data[pos:] if pos < end else data[:start]


def decode_file_actions(
    items: Sequence[tuple[int, bytes]], partition_columns: Sequence[str] = ()
) -> tuple[list[CommitHeader], FileActions]:
    """Decode commits given as ``(version, file bytes)``: per commit its other actions, and
    all their file actions as Arrow tables (see the module docstring).
    ``partition_columns``: the table's, as of the commit before ``items`` (later metaData
    actions among them are taken into account).

    Raises :class:`~eventlog.log.actions.ActionDecodeError` (with ``line``, and the failing
    version as ``version``) on a malformed commit.
    """
    try:
        columns = _partition_columns(items, partition_columns)
        if columns is not None:
            return _decode_fast(items, columns)
    except (pa.ArrowException, ValueError, KeyError, TypeError) as exc:
        # Anything odd (or malformed): the exact per-line codec decides, and names the line.
        logger.debug("bulk decoding of versions %d.. fell back to the per-line codec: %s", items[0][0], exc)
    return _decode_slow(items)


def _partition_columns(items: Sequence[tuple[int, bytes]], known: Sequence[str]) -> list[str] | None:
    """The partition columns in force across ``items``, or None when a metaData action among
    them changes them (rare: the per-line codec then keeps each file's keys exactly)."""
    columns: list[str] | None = list(known) if known else None
    for _, data in items:
        at = data.find(_METADATA_PREFIX)
        while at >= 0:
            if at == 0 or data[at - 1 : at] == b"\n":
                end = data.find(b"\n", at)
                (action,) = decode_commit(data[at : end if end >= 0 else len(data)])
                assert isinstance(action, Metadata)
                if columns is not None and list(action.partition_columns) != columns:
                    return None
                columns = list(action.partition_columns)
            at = data.find(_METADATA_PREFIX, at + 1)
    return columns or []


def _decode_slow(items: Sequence[tuple[int, bytes]]) -> tuple[list[CommitHeader], FileActions]:
    headers: list[CommitHeader] = []
    parts: list[FileActions] = []
    for version, data in items:
        try:
            actions = decode_commit(data)
        except ActionDecodeError as exc:
            raise ActionDecodeError(str(exc), exc.line, version) from exc
        parts.append(
            FileActions.of(
                version,
                [a for a in actions if isinstance(a, AddFile)],
                [a for a in actions if isinstance(a, RemoveFile)],
            )
        )
        headers.append(
            CommitHeader(version, tuple(a for a in actions if not isinstance(a, AddFile | RemoveFile)))
        )
    return headers, FileActions.concat(parts)
