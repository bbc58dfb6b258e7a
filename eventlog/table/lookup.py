"""Whether a path holds a table, without opening it. :class:`TableLookup` is a base of
:class:`~eventlog.table.Table`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import fsspec

from eventlog.log.storage import LogStore, open_log_store

__all__ = ["TableLookup"]


class TableLookup:
    """``Table.exists``."""

    @staticmethod
    def exists(
        uri: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        filesystem: fsspec.AbstractFileSystem | None = None,
    ) -> bool:
        """Whether ``uri`` holds a table (a commit in its ``_delta_log``)."""
        log = open_log_store(uri, storage_options, filesystem)
        return bool(LogStore.commit_versions(log.list_log()))
