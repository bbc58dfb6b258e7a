"""The table's ``_delta_log`` on any fsspec filesystem.

Commit files are immutable once published, and a published ``<N>.json`` always appears
with its full content: on local disks it is hard-linked from the fully written staged
file (``os.link`` is atomic and fails if the target exists, so it is also a
put-if-absent); on object stores a single PUT is atomic; the in-memory filesystem is
guarded by a process-wide lock.

Staged commits live in the table's own area, ``<table>/_eventlog/staged/``, never under
``_delta_log/``: that directory holds only the files the Delta protocol defines, and its
``_staged_commits/`` is Delta's (catalog-managed commits, whose names Delta Spark's log
cleanup parses and deletes). Tables staged there by earlier releases keep working: a staged
file not found in the new place is read (and published, and deleted) from the old one.

**Requests on object stores.** Every method here costs as few requests as S3 allows, and
never relies on what S3 lacks (rename, directories); LIST is strongly consistent:

- A commit or staged file is read with one GET (``FileNotFoundError`` when missing). s3fs's
  ``exists``/``info`` would cost a HEAD and, for a missing key, a LIST too (its directory
  fallback), and its ``cat_file`` of a whole file first asks for the size (a HEAD).
- :meth:`LogStore.commit_exists` probes with one ranged GET of the first
  ``PROBE_BYTES``: the next version is usually missing (a 404, as cheap as a HEAD), and when
  it is there its bytes are what the caller reads next, so a whole small commit is kept for
  the next :meth:`~LogStore.read_commit` / :meth:`~LogStore.open_commit` of that version
  (commit files are immutable once published).
- Nothing makes directories on object stores (S3 has none; s3fs's ``makedirs`` costs a HEAD
  of the bucket), and the storage options are checked without a request where the client can
  (s3fs builds its client from them).
- Publishing is one conditional PUT (``If-None-Match: *``).

**Durable mode** (``durable=True``, local file systems only): staged commits and their
directory are fsynced before the claim that names them, ``_delta_log`` after each publish,
and every directory made here has its entry synced (:mod:`eventlog.log.durable`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import inspect
import io
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO, cast

import fsspec
from fsspec.implementations.local import LocalFileSystem

from eventlog.errors import InvalidInputError, storage_step
from eventlog.log.durable import durable_filesystem, is_durable, make_dirs, sync_dir, sync_file
from eventlog.userinput import check_local_path, check_storage_options, check_uri

logger = logging.getLogger(__name__)

LOG_DIR = "_delta_log"
#: The table's own area (slots of the embedded store, staged commits, Spark staging).
EVENTLOG_DIR = "_eventlog"
#: Staged commits, relative to the table root.
STAGED_DIR = f"{EVENTLOG_DIR}/staged"
#: Where releases before 0.2 staged commits (Delta's reserved directory): read, never written.
LEGACY_STAGED_DIR = f"{LOG_DIR}/_staged_commits"
_MEMORY_LOCK = threading.Lock()
#: How much of a commit file one probing GET fetches (commitlog reads 64 KiB first too).
PROBE_BYTES = 1 << 16
_PROBED_KEEP = 16  # probed small commits kept for the read that follows
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"})


def flat_namespace(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` is an object store: keys, no directories (``makedirs`` would only cost
    a request)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool(_OBJECT_STORES & set(protocols))


def whole_file_options(fs: fsspec.AbstractFileSystem) -> dict[str, Any]:
    """``cat_file`` options that make reading a whole file one GET: s3fs >= 2025 otherwise
    asks for the size first (a HEAD; a HEAD and a LIST when the key is missing), to split big
    files into concurrent ranged GETs."""
    method = getattr(fs, "_cat_file", None)
    if method is None:
        return {}
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return {}
    return {"max_concurrency": 1} if "max_concurrency" in parameters else {}


class _Prefixed(io.RawIOBase):
    """A file read as ``prefix`` (already fetched) and then the rest, opened on first need."""

    def __init__(self, prefix: bytes, open_rest: Callable[[int], BinaryIO]) -> None:
        self._prefix = memoryview(prefix)
        self._pos = 0
        self._open_rest = open_rest
        self._rest: BinaryIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._pos < len(self._prefix):
            n = min(len(view), len(self._prefix) - self._pos)
            view[:n] = self._prefix[self._pos : self._pos + n]
            self._pos += n
            return n
        if self._rest is None:
            self._rest = self._open_rest(len(self._prefix))
        data = self._rest.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._rest is not None:
            self._rest.close()
        super().close()


def commit_file_name(version: int) -> str:
    return f"{version:020d}.json"


def parse_commit_file_name(name: str) -> int | None:
    base = name.rsplit("/", 1)[-1]
    if len(base) == 25 and base.endswith(".json") and base[:20].isdigit():
        return int(base[:20])
    return None


def file_mtime_ms(info: Mapping[str, Any]) -> int | None:
    """Modification time (epoch ms) from an fsspec ``info`` dict, whatever the filesystem
    calls it; None when it reports none."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return int(value * 1000)
        if isinstance(value, dt.datetime):
            return int(value.timestamp() * 1000)
    return None


