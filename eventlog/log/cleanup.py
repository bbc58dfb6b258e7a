"""Log cleanup: Delta's metadata cleanup, bounded by the audit retention.

Delta deletes ``_delta_log`` files older than ``delta.logRetentionDuration`` (30 days by
default) when it writes a checkpoint, but only below that checkpoint: the newest checkpoint
and every commit after it stay, so the table can always be rebuilt. Audits need longer, so
``eventlog.auditRetentionDuration`` (default: keep everything) is a second bound that
cleanup never crosses: a file is deleted only when it is older than *both* durations.

What counts (Delta's ``cleanUpExpiredLogs``): commit files ``<N>.json`` and their ``.crc``,
and checkpoint files of versions below the checkpoint just written, whose modification time
is before the cutoff. Deletion goes oldest first and stops at the first file that is not
expired, so what remains is always a contiguous run of commits after a checkpoint.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping

from eventlog.log.storage import LogStore, file_mtime_ms
from eventlog.userinput import parse_interval_ms

__all__ = [
    "AUDIT_RETENTION_KEY",
    "DEFAULT_LOG_RETENTION",
    "LOG_RETENTION_KEY",
    "cleanup_cutoff_ms",
    "cleanup_expired_logs",
]

LOG_RETENTION_KEY = "delta.logRetentionDuration"
DEFAULT_LOG_RETENTION = "interval 30 days"
AUDIT_RETENTION_KEY = "eventlog.auditRetentionDuration"
_VERSIONED = re.compile(r"^(\d{20})\.(json|crc|checkpoint\.parquet|checkpoint\.\d+\.\d+\.parquet)$")


def cleanup_cutoff_ms(properties: Mapping[str, str], now_ms: int | None = None) -> int | None:
    """The modification time before which log files may go, or None (keep everything:
    the default, since ``eventlog.auditRetentionDuration`` is unset)."""
    audit = properties.get(AUDIT_RETENTION_KEY)
    if audit is None:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    retention = max(
        int(parse_interval_ms(properties.get(LOG_RETENTION_KEY, DEFAULT_LOG_RETENTION))),
        int(parse_interval_ms(audit)),
    )
    return now - retention


def cleanup_expired_logs(log: LogStore, checkpoint_version: int, cutoff_ms: int) -> list[str]:
    """Delete expired log files below ``checkpoint_version`` (see the module docstring);
    returns the base names deleted, oldest first."""
    by_version: dict[int, list[str]] = {}
    for name in log.list_log():
        match = _VERSIONED.match(name)
        if match is not None and int(match.group(1)) < checkpoint_version:
            by_version.setdefault(int(match.group(1)), []).append(name)
    deleted: list[str] = []
    for version in sorted(by_version):
        names = by_version[version]
        paths = [f"{log.log_dir}/{n}" for n in names]
        mtimes = [file_mtime_ms(log.fs.info(p)) for p in paths]
        if any(m is None or m >= cutoff_ms for m in mtimes):
            break  # keep the rest contiguous
        for name, path in zip(names, paths, strict=True):
            with contextlib.suppress(FileNotFoundError):  # a concurrent cleanup got there first
                log.fs.rm(path)
            deleted.append(name)
    return deleted
