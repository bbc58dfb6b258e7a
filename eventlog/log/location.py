"""Where a table lives: its URI and the file-system options that reach it, as one value.

Engines that run a table's work in other processes (Spark tasks and its driver-side
Python workers, a streaming query restarted from its checkpoint) must reach the table the
way the caller did: the same URI *and* the same ``storage_options`` (endpoint,
credentials... passed to fsspec, see :func:`eventlog.log.storage.normalize_uri`). Those
processes do not see the caller's environment, so a :class:`TableLocation` travels instead
of a bare URI: in read and write plans, input partitions, commit messages and the
streaming sink's plans.

Secrets stay out of sight: the repr lists option *names* only, and nothing here writes
the options anywhere (not into the Delta log, not into a streaming checkpoint). They do
travel, pickled, between the engine's processes, as the engine's own options do.

Durable mode travels too (``durable``, :mod:`eventlog.log.durable`): tasks that write a
durable table's data files must fsync them before the commit that names them, so the
location of a table opened with ``durable=True`` hands them the durable file system.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from eventlog.log.durable import durable_filesystem
from eventlog.log.storage import LogStore, normalize_uri, open_log_store
from eventlog.userinput import check_storage_options, check_uri

__all__ = ["TableLocation"]


@dataclasses.dataclass(frozen=True, repr=False)
class TableLocation:
    """A table URI with the fsspec ``storage_options`` that open it; immutable and picklable.

    Build it with :meth:`of` (validates) or :meth:`from_store` (from an open table's log);
    open the log with :meth:`log_store`; tasks reach the data files with :meth:`files`.
    A table handle is opened with ``Table.open(loc.uri, slots, storage_options=
    loc.storage_options, durable=loc.durable)`` (the table facade sits above this layer).
    """

    uri: str
    options: tuple[tuple[str, Any], ...] = ()  # sorted (name, value) pairs; see storage_options
    durable: bool = False  # durable mode: files() and log_store() fsync what they write

    @classmethod
    def of(
        cls,
        uri: str | os.PathLike[str] | TableLocation,
        storage_options: Mapping[str, Any] | None = None,
        *,
        durable: bool = False,
    ) -> TableLocation:
        """The location of ``uri`` reached with ``storage_options`` (InvalidInputError for a
        bad URI or options that are not a mapping of option names), written in durable mode
        with ``durable``. A ``TableLocation`` given as ``uri`` is returned as it is when no
        options are given and ``durable`` adds nothing."""
        if isinstance(uri, TableLocation):
            if storage_options:
                return cls(uri.uri, _frozen(check_storage_options(storage_options)), durable or uri.durable)
            return dataclasses.replace(uri, durable=True) if durable and not uri.durable else uri
        text = os.fspath(check_uri(uri))
        return cls(text, _frozen(check_storage_options(storage_options)), durable)

    @classmethod
    def from_store(cls, store: LogStore) -> TableLocation:
        """The location of an open table's log: its canonical URI and the options its file
        system was built with (fsspec keeps them as ``fs.storage_options``). A file system
        passed in as ``filesystem=`` is described the same way: another process builds one
        from the URI's scheme with those options, which is equal for the scheme's own
        fsspec class (s3fs, gcsfs...), not for a wrapper such as ``DirFileSystem``."""
        options: Mapping[str, Any] = {}
        if not isinstance(store.fs, LocalFileSystem):
            options = getattr(store.fs, "storage_options", None) or {}
        return cls(store.uri, _frozen(dict(options)), store.durable)

    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec options, as a fresh dict (nested values copied)."""
        return {k: copy.deepcopy(v) for k, v in self.options}

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.options)

    def log_store(self) -> LogStore:
        """The table's log, opened as a user's URI is (:func:`open_log_store`):
        InvalidInputError for an unknown scheme or options the file system does not take."""
        return open_log_store(self.uri, self.storage_options, durable=self.durable)

    def files(self) -> tuple[fsspec.AbstractFileSystem, str]:
        """(file system, table root in its form) for reading and writing data files in tasks
        (no request is made; fsspec reuses one client per scheme and options in a process);
        in durable mode, the file system whose writers fsync (:func:`durable_filesystem`)."""
        fs, root, _ = normalize_uri(self.uri, self.storage_options)
        return (durable_filesystem(fs) if self.durable else fs), root

    def __repr__(self) -> str:
        names = ", ".join(self.option_names)
        options = f", storage_options=[{names}]" if names else ""
        return f"TableLocation({self.uri!r}{options}{', durable=True' if self.durable else ''})"

    def __str__(self) -> str:
        return self.uri

    def __hash__(self) -> int:
        return hash((self.uri, self.option_names, self.durable))


def _frozen(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(((k, copy.deepcopy(v)) for k, v in options.items()), key=lambda kv: kv[0]))