def normalize_uri(
    uri: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    filesystem: fsspec.AbstractFileSystem | None = None,
) -> tuple[fsspec.AbstractFileSystem, str, str]:
    """(filesystem, root path in the filesystem's form, canonical URI).

    ``storage_options`` go to fsspec for the URI's scheme (credentials, endpoint...), as in
    ``fsspec.open``, pandas and ``deltalake``; ``filesystem`` is an fsspec file system to use
    as it is (its own options apply)."""
    text = os.fspath(uri)
    if filesystem is not None:
        fs, root = filesystem, filesystem._strip_protocol(text)
    else:
        fs, root = fsspec.core.url_to_fs(text, **dict(storage_options or {}))
    root = root.rstrip("/") or "/"
    if isinstance(fs, LocalFileSystem):
        root = os.path.abspath(root)
        canonical = root
    else:
        canonical = fs.unstrip_protocol(root)
    return fs, root, canonical


class LogStore:
    """Reads and writes the commit files of one table.

    ``durable``: fsync before a commit is acknowledged (:mod:`eventlog.log.durable`); on
    object stores a PUT is durable when acknowledged, so it changes nothing there.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        filesystem: fsspec.AbstractFileSystem | None = None,
        durable: bool = False,
    ) -> None:
        self.fs, self.root, self.uri = normalize_uri(uri, storage_options, filesystem)
        if durable:
            self.fs = durable_filesystem(self.fs)
        #: fsync files and directories before a commit is acknowledged (local disks only).
        self.durable = is_durable(self.fs)
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.log_dir = f"{self.root}/{LOG_DIR}"
        self.staged_dir = f"{self.root}/{STAGED_DIR}"
        self.legacy_staged_dir = f"{self.root}/{LEGACY_STAGED_DIR}"
        self._legacy_staged: set[str] = set()  # names found only in the legacy directory
        self._made_dirs = not self.is_local and flat_namespace(self.fs)  # none to make
        self._whole = {} if self.is_local else whole_file_options(self.fs)
        self._probed: OrderedDict[int, bytes] = OrderedDict()  # small commits a probe fetched
        self._probed_lock = threading.Lock()

    def _fresh(self, path: str) -> fsspec.AbstractFileSystem:
        """The file system, with what it cached about ``path`` forgotten: object-store
        clients (s3fs) cache listings, and other writers' commits must be seen."""
        if not self.is_local:
            self.fs.invalidate_cache(path)
        return self.fs

    def _get(self, path: str) -> bytes:
        """The whole file at ``path`` (not local), in one GET; FileNotFoundError if missing."""
        data: bytes = self.fs.cat_file(path, **self._whole)
        return data

    def _get_head(self, path: str) -> bytes:
        """The first ``PROBE_BYTES`` of ``path`` (not local), in one ranged GET;
        FileNotFoundError if missing."""
        try:
            data: bytes = self.fs.cat_file(path, start=0, end=PROBE_BYTES)
        except FileNotFoundError:
            raise
        except OSError:
            return self._get(path)  # S3 refuses a range of an empty object (416)
        return data

    def _keep_probed(self, version: int, data: bytes) -> None:
        with self._probed_lock:
            self._probed[version] = data
            while len(self._probed) > _PROBED_KEEP:
                self._probed.popitem(last=False)

    def _take_probed(self, version: int) -> bytes | None:
        with self._probed_lock:
            return self._probed.pop(version, None)

    # ------------------------------------------------------------------ paths

    def commit_path(self, version: int) -> str:
        return f"{self.log_dir}/{commit_file_name(version)}"

    def staged_path(self, name: str) -> str:
        """Where staged commit ``name`` is: the legacy directory for a name read from there."""
        if name in self._legacy_staged:
            return f"{self.legacy_staged_dir}/{name}"
        return f"{self.staged_dir}/{name}"

    # ------------------------------------------------------------------ reading

    def list_log(self) -> list[str]:
        """Base names in ``_delta_log`` (empty when it does not exist)."""
        with storage_step(self.uri, LOG_DIR, "commit log"):
            return self._list_log()

    def _list_log(self) -> list[str]:
        if self.is_local:
            try:
                return os.listdir(self.log_dir)
            except FileNotFoundError:
                return []
        try:
            return [p.rsplit("/", 1)[-1] for p in self._fresh(self.log_dir).ls(self.log_dir, detail=False)]
        except FileNotFoundError:
            return []

    @staticmethod
    def commit_versions(names: Sequence[str]) -> list[int]:
        versions = [v for v in (parse_commit_file_name(n) for n in names) if v is not None]
        versions.sort()
        return versions

    @staticmethod
    def commit_version_bounds(names: Sequence[str]) -> tuple[int, int] | None:
        """(first, last) commit version among ``names`` (base names), or None.

        Zero-padded names sort like their versions, so no name is parsed but two: opening
        a table with a long log lists thousands of them.
        """
        commits = [n for n in names if len(n) == 25 and n[20:] == ".json" and n[:20].isdigit()]
        if not commits:
            return None
        return int(min(commits)[:20]), int(max(commits)[:20])

    def read_commit(self, version: int) -> bytes | None:
        """The bytes of ``<version>.json``, or None when it is not published."""
        path = self.commit_path(version)
        try:
            if self.is_local:
                with open(path, "rb") as f:
                    return f.read()
            probed = self._take_probed(version)
            if probed is not None:
                return probed
            with storage_step(self.uri, f"{LOG_DIR}/{commit_file_name(version)}", "commit log"):
                try:
                    return self._get(path)
                except FileNotFoundError:
                    return None
        except FileNotFoundError:
            return None

    def open_commit(self, version: int) -> BinaryIO | None:
        """``<version>.json`` opened for reading (big commits are read piece by piece), or
        None when it is not published."""
        path = self.commit_path(version)
        try:
            if self.is_local:
                return open(path, "rb")
            # One GET for a small commit; a big one continues with ranged reads.
            head = self._take_probed(version)
            if head is None:
                head = self._get_head(path)
        except FileNotFoundError:
            return None
        if len(head) < PROBE_BYTES:
            return io.BytesIO(head)

        def rest(offset: int) -> BinaryIO:
            f: BinaryIO = self.fs.open(path, "rb")
            f.seek(offset)
            return f

        return cast(BinaryIO, io.BufferedReader(_Prefixed(head, rest), buffer_size=PROBE_BYTES))

    def commit_exists(self, version: int) -> bool:
        """Whether ``<version>.json`` is published. On object stores one GET of its start
        (see the module docstring): a small commit's bytes are kept for the read that
        usually follows."""
        path = self.commit_path(version)
        if self.is_local:
            return os.path.exists(path)
        with storage_step(self.uri, f"{LOG_DIR}/{commit_file_name(version)}", "commit log"):
            try:
                head = self._get_head(path)
            except FileNotFoundError:
                return False
        if len(head) < PROBE_BYTES:
            self._keep_probed(version, head)
        return True

    def commit_mtimes_ms(self) -> dict[int, int]:
        """The modification time (epoch ms) of every commit file, from one listing."""
        with storage_step(self.uri, LOG_DIR, "commit log"):
            if self.is_local:
                try:
                    entries = list(os.scandir(self.log_dir))
                except FileNotFoundError:
                    return {}
                times: dict[str, int | None] = {e.name: int(e.stat().st_mtime * 1000) for e in entries}
            else:
                try:
                    listed = self._fresh(self.log_dir).ls(self.log_dir, detail=True)
                except FileNotFoundError:
                    return {}
                times = {i["name"].rsplit("/", 1)[-1]: file_mtime_ms(i) for i in listed}
        out: dict[int, int] = {}
        for name, mtime in times.items():
            version = parse_commit_file_name(name)
            if version is not None and mtime is not None:
                out[version] = mtime
        return out

    def commit_mtime_ms(self, version: int) -> int | None:
        path = self.commit_path(version)
        try:
            if self.is_local:
                return int(os.stat(path).st_mtime * 1000)
            info = self._fresh(path).info(path)
        except FileNotFoundError:
            return None
        return file_mtime_ms(info)

    def read_staged(self, name: str) -> bytes | None:
        """A staged commit's bytes, or None. A name missing from the staged directory is
        looked up in the legacy one (a claim made by an earlier release); found there, the
        name's later publish and delete use that file."""
        data = self._read_file(f"{self.staged_dir}/{name}")
        if data is None and name not in self._legacy_staged:
            data = self._read_file(f"{self.legacy_staged_dir}/{name}")
            if data is not None:
                self._legacy_staged.add(name)
        return data

    def _read_file(self, path: str) -> bytes | None:
        try:
            if self.is_local:
                with open(path, "rb") as f:
                    return f.read()
            return self._get(path)
        except FileNotFoundError:
            return None

    # ------------------------------------------------------------------ writing

    def _ensure_dirs(self) -> None:
        if self._made_dirs:
            return
        for directory in (self.log_dir, self.staged_dir):
            if self.durable:
                make_dirs(directory)  # the table's own directory too, when this made it
            elif self.is_local:
                os.makedirs(directory, exist_ok=True)
            else:  # not on object stores (``_made_dirs`` starts True there)
                self.fs.makedirs(directory, exist_ok=True)
        self._made_dirs = True

    def list_staged(self) -> list[str]:
        """Base names of the staged commits (empty when there are none)."""
        try:
            if self.is_local:
                return os.listdir(self.staged_dir)
            return [
                p.rsplit("/", 1)[-1] for p in self._fresh(self.staged_dir).ls(self.staged_dir, detail=False)
            ]
        except FileNotFoundError:
            return []

    def stage(self, name: str, data: bytes, *, atomic: bool = False) -> None:
        """Write a staged commit in full (before any slot claim references it).

        ``atomic``: the file appears whole or not at all, for files other processes may
        list and read while it is written (group commit's queued appends).
        """
        with storage_step(self.uri, f"_eventlog/staged/{name}", "staged commit"):
            self._stage(name, data, atomic)

    def _stage(self, name: str, data: bytes, atomic: bool) -> None:
        self._ensure_dirs()
        self._legacy_staged.discard(name)  # staged anew: in the staged directory
        path = self.staged_path(name)
        if self.is_local and atomic:
            tmp = f"{self.staged_dir}/.{name}.{os.getpid()}.{threading.get_ident()}.tmp"
            _write_local(tmp, data)
            if self.durable:
                sync_file(tmp)
            os.rename(tmp, path)
        elif self.is_local:
            # Written in place: a staged file is only ever referenced by a slot claim made
            # after this write returned, so recovery never sees a partial one. (A rewrite
            # before a later claim is safe too: no claim references it yet.)
            _write_local(path, data)
            if self.durable:
                sync_file(path)
        else:
            self.fs.pipe_file(path, data)
            return
        if self.durable:  # the claim that follows must never name bytes a power loss takes
            sync_dir(self.staged_dir)

    def publish(self, version: int, staged_name: str, data: bytes) -> bool:
        """Put-if-absent of ``<version>.json`` with ``data``. False if it already existed."""
        self._ensure_dirs()
        target = self.commit_path(version)
        if self.is_local:
            try:
                os.link(self.staged_path(staged_name), target)
                linked = True
            except FileExistsError:
                linked = False
            except FileNotFoundError:
                # The staged file is gone (a recovering process published it and the
                # owner cleaned up): fall back to an exclusive write of the bytes.
                linked = self._exclusive_local_write(target, data, self.durable)
            if self.durable:
                # Whoever linked it (this writer, or a reader publishing its staged bytes),
                # the commit is acknowledged only once its entry in the log is durable.
                sync_dir(self.log_dir)
            return linked
        # Object stores: a conditional put (S3 ``If-None-Match: *``), so a commit another
        # writer published at this version is never overwritten, in one request (file
        # systems without one check, then write); the lock makes fsspec's in-process memory
        # file system atomic too.
        with _MEMORY_LOCK:
            try:
                self._fresh(target).pipe_file(target, data, mode="create")
            except FileExistsError:
                return False
            return True

    @staticmethod
    def _exclusive_local_write(target: str, data: bytes, durable: bool) -> bool:
        tmp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
        _write_local(tmp, data)
        if durable:
            sync_file(tmp)
        try:
            os.link(tmp, target)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def delete_staged(self, name: str) -> None:
        """Delete a staged commit, best effort: it is cleanup (after a publish, or of a
        commit that did not land), so a storage failure is logged, never raised; VACUUM
        removes staged files left older than its retention."""
        path = self.staged_path(name)
        self._legacy_staged.discard(name)
        # Already gone is fine: a recovering process may have published and we clean up once.
        try:
            with contextlib.suppress(FileNotFoundError):
                if self.is_local:
                    os.unlink(path)
                else:
                    self.fs.rm_file(path)
        except OSError as exc:
            logger.warning("%s: could not delete the staged commit %s: %s", self.uri, name, exc)

    def write_commit_unguarded(self, version: int, data: bytes) -> bool:
        """Exclusive write of a commit file without a slot (tests and repair tools only)."""
        self._ensure_dirs()
        if self.is_local:
            written = self._exclusive_local_write(self.commit_path(version), data, self.durable)
            if self.durable:
                sync_dir(self.log_dir)
            return written
        target = self.commit_path(version)
        with _MEMORY_LOCK:
            try:
                self._fresh(target).pipe_file(target, data, mode="create")
            except FileExistsError:
                return False
            return True


