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
from collections.abc import Iterable, Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.json as pajson

from eventlog.log.actions import Action, ActionDecodeError, AddFile, Metadata, RemoveFile, decode_commit
from eventlog.log.filetable import (
    ADD_SCHEMA,
    ADD_STRUCT,
    DV_STRUCT,
    REMOVE_ACTION_SCHEMA,
    REMOVE_STRUCT,
    FileActions,
    conform,
    map_from_struct,
)

__all__ = ["DECODE_ERRORS", "BulkDecoder", "CommitHeader", "decode_file_actions", "decode_per_line"]

logger = logging.getLogger(__name__)

_ADD_PREFIX = b'{"add":'
_REMOVE_PREFIX = b'{"remove":'
_BATCH_BYTES = 16 << 20  # file lines parsed per Arrow call (bounds the temporary copies)
CHUNK_BYTES = 16 << 20  # how much of a big commit file is read at a time
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
        fields.append(pa.field("stats", pa.string()))  # kept with the commit's removes
    return pa.schema([pa.field(name, pa.struct(fields))])


_FREE = ("partitionValues", "tags")


def _parse_lines(body: bytes | memoryview, name: str, partition_columns: Sequence[str]) -> pa.Table:
    """Parse a buffer of ``{"add": ...}`` (or remove) lines into the flattened table."""
    struct, target = (ADD_STRUCT, ADD_SCHEMA) if name == "add" else (REMOVE_STRUCT, REMOVE_ACTION_SCHEMA)
    parsed = pajson.read_json(
        pa.BufferReader(body),
        read_options=pajson.ReadOptions(block_size=_BLOCK_BYTES),
        parse_options=pajson.ParseOptions(
            explicit_schema=_line_schema(name, struct, partition_columns), unexpected_field_behavior="infer"
        ),
    )
    tables = [_flatten(chunk, name, target) for chunk in parsed.column(name).chunks]  # no copy
    return pa.concat_tables(tables) if tables else target.empty_table()


def _flatten(col: pa.StructArray, name: str, target: pa.Schema) -> pa.Table:
    """One parsed chunk of ``{"add": {...}}`` rows as a table of ``target``'s columns."""
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
        pv = free == "partitionValues"  # a file without tags has none, not empty ones
        columns[free] = map_from_struct(value, keep_nulls=pv, null_as_empty=pv)
    if name == "add" and "partitionValues" not in columns:
        columns["partitionValues"] = map_from_struct(pa.array([{}] * len(col), pa.struct([])))
    table = pa.table({k: v for k, v in columns.items() if k in target.names})
    return conform(table, target)


class _ColumnsChanged(ValueError):
    """A metaData action changed the partition columns after file lines were parsed."""


