"""Reading checkpoints of every kind the Delta protocol defines.

PROTOCOL.md "Checkpoints" names three kinds, all read here (found by
:mod:`eventlog.log.checkpoint_locate`):

* classic: ``<v>.checkpoint.parquet`` (V1 spec, or V2 spec with ``checkpointMetadata`` and
  ``sidecar`` rows);
* multi-part: ``<v>.checkpoint.<o:010d>.<p:010d>.parquet``, parts 1..p; a set with a
  part missing is ignored;
* UUID-named V2: ``<v>.checkpoint.<uuid>.json`` or ``.parquet``, holding the non-file
  actions and either the file actions or ``sidecar`` actions naming Parquet files in
  ``_delta_log/_sidecars/`` that hold them.

File actions are read column-wise into ADD_SCHEMA/REMOVE_SCHEMA tables: only the struct
fields this library models are read (never ``stats_parsed``/``partitionValues_parsed``),
each row group's valid rows are kept, the struct is flattened and conformed, with no
Python object per file. The few non-file actions are decoded in Python. (Only file
actions inlined in a JSON V2 checkpoint, rare, go through Python objects.)
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from eventlog.errors import CorruptLogError
from eventlog.log.actions import (
    AddFile,
    DomainMetadata,
    Format,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from eventlog.log.checkpoint_locate import (
    CheckpointFiles,
    LastCheckpoint,
    is_local,
    list_checkpoints,
    list_log,
)
from eventlog.log.checkpoint_state import (
    CHECKPOINT_METADATA_STRUCT,
    CHECKPOINT_SCHEMA,
    SIDECAR_STRUCT,
    SIDECARS,
    CheckpointState,
)
from eventlog.log.filetable import ADD_SCHEMA, REMOVE_SCHEMA, adds_table, conform, removes_table
from eventlog.log.storage import whole_file_options

__all__ = ["read_checkpoint", "referenced_sidecars"]


# --------------------------------------------------------------------------- decode

# The struct columns read, with the fields decoded. add/remove are filetable's structs.
_ACTION_TYPES: dict[str, pa.StructType] = {
    **{f.name: f.type for f in CHECKPOINT_SCHEMA},
    "checkpointMetadata": CHECKPOINT_METADATA_STRUCT,
    "sidecar": SIDECAR_STRUCT,
}
_FILE_KINDS = ("add", "remove")
# Sub-fields that must be non-null in every row of a column (else the file is corrupt).
_REQUIRED: dict[str, tuple[str, ...]] = {
    "txn": ("appId", "version"),
    "add": ("path", "size", "modificationTime"),
    "remove": ("path",),
    "metaData": ("id", "schemaString"),
    "protocol": ("minReaderVersion", "minWriterVersion"),
    "domainMetadata": ("domain",),
    "checkpointMetadata": ("version",),
    "sidecar": ("path",),
}


@dataclass
class _Actions:
    """Actions gathered from the files of one checkpoint."""

    protocols: list[Protocol] = field(default_factory=list)
    metadatas: list[Metadata] = field(default_factory=list)
    txns: list[SetTransaction] = field(default_factory=list)
    domains: list[DomainMetadata] = field(default_factory=list)
    adds: list[pa.Table] = field(default_factory=list)
    removes: list[pa.Table] = field(default_factory=list)
    sidecars: list[str] = field(default_factory=list)
    checkpoint_versions: list[int] = field(default_factory=list)


def _fields(arr: pa.StructArray, column: str) -> tuple[int, dict[str, list[Any]]]:
    """The rows of a (valid-only) struct array as per-field Python lists."""
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


def _decode(kind: str, arr: pa.StructArray, out: _Actions) -> None:
    """Append the non-file actions of ``arr`` (valid rows of column ``kind``) to ``out``."""
    n, f = _fields(arr, kind)

    def col(name: str) -> list[Any]:
        return _col(f, name, n)

    if kind == "protocol":
        out.protocols += [
            Protocol(int(r), int(w), None if rf is None else tuple(rf), None if wf is None else tuple(wf))
            for r, w, rf, wf in zip(
                col("minReaderVersion"), col("minWriterVersion"), col("readerFeatures"),
                col("writerFeatures"), strict=True,
            )
        ]  # fmt: skip
    elif kind == "metaData":
        fmts = [fm or {} for fm in col("format")]
        out.metadatas += [
            Metadata(
                id=i, schema_string=ss, partition_columns=tuple(pc or ()), configuration=_dict(cf) or {},
                created_time=ct, name=nm, description=ds,
                format=Format(fm.get("provider") or "parquet", _dict(fm.get("options")) or {}),
            )
            for i, ss, pc, cf, ct, nm, ds, fm in zip(
                col("id"), col("schemaString"), col("partitionColumns"), col("configuration"),
                col("createdTime"), col("name"), col("description"), fmts, strict=True,
            )
        ]  # fmt: skip
    elif kind == "txn":
        cols = (col("appId"), col("version"), col("lastUpdated"))
        out.txns += [SetTransaction(a, int(v), u) for a, v, u in zip(*cols, strict=True)]
    elif kind == "domainMetadata":
        cols = (col("domain"), col("configuration"), col("removed"))
        # Tombstones do not belong in a checkpoint; drop any a foreign writer kept.
        out.domains += [DomainMetadata(d, c or "", False) for d, c, r in zip(*cols, strict=True) if not r]
    elif kind == "checkpointMetadata":
        out.checkpoint_versions += [int(v) for v in col("version")]
    elif kind == "sidecar":
        out.sidecars += col("path")


def _file_table(chunks: list[pa.StructArray], kind: str) -> pa.Table:
    """Valid rows of an add/remove struct column, flattened and conformed; required
    fields checked column-wise."""
    schema = ADD_SCHEMA if kind == "add" else REMOVE_SCHEMA
    tables = []
    for arr in chunks:
        names = [arr.type.field(i).name for i in range(arr.type.num_fields)]
        tables.append(conform(pa.Table.from_arrays(arr.flatten(), names=names), schema))
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    for name in _REQUIRED[kind]:  # a field the file lacks was conformed to nulls
        if table.column(name).null_count:
            raise ValueError(f"{kind}.{name} is missing or null in a {kind} row")
    return table


def _selected_columns(file_schema: pa.Schema, kinds: Iterable[str]) -> dict[str, list[str]]:
    """Per action column the file has, the dotted paths of the fields we decode it has.

    delta-rs/Spark may add stats_parsed, partitionValues_parsed, clusteringProvider...;
    those can be large, so they are never read.
    """
    selected: dict[str, list[str]] = {}
    for kind in kinds:
        idx = file_schema.get_field_index(kind)
        if idx < 0:
            continue  # PROTOCOL.md: a missing column is treated as all-null
        typ = file_schema.field(idx).type
        if not pa.types.is_struct(typ):
            raise ValueError(f"column {kind!r} is {typ}, not a struct")
        present = {typ.field(i).name for i in range(typ.num_fields)}
        want = _ACTION_TYPES[kind]
        names = [want.field(i).name for i in range(want.num_fields)]
        paths = [f"{kind}.{name}" for name in names if name in present]
        if paths:
            selected[kind] = paths
    return selected


def _parquet_file(fs: fsspec.AbstractFileSystem, path: str) -> pq.ParquetFile:
    if is_local(fs):
        # Arrow's own reader, streaming pages through a small buffer: neither the whole
        # file nor a whole (possibly uncompressed, 300 MB) row group is held in memory.
        return pq.ParquetFile(fs._strip_protocol(path), pre_buffer=False, buffer_size=1 << 20)
    return pq.ParquetFile(pa.BufferReader(fs.cat_file(path, **whole_file_options(fs))))  # one GET


# Row groups up to this many rows are read whole; larger ones (delta-rs writes a single
# one) are streamed in batches of this size, which bounds the decoding memory.
_BATCH_ROWS = 131_072
# Valid rows in at most this many runs are kept as zero-copy slices, else filtered.
_MAX_RUNS = 16


def _valid_rows(arr: pa.StructArray) -> list[pa.StructArray]:
    """The valid rows of ``arr``: slices of it when they form a few runs (actions of one
    kind are written in blocks), else a filtered copy."""
    if arr.null_count == 0:
        return [arr]
    if arr.null_count == len(arr):
        return []
    valid = arr.is_valid().to_numpy(zero_copy_only=False).view(np.int8)
    edges = np.flatnonzero(np.diff(valid, prepend=0, append=0))
    starts, stops = edges[0::2], edges[1::2]
    if len(starts) > _MAX_RUNS:
        return [arr.filter(arr.is_valid())]
    return [arr.slice(int(a), int(b - a)) for a, b in zip(starts, stops, strict=True)]


def _batches(pf: pq.ParquetFile, columns: list[str]) -> Iterator[pa.RecordBatch | pa.Table]:
    for i in range(pf.metadata.num_row_groups):
        if pf.metadata.row_group(i).num_rows <= 2 * _BATCH_ROWS:
            yield pf.read_row_group(i, columns=columns)
        else:
            yield from pf.iter_batches(batch_size=_BATCH_ROWS, row_groups=[i], columns=columns)


def _read_parquet(fs: fsspec.AbstractFileSystem, path: str, out: _Actions, kinds: Iterable[str]) -> None:
    """Gather the actions of column ``kinds`` in the Parquet file at ``path``.

    Group by group (or batch by batch in large groups); the valid rows of each action
    column are kept as slices where they are contiguous, so nothing is copied for files
    that write each kind in blocks (ours, delta-rs's).
    """
    pf = _parquet_file(fs, path)
    selected = _selected_columns(pf.schema_arrow, kinds)
    if not selected:
        return
    columns = [p for paths in selected.values() for p in paths]
    chunks: dict[str, list[pa.StructArray]] = {kind: [] for kind in selected}
    for batch in _batches(pf, columns):
        for kind in selected:
            column = batch.column(kind)
            for arr in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
                chunks[kind] += _valid_rows(arr)
    for kind, arrays in chunks.items():
        if kind in _FILE_KINDS:
            (out.adds if kind == "add" else out.removes).append(_file_table(arrays, kind))
        elif arrays:
            _decode(kind, pa.concat_arrays(arrays), out)


def _read_json(fs: fsspec.AbstractFileSystem, path: str, out: _Actions) -> None:
    """Gather the actions of a JSON (UUID-named V2) checkpoint."""
    adds: list[AddFile] = []
    removes: list[RemoveFile] = []
    for number, line in enumerate(fs.cat_file(path, **whole_file_options(fs)).splitlines(), 1):
        if not line.strip():
            continue
        action = orjson.loads(line)
        if not isinstance(action, dict) or len(action) != 1:
            raise ValueError(f"line {number} is not a single action")
        ((kind, body),) = action.items()
        if not isinstance(body, dict):
            raise ValueError(f"line {number}: {kind} is not an object")
        missing = [name for name in _REQUIRED.get(kind, ()) if body.get(name) is None]
        if missing:
            raise ValueError(f"{kind}.{missing[0]} is missing or null in a {kind} row")
        if kind == "add":
            adds.append(AddFile.from_json(body))
        elif kind == "remove":
            removes.append(RemoveFile.from_json(body))
        elif kind == "protocol":
            out.protocols.append(Protocol.from_json(body))
        elif kind == "metaData":
            out.metadatas.append(Metadata.from_json(body))
        elif kind == "txn":
            out.txns.append(SetTransaction.from_json(body))
        elif kind == "domainMetadata":
            if not body.get("removed"):
                out.domains.append(DomainMetadata(body["domain"], body.get("configuration") or ""))
        elif kind == "checkpointMetadata":
            out.checkpoint_versions.append(int(body["version"]))
        elif kind == "sidecar":
            out.sidecars.append(str(body["path"]))
    if adds:
        out.adds.append(adds_table(adds))
    if removes:
        out.removes.append(removes_table(removes))


def _sidecar_path(log_dir: str, path: str) -> str:
    """Where a ``sidecar`` action's (URI-encoded) path points: a bare name is in
    ``_delta_log/_sidecars/``; a full URI or absolute path is taken as is."""
    if "://" in path or path.startswith("/"):
        return path
    return f"{log_dir.rstrip('/')}/{SIDECARS}/{urllib.parse.unquote(path)}"


# --------------------------------------------------------------------------- read

_PARSE_ERRORS = (pa.ArrowException, ValueError, TypeError, KeyError, AttributeError)


def _corrupt(path: str, version: int, exc: Exception) -> CorruptLogError:
    return CorruptLogError(
        f"malformed checkpoint {path}: {type(exc).__name__}: {exc}", uri=path, version=version
    )


def _read_files(fs: fsspec.AbstractFileSystem, log_dir: str, cp: CheckpointFiles) -> CheckpointState:
    """Read the checkpoint ``cp``: its files, and the sidecars they name."""
    log_dir = log_dir.rstrip("/")
    out = _Actions()
    first = f"{log_dir}/{cp.names[0]}"
    for name in cp.names:
        path = f"{log_dir}/{name}"
        try:
            if name.endswith(".json"):
                _read_json(fs, path, out)
            else:
                _read_parquet(fs, path, out, [*_ACTION_TYPES])
        except _PARSE_ERRORS as exc:
            raise _corrupt(path, cp.version, exc) from exc
    for sidecar in out.sidecars:
        path = _sidecar_path(log_dir, sidecar)
        try:
            _read_parquet(fs, path, out, _FILE_KINDS)  # sidecars hold file actions only
        except _PARSE_ERRORS as exc:
            raise _corrupt(path, cp.version, exc) from exc
    try:
        if len(out.protocols) != 1 or len(out.metadatas) != 1:
            raise ValueError(
                f"expected exactly one protocol and one metaData row, found {len(out.protocols)} "
                f"and {len(out.metadatas)}"
            )
        if len(out.checkpoint_versions) > 1 or any(v != cp.version for v in out.checkpoint_versions):
            raise ValueError(
                f"checkpointMetadata rows {out.checkpoint_versions} do not name version {cp.version}"
            )
        adds = pa.concat_tables(out.adds) if out.adds else ADD_SCHEMA.empty_table()
        removes = pa.concat_tables(out.removes) if out.removes else REMOVE_SCHEMA.empty_table()
    except _PARSE_ERRORS as exc:
        raise _corrupt(first, cp.version, exc) from exc
    return CheckpointState(
        version=cp.version,
        protocol=out.protocols[0],
        metadata=out.metadatas[0],
        adds=adds,
        removes=removes,
        txns=out.txns,
        domains=out.domains,
    )


def read_checkpoint(
    fs: fsspec.AbstractFileSystem,
    log_dir: str,
    version: int,
    *,
    listing: Sequence[str] | None = None,
    last: LastCheckpoint | None = None,
) -> CheckpointState:
    """Read the checkpoint at ``version``, of whichever kind is there (ours, delta-rs's or
    Spark's: classic, multi-part or V2 with sidecars).

    With ``last`` (the parsed ``_last_checkpoint``) naming ``version``, its files are
    opened directly. Else with ``listing`` (the log directory's names or paths) the
    checkpoint is picked from it; else the classic file is tried first and the directory
    listed only when it is absent.

    Raises :class:`CorruptLogError` when a file is not a valid checkpoint, and
    ``FileNotFoundError`` when no checkpoint exists at ``version`` or one of its files
    is missing (callers may fall back to an older checkpoint or to replay).
    """
    if last is not None and last.version == version:
        return _read_files(fs, log_dir, last.files())
    if listing is not None:
        found = [cp for cp in list_checkpoints(listing) if cp.version == version]
        if not found:
            raise FileNotFoundError(f"no complete checkpoint at version {version} in {log_dir}")
        return _read_first(fs, log_dir, found)
    classic = LastCheckpoint(version).files()
    try:
        return _read_files(fs, log_dir, classic)
    except (FileNotFoundError, CorruptLogError) as exc:
        try:
            names = list_log(fs, log_dir)
        except FileNotFoundError:
            raise exc from None
        others = [cp for cp in list_checkpoints(names) if cp.version == version and cp != classic]
        if not others:
            raise
    return _read_first(fs, log_dir, others)


def _read_first(fs: fsspec.AbstractFileSystem, log_dir: str, found: list[CheckpointFiles]) -> CheckpointState:
    """The first of several checkpoints of one version that reads (racing writers may
    leave, say, a torn multi-part set next to a good V2 one); else the first one's error."""
    errors: list[CorruptLogError | FileNotFoundError] = []
    for cp in found:
        try:
            return _read_files(fs, log_dir, cp)
        except (CorruptLogError, FileNotFoundError) as exc:
            errors.append(exc)
    raise errors[0]


def referenced_sidecars(
    fs: fsspec.AbstractFileSystem, log_dir: str, checkpoints: Iterable[CheckpointFiles]
) -> set[str]:
    """The file names of the sidecars the single-file ``checkpoints`` (classic or UUID-named;
    only V2-spec ones have ``sidecar`` rows) reference: what log cleanup must keep.

    Raises :class:`CorruptLogError` or ``FileNotFoundError`` when a checkpoint cannot be
    read (callers then delete no sidecar)."""
    log_dir = log_dir.rstrip("/")
    names: set[str] = set()
    for cp in checkpoints:
        if cp.kind == "multipart":
            continue  # V1 spec only: never sidecars
        out = _Actions()
        path = f"{log_dir}/{cp.names[0]}"
        try:
            if path.endswith(".json"):
                _read_json(fs, path, out)
            else:
                _read_parquet(fs, path, out, ["sidecar"])
        except _PARSE_ERRORS as exc:
            raise _corrupt(path, cp.version, exc) from exc
        names |= {urllib.parse.unquote(p).rstrip("/").rpartition("/")[2] for p in out.sidecars}
    return names
