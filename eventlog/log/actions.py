"""Events of the commit log: Delta Lake actions as small frozen values, and their codec.

A commit (version N of a table) is the file ``_delta_log/<20-digit N>.json``, one JSON
action per line, ``commitInfo`` first. Field names and encodings follow the Delta
transaction log protocol exactly (PROTOCOL.md): ``partitionValues`` are strings (or
null), ``stats`` is a JSON *string*, ``schemaString`` is Spark's JSON schema, times are
epoch milliseconds. Actions this library does not model (``cdc``, ``checkpointMetadata``,
``sidecar``...) are kept as :class:`UnknownAction` so replay and re-encoding are faithful.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import orjson

ENGINE_INFO = "eventlog/0.1.0"  # commitInfo.engineInfo of every commit this library writes

# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class DeletionVectorDescriptor:
    """Where a deletion vector lives (``deletionVector`` field of add/remove)."""

    storage_type: str  # "u" (relative UUID path), "i" (inline), "p" (absolute path)
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    @property
    def unique_id(self) -> str:
        base = self.storage_type + self.path_or_inline_dv
        return base if self.offset is None else f"{base}@{self.offset}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline_dv,
        }
        if self.offset is not None:
            out["offset"] = self.offset
        out["sizeInBytes"] = self.size_in_bytes
        out["cardinality"] = self.cardinality
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> DeletionVectorDescriptor:
        return DeletionVectorDescriptor(
            storage_type=d["storageType"],
            path_or_inline_dv=d["pathOrInlineDv"],
            size_in_bytes=int(d["sizeInBytes"]),
            cardinality=int(d["cardinality"]),
            offset=d.get("offset"),
        )


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """Provenance of a commit; always the first line of the commit file."""

    timestamp: int
    operation: str
    operation_parameters: Mapping[str, str] = field(default_factory=dict)
    read_version: int | None = None
    isolation_level: str | None = None
    is_blind_append: bool | None = None
    txn_id: str | None = None
    engine_info: str | None = None
    user_metadata: str | None = None
    operation_metrics: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"timestamp": self.timestamp, "operation": self.operation}
        out["operationParameters"] = dict(self.operation_parameters)
        if self.read_version is not None:
            out["readVersion"] = self.read_version
        if self.isolation_level is not None:
            out["isolationLevel"] = self.isolation_level
        if self.is_blind_append is not None:
            out["isBlindAppend"] = self.is_blind_append
        if self.operation_metrics:
            out["operationMetrics"] = dict(self.operation_metrics)
        if self.user_metadata is not None:
            out["userMetadata"] = self.user_metadata
        if self.engine_info is not None:
            out["engineInfo"] = self.engine_info
        if self.txn_id is not None:
            out["txnId"] = self.txn_id
        out.update(self.extra)
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> CommitInfo:
        known = {
            "timestamp", "operation", "operationParameters", "readVersion", "isolationLevel",
            "isBlindAppend", "txnId", "engineInfo", "userMetadata", "operationMetrics",
        }  # fmt: skip
        params = d.get("operationParameters") or {}
        return CommitInfo(
            timestamp=int(d.get("timestamp") or 0),
            operation=str(d.get("operation") or "TRANSACTION"),
            operation_parameters={k: _param_str(v) for k, v in params.items()},
            read_version=d.get("readVersion"),
            isolation_level=d.get("isolationLevel"),
            is_blind_append=d.get("isBlindAppend"),
            txn_id=d.get("txnId"),
            engine_info=d.get("engineInfo"),
            user_metadata=d.get("userMetadata"),
            operation_metrics={k: str(v) for k, v in (d.get("operationMetrics") or {}).items()},
            extra={k: v for k, v in d.items() if k not in known},
        )


def _string_map(value: Any, field: str) -> dict[str, str | None]:
    """A JSON object of strings (``partitionValues``, ``tags``); other scalar values are
    taken as their JSON text, as Delta Spark's JSON reader does, and nested ones refused."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{field} is not a JSON object")
    out: dict[str, str | None] = {}
    for key, item in value.items():
        if item is None or isinstance(item, str):
            out[key] = item
        elif isinstance(item, bool | int | float):
            out[key] = orjson.dumps(item).decode()
        else:
            raise ValueError(f"{field}.{key} is not a string")
    return out


