"""In-commit timestamps (Delta's ``inCommitTimestamp`` writer feature, PROTOCOL.md "In-Commit
Timestamps"): each commit dates itself, in its commitInfo, instead of leaving it to the
commit file's modification time.

While ``delta.enableInCommitTimestamps`` is ``true``:

* writers put ``commitInfo`` first in every commit, with ``inCommitTimestamp`` =
  max(wall clock at the attempt, the previous commit's timestamp + 1 ms), so timestamps
  strictly increase with versions (:func:`next_timestamp`); the previous commit's timestamp
  is its own ``inCommitTimestamp``, or, for the commit that enables the feature, the
  modification time of the commit file before it;
* a commit that enables the feature on a table with older commits records where the in-commit
  timestamps begin: ``delta.inCommitTimestampEnablementVersion`` (its version) and
  ``delta.inCommitTimestampEnablementTimestamp`` (its ``inCommitTimestamp``);
* readers date versions from the enablement version on by ``inCommitTimestamp``, and older
  ones by their file's modification time; time travel to a timestamp at or after the
  enablement timestamp considers only versions from the enablement version on, and to an
  earlier one only versions before it (:func:`window`).

The helpers here are pure; the commit attempt (:mod:`eventlog.txn.attempt`) stamps commits,
the timeline (:mod:`eventlog.snapshot.timeline`) reads them, and the audit
(:mod:`eventlog.log.verify`) checks that they increase.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import orjson

from eventlog.log.actions import CommitInfo, Metadata

__all__ = [
    "ENABLE_KEY",
    "ENABLEMENT_TIMESTAMP_KEY",
    "ENABLEMENT_VERSION_KEY",
    "FIELD",
    "Enablement",
    "commit_time",
    "date_between",
    "enabled",
    "enablement",
    "in_commit_timestamp",
    "next_timestamp",
    "stamp_enablement",
    "stamp_info",
    "timestamp_of",
    "wall_clock_ms",
    "window",
]

ENABLE_KEY = "delta.enableInCommitTimestamps"
ENABLEMENT_VERSION_KEY = "delta.inCommitTimestampEnablementVersion"
ENABLEMENT_TIMESTAMP_KEY = "delta.inCommitTimestampEnablementTimestamp"
FIELD = "inCommitTimestamp"  # the commitInfo field


def wall_clock_ms() -> int:
    """The writer's clock (milliseconds since the epoch); tests replace it to skew clocks."""
    return int(time.time() * 1000)


def enabled(configuration: Mapping[str, str]) -> bool:
    """Whether a table with these properties writes in-commit timestamps."""
    return str(configuration.get(ENABLE_KEY, "")).lower() == "true"


@dataclasses.dataclass(frozen=True, slots=True)
class Enablement:
    """Where a table's in-commit timestamps begin: ``version`` (0 when they were on from
    the start) and that commit's ``timestamp`` (None when they were on from the start)."""

    version: int
    timestamp: int | None


def _integer(text: str) -> bool:
    return text.isascii() and text.isdigit()


def enablement(configuration: Mapping[str, str]) -> Enablement | None:
    """Where in-commit timestamps begin on a table with these properties (None when they
    are off). Unparsable enablement properties count as enabled from the start."""
    if not enabled(configuration):
        return None
    version, ts = configuration.get(ENABLEMENT_VERSION_KEY), configuration.get(ENABLEMENT_TIMESTAMP_KEY)
    if version is not None and ts is not None and _integer(version) and _integer(ts.removeprefix("-")):
        return Enablement(int(version), int(ts))
    return Enablement(0, None)  # not recorded, or unparsable: enabled from the start


def window(where: Enablement, ts_ms: int, latest: int) -> tuple[range, bool]:
    """The versions time travel to ``ts_ms`` considers, and whether they are dated by
    ``inCommitTimestamp`` (True) or by file modification time (False)."""
    if where.timestamp is None or where.version <= 0 or ts_ms >= where.timestamp:
        return range(where.version, latest + 1), True
    return range(0, min(where.version, latest + 1)), False


def in_commit_timestamp(info: CommitInfo | None) -> int | None:
    """The ``inCommitTimestamp`` of a commitInfo, or None when it has none."""
    if info is None:
        return None
    value = info.extra.get(FIELD)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def timestamp_of(data: bytes | None) -> int | None:
    """The ``inCommitTimestamp`` of a commit file's bytes (its commitInfo comes first), or
    None (no file, or a commit without one)."""
    if data is None:
        return None
    try:
        first = orjson.loads(data.split(b"\n", 1)[0])
    except orjson.JSONDecodeError:
        return None
    info = first.get("commitInfo") if isinstance(first, dict) else None
    value = info.get(FIELD) if isinstance(info, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def date_between(info: CommitInfo, previous: bytes | None, following: bytes | None) -> CommitInfo:
    """``info`` of a commit written into a gap (a REPAIR of a lost version) between the
    commit files ``previous`` and ``following``: dated after the previous commit's in-commit
    timestamp, and before the following one's when it can be, if the previous one has one."""
    before = timestamp_of(previous)
    if before is None:
        return info
    ts = next_timestamp(before, wall_clock_ms())
    after = timestamp_of(following)
    if after is not None and after - 1 > before:
        ts = min(ts, after - 1)
    return stamp_info(info, ts)


def commit_time(info: CommitInfo) -> int:
    """A commit's time as its commitInfo gives it: ``inCommitTimestamp``, else ``timestamp``."""
    stamped = in_commit_timestamp(info)
    return info.timestamp if stamped is None else stamped


def next_timestamp(previous_ms: int | None, now_ms: int) -> int:
    """A commit's in-commit timestamp: the writer's clock, but always after the previous
    commit's timestamp (``previous_ms``; None before version 0)."""
    return now_ms if previous_ms is None else max(now_ms, previous_ms + 1)


def stamp_info(info: CommitInfo, ts_ms: int) -> CommitInfo:
    """``info`` dated ``ts_ms``: its ``timestamp`` and its ``inCommitTimestamp`` (one value,
    so our history and Delta's agree)."""
    return dataclasses.replace(info, timestamp=ts_ms, extra={**info.extra, FIELD: ts_ms})


def stamp_enablement(metadata: Metadata, previous: Metadata, version: int, ts_ms: int) -> Metadata:
    """``metadata`` as a commit at ``version`` dated ``ts_ms`` writes it over ``previous``
    (the table's metadata before it): a commit that turns in-commit timestamps on records
    where they begin, and later metadata changes keep that record."""
    if not enabled(previous.configuration):
        where = {ENABLEMENT_VERSION_KEY: str(version), ENABLEMENT_TIMESTAMP_KEY: str(ts_ms)}
    else:
        keys = (ENABLEMENT_VERSION_KEY, ENABLEMENT_TIMESTAMP_KEY)
        where = {k: previous.configuration[k] for k in keys if k in previous.configuration}
        if all(metadata.configuration.get(k) == v for k, v in where.items()):
            return metadata
    return dataclasses.replace(metadata, configuration={**metadata.configuration, **where})
