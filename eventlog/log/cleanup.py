"""Log cleanup: Delta's metadata cleanup, bounded by the audit retention.

Delta deletes ``_delta_log`` files older than ``delta.logRetentionDuration`` (30 days by
default) when it writes a checkpoint, but only below that checkpoint: the newest checkpoint
and every commit after it stay, so the table can always be rebuilt. Audits need longer, so
``eventlog.auditRetentionDuration`` (default: keep everything) is a second bound that
cleanup never crosses: a file is deleted only when it is older than *both* durations.

What counts (Delta's ``cleanUpExpiredLogs``): commit files ``<N>.json`` and their ``.crc``,
and checkpoint files of every kind (classic, multi-part, UUID-named V2) of versions below
the checkpoint just written, whose modification time is before the cutoff. The candidates
go oldest first and stop at the first version with a file that is not expired, so what
remains is always a contiguous run of commits after a checkpoint. Then, in this order:

1. when the newest checkpoint is a UUID-named V2 one, its classic-named compatibility copy
   is written first (as Delta does), so readers that know no UUID names still find the
   protocol and fail cleanly once the commits are gone;
2. commits go before checkpoints (``checkpointProtection`` requirement d);
3. sidecar files in ``_delta_log/_sidecars`` that no remaining checkpoint references and
   that are older than the cutoff go last (PROTOCOL.md "Metadata Cleanup", steps 4-5);
   younger ones may belong to a checkpoint being written.

``checkpointProtection`` (writer feature; :class:`CheckpointProtection`): with
``delta.requireCheckpointProtectionBeforeVersion`` = P, history before P is cleaned up
only as Delta Spark's ``metadataCleanupAllowed`` permits: in one go up to P (the last
commit deleted is at least P - 1), or up to a version that already has a checkpoint, or
when this library supports the protocol of every version removed (read) and of the first
one kept (write). Otherwise nothing is deleted.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from eventlog.errors import CorruptLogError
from eventlog.log.actions import Protocol, decode_commit
from eventlog.log.checkpoint_locate import CheckpointFiles, list_checkpoints
from eventlog.log.checkpoint_read import read_checkpoint, referenced_sidecars
from eventlog.log.checkpoint_state import SIDECARS
from eventlog.log.checkpoint_v2 import write_compat_checkpoint
from eventlog.log.storage import LogStore, file_mtime_ms
from eventlog.userinput import parse_interval_ms

__all__ = [
    "AUDIT_RETENTION_KEY",
    "DEFAULT_LOG_RETENTION",
    "LOG_RETENTION_KEY",
    "PROTECTION_FEATURE",
    "PROTECTION_KEY",
    "CheckpointProtection",
    "cleanup_cutoff_ms",
    "cleanup_expired_logs",
]

logger = logging.getLogger(__name__)

LOG_RETENTION_KEY = "delta.logRetentionDuration"
DEFAULT_LOG_RETENTION = "interval 30 days"
AUDIT_RETENTION_KEY = "eventlog.auditRetentionDuration"
PROTECTION_FEATURE = "checkpointProtection"
PROTECTION_KEY = "delta.requireCheckpointProtectionBeforeVersion"
_VERSIONED = re.compile(
    r"^(\d{20})\.(json|crc|checkpoint\.parquet|checkpoint\.\d{10}\.\d{10}\.parquet"
    r"|checkpoint\.[0-9a-fA-F-]{36}\.(?:json|parquet))$"
)


TRUNCATE_HISTORY_RETENTION_KEY = "delta.dropFeatureTruncateHistory.retentionDuration"
DEFAULT_TRUNCATE_HISTORY_RETENTION = "interval 24 hours"


def truncate_history_cutoff_ms(properties: Mapping[str, str], now_ms: int) -> int:
    """The cutoff of DROP FEATURE ... TRUNCATE HISTORY's log cleanup (Delta's): files older
    than ``delta.dropFeatureTruncateHistory.retentionDuration`` (24 hours by default) go,
    but never within ``eventlog.auditRetentionDuration`` when that is set. ``now_ms``: "now"
    for retention decisions (:func:`eventlog.log.storage_clock.retention_now_ms`: this
    machine's clock bounded by the storage's, so a clock ahead deletes nothing early)."""
    retention = int(
        parse_interval_ms(properties.get(TRUNCATE_HISTORY_RETENTION_KEY, DEFAULT_TRUNCATE_HISTORY_RETENTION))
    )
    audit = properties.get(AUDIT_RETENTION_KEY)
    if audit is not None:
        retention = max(retention, int(parse_interval_ms(audit)))
    return now_ms - retention


def cleanup_cutoff_ms(properties: Mapping[str, str], now_ms: int) -> int | None:
    """The modification time before which log files may go, or None (keep everything:
    the default, since ``eventlog.auditRetentionDuration`` is unset). ``now_ms`` as for
    :func:`truncate_history_cutoff_ms`."""
    audit = properties.get(AUDIT_RETENTION_KEY)
    if audit is None:
        return None
    retention = max(
        int(parse_interval_ms(properties.get(LOG_RETENTION_KEY, DEFAULT_LOG_RETENTION))),
        int(parse_interval_ms(audit)),
    )
    return now_ms - retention


@dataclass(frozen=True, slots=True)
class CheckpointProtection:
    """The ``checkpointProtection`` bound of a table: history before ``before_version`` is
    protected; ``supported(protocol, write)`` says whether this library reads (or, with
    ``write``, writes) a table with ``protocol``."""

    before_version: int
    supported: Callable[[Protocol, bool], bool]

    @staticmethod
    def of(
        protocol: Protocol, properties: Mapping[str, str], supported: Callable[[Protocol, bool], bool]
    ) -> CheckpointProtection | None:
        """The protection a table with ``protocol`` and ``properties`` asks for, or None (the
        feature is not supported, or the version is unset, unparsable or 0)."""
        if PROTECTION_FEATURE not in (protocol.writer_features or ()) or protocol.min_writer_version < 7:
            return None
        raw = properties.get(PROTECTION_KEY, "0")
        # An unreadable bound protects everything: nothing before it is ever cleaned up.
        before = int(raw) if raw.isascii() and raw.isdigit() else 2**62
        return CheckpointProtection(before, supported) if before > 0 else None


def _expired(
    log: LogStore, checkpoint_version: int, cutoff_ms: int, names: Sequence[str]
) -> dict[int, list[str]]:
    """The log files (by version) cleanup may delete: below ``checkpoint_version``, oldest
    first, up to the first version with a file that is not older than ``cutoff_ms``."""
    by_version: dict[int, list[str]] = {}
    for name in names:
        match = _VERSIONED.match(name)
        if match is not None and int(match.group(1)) < checkpoint_version:
            by_version.setdefault(int(match.group(1)), []).append(name)
    doomed: dict[int, list[str]] = {}
    for version in sorted(by_version):
        mtimes = [file_mtime_ms(log.fs.info(f"{log.log_dir}/{n}")) for n in by_version[version]]
        if any(m is None or m >= cutoff_ms for m in mtimes):
            break  # keep the rest contiguous
        doomed[version] = sorted(by_version[version])
    return doomed


def _protocols_supported(
    log: LogStore, first: int, last: int, names: Sequence[str], protection: CheckpointProtection
) -> bool:
    """Whether the protocol of every version in ``first..last`` reads here, and that of
    ``last`` (the first version kept) also writes."""
    base = next((cp for cp in list_checkpoints(names) if cp.version <= first), None)
    try:
        protocol = (
            None
            if base is None
            else read_checkpoint(log.fs, log.log_dir, base.version, listing=names).protocol
        )
        for version in range(0 if base is None else base.version + 1, last + 1):
            data = log.read_commit(version)
            if data is None:
                return False  # a hole: the history cannot be checked
            for action in decode_commit(data):
                if isinstance(action, Protocol):
                    protocol = action
            if version >= first and (protocol is None or not protection.supported(protocol, version == last)):
                return False
    except (CorruptLogError, FileNotFoundError, ValueError):
        return False
    return True


def _allowed(
    log: LogStore,
    doomed: Mapping[int, list[str]],
    names: Sequence[str],
    protection: CheckpointProtection | None,
) -> bool:
    """Delta Spark's ``metadataCleanupAllowed`` (see the module docstring)."""
    if protection is None:
        return True
    before = protection.before_version
    commits = [v for v, files in doomed.items() if f"{v:020d}.json" in files and v <= before - 1]
    if not commits:
        return True  # nothing before the protected version goes
    first, end = min(commits), max(commits)
    if end >= before - 1:
        return True  # the whole protected history goes in one go
    if any(cp.version == end + 1 for cp in list_checkpoints(names)):
        return True  # the first version kept already has a checkpoint
    return _protocols_supported(log, first, end + 1, names, protection)