def _tags(value: Any) -> dict[str, str] | None:
    """``tags``: a string map whose null values mean absent keys."""
    if value is None:
        return None
    return {k: v for k, v in _string_map(value, "tags").items() if v is not None}


def _param_str(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


@dataclass(frozen=True, slots=True)
class Format:
    provider: str = "parquet"
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Metadata:
    """Table identity, schema (Spark JSON), partition columns and properties."""

    id: str
    schema_string: str
    partition_columns: tuple[str, ...] = ()
    configuration: Mapping[str, str] = field(default_factory=dict)
    created_time: int | None = None
    name: str | None = None
    description: str | None = None
    format: Format = field(default_factory=Format)

    @staticmethod
    def new_id() -> str:
        return str(uuid.uuid4())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id}
        if self.name is not None:
            out["name"] = self.name
        if self.description is not None:
            out["description"] = self.description
        out["format"] = {"provider": self.format.provider, "options": dict(self.format.options)}
        out["schemaString"] = self.schema_string
        out["partitionColumns"] = list(self.partition_columns)
        out["configuration"] = dict(self.configuration)
        if self.created_time is not None:
            out["createdTime"] = self.created_time
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Metadata:
        fmt = d.get("format") or {}
        return Metadata(
            id=d["id"],
            schema_string=d["schemaString"],
            partition_columns=tuple(d.get("partitionColumns") or ()),
            configuration=dict(d.get("configuration") or {}),
            created_time=d.get("createdTime"),
            name=d.get("name"),
            description=d.get("description"),
            format=Format(fmt.get("provider", "parquet"), dict(fmt.get("options") or {})),
        )


@dataclass(frozen=True, slots=True)
class Protocol:
    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] | None = None
    writer_features: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "minReaderVersion": self.min_reader_version,
            "minWriterVersion": self.min_writer_version,
        }
        if self.reader_features is not None:
            out["readerFeatures"] = list(self.reader_features)
        if self.writer_features is not None:
            out["writerFeatures"] = list(self.writer_features)
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Protocol:
        rf = d.get("readerFeatures")
        wf = d.get("writerFeatures")
        return Protocol(
            min_reader_version=int(d["minReaderVersion"]),
            min_writer_version=int(d["minWriterVersion"]),
            reader_features=tuple(rf) if rf is not None else None,
            writer_features=tuple(wf) if wf is not None else None,
        )


