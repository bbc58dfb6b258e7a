"""The commit log of one table: the event store behind snapshots and transactions.

A :class:`CommitLog` reads and caches commits (decoded once, shared by conflict checks and
snapshot folds), finds the latest version (finishing claimed-but-unpublished slots from
their staged commits, so readers never see a gap), and publishes claimed versions. What a
slot without its commit means, and who may resolve it, is :mod:`eventlog.log.recovery`'s.
It knows nothing of snapshots or operations: :class:`eventlog.table.Table` builds those on
top.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO
from urllib.parse import urlparse

import fsspec

from eventlog.errors import CorruptLogError, SlotStoreError, SlotStoreRequiredError
from eventlog.log.actions import ActionDecodeError
from eventlog.log.audit import digest
from eventlog.log.bulk import CHUNK_BYTES, DECODE_ERRORS, BulkDecoder, CommitHeader, decode_per_line
from eventlog.log.commit import Commit, decode
from eventlog.log.filetable import FileActions
from eventlog.log.recovery import SlotRecovery
from eventlog.log.storage import EVENTLOG_DIR, LogStore
from lockstore import (
    EmbeddedSlotStore,
    InMemorySlotStore,
    Lease,
    LeaseOwner,
    LocalFileSlotStore,
    LockstoreError,
    SlotClaim,
    SlotRecord,
    SlotStore,
    SlotStoreUnavailableError,
)
from lockstore.registry import ENV_VAR, open_slot_store, release_slot_store

logger = logging.getLogger("eventlog.log.commitlog")

_COMMIT_CACHE_SIZE = 512
PREFETCH_COMMITS = 16  # commit files read ahead, concurrently, on object stores
_FIRST_READ = 1 << 16
PUBLISH_GRACE_SECONDS = 0.02
SlotsSpec = SlotStore | str | None


def _is_memory(log: LogStore) -> bool:
    protocol = log.fs.protocol
    return "memory" in ((protocol,) if isinstance(protocol, str) else tuple(protocol))


def _refuse_local_store_for_remote(store: SlotStore, log: LogStore) -> None:
    """A local-file slot store guards the writers of one machine only: refuse it for a
    table that writers on other machines reach (an object store)."""
    if isinstance(store, LocalFileSlotStore) and not log.is_local and not _is_memory(log):
        raise SlotStoreRequiredError(
            f"{log.uri} is on an object store that writers on other machines reach too, but "
            f"the slot store named for it is a local-file store ({store.root}): its locks "
            'guard one machine only. Use ZooKeeper slots (slots="zk://host:2181/chroot"), '
            'S3 conditional-write slots (slots="s3://bucket/slots"), or set $EVENTLOG_SLOTS',
            uri=log.uri,
        )


def _same_store(spec: str, log: LogStore) -> fsspec.AbstractFileSystem | None:
    """The table's own file system for an object-store slot spec of the same scheme
    (``slots="s3://bucket/slots"`` for an ``s3://`` table): the slots then reach the store
    with the table's ``storage_options`` (endpoint, credentials). None otherwise."""
    if log.is_local or _is_memory(log):
        return None
    scheme = urlparse(spec).scheme
    protocol = log.fs.protocol
    return log.fs if scheme and scheme in ((protocol,) if isinstance(protocol, str) else protocol) else None


def unreachable(uri: str, cause: SlotStoreUnavailableError) -> SlotStoreError:
    """The engine's error for lockstore's (chain it as the cause): the slot store of the
    table at ``uri`` cannot be reached, and nothing was written."""
    return SlotStoreError(f"{uri}: the version-slot store is unreachable: {cause}", uri=uri)


@contextlib.contextmanager
def slots_reachable(uri: str) -> Iterator[None]:
    """Inside, lockstore's ``SlotStoreUnavailableError`` becomes :func:`unreachable`'s error."""
    try:
        yield
    except SlotStoreUnavailableError as exc:
        raise unreachable(uri, exc) from exc


def resolve_slots(spec: SlotsSpec, log: LogStore) -> SlotStore:
    """The slot store for a table: explicit, ``$EVENTLOG_SLOTS``, or the embedded default.

    A local-file store named for an object-store table is refused with
    :class:`SlotStoreRequiredError` (it cannot guard other machines' writers). The embedded
    store of a table in durable mode fsyncs; a named store is as durable as it was opened."""
    if isinstance(spec, SlotStore):
        _refuse_local_store_for_remote(spec, log)
        return spec
    spec = spec or os.environ.get(ENV_VAR) or None
    if spec is not None:
        try:
            store = open_slot_store(spec, filesystem=_same_store(spec, log))
        except SlotStoreUnavailableError as exc:  # the engine's error, lockstore's as the cause
            raise unreachable(log.uri, exc) from exc
        try:
            _refuse_local_store_for_remote(store, log)
        except SlotStoreRequiredError:
            release_slot_store(store)
            raise
        return store
    if log.is_local:  # durable mode: each claim synced before it counts (eventlog.log.durable)
        return EmbeddedSlotStore(os.path.join(log.root, EVENTLOG_DIR, "slots"), fsync=log.durable)
    if _is_memory(log):
        return InMemorySlotStore.shared()
    # Any other file system is reached from other machines too: no store made here could
    # guard their writers, so this handle may read but not write.
    return UnguardedSlots(log.uri)


class UnguardedSlots(SlotStore):
    """What a handle on an object-store table gets when no slot store was named.

    Reading works: there are no claims to finish, and the latest version is found in the
    log itself. Every write is refused with :class:`SlotStoreRequiredError` before anything
    is written (:func:`require_writable`); its claim methods raise the same, as a backstop.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def error(self) -> SlotStoreRequiredError:
        return SlotStoreRequiredError(
            f"{self.uri} is on an object store that writers on other machines reach too, and no "
            "slot store was named for it: a lock on this machine cannot guard them. Pass "
            'slots="zk://host:2181/chroot" (ZooKeeper), slots="s3://bucket/slots" (S3 '
            "conditional writes) or set $EVENTLOG_SLOTS; reading needs none",
            uri=self.uri,
        )

    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        raise self.error()

    def latest(self, table: str) -> int:
        return -1

    def get(self, table: str, version: int) -> SlotRecord | None:
        return None

    def mark_complete(self, table: str, version: int) -> None:
        raise self.error()

    def reserve_range(self, table: str, name: str, count: int, floor: int = 0) -> int:
        raise self.error()

    def acquire_lease(self, name: str, owner: LeaseOwner) -> Lease:
        raise self.error()

    def lease_owner(self, name: str) -> LeaseOwner | None:
        return None


def require_writable(slots: SlotStore) -> None:
    """Raise :class:`SlotStoreRequiredError` when ``slots`` cannot guard a write."""
    if isinstance(slots, UnguardedSlots):
        raise slots.error()


def acquire_slots(spec: SlotsSpec, log: LogStore) -> tuple[SlotStore, Callable[[], None] | None]:
    """:func:`resolve_slots`, and how to give the store back once the table is done with it
    (:func:`lockstore.registry.release_slot_store`); None for a store the caller passed in,
    which stays the caller's to close."""
    if isinstance(spec, SlotStore):
        return resolve_slots(spec, log), None
    store = resolve_slots(spec, log)
    return store, functools.partial(release_slot_store, store)


def _release_quietly(release: Callable[[], None], uri: str) -> None:
    # May run inside a garbage collection or at exit: never raise.
    try:
        release()
    except Exception as exc:
        logger.warning("%s: releasing the slot store failed: %s", uri, exc)


class Published(enum.IntEnum):
    """The outcome of :meth:`CommitLog.publish_claimed` (false only for ``TAKEN``)."""

    TAKEN = 0  # another writer's commit is at the version: claim the next one
    VISIBLE = 1  # the commit file is in the log
    PENDING = 2  # decided by the claim; a reader publishes it from the staged commit


class CommitLog:
    """Commits of one table: reading, caching, latest version, publishing, repair."""

    def __init__(
        self, log: LogStore, slots: SlotStore, *, published: int = -1, audit_key: bytes | None = None
    ) -> None:
        self.log = log
        self.slots = slots
        self.audit_key = audit_key  # HMACs each commit it writes (eventlog.log.audit)
        self._published = published  # versions known to be published (a watermark)
        self._commits: OrderedDict[int, Commit] = OrderedDict()
        self._digests: OrderedDict[int, str] = OrderedDict()  # SHA-256 of commit files' bytes
        self._lock = threading.RLock()
        self._release: Callable[[], object] | None = None
        self._bound: str | None = None  # the table id this handle bound its slots to

    @property
    def recovery(self) -> SlotRecovery:
        """What to do with claimed slots whose commit is not in the log. Made per use: held
        in an attribute, its callbacks would tie this log into a reference cycle, and a
        handle dropped by its last user must be freed (and give its slot store back) at once."""
        return SlotRecovery(
            self.log,
            self.slots,
            self.key,
            prev_digest=self.commit_digest,
            note_digest=self._note_digest,
            audit_key=lambda: self.audit_key,
        )

    def bind_once(self, table_id: str) -> None:
        """Bind the slots to ``table_id`` (:meth:`lockstore.SlotStore.bind`), once per handle.

        Writers call it before their first claim, not at open: a handle that only reads
        never writes into the slot store (the local-file store keeps its binding under
        ``<table>/_eventlog``, which may be read-only or another engine's)."""
        if self._bound != table_id:
            try:
                self.slots.bind(self.key, table_id)
            except SlotStoreUnavailableError as exc:
                raise unreachable(self.uri, exc) from exc
            self._bound = table_id

    def own_slots(self, release: Callable[[], None]) -> None:
        """Call ``release`` once, when this log is closed or garbage collected (or at exit):
        the table opened the slot store and gives it back then. ``release`` must not refer
        to this log (a ``weakref.finalize`` holds it)."""
        self._release = weakref.finalize(self, _release_quietly, release, self.uri)

    def close(self) -> None:
        """Give back the slot store this log opened (:meth:`own_slots`). Idempotent, any thread."""
        if self._release is not None:
            self._release()

    @property
    def uri(self) -> str:
        return self.log.uri

    @property
    def key(self) -> str:
        """The key of this table's version slots in the slot store."""
        return self.log.uri

    def note_listed(self, version: int) -> None:
        """Versions up to ``version`` were seen in a listing of the log: they are published."""
        with self._lock:
            self._published = max(self._published, version)

    def note_published(self, commit: Commit) -> None:
        """Remember a commit this process published (cached for later readers)."""
        with self._lock:
            self._cache(commit)
            self._published = max(self._published, commit.version)

    def forget_through(self, version: int) -> None:
        """Drop cached commits up to ``version`` (log cleanup deleted their files)."""
        with self._lock:
            for cached in [v for v in self._commits if v <= version]:
                del self._commits[cached]

    def commit_digest(self, version: int) -> str | None:
        """SHA-256 of commit ``version``'s file bytes (what the next commit chains to), from
        the cache of commits this process read or published, else read; None below 0."""
        if version < 0:
            return None
        with self._lock:
            known = self._digests.get(version)
        if known is not None:
            return known
        data = self.log.read_commit(version)
        if data is None:
            raise self._gap(version)
        return self._note_digest(version, data)

    def _note_digest(self, version: int, data: bytes) -> str:
        value = digest(data)
        with self._lock:
            self._digests[version] = value
            self._digests.move_to_end(version)
            while len(self._digests) > _COMMIT_CACHE_SIZE:
                self._digests.popitem(last=False)
        return value

    def latest_version(
        self, claimed: int | None = None, *, probe_log: bool = True, repair: bool = False
    ) -> int:
        """Latest version: finishes claimed-but-unpublished slots, then probes the log.

        ``claimed``: the slot store's latest version if the caller just read it (saves a
        round trip). ``probe_log=False``: skip probing for commits written without a slot,
        for a caller that has just listed the log (a LIST is strongly consistent on S3 too,
        so the probe would only cost a request). ``repair``: the caller is a writer about
        to claim the next version, and resolves a never-completed claim whose writer is
        gone with a REPAIR commit; readers leave it unresolved and see the version before
        it (:mod:`eventlog.log.recovery`). Raises :class:`SlotStoreError` when the slot
        store cannot be reached, and :class:`~eventlog.errors.CommitLostError` when an
        acknowledged commit is missing.
        """
        try:
            return self._latest_version(claimed, probe_log, repair)
        except SlotStoreUnavailableError as exc:
            raise unreachable(self.uri, exc) from exc

    def _latest_version(self, claimed: int | None, probe_log: bool, repair: bool) -> int:
        if claimed is None:
            claimed = self.slots.latest(self.key)
        with self._lock:
            published = self._published
        visible = claimed
        for version in range(published + 1, claimed + 1):
            if self.log.commit_exists(version) or (version == claimed and self._published_soon(version)):
                continue
            if not self.recovery.resolve(version, claimed=claimed, hot=True, repair=repair):
                visible = version - 1  # a claim never completed: nothing after it is published
                break
        latest = max(visible, published)
        # Commits written without a slot (another Delta writer, run sequentially).
        while probe_log and self.log.commit_exists(latest + 1):
            latest += 1
        with self._lock:
            self._published = max(self._published, latest)
        return latest

    def _published_soon(self, version: int) -> bool:
        """Give the owner of the newest claim a moment to publish it before recovering it.

        The claim and the publish are two steps, and readers woken by the claim (group
        commit's members) would otherwise all race the owner to publish. Waits at most
        ``PUBLISH_GRACE_SECONDS``, checking with a growing interval.
        """
        deadline = time.monotonic() + PUBLISH_GRACE_SECONDS
        pause = 0.0002
        while time.monotonic() < deadline:
            time.sleep(pause)
            if self.log.commit_exists(version):
                return True
            pause = min(pause * 2, 0.005)
        return False

    def repair_slots(
        self, *, dry_run: bool = False, limit: int = 100, accept_lost: Sequence[int] = ()
    ) -> list[dict[str, Any]]:
        """Finish or resolve the newest ``limit`` slots whose commit is not in the log
        (:meth:`eventlog.log.recovery.SlotRecovery.repair`). :class:`SlotStoreError` when
        the slot store cannot be reached."""
        with slots_reachable(self.uri):
            return self.recovery.repair(dry_run=dry_run, limit=limit, accept_lost=frozenset(accept_lost))

    def publish_claimed(self, version: int, staged_name: str, data: bytes, txn_id: str) -> Published:
        """Make a version this process claimed visible (idempotent with recovery).

        ``TAKEN`` when the log already holds *another* commit at ``version``: a writer that
        does not use this slot store (e.g. another Delta library) took it. The caller then
        treats the version as lost and retries above it.

        ``PENDING`` when storage failed while publishing (no space, an I/O or object-store
        error): the claim and the staged commit already decide the version, so it is
        committed, and the next reader publishes it from the staged commit (as Delta's
        external log stores ignore a failed copy once their entry is in). The caller must
        then keep the staged commit.
        """
        try:
            published = self.log.publish(version, staged_name, data)
        except Exception as exc:
            return self._after_failed_publish(version, txn_id, exc)
        if not published:
            existing = self.read_commit(version, required=True)
            assert existing is not None
            info = existing.commit_info
            if info is None or info.txn_id != txn_id:
                logger.warning(
                    "version %s of %s was claimed by txn %s but written by another writer",
                    version,
                    self.uri,
                    txn_id,
                )
                return Published.TAKEN
        self._note_digest(version, data)
        self.slots.mark_complete(self.key, version)
        return Published.VISIBLE

    def _after_failed_publish(self, version: int, txn_id: str, error: Exception) -> Published:
        """What a publish that raised left: the commit file may have been written anyway."""
        try:
            existing = self.read_commit(version, required=False)
        except Exception:
            existing = None
        if existing is not None:
            info = existing.commit_info
            if info is None or info.txn_id != txn_id:
                return Published.TAKEN
            self.slots.mark_complete(self.key, version)
            return Published.VISIBLE
        logger.warning(
            "txn %s claimed version %s of %s but publishing it failed (%s: %s); the claim and its "
            "staged commit stand, and the next reader publishes it",
            txn_id,
            version,
            self.uri,
            type(error).__name__,
            error,
        )
        return Published.PENDING

    def commits_between(self, first: int, last: int) -> list[Commit]:
        """Commits ``first..last`` (inclusive), read from the log or the cache."""
        return self._read_range(first, last)

    def _read_range(self, first: int, last: int) -> list[Commit]:
        out = []
        for version in range(first, last + 1):
            commit = self.read_commit(version, required=True)
            assert commit is not None
            out.append(commit)
        return out

    def events_between(
        self, first: int, last: int, partition_columns: Sequence[str] = ()
    ) -> tuple[list[Commit | CommitHeader], FileActions]:
        """Commits ``first..last`` for a snapshot fold: each one's other actions, and all
        their add/remove actions as Arrow tables, decoded in bulk
        (:class:`eventlog.log.bulk.BulkDecoder`; ``partition_columns``: the table's before
        ``first``). Big commit files are read piece by piece, never whole. Cached commits
        are reused; the others are not cached (a fold may cover hundreds of thousands of
        actions)."""
        decoder = BulkDecoder(partition_columns)
        cached_parts: list[FileActions] = []
        cached_events: list[Commit] = []
        to_read: list[int] = []
        for version in range(first, last + 1):
            with self._lock:
                cached = self._commits.get(version)
            if cached is None:
                to_read.append(version)
            else:
                cached_events.append(cached)
                cached_parts.append(cached.file_actions)
        try:
            for version, f in self._opened(to_read):
                decoder.commit(version, self._chunks(version, f, note_digest=version == last))
            headers, files = decoder.finish()
        except DECODE_ERRORS as exc:
            if isinstance(exc, CorruptLogError):
                raise
            # Something the bulk path does not take: the exact per-line codec decides.
            logger.debug("%s: bulk decoding fell back to the per-line codec: %s", self.uri, exc)
            headers, files = self._decode_per_line(first, last, {c.version for c in cached_events})
        events: list[Commit | CommitHeader] = [*headers, *cached_events]
        events.sort(key=lambda e: e.version)
        return events, FileActions.concat([files, *cached_parts])

    def _opened(self, versions: Sequence[int]) -> Iterator[tuple[int, BinaryIO | None]]:
        """Each version with its commit file opened (:meth:`LogStore.open_commit`; None when
        it is missing), in order. On object stores an open is a GET of the file's start, so
        up to ``PREFETCH_COMMITS`` are fetched ahead, concurrently: reading a log of many
        small commits is then not one round trip after the other."""
        if self.log.is_local or len(versions) < 2:
            for version in versions:
                yield version, self.log.open_commit(version)
            return
        upcoming = iter(versions)
        pool = ThreadPoolExecutor(max_workers=min(PREFETCH_COMMITS, len(versions)))
        try:
            ahead = itertools.islice(upcoming, PREFETCH_COMMITS)
            pending = deque((v, pool.submit(self.log.open_commit, v)) for v in ahead)
            while pending:
                version, future = pending.popleft()
                following = next(upcoming, None)
                if following is not None:
                    pending.append((following, pool.submit(self.log.open_commit, following)))
                yield version, future.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _chunks(self, version: int, f: BinaryIO | None, *, note_digest: bool) -> Iterator[bytes]:
        if f is None:
            raise self._gap(version)
        with f:
            first = f.read(_FIRST_READ)  # most commits are small: no 16 MB buffer for them
            if not first:
                raise self._empty(version)
            if len(first) < _FIRST_READ:  # the whole (small) commit
                if note_digest:
                    self._note_digest(version, first)  # what the next commit chains to
                yield first
                return
            yield first
            while chunk := f.read(CHUNK_BYTES):
                yield chunk

    def _decode_per_line(
        self, first: int, last: int, skip: set[int]
    ) -> tuple[list[CommitHeader], FileActions]:
        raw = []
        for version in range(first, last + 1):
            if version in skip:
                continue
            data = self.log.read_commit(version)
            if data is None:
                raise self._gap(version)
            if not data:
                raise self._empty(version)
            raw.append((version, data))
        try:
            return decode_per_line(raw)
        except ActionDecodeError as exc:
            raise self._corrupt(exc.version if exc.version is not None else first, exc) from exc

    def _gap(self, version: int) -> CorruptLogError:
        """The error for a commit missing from the log: :class:`CommitLostError` when the slot
        store granted that version (a commit was acknowledged there, as later ones were
        published after it), a plain gap otherwise."""
        try:
            record = self.slots.get(self.key, version)
        except LockstoreError:
            record = None  # the gap is the news; the slot store's state is a detail
        if record is not None:
            return self.recovery.lost(record)
        return CorruptLogError(
            f"{self.uri}: the commit log has a gap: version {version} is missing",
            uri=self.uri,
            version=version,
        )

    def _empty(self, version: int) -> CorruptLogError:
        """A commit file of zero bytes: never one a writer publishes (each carries at least
        its commitInfo), but what a power loss leaves of a commit whose directory entry was
        written back and whose content was not (a table not in durable mode): refused, so a
        reader never takes the torn table for one with an empty commit."""
        return CorruptLogError(
            f"{self.uri}: commit {version} ({self.log.commit_path(version)}) is empty: its content "
            "was lost (a power loss before it was written back?); restore it from a copy",
            uri=self.uri,
            version=version,
        )

    def _corrupt(self, version: int, exc: ActionDecodeError) -> CorruptLogError:
        return CorruptLogError(
            f"{self.uri}: corrupt commit {version} ({self.log.commit_path(version)}) {exc}",
            uri=self.uri,
            version=version,
            line=exc.line,
        )

    def read_commit(self, version: int, *, required: bool) -> Commit | None:
        with self._lock:
            cached = self._commits.get(version)
        if cached is not None:
            return cached
        data = self.log.read_commit(version)
        if data is None:
            if not required:
                return None
            raise self._gap(version)
        if not data:
            raise self._empty(version)
        self._note_digest(version, data)
        try:
            commit = decode(version, data)
        except ActionDecodeError as exc:
            raise self._corrupt(version, exc) from exc
        with self._lock:
            self._cache(commit)
        return commit

    def _cache(self, commit: Commit) -> None:
        self._commits[commit.version] = commit
        self._commits.move_to_end(commit.version)
        while len(self._commits) > _COMMIT_CACHE_SIZE:
            self._commits.popitem(last=False)
