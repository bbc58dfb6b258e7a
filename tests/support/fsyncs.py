"""A record of every ``os.fsync`` a test's process makes: the path synced and, for a
directory, its entries at that moment (a directory sync makes exactly those entries
durable). Used by the durable-mode tests of the engine, the CLI and the slot store's leases.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["Synced", "record_fsyncs"]


@dataclass
class Synced:
    """The fsync calls made, in order: (path, entries) for directories, (path, None) for files."""

    calls: list[tuple[str, frozenset[str] | None]] = field(default_factory=list)

    def files(self) -> list[str]:
        return [p for p, entries in self.calls if entries is None]

    def dirs(self) -> list[str]:
        return [p for p, entries in self.calls if entries is not None]

    def entry_durable(self, path: str | Path) -> int:
        """Index of the first directory sync that made ``path``'s entry durable (-1: none)."""
        parent, name = os.path.split(os.fspath(path))
        for i, (p, entries) in enumerate(self.calls):
            if p == parent and entries is not None and name in entries:
                return i
        return -1

    def file_synced(self, path: str | Path) -> int:
        """Index of the first sync of the file ``path`` (-1: none)."""
        for i, (p, entries) in enumerate(self.calls):
            if p == os.fspath(path) and entries is None:
                return i
        return -1


def record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> Synced:
    """Wrap ``os.fsync`` (for the test) to record each call in the returned :class:`Synced`."""
    record = Synced()
    real = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        record.calls.append((path, frozenset(os.listdir(path)) if is_dir else None))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return record
