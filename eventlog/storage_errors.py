"""Typed errors of the storage under a table: :class:`StorageError` (a write or a read of the
log that storage refused) and :class:`CorruptDataFileError` (a data file that is not Parquet).

Re-exported from :mod:`eventlog.errors` and :mod:`eventlog`, where users import them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from eventlog.error_base import EventlogError

__all__ = ["CorruptDataFileError", "StorageError", "is_storage_failure", "storage_error", "storage_step"]


class StorageError(EventlogError, OSError):
    """The storage under a table failed: no space left, an I/O error, permission denied, an
    object store's error after its retries. It is both an :class:`EventlogError` and an
    ``OSError`` (``errno`` is the cause's, ``filename`` the path); the cause is chained.

    Fields: ``uri`` (the table), ``path`` (the file, relative to the table where it is
    one of its files), ``step`` (``"data file"``, ``"deletion vector"``, ``"staged
    commit"``, ``"slot claim"`` (a local slot store's own disk), ``"checkpoint"``, ``"commit
    log"``: reading ``_delta_log``) and
    ``errno``. A write that fails at one of these steps
    commits nothing and deletes the files it wrote; the table is as it was.
    """

    def __init__(self, message: str, *, uri: str, path: str, step: str, errno: int | None) -> None:
        super().__init__(message, uri=uri, path=path, step=step, errno=errno)
        self.strerror = message
        self.filename = path


def storage_error(uri: str, path: str, step: str, cause: BaseException) -> StorageError:
    """The :class:`StorageError` of ``cause`` (an ``OSError`` or an object store's error)
    raised at ``step`` on ``path``."""
    code = getattr(cause, "errno", None)
    reason = (
        cause.strerror
        if isinstance(cause, OSError) and cause.strerror
        else str(cause) or type(cause).__name__
    )
    return StorageError(
        f"{uri}: storage failed {'reading' if step == 'commit log' else 'writing'} the {step} "
        f"{path}: {reason}",
        uri=uri,
        path=path,
        step=step,
        errno=code if isinstance(code, int) else None,
    )


#: Packages of the object-store clients under fsspec, whose errors s3fs, gcsfs and adlfs
#: raise as they are when no HTTP answer came (a refused or reset connection, a timeout).
_CLIENT_PACKAGES = frozenset({"botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google", "azure"})


def is_storage_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is storage failing: an ``OSError`` or an object-store client's error."""
    if isinstance(exc, OSError):
        return True
    return any(cls.__module__.split(".")[0] in _CLIENT_PACKAGES for cls in type(exc).__mro__)


@contextlib.contextmanager
def storage_step(uri: str, path: str, step: str = "data file") -> Iterator[None]:
    """An ``OSError`` (or an object-store client's error) from storage inside becomes
    :class:`StorageError` (naming ``path`` and ``step``), the cause chained; the library's
    own errors pass as they are."""
    try:
        yield
    except EventlogError:
        raise
    except Exception as exc:
        if not is_storage_failure(exc):
            raise
        raise storage_error(uri, path, step, exc) from exc


class CorruptDataFileError(EventlogError):
    """A data file the snapshot names is not a readable Parquet file: empty, torn or
    overwritten (a power loss on a table not in durable mode, a partial copy). Fields:
    ``uri`` (the table), ``path`` (the file), ``version`` (the snapshot read, None when
    unknown) and ``reason`` (what the Parquet reader said). The log is intact; restoring the
    file (or RESTORE to a version without it) repairs the table."""

    def __init__(self, uri: str, path: str, version: int | None, reason: str) -> None:
        at = f" at version {version}" if version is not None else ""
        super().__init__(
            f"{uri}: data file {path} of the snapshot{at} is not a readable Parquet file: {reason}",
            uri=uri,
            path=path,
            version=version,
            reason=reason,
        )
