"""Offsets of a streaming read: a position in a table's history, as readable JSON.

An offset names the next change to read: ``version`` and ``index``, the number of that
version's data files already read. ``{"version": 12, "index": 3}`` means every version
before 12 and the first three files of version 12 have been read. While the stream reads
its first batch from a snapshot (no starting version given), ``isInitialSnapshot`` is true
and the files are those of the snapshot at ``version``, in a fixed order (modification
time, then path); the offset after the last of them is ``{"version": version + 1,
"index": 0}``. Files of a commit are numbered in the order the commit lists them (only
``dataChange`` adds count).

The JSON is what Spark stores in the checkpoint's ``offsets/<batch>`` files::

    {"sourceVersion": 1, "tableId": "4e0c…", "version": 12, "index": 3, "isInitialSnapshot": false}

``sourceVersion`` is the format of this JSON (a newer format is refused, not misread);
``tableId`` is the table's ``metaData.id``, so a stream never resumes on a different table
that was created at the same path. Offsets depend on nothing but the log, so they are
stable across restarts, processes and machines.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streaming.errors import InvalidOffsetError

__all__ = ["SOURCE_OFFSET_VERSION", "SourceOffset"]

SOURCE_OFFSET_VERSION = 1


@dataclass(frozen=True, slots=True)
class SourceOffset:
    """A position in a table's history; see the module docstring."""

    table_id: str
    version: int
    index: int = 0
    initial_snapshot: bool = False

    def __post_init__(self) -> None:
        if self.version < 0 or self.index < 0:
            raise ValueError(f"offset version and index must not be negative: {self}")

    @property
    def key(self) -> tuple[int, int, int]:
        """Sort key: a snapshot at ``v`` comes after commit ``v``'s files and before ``v + 1``."""
        return (self.version, 1 if self.initial_snapshot else 0, self.index)

    def to_json(self) -> dict[str, Any]:
        return {
            "sourceVersion": SOURCE_OFFSET_VERSION,
            "tableId": self.table_id,
            "version": self.version,
            "index": self.index,
            "isInitialSnapshot": self.initial_snapshot,
        }

    def __str__(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(
        cls, data: Mapping[str, Any] | str, *, uri: str, table_id: str | None = None
    ) -> SourceOffset:
        """Parse an offset (a dict or its JSON text) of the table at ``uri``.

        InvalidOffsetError when it is malformed, of a newer format, or (``table_id`` given)
        of another table.
        """
        try:
            doc = json.loads(data) if isinstance(data, str) else data
            fmt = int(doc.get("sourceVersion", SOURCE_OFFSET_VERSION))
            offset = cls(
                table_id=str(doc["tableId"]),
                version=_as_int(doc["version"]),
                index=_as_int(doc.get("index", 0)),
                initial_snapshot=_as_bool(doc.get("isInitialSnapshot", False)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidOffsetError(uri=uri, offset=data, reason=f"malformed offset ({exc})") from exc
        if fmt > SOURCE_OFFSET_VERSION:
            raise InvalidOffsetError(
                uri=uri,
                offset=data,
                reason=f"it has format version {fmt}, this library reads up to {SOURCE_OFFSET_VERSION}; "
                "upgrade the library",
            )
        if table_id is not None and offset.table_id != table_id:
            raise InvalidOffsetError(
                uri=uri,
                offset=data,
                reason=f"it belongs to table {offset.table_id}, but the table at this path is {table_id} "
                "(the table was deleted and created again); start the stream with a new checkpoint",
            )
        return offset


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value