@dataclass(frozen=True, slots=True)
class AddFile:
    """A data file that becomes live. Keyed in snapshots by ``(path, dv unique id)``."""

    path: str
    partition_values: Mapping[str, str | None]
    size: int
    modification_time: int
    data_change: bool = True
    stats: str | None = None
    tags: Mapping[str, str] | None = None
    deletion_vector: DeletionVectorDescriptor | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    # The clustering implementation that wrote this file clustered ("liquid"), or None.
    clustering_provider: str | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        dv = self.deletion_vector
        return (self.path, dv.unique_id if dv is not None else None)

    @property
    def num_records(self) -> int | None:
        """``numRecords`` from the stats, or None when the file carries no stats."""
        if self.stats is None:
            return None
        n = orjson.loads(self.stats).get("numRecords")
        return int(n) if n is not None else None

    def parsed_stats(self) -> dict[str, Any] | None:
        return orjson.loads(self.stats) if self.stats else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "modificationTime": self.modification_time,
            "dataChange": self.data_change,
        }
        if self.stats is not None:
            out["stats"] = self.stats
        if self.tags is not None:
            out["tags"] = dict(self.tags)
        if self.deletion_vector is not None:
            out["deletionVector"] = self.deletion_vector.to_json()
        if self.base_row_id is not None:
            out["baseRowId"] = self.base_row_id
        if self.default_row_commit_version is not None:
            out["defaultRowCommitVersion"] = self.default_row_commit_version
        if self.clustering_provider is not None:
            out["clusteringProvider"] = self.clustering_provider
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> AddFile:
        dv = d.get("deletionVector")
        stats = d.get("stats")
        tags = d.get("tags")
        return AddFile(
            path=d["path"],
            partition_values=_string_map(d.get("partitionValues") or {}, "partitionValues"),
            size=int(d.get("size") or 0),
            modification_time=int(d.get("modificationTime") or 0),
            data_change=bool(d.get("dataChange", True)),
            stats=stats if stats is None or isinstance(stats, str) else orjson.dumps(stats).decode(),
            tags=_tags(tags),
            deletion_vector=DeletionVectorDescriptor.from_json(dv) if dv else None,
            base_row_id=d.get("baseRowId"),
            default_row_commit_version=d.get("defaultRowCommitVersion"),
            clustering_provider=d.get("clusteringProvider"),
        )

    def with_deletion_vector(
        self, dv: DeletionVectorDescriptor, *, modification_time: int | None = None, data_change: bool = True
    ) -> AddFile:
        """This file with ``dv`` attached, as a DML commit adds it.

        Its statistics describe every physical row, deleted ones included, so they are marked
        ``"tightBounds": false`` (the protocol's wide bounds), which Delta Spark requires of an
        ``add`` whose deletion vector a DML command wrote.
        """
        stats = self.stats
        if stats is not None:
            parsed = orjson.loads(stats)
            if parsed.get("tightBounds") is not False:
                parsed["tightBounds"] = False
                stats = orjson.dumps(parsed).decode()
        return dataclasses.replace(
            self,
            deletion_vector=dv,
            data_change=data_change,
            stats=stats,
            modification_time=self.modification_time if modification_time is None else modification_time,
        )

    def remove(self, timestamp: int, *, data_change: bool = True) -> RemoveFile:
        """The ``remove`` action that retires exactly this file (same path and DV)."""
        return RemoveFile(
            path=self.path,
            deletion_timestamp=timestamp,
            data_change=data_change,
            extended_file_metadata=True,
            partition_values=self.partition_values,
            size=self.size,
            stats=self.stats,
            deletion_vector=self.deletion_vector,
            base_row_id=self.base_row_id,
            default_row_commit_version=self.default_row_commit_version,
        )


@dataclass(frozen=True, slots=True)
class RemoveFile:
    """A data file (or one DV state of it) that stops being live."""

    path: str
    deletion_timestamp: int | None = None
    data_change: bool = True
    extended_file_metadata: bool | None = None
    partition_values: Mapping[str, str | None] | None = None
    size: int | None = None
    stats: str | None = None
    deletion_vector: DeletionVectorDescriptor | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        dv = self.deletion_vector
        return (self.path, dv.unique_id if dv is not None else None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.deletion_timestamp is not None:
            out["deletionTimestamp"] = self.deletion_timestamp
        out["dataChange"] = self.data_change
        if self.extended_file_metadata is not None:
            out["extendedFileMetadata"] = self.extended_file_metadata
        if self.partition_values is not None:
            out["partitionValues"] = dict(self.partition_values)
        if self.size is not None:
            out["size"] = self.size
        if self.stats is not None:
            out["stats"] = self.stats
        if self.deletion_vector is not None:
            out["deletionVector"] = self.deletion_vector.to_json()
        if self.base_row_id is not None:
            out["baseRowId"] = self.base_row_id
        if self.default_row_commit_version is not None:
            out["defaultRowCommitVersion"] = self.default_row_commit_version
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> RemoveFile:
        dv = d.get("deletionVector")
        pv = d.get("partitionValues")
        return RemoveFile(
            path=d["path"],
            deletion_timestamp=d.get("deletionTimestamp"),
            data_change=bool(d.get("dataChange", True)),
            extended_file_metadata=d.get("extendedFileMetadata"),
            partition_values=_string_map(pv, "partitionValues") if pv is not None else None,
            size=d.get("size"),
            stats=d.get("stats"),
            deletion_vector=DeletionVectorDescriptor.from_json(dv) if dv else None,
            base_row_id=d.get("baseRowId"),
            default_row_commit_version=d.get("defaultRowCommitVersion"),
        )


@dataclass(frozen=True, slots=True)
class AddCDCFile:
    """``cdc``: a change data file (``_change_data/...``) holding the rows a commit changed,
    with their ``_change_type``; never live data (``dataChange`` is always false)."""

    path: str
    partition_values: Mapping[str, str | None]
    size: int
    tags: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": self.path,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "dataChange": False,
        }
        if self.tags is not None:
            out["tags"] = dict(self.tags)
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> AddCDCFile:
        return AddCDCFile(
            path=d["path"],
            partition_values=_string_map(d.get("partitionValues") or {}, "partitionValues"),
            size=int(d.get("size") or 0),
            tags=_tags(d.get("tags")),
        )


