"""File actions as Arrow tables: the columnar form of ``add`` and ``remove`` events.

A table with hundreds of thousands of live files must not cost a Python object per file,
so snapshots, checkpoints and bulk-parsed commits carry their file actions as Arrow tables
whose columns are exactly the fields of the checkpoint's ``add`` and ``remove`` structs
(PROTOCOL.md "Checkpoints"): :data:`ADD_SCHEMA` and :data:`REMOVE_SCHEMA`. A checkpoint
is these rows wrapped in one struct column, and a checkpoint's rows flattened are these
tables, so neither direction builds objects.

:class:`~eventlog.log.actions.AddFile` and :class:`~eventlog.log.actions.RemoveFile`
remain the values operations work with; :func:`adds_table`/:func:`add_files` convert
between the two forms for the few files an operation touches.

Files are keyed by ``(path, deletion-vector unique id)`` (:func:`file_keys`), the key
under which the newest action wins when commits are folded.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar, cast, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventlog.log.actions import AddFile, DeletionVectorDescriptor, RemoveFile

__all__ = [
    "ActionSequence",
    "AddFiles",
    "FileActions",
    "RemoveFiles",
    "ADD_SCHEMA",
    "ADD_STRUCT",
    "DV_STRUCT",
    "REMOVE_ACTION_SCHEMA",
    "REMOVE_SCHEMA",
    "REMOVE_STRUCT",
    "add_files",
    "adds_table",
    "conform",
    "dv_ids",
    "file_keys",
    "map_from_struct",
    "remove_files",
    "removes_table",
]


def _f(name: str, typ: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable)


_STR = pa.string()
_LONG = pa.int64()
STRING_MAP = pa.map_(_STR, _STR)  # partitionValues and tags may hold null values

DV_STRUCT = pa.struct([
    _f("storageType", _STR, False),
    _f("pathOrInlineDv", _STR, False),
    _f("offset", pa.int32()),
    _f("sizeInBytes", pa.int32(), False),
    _f("cardinality", _LONG, False),
])  # fmt: skip
ADD_STRUCT = pa.struct([
    _f("path", _STR, False),
    _f("partitionValues", STRING_MAP, False),
    _f("size", _LONG, False),
    _f("modificationTime", _LONG, False),
    _f("dataChange", pa.bool_(), False),
    _f("stats", _STR),
    _f("tags", STRING_MAP),
    _f("deletionVector", DV_STRUCT),
    _f("baseRowId", _LONG),
    _f("defaultRowCommitVersion", _LONG),
    _f("clusteringProvider", _STR),
])  # fmt: skip
REMOVE_STRUCT = pa.struct([
    _f("path", _STR, False),
    _f("deletionTimestamp", _LONG),
    _f("dataChange", pa.bool_(), False),
    _f("extendedFileMetadata", pa.bool_()),
    _f("partitionValues", STRING_MAP),
    _f("size", _LONG),
    _f("deletionVector", DV_STRUCT),
    _f("baseRowId", _LONG),
    _f("defaultRowCommitVersion", _LONG),
])  # fmt: skip

# The flattened forms: one column per field. Nullability is relaxed at this level (a
# checkpoint writer re-checks the required fields); what is kept is names and types.
ADD_SCHEMA = pa.schema([f.with_nullable(True) for f in ADD_STRUCT])
REMOVE_SCHEMA = pa.schema([f.with_nullable(True) for f in REMOVE_STRUCT])
# A commit's remove actions also keep their stats (a tombstone does not need them).
REMOVE_ACTION_SCHEMA = pa.schema([*REMOVE_SCHEMA, pa.field("stats", _STR)])


# --------------------------------------------------------------------------- objects -> columns


def _items(m: Mapping[str, Any] | None) -> list[tuple[str, Any]] | None:
    return None if m is None else list(m.items())


def _dv(dv: DeletionVectorDescriptor | None) -> dict[str, Any] | None:
    if dv is None:
        return None
    return {
        "storageType": dv.storage_type,
        "pathOrInlineDv": dv.path_or_inline_dv,
        "offset": dv.offset,
        "sizeInBytes": dv.size_in_bytes,
        "cardinality": dv.cardinality,
    }


def _from_rows(schema: pa.Schema, rows: Sequence[tuple[Any, ...]]) -> pa.Table:
    if not rows:
        return schema.empty_table()
    columns = list(zip(*rows, strict=True))
    return pa.Table.from_arrays(
        [pa.array(col, f.type) for f, col in zip(schema, columns, strict=True)], schema=schema
    )


def adds_table(adds: Sequence[AddFile]) -> pa.Table:
    """``adds`` as a table of :data:`ADD_SCHEMA` (in the same order)."""
    return _from_rows(
        ADD_SCHEMA,
        [
            (
                a.path, list(a.partition_values.items()), a.size, a.modification_time, a.data_change,
                a.stats, _items(a.tags), _dv(a.deletion_vector), a.base_row_id,
                a.default_row_commit_version, a.clustering_provider,
            )
            for a in adds
        ],
    )  # fmt: skip


def removes_table(removes: Sequence[RemoveFile], *, keep_stats: bool = False) -> pa.Table:
    """``removes`` as a table of :data:`REMOVE_SCHEMA`, or with ``keep_stats`` of
    :data:`REMOVE_ACTION_SCHEMA` (a tombstone needs no stats, and checkpoints leave them
    out; a commit's removes keep them)."""
    rows = [
        (
            r.path, r.deletion_timestamp, r.data_change, r.extended_file_metadata,
            _items(r.partition_values), r.size, _dv(r.deletion_vector), r.base_row_id,
            r.default_row_commit_version,
        )
        for r in removes
    ]  # fmt: skip
    if not keep_stats:
        return _from_rows(REMOVE_SCHEMA, rows)
    return _from_rows(REMOVE_ACTION_SCHEMA, [(*row, r.stats) for row, r in zip(rows, removes, strict=True)])


@dataclasses.dataclass(frozen=True)
class FileActions:
    """Add and remove actions of some commits, with the version of each row.

    ``adds`` has :data:`~eventlog.log.filetable.ADD_SCHEMA`, ``removes``
    :data:`~eventlog.log.filetable.REMOVE_ACTION_SCHEMA`; ``add_versions``/``remove_versions`` give
    each row's commit version (rows of one version are in no particular order: a commit never
    adds and removes the same file, so their order does not matter to the fold).
    """

    adds: pa.Table
    add_versions: np.ndarray
    removes: pa.Table
    remove_versions: np.ndarray

    @staticmethod
    def empty() -> FileActions:
        none = np.zeros(0, dtype=np.int64)
        return FileActions(ADD_SCHEMA.empty_table(), none, REMOVE_ACTION_SCHEMA.empty_table(), none)

    @staticmethod
    def of(version: int, adds: Sequence[AddFile], removes: Sequence[RemoveFile]) -> FileActions:
        """One commit's file actions given as values."""
        return FileActions(
            adds_table(adds),
            np.full(len(adds), version, dtype=np.int64),
            removes_table(removes, keep_stats=True),
            np.full(len(removes), version, dtype=np.int64),
        )

    @staticmethod
    def concat(parts: Iterable[FileActions]) -> FileActions:
        parts = [p for p in parts if p.adds.num_rows or p.removes.num_rows]
        if not parts:
            return FileActions.empty()
        if len(parts) == 1:
            return parts[0]
        return FileActions(
            pa.concat_tables([p.adds for p in parts]),
            np.concatenate([p.add_versions for p in parts]),
            pa.concat_tables([p.removes for p in parts]),
            np.concatenate([p.remove_versions for p in parts]),
        )

    @property
    def is_empty(self) -> bool:
        return int(self.adds.num_rows) == 0 and int(self.removes.num_rows) == 0


# --------------------------------------------------------------------------- columns -> objects


def _dict(pairs: list[tuple[str, Any]] | None) -> dict[str, Any] | None:
    return None if pairs is None else dict(pairs)


def _dvs(values: list[Any]) -> list[DeletionVectorDescriptor | None]:
    return [DeletionVectorDescriptor.from_json(d) if d else None for d in values]


def _columns(table: pa.Table, schema: pa.Schema) -> list[list[Any]]:
    return [table.column(f.name).to_pylist() for f in schema]


def add_files(table: pa.Table) -> list[AddFile]:
    """The rows of an :data:`ADD_SCHEMA` table as :class:`AddFile` values, in order."""
    table = conform(table, ADD_SCHEMA)
    p, pv, s, mt, dc, st, tg, dv, br, drv, cp = _columns(table, ADD_SCHEMA)
    return [
        AddFile(
            path=p_, partition_values=dict(pv_) if pv_ is not None else {}, size=int(s_ or 0),
            modification_time=int(mt_ or 0), data_change=True if dc_ is None else bool(dc_),
            stats=st_, tags=_dict(tg_), deletion_vector=dv_, base_row_id=br_,
            default_row_commit_version=drv_, clustering_provider=cp_,
        )
        for p_, pv_, s_, mt_, dc_, st_, tg_, dv_, br_, drv_, cp_ in zip(
            p, pv, s, mt, dc, st, tg, _dvs(dv), br, drv, cp, strict=True
        )
    ]  # fmt: skip


def remove_files(table: pa.Table) -> list[RemoveFile]:
    """The rows of a :data:`REMOVE_SCHEMA` (or :data:`REMOVE_ACTION_SCHEMA`) table as
    :class:`RemoveFile` values, in order."""
    n = table.num_rows
    stats = table.column("stats").to_pylist() if "stats" in table.column_names else [None] * n
    table = conform(table, REMOVE_SCHEMA)
    p, ts, dc, ext, pv, s, dv, br, drv = _columns(table, REMOVE_SCHEMA)
    return [
        RemoveFile(
            path=p_, deletion_timestamp=ts_, data_change=True if dc_ is None else bool(dc_),
            extended_file_metadata=ext_, partition_values=_dict(pv_), size=s_, stats=st_,
            deletion_vector=dv_, base_row_id=br_, default_row_commit_version=drv_,
        )
        for p_, ts_, dc_, ext_, pv_, s_, dv_, br_, drv_, st_ in zip(
            p, ts, dc, ext, pv, s, _dvs(dv), br, drv, stats, strict=True
        )
    ]  # fmt: skip


# --------------------------------------------------------------------------- lazy sequences

_T = TypeVar("_T", AddFile, RemoveFile)


class ActionSequence(Sequence[_T], Generic[_T]):
    """File actions held as an Arrow table and offered as a sequence of action objects.

    Built from either form; the other is derived on first use and kept. ``len`` never
    builds objects. Equal to any sequence holding equal actions in the same order.
    """

    __slots__ = ("_items", "_table")
    SCHEMA: ClassVar[pa.Schema]

    def __init__(self, table: pa.Table | None = None, items: Sequence[_T] | None = None) -> None:
        if table is None and items is None:
            raise ValueError("ActionSequence needs a table or items")
        self._table: pa.Table | None = table
        self._items: Sequence[_T] | None = items

    @classmethod
    def of(cls, value: Any) -> Self:
        """``value`` (a sequence of actions, an Arrow table, or one of these) as ``cls``."""
        if isinstance(value, cls):
            return value
        if isinstance(value, ActionSequence):
            raise TypeError(f"expected {cls.__name__}, got {type(value).__name__}")
        if isinstance(value, pa.Table):
            return cls(table=conform(value, cls.SCHEMA))
        return cls(items=list(value))

    @abstractmethod
    def _to_table(self, items: Sequence[_T]) -> pa.Table:
        """The values as a table of :attr:`SCHEMA`."""

    @abstractmethod
    def _to_items(self, table: pa.Table) -> list[_T]:
        """The rows of a :attr:`SCHEMA` table as values."""

    @property
    def table(self) -> pa.Table:
        """The actions as a table of :attr:`SCHEMA` (built from the objects on first use)."""
        if self._table is None:
            self._table = self._to_table(cast(Sequence[_T], self._items))
        return self._table

    def _objects(self) -> Sequence[_T]:
        if self._items is None:
            items: Sequence[_T] = self._to_items(self._table)
            self._items = items
            return items
        return self._items

    def __len__(self) -> int:
        if self._items is not None:
            return len(self._items)
        return int(self.table.num_rows)

    @overload
    def __getitem__(self, index: int) -> _T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[_T]: ...
    def __getitem__(self, index: int | slice) -> _T | Sequence[_T]:
        if self._items is None and isinstance(index, int) and self._table is not None:
            n = self._table.num_rows
            if not -n <= index < n:
                raise IndexError(index)
            return self._to_items(self._table.slice(index % n, 1))[0]  # one value, not all
        return self._objects()[index]

    def __iter__(self) -> Iterator[_T]:
        return iter(self._objects())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ActionSequence):
            if type(other) is not type(self):
                return False
            if self._table is not None and other._table is not None and self._table.equals(other._table):
                return True
            return list(self) == list(other)
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} files)"