class BulkDecoder:
    """Decodes commits one after the other, each given as chunks of its bytes, batching the
    file lines of all of them into few Arrow calls (see the module docstring).

    A commit larger than a chunk never sits in memory whole: long runs of add lines are
    parsed straight from each chunk. Partition columns come from ``partition_columns``
    (the table's before the first commit) and from metaData actions as they pass; one that
    changes them once file lines were parsed raises (the caller then decodes per line).
    """

    def __init__(self, partition_columns: Sequence[str] = ()) -> None:
        self.partition_columns: list[str] = list(partition_columns)
        self._columns_known = bool(partition_columns)
        self.headers: list[CommitHeader] = []
        self._lines: dict[str, list[bytes]] = {"add": [], "remove": []}
        self._counts: dict[str, list[tuple[int, int]]] = {"add": [], "remove": []}  # (version, lines)
        self._nbytes = 0
        self._parsed_any = False
        self._parts: list[FileActions] = []

    def commit(self, version: int, chunks: Iterable[bytes]) -> None:
        """Decode commit ``version`` from consecutive pieces of its file."""
        actions: list[Action] = []
        carry = b""
        for chunk in chunks:
            data = carry + chunk if carry else chunk
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            if cut:
                self._body(version, data if cut == len(data) else data[:cut], actions)
        if carry:
            self._body(version, carry, actions)
        odd = [a for a in actions if isinstance(a, AddFile | RemoveFile)]
        if odd:  # file actions spelled unusually: decoded as values
            adds = [a for a in odd if isinstance(a, AddFile)]
            self._parts.append(FileActions.of(version, adds, [a for a in odd if isinstance(a, RemoveFile)]))
            actions = [a for a in actions if not isinstance(a, AddFile | RemoveFile)]
        self.headers.append(CommitHeader(version, tuple(actions)))

    def finish(self) -> tuple[list[CommitHeader], FileActions]:
        self._flush()
        return self.headers, FileActions.concat(self._parts)

    # ------------------------------------------------------------------ internals

    def _body(self, version: int, body: bytes, actions: list[Action]) -> None:
        """Whole lines of one commit: a run of add lines is parsed in place, else split."""
        if not self._columns_known:
            self._learn_columns(body)
        lines = body.count(b"\n") + (not body.endswith(b"\n"))
        if body.startswith(_ADD_PREFIX) and body.count(b"\n" + _ADD_PREFIX) == lines - 1 and lines > 1:
            self._flush()
            table = _parse_lines(memoryview(body), "add", self.partition_columns)
            self._parts.append(_part("add", table, [(version, lines)]))
            self._parsed_any = True
            return
        adds: list[bytes] = []
        removes: list[bytes] = []
        others: list[bytes] = []
        for line in body.split(b"\n"):
            if line.startswith(_ADD_PREFIX):
                adds.append(line)
            elif line.startswith(_REMOVE_PREFIX):
                removes.append(line)
            elif line.strip():
                others.append(line)
        if others:
            decoded = decode_commit(b"\n".join(others))
            for action in decoded:
                if isinstance(action, Metadata) and list(action.partition_columns) != self.partition_columns:
                    if self._parsed_any or any(self._lines.values()):
                        raise _ColumnsChanged("the partition columns change within the commits")
                    self.partition_columns = list(action.partition_columns)
                self._columns_known |= isinstance(action, Metadata)
            actions.extend(decoded)
        self._gather(version, "add", adds)
        self._gather(version, "remove", removes)

    def _learn_columns(self, body: bytes) -> None:
        """With no metaData to go by (one commit read on its own), take the partition
        columns from the first file action's ``partitionValues`` keys: every file of a
        table has the same ones (a file that differs sends the batch to the exact codec)."""
        for prefix, kind in ((_ADD_PREFIX, "add"), (_REMOVE_PREFIX, "remove")):
            at = 0 if body.startswith(prefix) else body.find(b"\n" + prefix) + 1
            if at == 0 and not body.startswith(prefix):
                continue
            end = body.find(b"\n", at)
            values = orjson.loads(body[at : end if end >= 0 else len(body)])[kind].get("partitionValues")
            if isinstance(values, dict):
                self.partition_columns = [str(k) for k in values]
                self._columns_known = True
                return

    def _gather(self, version: int, kind: str, lines: list[bytes]) -> None:
        if not lines:
            return
        self._lines[kind] += lines
        self._counts[kind].append((version, len(lines)))
        self._nbytes += sum(map(len, lines))
        if self._nbytes >= _BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        for kind in ("add", "remove"):
            lines = self._lines[kind]
            if lines:
                table = _parse_lines(b"\n".join(lines), kind, self.partition_columns)
                self._parts.append(_part(kind, table, self._counts[kind]))
                self._parsed_any = True
            self._lines[kind] = []
            self._counts[kind] = []
        self._nbytes = 0


def _part(kind: str, table: pa.Table, counts: list[tuple[int, int]]) -> FileActions:
    versions = np.repeat(
        np.array([v for v, _ in counts], dtype=np.int64), np.array([c for _, c in counts], dtype=np.int64)
    )
    if len(versions) != table.num_rows:
        raise ValueError(f"{table.num_rows} {kind} rows parsed from {len(versions)} lines")
    none = np.zeros(0, dtype=np.int64)
    if kind == "add":
        return FileActions(table, versions, REMOVE_ACTION_SCHEMA.empty_table(), none)
    return FileActions(ADD_SCHEMA.empty_table(), none, table, versions)


DECODE_ERRORS = (pa.ArrowException, ValueError, KeyError, TypeError)  # the bulk path gives up


def decode_file_actions(
    items: Sequence[tuple[int, bytes]], partition_columns: Sequence[str] = ()
) -> tuple[list[CommitHeader], FileActions]:
    """Decode commits given as ``(version, file bytes)``: per commit its other actions, and
    all their file actions as Arrow tables (see the module docstring).
    ``partition_columns``: the table's, as of the commit before ``items``.

    Raises :class:`~eventlog.log.actions.ActionDecodeError` (with ``line``, and the failing
    version as ``version``) on a malformed commit.
    """
    try:
        decoder = BulkDecoder(partition_columns)
        for version, data in items:
            decoder.commit(version, (data,))
        return decoder.finish()
    except DECODE_ERRORS as exc:
        # Anything odd (or malformed): the exact per-line codec decides, and names the line.
        logger.debug("bulk decoding of versions %d.. fell back to the per-line codec: %s", items[0][0], exc)
    return decode_per_line(items)


def decode_per_line(items: Iterable[tuple[int, bytes]]) -> tuple[list[CommitHeader], FileActions]:
    """What :func:`decode_file_actions` returns, through the exact per-line codec."""
    headers: list[CommitHeader] = []
    parts: list[FileActions] = []
    for version, data in items:
        try:
            actions = decode_commit(data)
        except ActionDecodeError as exc:
            raise ActionDecodeError(str(exc), exc.line, version) from exc
        adds = [a for a in actions if isinstance(a, AddFile)]
        parts.append(FileActions.of(version, adds, [a for a in actions if isinstance(a, RemoveFile)]))
        headers.append(
            CommitHeader(version, tuple(a for a in actions if not isinstance(a, AddFile | RemoveFile)))
        )
    return headers, FileActions.concat(parts)