def _write_local(path: str, data: bytes) -> None:
    """Write a whole local file; a write that fails (a full disk) leaves no partial file."""
    try:
        with open(path, "wb") as f:
            f.write(data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def open_log_store(
    uri: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    filesystem: fsspec.AbstractFileSystem | None = None,
    *,
    durable: bool = False,
) -> LogStore:
    """The LogStore of a table URI given by a user: InvalidInputError (before anything is
    written) for bad text, an unknown scheme, or file-system options the scheme's fsspec
    implementation does not take; see :func:`normalize_uri` for the options, and
    :mod:`eventlog.log.durable` for ``durable``."""
    checked = check_uri(uri)
    options = check_storage_options(storage_options)
    if filesystem is not None and not isinstance(filesystem, fsspec.AbstractFileSystem):
        raise InvalidInputError(
            f"filesystem must be an fsspec AbstractFileSystem, not {type(filesystem).__name__}"
        )
    if filesystem is not None and options:
        raise InvalidInputError("pass storage_options or filesystem, not both (a file system has its own)")
    try:
        log = LogStore(checked, storage_options=options, filesystem=filesystem, durable=durable)
    except (ValueError, TypeError) as exc:  # fsspec: "Protocol not known: foo"; unknown option
        raise InvalidInputError(f"cannot use table URI {checked!r}: {type(exc).__name__}: {exc}") from exc
    if log.is_local:
        check_local_path(log.root)
    elif options:
        # Object-store clients take their options at the first request: make the client
        # here, so an option it does not know is an input error, not a failure mid-commit.
        # s3fs builds it without a request (``connect``); others get an existence check.
        try:
            if type(log.fs).__module__.split(".")[0] == "s3fs":
                log.fs.connect()
            else:
                log.fs.exists(log.log_dir)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"storage_options for {checked!r} are not accepted by {type(log.fs).__name__}: {exc}"
            ) from exc
    return log