class AddFiles(ActionSequence[AddFile]):
    """``add`` actions: an :data:`~eventlog.log.filetable.ADD_SCHEMA` table."""

    __slots__ = ()
    SCHEMA = ADD_SCHEMA

    def _to_table(self, items: Sequence[AddFile]) -> pa.Table:
        return adds_table(items)

    def _to_items(self, table: pa.Table) -> list[AddFile]:
        return add_files(table)


class RemoveFiles(ActionSequence[RemoveFile]):
    """``remove`` actions: a :data:`REMOVE_SCHEMA` table (tombstones, without stats), or a
    commit's :data:`REMOVE_ACTION_SCHEMA` table (with them)."""

    __slots__ = ()
    SCHEMA = REMOVE_SCHEMA

    def _to_table(self, items: Sequence[RemoveFile]) -> pa.Table:
        return removes_table(items)

    def _to_items(self, table: pa.Table) -> list[RemoveFile]:
        return remove_files(table)


# --------------------------------------------------------------------------- shape


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns, in order: missing columns (and missing
    fields of the deletion-vector struct) become nulls, others are cast, extra ones dropped.

    Foreign checkpoints differ in small ways (an ``offset`` field left out, ``int64`` sizes,
    extra columns such as ``stats_parsed``): readers accept all of them.
    """
    if table.schema.equals(schema):
        return table
    n = table.num_rows
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pa.nulls(n, field.type))
            continue
        col = table.column(field.name)
        if col.type != field.type:
            col = _cast(col, field.type)
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def _cast(col: pa.ChunkedArray, typ: pa.DataType) -> pa.ChunkedArray:
    if pa.types.is_struct(typ) and pa.types.is_struct(col.type):
        chunks = []
        for chunk in col.chunks:
            have = {chunk.type.field(i).name for i in range(chunk.type.num_fields)}
            children = [
                chunk.field(f.name).cast(f.type) if f.name in have else pa.nulls(len(chunk), f.type)
                for f in typ
            ]
            chunks.append(pa.StructArray.from_arrays(children, fields=list(typ), mask=chunk.is_null()))
        return pa.chunked_array(chunks, typ)
    if pa.types.is_map(typ) and pa.types.is_struct(col.type):
        return pa.chunked_array([map_from_struct(c) for c in col.chunks], typ)
    return col.cast(typ)


def map_from_struct(
    arr: pa.StructArray, *, keep_nulls: bool = True, null_as_empty: bool = True
) -> pa.MapArray:
    """A ``map<string, string>`` with one entry per struct field of each row.

    JSON objects with free keys (``partitionValues``, ``tags``) come out of Arrow's JSON
    reader as structs over the union of keys seen; this turns them back into the maps the
    protocol means. A null struct becomes an empty map (``null_as_empty``) or a null map;
    with ``keep_nulls=False`` entries whose value is null are left out (a tag is absent,
    not null).
    """
    n = len(arr)
    names = [arr.type.field(i).name for i in range(arr.type.num_fields)]
    k = len(names)
    valid = np.ones(n, dtype=bool) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
    mask = None if null_as_empty or arr.null_count == 0 else pa.array(~valid)
    if k == 0:
        offsets = pa.array(np.zeros(n + 1, dtype=np.int32))
        return pa.MapArray.from_arrays(
            offsets, pa.array([], _STR), pa.array([], _STR), type=STRING_MAP, mask=mask
        )
    children = [
        (arr.field(i) if arr.type.field(i).type == _STR else arr.field(i).cast(_STR)) for i in range(k)
    ]
    # Row-major interleave: entry j of row i is child j at i.
    values = pa.concat_arrays(children)
    order = (np.arange(k, dtype=np.int64)[None, :] * n + np.arange(n, dtype=np.int64)[:, None]).ravel()
    keys_np = np.tile(np.array(names, dtype=object), n)
    keep = np.repeat(valid, k)
    if not keep_nulls:
        keep &= values.is_valid().to_numpy(zero_copy_only=False)[order]
    counts = keep.reshape(n, k).sum(axis=1) if n else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    idx = order[keep]
    items = values.take(pa.array(idx))
    keys = pa.array(keys_np[keep], _STR)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, items, type=STRING_MAP, mask=mask)


# --------------------------------------------------------------------------- keys


def dv_ids(deletion_vectors: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Each row's deletion-vector unique id (``storageType + pathOrInlineDv [+ '@' + offset]``,
    :attr:`DeletionVectorDescriptor.unique_id`), null where the file has no DV."""
    dv = deletion_vectors
    if dv.null_count == len(dv):
        return pa.nulls(len(dv), _STR)
    base = pc.binary_join_element_wise(
        pc.struct_field(dv, "storageType"), pc.struct_field(dv, "pathOrInlineDv"), ""
    )
    offset = pc.struct_field(dv, "offset")
    with_offset = pc.binary_join_element_wise(base, pc.cast(offset, _STR), "@")
    ids = pc.if_else(pc.is_null(offset), base, with_offset)
    return pc.if_else(pc.is_valid(dv), ids, pa.scalar(None, _STR))


def file_keys(table: pa.Table) -> pa.ChunkedArray | pa.Array:
    """One string per row that identifies the file: its path, and its deletion vector's
    unique id after a NUL when it has one (no path holds a NUL)."""
    paths = table.column("path")
    ids = dv_ids(table.column("deletionVector"))
    if ids.null_count == len(ids):
        return paths
    joined = pc.binary_join_element_wise(paths, ids, "\x00")  # null where ids is null
    return pc.if_else(pc.is_null(ids), paths, joined)
