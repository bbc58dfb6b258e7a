"""The storage's clock, for retention decisions.

VACUUM and log cleanup delete files whose modification time (stamped by the storage: the
file server's kernel, S3's ``LastModified``) is older than "now" minus a retention. Taking
"now" from this process's clock alone lets a machine whose clock runs hours ahead delete
files that are still within the retention by every other clock: data files a writer has
not committed yet, files time travel still reads, commits of the retained history. Delta
uses the local clock there; this library bounds it by the storage's:
:func:`retention_now_ms` is the earlier of the two, so a clock ahead deletes nothing early
and a clock behind only keeps files longer. (Storage times of whole seconds, as S3's, are
read as the end of their second: up to 999 ms late, never hours.)

The storage's clock is read by writing a small probe object (``_eventlog/clock/<uuid>``,
never data: VACUUM skips ``_`` names), reading its modification time back and deleting
it: three requests per VACUUM or log cleanup. When that fails, or the file system reports
no time, the local clock is used (and a warning logged).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid

from eventlog.log.storage import EVENTLOG_DIR, LogStore, file_mtime_ms

__all__ = ["CLOCK_DIR", "retention_now_ms", "storage_now_ms"]

logger = logging.getLogger(__name__)

CLOCK_DIR = f"{EVENTLOG_DIR}/clock"


def storage_now_ms(log: LogStore) -> int | None:
    """The storage's current time (epoch ms) as the modification time of a probe object
    written now; None when it cannot be read (the probe failed, or no time was reported)."""
    fs = log.fs
    directory = f"{log.root}/{CLOCK_DIR}"
    path = f"{directory}/{uuid.uuid4().hex}"
    try:
        if log.is_local:
            fs.makedirs(directory, exist_ok=True)
        fs.pipe_file(path, b"")
        with contextlib.suppress(AttributeError, TypeError):
            fs.invalidate_cache(path)
        stamped = file_mtime_ms(fs.info(path))
    except Exception as exc:  # an optimisation of safety: fall back to the local clock
        logger.warning("%s: cannot read the storage's clock (%r); using this machine's", log.uri, exc)
        return None
    finally:
        with contextlib.suppress(Exception):
            fs.rm_file(path)
    if stamped is not None and stamped % 1000 == 0:
        # Whole seconds (S3's LastModified): the probe was written within that second, so
        # the end of it bounds "now" (at most 999 ms late) where its start would lag.
        stamped += 999
    return stamped


def retention_now_ms(log: LogStore) -> int:
    """ "Now" for retention decisions on ``log``'s storage: the earlier of this process's
    clock and the storage's (see the module docstring)."""
    local = int(time.time() * 1000)
    stamped = storage_now_ms(log)
    return local if stamped is None else min(local, stamped)
