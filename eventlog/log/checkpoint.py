"""Delta Lake classic checkpoints: the folded table state as one Parquet file.

A checkpoint at version ``v`` is ``_delta_log/<20-digit v>.checkpoint.parquet``: one row
per action, the top-level nullable struct columns ``txn``, ``add``, ``remove``,
``metaData``, ``protocol`` and ``domainMetadata``, exactly one of them non-null per row
(PROTOCOL.md "Checkpoints", V1 spec, classic naming). ``_delta_log/_last_checkpoint`` is a
JSON pointer to the newest one. Field names, types and nullability match what delta-rs
(delta-kernel) writes, so delta-rs and Delta Spark open tables whose early JSON commits
were deleted and only our checkpoint remains.

Per the protocol the checkpoint never holds ``commitInfo``/``cdc``, ``remove`` carries no
``stats``/``tags``, and domain metadata tombstones (``removed=true``) are left out.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from eventlog.errors import CorruptLogError
from eventlog.log.actions import (
    AddFile,
    DeletionVectorDescriptor,
    DomainMetadata,
    Format,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)

__all__ = [
    "LAST_CHECKPOINT",
    "CHECKPOINT_SCHEMA",
    "CheckpointState",
    "checkpoint_path",
    "find_latest_checkpoint",
    "read_checkpoint",
    "read_last_checkpoint",
    "write_checkpoint",
]

LAST_CHECKPOINT = "_last_checkpoint"

# Only the single-file V1 name; multi-part (<v>.checkpoint.<o>.<p>.parquet), UUID-named V2
# (<v>.checkpoint.<uuid>.{json,parquet}) and _sidecars/ never match.
_CHECKPOINT_RE = re.compile(r"^(\d{20})\.checkpoint\.parquet$")

# --------------------------------------------------------------------------- schema


def _f(name: str, typ: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, typ, nullable=nullable)


_STR = pa.string()
_LONG = pa.int64()
# partitionValues/tags may hold null values; format.options/configuration may not.
_MAP = pa.map_(_STR, _STR)
_MAP_NN = pa.map_(_STR, _f("value", _STR, False))
_LIST_NN = pa.list_(_f("element", _STR, False))

_DV = pa.struct([
    _f("storageType", _STR, False),
    _f("pathOrInlineDv", _STR, False),
    _f("offset", pa.int32()),
    _f("sizeInBytes", pa.int32(), False),
    _f("cardinality", _LONG, False),
])  # fmt: skip
_TXN = pa.struct([_f("appId", _STR, False), _f("version", _LONG, False), _f("lastUpdated", _LONG)])
_ADD = pa.struct([
    _f("path", _STR, False),
    _f("partitionValues", _MAP, False),
    _f("size", _LONG, False),
    _f("modificationTime", _LONG, False),
    _f("dataChange", pa.bool_(), False),
    _f("stats", _STR),
    _f("tags", _MAP),
    _f("deletionVector", _DV),
    _f("baseRowId", _LONG),
    _f("defaultRowCommitVersion", _LONG),
])  # fmt: skip
_REMOVE = pa.struct([
    _f("path", _STR, False),
    _f("deletionTimestamp", _LONG),
    _f("dataChange", pa.bool_(), False),
    _f("extendedFileMetadata", pa.bool_()),
    _f("partitionValues", _MAP),
    _f("size", _LONG),
    _f("deletionVector", _DV),
    _f("baseRowId", _LONG),
    _f("defaultRowCommitVersion", _LONG),
])  # fmt: skip
_METADATA = pa.struct([
    _f("id", _STR, False),
    _f("name", _STR),
    _f("description", _STR),
    _f("format", pa.struct([_f("provider", _STR, False), _f("options", _MAP_NN, False)]), False),
    _f("schemaString", _STR, False),
    _f("partitionColumns", _LIST_NN, False),
    _f("createdTime", _LONG),
    _f("configuration", _MAP_NN, False),
])  # fmt: skip
_PROTOCOL = pa.struct([
    _f("minReaderVersion", pa.int32(), False),
    _f("minWriterVersion", pa.int32(), False),
    _f("readerFeatures", _LIST_NN),
    _f("writerFeatures", _LIST_NN),
])  # fmt: skip
_DOMAIN = pa.struct([
    _f("domain", _STR, False), _f("configuration", _STR, False), _f("removed", pa.bool_(), False)
])  # fmt: skip

CHECKPOINT_SCHEMA = pa.schema([
    _f("txn", _TXN),
    _f("add", _ADD),
    _f("remove", _REMOVE),
    _f("metaData", _METADATA),
    _f("protocol", _PROTOCOL),
    _f("domainMetadata", _DOMAIN),
])  # fmt: skip

# Sub-fields that must be non-null in every row of a column (else the file is corrupt).
_REQUIRED: dict[str, tuple[str, ...]] = {
    "txn": ("appId", "version"),
    "add": ("path", "size", "modificationTime"),
    "remove": ("path",),
    "metaData": ("id", "schemaString"),
    "protocol": ("minReaderVersion", "minWriterVersion"),
    "domainMetadata": ("domain",),
}


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """The reconciled table state at ``version``: what a checkpoint stores."""

    version: int
    protocol: Protocol
    metadata: Metadata
    adds: Sequence[AddFile]
    removes: Sequence[RemoveFile]
    txns: Sequence[SetTransaction]
    domains: Sequence[DomainMetadata]
    # SHA-256 of commit ``version``'s bytes (the head of the tamper-evidence chain), kept in
    # the Parquet footer's key-value metadata, which Delta readers ignore; verification
    # continues from it after older commits are cleaned up (eventlog.log.verify).
    chain_head: str | None = None


def checkpoint_path(log_dir: str, version: int) -> str:
    """Path of the classic single-file checkpoint for ``version`` in ``log_dir``."""
    return f"{log_dir.rstrip('/')}/{version:020d}.checkpoint.parquet"


def _last_checkpoint_path(log_dir: str) -> str:
    return f"{log_dir.rstrip('/')}/{LAST_CHECKPOINT}"


# --------------------------------------------------------------------------- write


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


def _add_row(a: AddFile, with_stats: bool) -> tuple[Any, ...]:
    return (
        a.path, list(a.partition_values.items()), a.size, a.modification_time, a.data_change,
        a.stats if with_stats else None, _items(a.tags), _dv(a.deletion_vector), a.base_row_id,
        a.default_row_commit_version,
    )  # fmt: skip


def _remove_row(r: RemoveFile) -> tuple[Any, ...]:
    return (
        r.path, r.deletion_timestamp, r.data_change, r.extended_file_metadata,
        _items(r.partition_values), r.size, _dv(r.deletion_vector), r.base_row_id,
        r.default_row_commit_version,
    )  # fmt: skip


def _metadata_row(m: Metadata) -> tuple[Any, ...]:
    fmt = {"provider": m.format.provider, "options": list(m.format.options.items())}
    return (
        m.id, m.name, m.description, fmt, m.schema_string, list(m.partition_columns),
        m.created_time, list(m.configuration.items()),
    )  # fmt: skip


def _protocol_row(p: Protocol) -> tuple[Any, ...]:
    # PROTOCOL.md: readerFeatures must be non-null iff reader version 3, writerFeatures
    # iff writer version 7; below those versions the values must be null.
    rf = list(p.reader_features or ()) if p.min_reader_version >= 3 else None
    wf = list(p.writer_features or ()) if p.min_writer_version >= 7 else None
    return (p.min_reader_version, p.min_writer_version, rf, wf)


def _struct(typ: pa.StructType, rows: Sequence[tuple[Any, ...]]) -> pa.Array:
    """Build a struct array column-wise from row tuples (in the type's field order)."""
    if not rows:
        return pa.array([], typ)
    columns = list(zip(*rows, strict=True))
    children = [pa.array(col, typ.field(i).type) for i, col in enumerate(columns)]
    return pa.StructArray.from_arrays(children, fields=list(typ))


def _build_table(state: CheckpointState) -> pa.Table:
    with_stats = state.metadata.configuration.get("delta.checkpoint.writeStatsAsJson", "true") != "false"
    # Each action kind occupies one contiguous block of rows; every other column is null
    # there. Order does not matter to readers; protocol and metadata first helps humans.
    blocks: list[tuple[str, pa.Array]] = [
        ("protocol", _struct(_PROTOCOL, [_protocol_row(state.protocol)])),
        ("metaData", _struct(_METADATA, [_metadata_row(state.metadata)])),
        ("txn", _struct(_TXN, [(t.app_id, t.version, t.last_updated) for t in state.txns])),
        (
            "domainMetadata",
            _struct(_DOMAIN, [(d.domain, d.configuration, False) for d in state.domains if not d.removed]),
        ),
        ("add", _struct(_ADD, [_add_row(a, with_stats) for a in state.adds])),
        ("remove", _struct(_REMOVE, [_remove_row(r) for r in state.removes])),
    ]
    total = sum(len(arr) for _, arr in blocks)
    placed: dict[str, pa.Array] = {}
    start = 0
    for name, arr in blocks:
        typ = CHECKPOINT_SCHEMA.field(name).type
        # Padding must come from pa.array([None]...), not pa.nulls(): the Parquet writer
        # rejects nulls in a required child even under a null parent, and pa.array fills
        # required children of null rows with placeholder values.
        before = pa.array([None] * start, typ)
        after = pa.array([None] * (total - start - len(arr)), typ)
        placed[name] = pa.concat_arrays([before, arr, after])
        start += len(arr)
    return pa.Table.from_arrays([placed[f.name] for f in CHECKPOINT_SCHEMA], schema=CHECKPOINT_SCHEMA)


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool({"file", "local"} & set(protocols))


def _put(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` so readers never see a torn file.

    Object stores publish a PUT atomically, so write in place there. On a local (POSIX)
    file system write a hidden temp file next to the target and rename it over; the
    leading dot keeps Delta readers from treating a leftover temp as a log file.
    """
    if not _is_local(fs):
        fs.pipe_file(path, data)
        return
    head, _, name = path.rpartition("/")
    tmp = f"{head}/.{name}.{uuid.uuid4().hex}.tmp"
    fs.pipe_file(tmp, data)
    try:
        fs.mv(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.rm(tmp)
        raise


CHAIN_HEAD_KEY = b"eventlog.chainHead"


def read_chain_head(fs: fsspec.AbstractFileSystem, log_dir: str, version: int) -> str | None:
    """The chain head a single-file checkpoint at ``version`` carries (footer only), or None."""
    path = checkpoint_path(log_dir, version)
    try:
        with fs.open(path, "rb") as f:
            metadata = pq.read_schema(f).metadata or {}
    except FileNotFoundError:
        return None
    value = metadata.get(CHAIN_HEAD_KEY)
    return value.decode() if value is not None else None


def write_checkpoint(fs: fsspec.AbstractFileSystem, log_dir: str, state: CheckpointState) -> int:
    """Write the checkpoint for ``state.version`` and point ``_last_checkpoint`` at it.

    Returns the size of the Parquet file in bytes. ``_last_checkpoint`` is only replaced
    when it does not already name a newer checkpoint.
    """
    if state.version < 0:
        raise ValueError(f"checkpoint version must be >= 0, got {state.version}")
    table = _build_table(state)
    if state.chain_head is not None:
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), CHAIN_HEAD_KEY: state.chain_head}
        )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    data = sink.getvalue().to_pybytes()
    _put(fs, checkpoint_path(log_dir, state.version), data)

    # The pointer must never move backwards: metadata cleanup may already have deleted
    # the commits an older checkpoint would need to be replayed forwards. (Best effort:
    # a concurrent checkpointer can still interleave; readers then just replay more.)
    current = read_last_checkpoint(fs, log_dir)
    if current is None or current <= state.version:
        pointer = {
            "version": state.version,
            "size": table.num_rows,
            "sizeInBytes": len(data),
            "numOfAddFiles": len(state.adds),
        }
        _put(fs, _last_checkpoint_path(log_dir), orjson.dumps(pointer))
    return len(data)


# --------------------------------------------------------------------------- locate


def read_last_checkpoint(fs: fsspec.AbstractFileSystem, log_dir: str) -> int | None:
    """Version named by ``_last_checkpoint``; None if it is absent or unreadable.

    A torn or corrupt pointer is only an optimisation lost: callers fall back to listing.
    """
    try:
        raw = fs.cat_file(_last_checkpoint_path(log_dir))
        version = orjson.loads(raw).get("version")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        return None
    return version


def find_latest_checkpoint(
    fs: fsspec.AbstractFileSystem,
    log_dir: str,
    at_or_before: int | None = None,
    listing: Sequence[str] | None = None,
) -> int | None:
    """Newest classic single-file checkpoint version ``<= at_or_before`` (any if None).

    ``listing`` is the log directory's file names (or paths); without it, ``log_dir``
    is listed. Multi-part, UUID-named V2 checkpoints and sidecars are ignored.
    """
    if listing is None:
        try:
            listing = fs.ls(log_dir, detail=False)
        except FileNotFoundError:
            return None
    best: int | None = None
    for entry in [e for e in listing if ".checkpoint." in e]:  # a cheap filter before the regex
        match = _CHECKPOINT_RE.match(entry.rstrip("/").rpartition("/")[2])
        if match is None:
            continue
        version = int(match.group(1))
        if (at_or_before is None or version <= at_or_before) and (best is None or version > best):
            best = version
    return best


# --------------------------------------------------------------------------- read


def _rows(table: pa.Table, column: str) -> tuple[int, dict[str, list[Any]]]:
    """Non-null rows of a struct column as per-field Python lists (absent fields omitted)."""
    if column not in table.column_names:
        return 0, {}
    arr = table.column(column).combine_chunks()
    arr = arr.filter(arr.is_valid())  # column-wise: only this action's rows reach Python
    names = [arr.type.field(i).name for i in range(arr.type.num_fields)]
    fields = {name: child.to_pylist() for name, child in zip(names, arr.flatten(), strict=True)}
    for name in _REQUIRED[column]:
        values = fields.get(name)
        if len(arr) and (values is None or any(v is None for v in values)):
            raise ValueError(f"{column}.{name} is missing or null in a {column} row")
    return len(arr), fields


def _col(fields: dict[str, list[Any]], name: str, n: int) -> list[Any]:
    return fields.get(name) or [None] * n


def _dict(pairs: list[tuple[str, Any]] | None) -> dict[str, Any] | None:
    return None if pairs is None else dict(pairs)


def _dvs(values: list[Any]) -> list[DeletionVectorDescriptor | None]:
    return [DeletionVectorDescriptor.from_json(d) if d else None for d in values]


def _bool(value: bool | None, default: bool) -> bool:
    return default if value is None else bool(value)


def _protocols(table: pa.Table) -> list[Protocol]:
    n, f = _rows(table, "protocol")
    return [
        Protocol(
            min_reader_version=int(r), min_writer_version=int(w),
            reader_features=tuple(rf) if rf is not None else None,
            writer_features=tuple(wf) if wf is not None else None,
        )
        for r, w, rf, wf in zip(
            _col(f, "minReaderVersion", n), _col(f, "minWriterVersion", n),
            _col(f, "readerFeatures", n), _col(f, "writerFeatures", n), strict=True,
        )
    ]  # fmt: skip


def _metadatas(table: pa.Table) -> list[Metadata]:
    n, f = _rows(table, "metaData")
    return [
        Metadata(
            id=i, schema_string=ss, partition_columns=tuple(pc or ()), configuration=_dict(cf) or {},
            created_time=ct, name=nm, description=ds,
            format=Format((fm or {}).get("provider") or "parquet", _dict((fm or {}).get("options")) or {}),
        )
        for i, ss, pc, cf, ct, nm, ds, fm in zip(
            _col(f, "id", n), _col(f, "schemaString", n), _col(f, "partitionColumns", n),
            _col(f, "configuration", n), _col(f, "createdTime", n), _col(f, "name", n),
            _col(f, "description", n), _col(f, "format", n), strict=True,
        )
    ]  # fmt: skip


def _txns(table: pa.Table) -> list[SetTransaction]:
    n, f = _rows(table, "txn")
    cols = (_col(f, "appId", n), _col(f, "version", n), _col(f, "lastUpdated", n))
    return [SetTransaction(a, int(v), u) for a, v, u in zip(*cols, strict=True)]


def _domains(table: pa.Table) -> list[DomainMetadata]:
    n, f = _rows(table, "domainMetadata")
    cols = (_col(f, "domain", n), _col(f, "configuration", n), _col(f, "removed", n))
    # Tombstones do not belong in a checkpoint; drop any a foreign writer kept.
    return [DomainMetadata(d, c or "", False) for d, c, r in zip(*cols, strict=True) if not r]


def _adds(table: pa.Table) -> list[AddFile]:
    n, f = _rows(table, "add")
    return [
        AddFile(
            path=p, partition_values=_dict(pv) or {}, size=int(s), modification_time=int(mt),
            data_change=_bool(dc, True), stats=st, tags=_dict(tg), deletion_vector=dv,
            base_row_id=br, default_row_commit_version=drv,
        )
        for p, pv, s, mt, dc, st, tg, dv, br, drv in zip(
            _col(f, "path", n), _col(f, "partitionValues", n), _col(f, "size", n),
            _col(f, "modificationTime", n), _col(f, "dataChange", n), _col(f, "stats", n),
            _col(f, "tags", n), _dvs(_col(f, "deletionVector", n)), _col(f, "baseRowId", n),
            _col(f, "defaultRowCommitVersion", n), strict=True,
        )
    ]  # fmt: skip


def _removes(table: pa.Table) -> list[RemoveFile]:
    n, f = _rows(table, "remove")
    return [
        RemoveFile(
            path=p, deletion_timestamp=ts, data_change=_bool(dc, True), extended_file_metadata=ext,
            partition_values=_dict(pv), size=s, deletion_vector=dv, base_row_id=br,
            default_row_commit_version=drv,
        )
        for p, ts, dc, ext, pv, s, dv, br, drv in zip(
            _col(f, "path", n), _col(f, "deletionTimestamp", n), _col(f, "dataChange", n),
            _col(f, "extendedFileMetadata", n), _col(f, "partitionValues", n), _col(f, "size", n),
            _dvs(_col(f, "deletionVector", n)), _col(f, "baseRowId", n),
            _col(f, "defaultRowCommitVersion", n), strict=True,
        )
    ]  # fmt: skip


def _selected_columns(file_schema: pa.Schema) -> list[str]:
    """Dotted leaf paths of the fields we decode that the file actually has.

    delta-rs/Spark may add stats_parsed, partitionValues_parsed, clusteringProvider,
    sidecar...; those can be large, so they are never read.
    """
    selected: list[str] = []
    for col in CHECKPOINT_SCHEMA:
        idx = file_schema.get_field_index(col.name)
        if idx < 0:
            continue  # PROTOCOL.md: a missing column is treated as all-null
        typ = file_schema.field(idx).type
        if not pa.types.is_struct(typ):
            raise ValueError(f"column {col.name!r} is {typ}, not a struct")
        present = {typ.field(i).name for i in range(typ.num_fields)}
        names = [col.type.field(i).name for i in range(col.type.num_fields)]
        selected += [f"{col.name}.{name}" for name in names if name in present]
    return selected


def read_checkpoint(fs: fsspec.AbstractFileSystem, log_dir: str, version: int) -> CheckpointState:
    """Read the classic checkpoint at ``version`` (ours, delta-rs's or Spark's).

    Raises :class:`CorruptLogError` when the file is not a valid checkpoint, and
    ``FileNotFoundError`` when it does not exist (callers may fall back to listing).
    """
    path = checkpoint_path(log_dir, version)
    data = fs.cat_file(path)  # whole file at once: one GET on object stores
    try:
        pf = pq.ParquetFile(pa.BufferReader(data))
        table = pf.read(columns=_selected_columns(pf.schema_arrow))
        protocols, metas = _protocols(table), _metadatas(table)
        if len(protocols) != 1 or len(metas) != 1:
            raise ValueError(
                f"expected exactly one protocol and one metaData row, found {len(protocols)} and {len(metas)}"
            )
        return CheckpointState(
            version=version,
            protocol=protocols[0],
            metadata=metas[0],
            adds=_adds(table),
            removes=_removes(table),
            txns=_txns(table),
            domains=_domains(table),
        )
    except (pa.ArrowException, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CorruptLogError(
            f"malformed checkpoint {path}: {type(exc).__name__}: {exc}", uri=path, version=version
        ) from exc
