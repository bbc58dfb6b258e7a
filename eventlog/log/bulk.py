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
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson

from eventlog.log.actions import Action, ActionDecodeError, AddFile, RemoveFile, decode_commit
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

_ADD_PREFIX = b'{"add":'
_REMOVE_PREFIX = b'{"remove":'
_BATCH_BYTES = 16 << 20  # file lines parsed per Arrow call (bounds the temporary copies)
_BLOCK_BYTES = 16 << 20  # Arrow's JSON block: the longest line it can take


@dataclasses.dataclass(frozen=True)
class CommitHeader:
    """One commit's actions other than add and remove, in file order."""

    version: int
    actions: tuple[Action, ...]


# --------------------------------------------------------------------------- parsing


_DV_LINES = pa.struct([f.with_nullable(True) for f in DV_STRUCT])  # a missing DV: a null struct


def _line_schema(name: str, struct: pa.StructType, free: set[str]) -> pa.Schema:
    """The explicit schema of one action kind's lines; ``free`` fields (JSON objects with
    arbitrary keys) are left out and inferred, then turned into maps."""
    fields = [f for f in struct if f.name not in free]
    if name == "remove":
        fields.append(pa.field("stats", pa.string()))  # parsed (to keep it a string), dropped
    fields = [
        f.with_nullable(True) if f.name != "deletionVector" else pa.field(f.name, _DV_LINES) for f in fields
    ]
    return pa.schema([pa.field(name, pa.struct(fields))])


_FREE = {"partitionValues", "tags"}
_ADD_LINES = _line_schema("add", ADD_STRUCT, _FREE)
_REMOVE_LINES = _line_schema("remove", REMOVE_STRUCT, _FREE)


def _parse_lines(body: bytes | memoryview, name: str) -> pa.Table:
    """Parse a buffer of ``{"add": ...}`` (or remove) lines into the flattened table."""
    schema, target = (_ADD_LINES, ADD_SCHEMA) if name == "add" else (_REMOVE_LINES, REMOVE_SCHEMA)
    parsed = pajson.read_json(
        pa.BufferReader(body),
        read_options=pajson.ReadOptions(block_size=_BLOCK_BYTES),
        parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"),
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
        if not pa.types.is_struct(value.type):
            raise ValueError(f"{name}.{free} is not a JSON object")
        columns[free] = map_from_struct(value, keep_nulls=free == "partitionValues")
    if name == "add" and "partitionValues" not in columns:
        columns["partitionValues"] = map_from_struct(pa.array([{}] * len(col), pa.struct([])))
    table = pa.table({k: v for k, v in columns.items() if k in target.names})
    return conform(table, target)


class _Batch:
    """File lines gathered from many commits, parsed in one Arrow call per kind."""

    def __init__(self) -> None:
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
        self.parts.append(_part(kind, _parse_lines(body, kind), [(version, count)]))

    def flush(self) -> None:
        for kind in ("add", "remove"):
            lines = self.lines[kind]
            if lines:
                self.parts.append(_part(kind, _parse_lines(b"\n".join(lines), kind), self.versions[kind]))
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


def _decode_fast(items: Sequence[tuple[int, bytes]]) -> tuple[list[CommitHeader], FileActions]:
    batch = _Batch()
    headers: list[CommitHeader] = []
    slow: list[FileActions] = []
    for version, data in items:
        rest = _bulk_blocks(batch, version, data) if len(data) > _BATCH_BYTES else data
        adds, removes, others = _split(rest)
        batch.add(version, "add", adds)
        batch.add(version, "remove", removes)
        actions = tuple(decode_commit(b"\n".join(others))) if others else ()
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


def decode_file_actions(items: Sequence[tuple[int, bytes]]) -> tuple[list[CommitHeader], FileActions]:
    """Decode commits given as ``(version, file bytes)``: per commit its other actions, and
    all their file actions as Arrow tables (see the module docstring).

    Raises :class:`~eventlog.log.actions.ActionDecodeError` (with ``line``, and the failing
    version as ``version``) on a malformed commit.
    """
    try:
        return _decode_fast(items)
    except (pa.ArrowException, ValueError, KeyError, TypeError):
        # Anything odd (or malformed): the exact per-line codec decides, and names the line.
        return _decode_slow(items)


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
