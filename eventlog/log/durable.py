"""Durable mode: a commit is acknowledged only once every file and directory entry it
needs would survive a power loss.

By default nothing is fsynced. A commit then survives the crash of any process (the page
cache holds it), but not the loss of the page cache itself (power failure, kernel crash):
commits acknowledged since the kernel last wrote its dirty pages and directory changes
back (seconds on ext4) may be gone afterwards, and their versions taken again by the next
writers.

A table opened with ``durable=True`` on a local file system fsyncs, before ``commit()``
returns:

- every data file, deletion-vector file and change-data file it wrote, and the directory
  entry of each (the directory it is in);
- every directory it created (data partitions, ``_delta_log``, ``_eventlog/staged``, the
  table's own directory), by fsyncing the parent of each;
- the staged commit and its directory, before the version slot is claimed (the claim is
  the commit point: it must never name bytes that could vanish);
- ``_delta_log`` after the commit file is linked into it (the publish);
- the embedded version-slot store, opened with ``fsync=True`` (each claim and its
  directories).

Checkpoints and ``_last_checkpoint`` are written in full and fsynced before they are
renamed into place, so a power loss never leaves a pointer to a torn checkpoint.

On object stores (S3, GCS, Azure) a PUT is durable once acknowledged: durable mode changes
nothing there. fsspec's in-memory file system has nothing to make durable.

:class:`DurableLocalFileSystem` is the table's local file system in durable mode: its
``makedirs`` and ``mv`` sync what they change, and the engine's writers ask
:func:`is_durable` whether to fsync the files they write outside fsspec.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem


def sync_file(path: str) -> None:
    """fsync the file at ``path`` (its data and size). A descriptor opened for reading
    suffices: Linux writes back the whole inode."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: str) -> None:
    """fsync the directory at ``path``: the entries created, renamed or removed in it
    become durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, then the entry of every directory it created
    made durable (the parent of each fsynced, top down)."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    if not missing:
        return
    os.makedirs(path, exist_ok=True)
    for directory in reversed(missing):
        sync_dir(os.path.dirname(directory))


class DurableLocalFileSystem(LocalFileSystem):  # type: ignore[misc]  # fsspec is untyped
    """The local file system of a table in durable mode (see the module docstring):
    ``makedirs`` and ``mv`` make their directory changes durable before they return; file
    contents are fsynced by the writers (:func:`sync_file`), which know when a file is
    complete."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        stripped = self._strip_protocol(path)
        if not exist_ok and os.path.exists(stripped):
            raise FileExistsError(stripped)
        make_dirs(stripped)

    def mv(self, path1: str, path2: str, recursive: bool = True, **kwargs: Any) -> None:
        super().mv(path1, path2, recursive=recursive, **kwargs)
        source, target = (os.path.dirname(self._strip_protocol(p)) for p in (path1, path2))
        sync_dir(target)
        if source != target:
            sync_dir(source)


def is_durable(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether writers on ``fs`` must fsync what they write (a table in durable mode)."""
    return isinstance(fs, DurableLocalFileSystem)


def durable_filesystem(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """``fs`` for a table in durable mode: a local file system becomes a
    :class:`DurableLocalFileSystem`; any other is returned as it is (an object store's PUT
    is durable when acknowledged)."""
    if isinstance(fs, LocalFileSystem) and not isinstance(fs, DurableLocalFileSystem):
        return DurableLocalFileSystem(auto_mkdir=fs.auto_mkdir)
    return fs


def sync_written(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """In durable mode, fsync the file just written at ``path`` and its directory entry;
    nothing otherwise."""
    if is_durable(fs):
        local = fs._strip_protocol(path)
        sync_file(local)
        sync_dir(os.path.dirname(local))
