"""A FUSE file system that forgets, at a power loss, every write not yet fsynced.

**The model** (strict POSIX, what fsync(2) promises and no more): the file system keeps
the state every process sees (the page cache) and, beside it, the *durable* state (the
disk). A file's content becomes durable only when that file is fsynced (``fsync`` or
``fdatasync`` on any descriptor of it): its durable content is then its whole current
content. A directory entry (create, mkdir, symlink, link, rename, unlink, rmdir) becomes
durable only when its directory is fsynced: the directory's durable entries are then
exactly its current ones, each naming the file it names now. A symlink's target is part
of its entry. A file whose entry is durable but which was never fsynced is empty on the
disk (ext4's zero-length files after a crash); a rename is two entries, each durable with
its own directory. Nothing else is ever written back on its own, unless the test asks for
a **writeback** (:meth:`PowerLossMount.writeback`: everything current becomes durable at
once, as when the kernel flushes its dirty pages and the journal commits), which is how
the default (no fsync) mode keeps anything at all.

**Power loss** (:meth:`PowerLossMount.cut`): the durable state is frozen at once and every
operation after it fails with EIO (the disk is gone); the test then SIGKILLs the writers,
and the frozen state is written into an ordinary directory (the *image*), which the test
opens as the table after the "reboot".

**Slow disk**: ``delay`` seconds per operation that touches data or entries (lookups and
attribute reads excluded), ``sync_delay`` more per fsync; the daemon is single-threaded,
so a delay holds every writer up, as one slow device does.

The daemon runs in its own process (``multiprocessing`` spawn), mounted with the kernel's
attribute and entry caches off, and is driven through a pipe. Writers are other processes
(:mod:`tests.support.powerloss_writers`).
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing as mp
import os
import stat
import subprocess
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import mfusepy

__all__ = ["PowerLossMount", "VolatileFS"]

_READY_TIMEOUT = 20.0
_CONTROL_TIMEOUT = 60.0


@dataclass(eq=False)
class Node:
    """A file, directory or symlink: its current state and its durable state."""

    kind: int  # stat.S_IFREG, S_IFDIR or S_IFLNK
    mode: int
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    entries: dict[str, Node] = field(default_factory=dict)
    durable_entries: dict[str, Node] = field(default_factory=dict)
    target: str = ""
    nlink: int = 1
    mtime_ns: int = field(default_factory=time.time_ns)

    def attrs(self) -> dict[str, Any]:
        size = len(self.data) if self.kind == stat.S_IFREG else len(self.target)
        nlink = 2 + sum(1 for n in self.entries.values() if n.kind == stat.S_IFDIR)
        return {
            "st_mode": self.kind | self.mode,
            "st_nlink": nlink if self.kind == stat.S_IFDIR else self.nlink,
            "st_size": size,
            "st_blocks": (size + 511) // 512,
            "st_atime": self.mtime_ns,
            "st_mtime": self.mtime_ns,
            "st_ctime": self.mtime_ns,
            "st_uid": os.getuid(),
            "st_gid": os.getgid(),
        }


Frozen = dict[str, Any]  # name -> bytes (file), str (symlink target) or Frozen (directory)


def _fail(code: int) -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(code)


class VolatileFS(mfusepy.Operations):  # type: ignore[misc]  # mfusepy is untyped
    """The file system of the module docstring (one instance per mount)."""

    use_ns = True

    def __init__(self, delay: float = 0.0, sync_delay: float = 0.0) -> None:
        self.root = Node(stat.S_IFDIR, 0o755)
        self.root.durable_entries = {}
        self.delay = delay
        self.sync_delay = sync_delay
        self.handles: dict[int, Node] = {}
        self.next_fh = 1
        self.dead = False  # after the power loss: every operation fails with EIO
        self.syncs = 0
        self.ops = 0
        self._mutex = threading.Lock()  # the control thread and the FUSE thread (not ``lock``: an op)

    # ------------------------------------------------------------------ helpers

    def _op(self, *, slow: bool = True) -> None:
        if self.dead:
            raise _fail(errno.EIO)
        self.ops += 1
        if slow and self.delay:
            time.sleep(self.delay)

    def _resolve(self, path: str) -> Node:
        node = self.root
        for part in path.strip("/").split("/"):
            if not part:
                continue
            if node.kind != stat.S_IFDIR:
                raise _fail(errno.ENOTDIR)
            child = node.entries.get(part)
            if child is None:
                raise _fail(errno.ENOENT)
            node = child
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._resolve(head or "/")
        if parent.kind != stat.S_IFDIR:
            raise _fail(errno.ENOTDIR)
        return parent, name

    def _new_fh(self, node: Node) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = node
        return fh

    def _node(self, path: str | None, fh: int | None) -> Node:
        if fh is not None and fh in self.handles:
            return self.handles[fh]
        if path is None:
            raise _fail(errno.EBADF)
        return self._resolve(path)

    def _add(self, path: str, node: Node) -> None:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _fail(errno.EEXIST)
        parent.entries[name] = node
        parent.mtime_ns = time.time_ns()

    # ------------------------------------------------------------------ metadata

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        self._op(slow=False)
        with self._mutex:
            return self._node(path, fh).attrs()

    def access(self, path: str, amode: int) -> int:
        self._op(slow=False)
        with self._mutex:
            self._resolve(path)
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        self._op()
        with self._mutex:
            node = self._resolve(path)
            if node.kind != stat.S_IFDIR:
                raise _fail(errno.ENOTDIR)
            return [".", "..", *node.entries]

    def opendir(self, path: str) -> int:
        self._op(slow=False)
        with self._mutex:
            node = self._resolve(path)
            if node.kind != stat.S_IFDIR:
                raise _fail(errno.ENOTDIR)
            return self._new_fh(node)

    def releasedir(self, path: str, fh: int) -> int:
        with self._mutex:
            self.handles.pop(fh, None)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._op()
        with self._mutex:
            self._add(path, Node(stat.S_IFDIR, mode & 0o7777))
        return 0

    def rmdir(self, path: str) -> int:
        self._op()
        with self._mutex:
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                raise _fail(errno.ENOENT)
            if node.kind != stat.S_IFDIR:
                raise _fail(errno.ENOTDIR)
            if node.entries:
                raise _fail(errno.ENOTEMPTY)
            del parent.entries[name]
        return 0

    def unlink(self, path: str) -> int:
        self._op()
        with self._mutex:
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                raise _fail(errno.ENOENT)
            if node.kind == stat.S_IFDIR:
                raise _fail(errno.EISDIR)
            del parent.entries[name]
            node.nlink -= 1
        return 0

    def rename(self, old: str, new: str) -> int:
        self._op()
        with self._mutex:
            source, old_name = self._parent(old)
            node = source.entries.get(old_name)
            if node is None:
                raise _fail(errno.ENOENT)
            target, new_name = self._parent(new)
            existing = target.entries.get(new_name)
            if existing is node:
                return 0
            if existing is not None:
                if existing.kind == stat.S_IFDIR and node.kind != stat.S_IFDIR:
                    raise _fail(errno.EISDIR)
                if existing.kind != stat.S_IFDIR and node.kind == stat.S_IFDIR:
                    raise _fail(errno.ENOTDIR)
                if existing.kind == stat.S_IFDIR and existing.entries:
                    raise _fail(errno.ENOTEMPTY)
                existing.nlink -= 1
            del source.entries[old_name]
            target.entries[new_name] = node
        return 0

    def link(self, target: str, source: str) -> int:
        self._op()
        with self._mutex:
            node = self._resolve(source)
            if node.kind == stat.S_IFDIR:
                raise _fail(errno.EPERM)
            self._add(target, node)
            node.nlink += 1
        return 0

    def symlink(self, target: str, source: str) -> int:
        self._op()
        with self._mutex:
            self._add(target, Node(stat.S_IFLNK, 0o777, target=source))
        return 0

    def readlink(self, path: str) -> str:
        self._op(slow=False)
        with self._mutex:
            node = self._resolve(path)
            if node.kind != stat.S_IFLNK:
                raise _fail(errno.EINVAL)
            return node.target

    def chmod(self, path: str, mode: int) -> int:
        self._op(slow=False)
        with self._mutex:
            self._resolve(path).mode = mode & 0o7777
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._op(slow=False)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._op(slow=False)
        with self._mutex:
            self._resolve(path).mtime_ns = times[1] if times else time.time_ns()
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 1 << 24, "f_bfree": 1 << 23,
                "f_bavail": 1 << 23, "f_files": 1 << 20, "f_ffree": 1 << 19, "f_namemax": 255}  # fmt: skip

    # ------------------------------------------------------------------ file data

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        self._op()
        with self._mutex:
            parent, name = self._parent(path)
            node = parent.entries.get(name)
            if node is None:
                node = Node(stat.S_IFREG, mode & 0o7777)
                parent.entries[name] = node
            elif flags & os.O_EXCL:
                raise _fail(errno.EEXIST)
            elif flags & os.O_TRUNC:
                node.data = bytearray()
            return self._new_fh(node)

    def open(self, path: str, flags: int) -> int:
        self._op(slow=False)
        with self._mutex:
            node = self._resolve(path)
            if flags & os.O_TRUNC and flags & (os.O_WRONLY | os.O_RDWR):
                node.data = bytearray()
            return self._new_fh(node)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._op()
        with self._mutex:
            return bytes(self._node(path, fh).data[offset : offset + size])

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._op()
        with self._mutex:
            node = self._node(path, fh)
            if offset > len(node.data):
                node.data.extend(bytes(offset - len(node.data)))
            node.data[offset : offset + len(data)] = data
            node.mtime_ns = time.time_ns()
        return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._op()
        with self._mutex:
            node = self._node(path, fh)
            if length < len(node.data):
                del node.data[length:]
            else:
                node.data.extend(bytes(length - len(node.data)))
        return 0

    def flush(self, path: str, fh: int) -> int:
        self._op(slow=False)
        return 0  # close(2) writes nothing back: only fsync does

    def release(self, path: str, fh: int) -> int:
        with self._mutex:
            self.handles.pop(fh, None)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._op()
        if self.sync_delay:
            time.sleep(self.sync_delay)
        with self._mutex:
            node = self._node(path, fh)
            node.durable = bytes(node.data)
            self.syncs += 1
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._op()
        if self.sync_delay:
            time.sleep(self.sync_delay)
        with self._mutex:
            node = self._node(path, fh)
            node.durable_entries = dict(node.entries)
            self.syncs += 1
        return 0

    # ------------------------------------------------------------------ control

    def writeback(self) -> None:
        """Everything current becomes durable (the kernel's periodic flush)."""
        with self._mutex:
            pending = [self.root]
            while pending:
                node = pending.pop()
                if node.kind == stat.S_IFDIR:
                    node.durable_entries = dict(node.entries)
                    pending.extend(node.entries.values())
                elif node.kind == stat.S_IFREG:
                    node.durable = bytes(node.data)

    def cut(self) -> Frozen:
        """Power loss: freeze the durable state; every later operation fails with EIO."""
        with self._mutex:
            self.dead = True
            return _freeze(self.root)

    def control(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message["op"]
        if op == "writeback":
            self.writeback()
            return {"ok": True}
        if op == "cut":
            frozen = self.cut()
            files = _materialize(frozen, Path(message["image"]))
            return {"ok": True, "files": files, "syncs": self.syncs, "ops": self.ops}
        if op == "delay":
            self.delay, self.sync_delay = float(message["delay"]), float(message["sync_delay"])
            return {"ok": True}
        if op == "stats":
            return {"ok": True, "syncs": self.syncs, "ops": self.ops}
        return {"ok": False, "error": f"unknown op {op!r}"}


def _freeze(directory: Node) -> Frozen:
    out: Frozen = {}
    for name, node in directory.durable_entries.items():
        if node.kind == stat.S_IFDIR:
            out[name] = _freeze(node)
        elif node.kind == stat.S_IFLNK:
            out[name] = node.target
        else:
            out[name] = node.durable
    return out


def _materialize(frozen: Frozen, where: Path) -> int:
    """Write the frozen durable tree into ``where``; the number of files written."""
    where.mkdir(parents=True, exist_ok=True)
    count = 0
    for name, value in frozen.items():
        path = where / name
        if isinstance(value, dict):
            count += _materialize(value, path)
        elif isinstance(value, str):
            os.symlink(value, path)
            count += 1
        else:
            path.write_bytes(value)
            count += 1
    return count


def _serve(mountpoint: str, conn: Connection, delay: float, sync_delay: float) -> None:
    """The daemon process: mount, answer the pipe's commands, return once unmounted."""
    fs = VolatileFS(delay, sync_delay)

    def control() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return
            try:
                reply = fs.control(message)
            except Exception as exc:  # reported to the test, which fails on it
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            conn.send(reply)

    threading.Thread(target=control, name="powerloss-control", daemon=True).start()
    mfusepy.FUSE(
        fs, mountpoint, foreground=True, nothreads=True, fsname="powerloss",
        attr_timeout=0, entry_timeout=0, negative_timeout=0,
    )  # fmt: skip


def _mounted(path: Path) -> bool:
    """Whether a file system is mounted at ``path`` (from the mount table: a stat of a
    mount whose daemon is dead or refuses would fail)."""
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts if len(line.split()) > 1)


class PowerLossMount:
    """The daemon of :class:`VolatileFS` mounted at ``mountpoint``, in its own process."""

    def __init__(self, mountpoint: Path, *, delay: float = 0.0, sync_delay: float = 0.0) -> None:
        self.mountpoint = mountpoint
        mountpoint.mkdir(parents=True, exist_ok=True)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(str(mountpoint), child, delay, sync_delay), name="powerloss-fuse"
        )
        self._proc.start()
        deadline = time.monotonic() + _READY_TIMEOUT
        while not _mounted(mountpoint):
            if not self._proc.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the power-loss file system did not mount at {mountpoint}")
            time.sleep(0.02)

    def _call(self, **message: Any) -> dict[str, Any]:
        self._conn.send(message)
        if not self._conn.poll(_CONTROL_TIMEOUT):
            raise TimeoutError(f"the power-loss file system did not answer {message}")
        reply: dict[str, Any] = self._conn.recv()
        if not reply.get("ok"):
            raise RuntimeError(f"power-loss file system: {reply}")
        return reply

    def writeback(self) -> None:
        """Make everything written so far durable (the kernel flushing its page cache)."""
        self._call(op="writeback")

    def set_delay(self, delay: float, sync_delay: float = 0.0) -> None:
        self._call(op="delay", delay=delay, sync_delay=sync_delay)

    def stats(self) -> dict[str, Any]:
        return self._call(op="stats")

    def cut(self, image: Path) -> dict[str, Any]:
        """Power loss now: the durable state is written to ``image`` (``files``: how many);
        every operation on the mount fails with EIO from here on."""
        return self._call(op="cut", image=str(image))

    def close(self) -> None:
        """Unmount (lazily, should a killed writer still hold a file) and stop the daemon."""
        if _mounted(self.mountpoint):
            done = subprocess.run(
                ["fusermount3", "-u", str(self.mountpoint)], capture_output=True, timeout=30
            )
            if done.returncode != 0:
                subprocess.run(
                    ["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, timeout=30
                )
        self._proc.join(timeout=15)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=15)
        with contextlib.suppress(OSError):
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