def _delete(log: LogStore, paths: Sequence[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):  # a concurrent cleanup got there first
            log.fs.rm(path)


def _compat_checkpoint(log: LogStore, names: Sequence[str], checkpoint_version: int) -> None:
    newest = [cp for cp in list_checkpoints(names) if cp.version == checkpoint_version]
    if newest and all(cp.kind == "v2" for cp in newest):
        try:
            write_compat_checkpoint(log.fs, log.log_dir, newest[0])
        except (OSError, ValueError, pa.ArrowException) as exc:  # an optimisation for old readers
            logger.warning("no compatibility checkpoint at %s: %s", checkpoint_version, exc)


def _sweep_sidecars(log: LogStore, cutoff_ms: int) -> list[str]:
    """Delete sidecars no checkpoint left in the log references, older than ``cutoff_ms``."""
    directory = f"{log.log_dir}/{SIDECARS}"
    try:
        entries = log.fs.ls(directory, detail=True)
    except FileNotFoundError:
        return []
    checkpoints: list[CheckpointFiles] = list_checkpoints(log.list_log())
    try:
        keep = referenced_sidecars(log.fs, log.log_dir, checkpoints)
    except (CorruptLogError, FileNotFoundError) as exc:  # cannot tell what is referenced
        logger.warning("%s: no sidecar deleted: %s", log.log_dir, exc)
        return []
    deleted = []
    for entry in sorted(entries, key=lambda e: str(e["name"])):
        name = str(entry["name"]).rstrip("/").rpartition("/")[2]
        mtime = file_mtime_ms(entry)
        if entry.get("type") != "file" or name in keep or mtime is None or mtime >= cutoff_ms:
            continue
        _delete(log, [f"{directory}/{name}"])
        deleted.append(f"{SIDECARS}/{name}")
    return deleted


def cleanup_expired_logs(
    log: LogStore, checkpoint_version: int, cutoff_ms: int, *, protection: CheckpointProtection | None = None
) -> list[str]:
    """Delete expired log files below ``checkpoint_version`` and unreferenced sidecars (see
    the module docstring); returns the names deleted (``_sidecars/<name>`` for sidecars),
    commits first, oldest first.

    Raises ``OSError`` when the storage fails; what was deleted before stays deleted (the
    log remains a contiguous run of commits after a checkpoint)."""
    names = log.list_log()
    doomed = _expired(log, checkpoint_version, cutoff_ms, names)
    if doomed and not _allowed(log, doomed, names, protection):
        logger.info("%s: log cleanup skipped: checkpointProtection keeps the history", log.log_dir)
        return []
    deleted: list[str] = []
    if doomed:
        _compat_checkpoint(log, names, checkpoint_version)
        files = [n for version in sorted(doomed) for n in doomed[version]]
        commits = [n for n in files if n.endswith((".json", ".crc")) and ".checkpoint." not in n]
        checkpoints = [n for n in files if ".checkpoint." in n]
        for group in (commits, checkpoints):  # commits before the checkpoints (requirement d)
            _delete(log, [f"{log.log_dir}/{n}" for n in group])
            deleted += group
    return deleted + _sweep_sidecars(log, cutoff_ms)
