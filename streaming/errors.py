"""Typed errors of streaming reads: one root, :class:`StreamingError` (an :class:`EventlogError`).

Every error carries structured fields (set as attributes, like :mod:`eventlog.errors`) and
survives pickling. Spark does not hand a Python exception raised inside a streaming query
back to the driver: it wraps its *text* in a ``StreamingQueryException``. So each message
ends with one line, ``EVENTLOG_STREAMING_ERROR {"class": ..., "fields": {...}}``, from which
:func:`recover` rebuilds the typed error on the driver (that is how
:func:`streaming.supervise` recognises a metadata change without parsing prose).

* :class:`SourceMetadataChangedError`: the table's schema, properties or protocol changed
  under a running stream; restart the query (it continues from the same offset).
* :class:`ChangeCommitError`: a commit that removes or rewrites rows (DELETE, UPDATE,
  MERGE, overwrite, RESTORE); set ``skipChangeCommits`` (or ``ignoreDeletes``) to skip it.
* :class:`DataLossError`: commits or data files the stream still needed were removed
  (log cleanup, VACUUM); ``failOnDataLoss=false`` skips them with a logged warning.
* :class:`InvalidOffsetError`: an offset this source cannot resume from (another table,
  a newer offset format, malformed JSON).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from eventlog.errors import EventlogError

__all__ = [
    "ChangeCommitError",
    "DataLossError",
    "InvalidOffsetError",
    "SourceMetadataChangedError",
    "StreamingError",
    "recover",
]

PAYLOAD_MARKER = "EVENTLOG_STREAMING_ERROR "


class StreamingError(EventlogError):
    """Root of the streaming errors. ``error_class`` names the condition, as Spark does."""

    error_class = "EVENTLOG_STREAMING"

    uri: str
    version: int | None
    operation: str
    changed: list[str]
    old_schema: str
    new_schema: str
    old_properties: dict[str, str]
    new_properties: dict[str, str]
    old_protocol: dict[str, Any]
    new_protocol: dict[str, Any]
    read_version: int
    removed_files: int
    added_files: int
    kind: str
    path: str | None
    offset: Any

    def __init__(self, message: str, **fields: Any) -> None:
        payload = json.dumps({"class": type(self).__name__, "fields": fields}, sort_keys=True, default=str)
        super().__init__(f"[{self.error_class}] {message}\n{PAYLOAD_MARKER}{payload}", **fields)


def _from_fields(cls: type[StreamingError], fields: Mapping[str, Any]) -> StreamingError:
    # Every concrete class takes exactly its fields as keyword arguments.
    return cls(**fields)


def recover(error: BaseException | str | None) -> StreamingError | None:
    """The streaming error behind ``error``: itself, one in its cause chain, or one whose
    payload line appears in its text (a Spark ``StreamingQueryException`` wrapping a Python
    worker's traceback). None when there is none."""
    seen: set[int] = set()
    node: BaseException | None = error if isinstance(error, BaseException) else None
    while node is not None and id(node) not in seen:
        if isinstance(node, StreamingError):
            return node
        seen.add(id(node))
        node = node.__cause__ or node.__context__
    text = error if isinstance(error, str) else _text(error)
    start = text.find(PAYLOAD_MARKER)
    if start < 0:
        return None
    line = text[start + len(PAYLOAD_MARKER) :].split("\n", 1)[0].strip()
    try:
        payload = json.JSONDecoder().raw_decode(line)[0]
        cls = _CLASSES[payload["class"]]
        return _from_fields(cls, payload["fields"])
    except (ValueError, KeyError, TypeError):
        return None


def _text(error: BaseException | None) -> str:
    if error is None:
        return ""
    parts = [str(error)]
    for attr in ("desc", "stackTrace"):  # pyspark's StreamingQueryException keeps both
        value = getattr(error, attr, None)
        if isinstance(value, str):
            parts.append(value)
    return "\n".join(parts)


def _columns(schema_json: str) -> str:
    """``[id: long, x: long]`` from a Spark JSON schema (the text as is if unparseable)."""
    try:
        fields = json.loads(schema_json)["fields"]
        return "[" + ", ".join(f"{f['name']}: {_type_name(f['type'])}" for f in fields) + "]"
    except (ValueError, KeyError, TypeError):
        return schema_json


def _type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    if isinstance(t, dict):
        kind = t.get("type")
        if kind == "struct":
            return "struct<" + ", ".join(f"{f['name']}: {_type_name(f['type'])}" for f in t["fields"]) + ">"
        if kind == "array":
            return f"array<{_type_name(t['elementType'])}>"
        if kind == "map":
            return f"map<{_type_name(t['keyType'])}, {_type_name(t['valueType'])}>"
    return json.dumps(t)


class SourceMetadataChangedError(StreamingError):
    """A commit changed the table's metadata (schema, properties or protocol) while a stream
    read it. Fields: ``uri``, ``version`` (the commit), ``operation``, ``changed`` (which of
    ``"schema"``, ``"properties"``, ``"protocol"``), ``old_schema``/``new_schema`` (Spark JSON
    schema strings), ``old_properties``/``new_properties``, ``old_protocol``/``new_protocol``
    (Delta protocol actions as dicts) and ``read_version`` (the version whose metadata the
    stream was started with). Restart the query: it resumes at ``version`` with the new
    metadata, losing and repeating no row."""

    error_class = "EVENTLOG_SOURCE_METADATA_CHANGED"

    def __init__(
        self,
        *,
        uri: str,
        version: int,
        operation: str,
        changed: list[str],
        old_schema: str,
        new_schema: str,
        old_properties: dict[str, str],
        new_properties: dict[str, str],
        old_protocol: dict[str, Any],
        new_protocol: dict[str, Any],
        read_version: int,
    ) -> None:
        details = []
        if "schema" in changed:
            details.append(f"schema {_columns(old_schema)} -> {_columns(new_schema)}")
        if "properties" in changed:
            details.append(f"properties {old_properties} -> {new_properties}")
        if "protocol" in changed:
            details.append(f"protocol {old_protocol} -> {new_protocol}")
        message = (
            f"The metadata of the source table {uri} changed at version {version} ({operation}): "
            f"{'; '.join(details)}. The stream must be restarted: it was started with the "
            f"metadata of version {read_version}, and a running query keeps the schema it started "
            "with, so it can neither emit rows of the new schema nor know whether the new "
            "properties or protocol change how rows must be read. Restart the query (for example "
            "with streaming.supervise): it resumes at this version with the new metadata, without "
            "losing or repeating a row."
        )
        super().__init__(
            message,
            uri=uri,
            version=version,
            operation=operation,
            changed=list(changed),
            old_schema=old_schema,
            new_schema=new_schema,
            old_properties=dict(old_properties),
            new_properties=dict(new_properties),
            old_protocol=dict(old_protocol),
            new_protocol=dict(new_protocol),
            read_version=read_version,
        )


class ChangeCommitError(StreamingError):
    """A commit removes rows the stream may already have emitted (DELETE, UPDATE, MERGE,
    overwrite, RESTORE). Fields: ``uri``, ``version``, ``operation``, ``removed_files``,
    ``added_files``. A stream emits appended rows only and cannot take rows back."""

    error_class = "EVENTLOG_SOURCE_CHANGE_COMMIT"

    def __init__(
        self, *, uri: str, version: int, operation: str, removed_files: int, added_files: int
    ) -> None:
        rewritten = f" and adds {added_files}" if added_files else ""
        message = (
            f"Detected a data update ({operation}) in the source table {uri} at version {version}: "
            f"it removes {removed_files} file(s){rewritten}. A stream emits appended rows only and "
            "cannot take back rows it already emitted. To skip commits that change existing rows "
            "(their rows, old and new, are then not emitted), set the option "
            "skipChangeCommits=true; to skip only commits that delete whole files or partitions, "
            "set ignoreDeletes=true."
        )
        super().__init__(
            message,
            uri=uri,
            version=version,
            operation=operation,
            removed_files=removed_files,
            added_files=added_files,
        )


class DataLossError(StreamingError):
    """Commits or data files the stream still needed are gone. Fields: ``uri``, ``kind``
    (``"commits"``: log entries cleaned up; ``"file"``: a data or deletion-vector file
    removed by VACUUM), ``first_version`` and ``last_version`` (the missing commits, or
    twice the commit that added the missing file), ``path`` (the file, or None)."""

    error_class = "EVENTLOG_SOURCE_DATA_LOSS"

    first_version: int
    last_version: int

    def __init__(
        self, *, uri: str, kind: str, first_version: int, last_version: int, path: str | None = None
    ) -> None:
        if kind == "file":
            what = (
                f"data file {path} added at version {first_version} of the source table {uri} was "
                "removed (VACUUM) before the stream read it"
            )
        elif first_version == last_version:
            what = (
                f"commit {first_version} of the source table {uri} was removed (log cleanup) "
                "before the stream read it"
            )
        else:
            what = (
                f"commits {first_version}..{last_version} of the source table {uri} were removed "
                "(log cleanup) before the stream read them"
            )
        message = (
            f"Data loss: {what}. Its rows cannot be emitted. Set failOnDataLoss=false to skip what "
            "is missing (with a logged warning) and continue, or restart the stream from a version "
            "the table still holds (startingVersion)."
        )
        super().__init__(
            message, uri=uri, kind=kind, first_version=first_version, last_version=last_version, path=path
        )


class InvalidOffsetError(StreamingError):
    """An offset this source cannot resume from. Fields: ``uri``, ``offset`` (as given),
    ``reason``."""

    error_class = "EVENTLOG_SOURCE_INVALID_OFFSET"

    def __init__(self, *, uri: str, offset: Any, reason: str) -> None:
        super().__init__(
            f"Cannot resume the stream over {uri} from offset {offset!r}: {reason}",
            uri=uri,
            offset=offset,
            reason=reason,
        )


_CLASSES: dict[str, type[StreamingError]] = {
    cls.__name__: cls
    for cls in (SourceMetadataChangedError, ChangeCommitError, DataLossError, InvalidOffsetError)
}
