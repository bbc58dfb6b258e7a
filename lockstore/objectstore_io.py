"""The object-store adapter's requests (:mod:`lockstore.objectstore`): :class:`Objects`, the
operations the store makes of its file system with errors translated; the modification
time of a listing entry; the check that a file system has an atomic put-if-absent; and the
parsing of ``<20 digits><suffix>`` object names.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import threading
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.asyn import AsyncFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from lockstore.base import SlotStoreUnavailableError

# Errors that are bugs in the caller or in this module, never "the store is unreachable".
_PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError, AssertionError, NotImplementedError)
# fsspec's in-memory file system implements put-if-absent as check-then-write; it is one
# process's, so one lock of this module makes it atomic.
_MEMORY_CREATE_LOCK = threading.Lock()


class Objects:
    """The operations the store uses, with errors translated.

    Every unexpected error (network, permissions, a missing bucket) becomes
    :class:`SlotStoreUnavailableError` naming the operation and key; the original is its
    ``__cause__``.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem) -> None:
        self.fs = fs
        self.memory = isinstance(fs, MemoryFileSystem)
        # s3fs HEADs an object before a GET when max_concurrency > 1 (its default), and HEAD
        # plus LIST when the object is missing; max_concurrency=1 makes cat_file one GET.
        self._cat_kwargs: dict[str, Any] = {"max_concurrency": 1} if hasattr(fs, "max_concurrency") else {}

    @staticmethod
    def _unavailable(operation: str, path: str, exc: BaseException) -> SlotStoreUnavailableError:
        error = SlotStoreUnavailableError(f"{operation} {path}: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error

    def create(self, path: str, data: bytes) -> bool:
        """Put-if-absent: True if this call created ``path``, False if it existed."""
        try:
            if self.memory:
                with _MEMORY_CREATE_LOCK:
                    self.fs.pipe_file(path, data, mode="create")
            else:
                self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        except _PROGRAMMING_ERRORS:
            raise
        except Exception as exc:
            raise self._unavailable("conditional put of", path, exc) from exc
        return True

    def put(self, path: str, data: bytes) -> None:
        try:
            self.fs.pipe_file(path, data)
        except _PROGRAMMING_ERRORS:
            raise
        except Exception as exc:
            raise self._unavailable("put of", path, exc) from exc

    def get(self, path: str) -> bytes | None:
        """The object's bytes, or None if it does not exist (one GET)."""
        try:
            data = self.fs.cat_file(path, **self._cat_kwargs)
        except FileNotFoundError:
            return None
        except _PROGRAMMING_ERRORS:
            raise
        except Exception as exc:
            raise self._unavailable("get of", path, exc) from exc
        return bytes(data)

    def exists(self, path: str) -> bool:
        return self.get(path) is not None

    def modified(self, path: str) -> float | None:
        """The object's modification time (epoch seconds, the server's: S3's whole-second
        ``LastModified``), fresh (one HEAD); None if it does not exist or has none."""
        try:
            with contextlib.suppress(AttributeError, TypeError):
                self.fs.invalidate_cache(path)
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        except _PROGRAMMING_ERRORS:
            raise
        except Exception as exc:
            raise self._unavailable("head of", path, exc) from exc
        return entry_time(info)

    def list(self, directory: str) -> dict[str, float | None]:
        """Base name -> modification time (epoch seconds, server's) of the objects directly
        under ``directory``; {} if there are none. Fresh: the listing cache is dropped first."""
        try:
            self.fs.invalidate_cache(directory)
            try:
                entries = self.fs.ls(directory, detail=True)
            except FileNotFoundError:
                return {}
        except _PROGRAMMING_ERRORS:
            raise
        except Exception as exc:
            raise self._unavailable("listing of", directory, exc) from exc
        out: dict[str, float | None] = {}
        for entry in entries:
            if entry.get("type") == "directory":
                continue
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            out[name] = entry_time(entry)
        return out


def entry_time(entry: Mapping[str, Any]) -> float | None:
    """The modification time of a listing entry, from whichever key the file system uses
    (s3fs: LastModified, gcsfs: updated, adlfs: last_modified, memory: created, local: mtime)."""
    for key in ("LastModified", "last_modified", "updated", "mtime", "created"):
        value = entry.get(key)
        if value is None:
            continue
        if isinstance(value, _dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=_dt.UTC)
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return _dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


def has_own_put(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` implements its own put (not fsspec's generic check-then-write one,
    which LocalFileSystem inherits): a precondition for an atomic ``mode="create"``."""
    if isinstance(fs, AsyncFileSystem):
        return type(fs)._pipe_file is not AsyncFileSystem._pipe_file
    return type(fs).pipe_file is not fsspec.AbstractFileSystem.pipe_file


def parse_numbered(name: str, suffix: str) -> int:
    """The number of a ``<20 digits><suffix>`` name, or -1 if ``name`` is not one."""
    if len(name) == 20 + len(suffix) and name.endswith(suffix) and name[:20].isdigit():
        return int(name[:20])
    return -1