@dataclass(frozen=True, slots=True)
class SetTransaction:
    """``txn``: the latest version an application (stream, idempotent writer) committed."""

    app_id: str
    version: int
    last_updated: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"appId": self.app_id, "version": self.version}
        if self.last_updated is not None:
            out["lastUpdated"] = self.last_updated
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SetTransaction:
        return SetTransaction(d["appId"], int(d["version"]), d.get("lastUpdated"))


@dataclass(frozen=True, slots=True)
class DomainMetadata:
    domain: str
    configuration: str
    removed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"domain": self.domain, "configuration": self.configuration, "removed": self.removed}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> DomainMetadata:
        return DomainMetadata(d["domain"], d.get("configuration") or "", bool(d.get("removed")))


@dataclass(frozen=True, slots=True)
class UnknownAction:
    """An action type this library does not model, kept verbatim."""

    name: str
    body: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.body)


Action = Union[
    CommitInfo,
    Metadata,
    Protocol,
    AddFile,
    RemoveFile,
    AddCDCFile,
    SetTransaction,
    DomainMetadata,
    UnknownAction,
]

_NAMES: dict[type, str] = {
    CommitInfo: "commitInfo",
    Metadata: "metaData",
    Protocol: "protocol",
    AddFile: "add",
    RemoveFile: "remove",
    AddCDCFile: "cdc",
    SetTransaction: "txn",
    DomainMetadata: "domainMetadata",
}
_DECODERS: dict[str, Any] = {name: cls.from_json for cls, name in _NAMES.items()}  # type: ignore[attr-defined]


def action_name(action: Action) -> str:
    if isinstance(action, UnknownAction):
        return action.name
    return _NAMES[type(action)]


# --------------------------------------------------------------------------- codec


class ActionDecodeError(ValueError):
    """A line of a commit file is not a valid action (the caller adds version and path)."""

    def __init__(self, message: str, line: int, version: int | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.version = version


def encode_action(action: Action) -> bytes:
    return orjson.dumps({action_name(action): action.to_json()})


def encode_commit(actions: Iterable[Action]) -> bytes:
    """Serialise actions as newline-delimited JSON (a commit file's bytes)."""
    return b"\n".join(encode_action(a) for a in actions) + b"\n"


def decode_action_dict(d: Mapping[str, Any]) -> Action:
    if len(d) != 1:
        raise ValueError(f"an action line must hold exactly one key, found {sorted(d)}")
    ((name, body),) = d.items()
    decoder = _DECODERS.get(name)
    if decoder is None:
        return UnknownAction(name, body)
    if not isinstance(body, Mapping):
        raise ValueError(f"action {name!r} is not a JSON object")
    result: Action = decoder(body)
    return result


def decode_commit(data: bytes) -> list[Action]:
    """Parse a commit file's bytes. Raises :class:`ActionDecodeError` naming the bad line."""
    actions: list[Action] = []
    for lineno, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            actions.append(decode_action_dict(orjson.loads(raw)))
        except (orjson.JSONDecodeError, ValueError, KeyError, TypeError) as exc:
            raise ActionDecodeError(f"line {lineno}: {type(exc).__name__}: {exc}", lineno) from exc
    return actions
