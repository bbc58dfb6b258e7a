"""Version slots on an object store's conditional writes (S3 ``If-None-Match: *``).

:class:`ObjectStoreSlotStore` needs nothing but what S3 offers: an atomic put-if-absent
(``fs.pipe_file(path, data, mode="create")``: one PUT with ``If-None-Match: *`` on s3fs,
:class:`FileExistsError` when the key exists), GET, unconditional PUT, LIST (strongly
consistent on S3) and DELETE (unused). No rename, no directories, no locks, no sessions.
Writers on many machines share it through the bucket alone, as delta-rs's conditional-put
commits do.

Layout, one "directory" (key prefix) per table under ``root``::

    root/<sanitised table key>-<sha1[:12]>/       (lockstore.localfs.table_dir_name)
        00000000000000000007.slot   claim of version 7: {"claim": ..., "claimed_at": ..., "nonce": ...},
                                    created with put-if-absent: the exclusive grant
        00000000000000000007.done   empty; created (put-if-absent) once version 7 is published
        _latest                     best-effort hint: the text of a recently claimed version
        _table_id                   the table id bound to these slots (put-if-absent)
        _clock                      rewritten by claim_age: the server's "now"
        _counters/<lease_node_name(name)>/00000000000000000004.ctr
                                    link 4 of counter ``name``: {"value": ..., "nonce": ...}
                                    (put-if-absent; reserve_range creates the next link)
    root/_leases/<lease_node_name(name)>/
        00000000000000000003.lease  generation 3 of the lease: the owner's record (put-if-absent)
        00000000000000000003.beat   the holder's heartbeat, rewritten every ``lease_ttl / 3``
        00000000000000000003.released  written when the holder gave generation 3 up
        _clock                      rewritten by whoever checks liveness: the server's "now"

Requests (S3): ``claim`` is one PUT (plus a GET when the PUT is refused, see below; plus a
hint PUT when the claim is not contiguous with what this handle knew, and on every 16th
version). ``latest`` is one GET when nothing new was claimed since this handle last looked:
it probes ``k+1, k+2, k+4, ...`` from the highest version ``k`` it knows, then bisects (each
probe a GET), so a lag of ``n`` versions costs about ``2 log2 n`` GETs. A handle's first
``latest`` reads the hint (one GET), checks the hinted slot exists (one GET) and probes from
there; only a missing or invalid hint costs one LIST of the table's slots, after which the
hint is rewritten. ``mark_complete`` is one PUT for a version this handle claimed, a GET
and a PUT otherwise. ``get`` is two GETs (slot and completion marker). Nothing on the commit
path lists the slots, so a table with a million versions costs the same per commit.

A put-if-absent refused with "exists" may be this writer's own earlier attempt (s3fs retries
a PUT whose response was lost); every claim carries a random nonce, and a refused claim
reads the slot back: only an identical record counts as granted to this call.

Leases, without sessions: generation ``g`` of a lease is created with put-if-absent, so at
most one acquirer wins it, and it is won only after generation ``g-1`` was seen ended:
released, or its heartbeat silent for longer than ``lease_ttl``. The holder's daemon thread
rewrites ``<g>.beat`` every ``lease_ttl / 3`` and then checks that ``<g+1>.lease`` does not
exist (two requests per beat). Liveness compares the beat's ``LastModified`` with that of
the ``_clock`` object written just before listing the lease, both stamped by the server, so
client clocks do not matter (S3 stamps whole seconds; one second of slack is allowed for it).
``Lease.held`` is False once released, once the store was closed, in a forked child, once
no heartbeat succeeded for ``lease_ttl`` seconds (measured from the start of the last
successful one, so a holder stops reporting ``held`` before anyone may take the lease over),
and once a higher generation was seen. A lost lease is not taken again automatically.
Acquiring or checking a lease lists its generations (one LIST; the list grows by one
generation per acquisition and is never pruned: deleting old generations would let a
stale acquirer recreate one); a held lease also costs a clock PUT, a second LIST and a GET
of the owner record.

Honest non-guarantees (in addition to those of :mod:`lockstore.base`):

* The put-if-absent must be atomic. It is on S3 (and on MinIO, R2 and other stores that
  implement ``If-None-Match: *``); moto's server is not (the test harness serialises its
  writes). fsspec's local file system implements ``mode="create"`` as check-then-write, so
  it is refused: use :class:`~lockstore.localfs.LocalFileSlotStore` there. fsspec's
  in-memory file system is per process; the store serialises its conditional writes with a
  lock of :mod:`lockstore.objectstore_io`.
* Leases are liveness-bound by TTL, not by a session: a SIGKILLed owner's lease is taken
  over ``lease_ttl`` (+1 s) after its last heartbeat. A clean exit releases it (when the
  main thread ends, after the other non-daemon threads did; a lease whose release fails
  there expires by TTL).
  A holder paused (GC, VM freeze) or cut off for longer than ``lease_ttl`` may overlap with
  the next owner until it notices (``held`` turns False within ``lease_ttl`` of its last
  successful beat); as with ZooKeeper, ``held`` is not a fence, and the streaming sink's
  commit-time txn check is the backstop.
* ``latest`` of a handle that knows version ``k`` probes forward from ``k``: it is exact under
  the engine's gapless "claim latest + 1" rule; a version claimed by another handle past a
  gap is seen by a new handle (which reads the hint), not by the probe.
* ``owner_alive`` returns None (the store cannot tell whether a claimer lives); how old a
  claim is (:meth:`ObjectStoreSlotStore.claim_age`, what the engine's repair of a claim
  without its staged commit waits on) is judged on the server's clock, like leases: the
  ``claimed_at`` in the record is the claimer's clock, kept for operators.
* Slot, marker and lease objects must not be deleted or rewritten from outside while the
  store is in use (a bucket lifecycle rule on the prefix would break the exclusive grant).

Closing: the store holds no connection of its own (the file system is the caller's and is
not closed); :meth:`ObjectStoreSlotStore.close` stops the heartbeats and releases the leases
acquired through it, and the store stays usable (``closed`` stays False). The store is
picklable: the copy (e.g. in a ``spawn`` child) gets its own file-system client from the
file system's own pickling, and none of the original's leases.

The requests themselves (errors translated) are :mod:`lockstore.objectstore_io`'s; the
leases' generations and heartbeats are :mod:`lockstore.objectstore_leases`'s.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

import fsspec

from lockstore.base import (
    Lease,
    LeaseOwner,
    LeaseSet,
    LockstoreError,
    SlotClaim,
    SlotNotClaimedError,
    SlotRecord,
    SlotStore,
    SlotStoreUnavailableError,
    TableBindingError,
    check_range_request,
    lease_node_name,
)
from lockstore.localfs import table_dir_name
from lockstore.objectstore_io import Objects, has_own_put, parse_numbered
from lockstore.objectstore_leases import acquire_generation, current_generation, read_owner

log = logging.getLogger("lockstore.objectstore")

DEFAULT_LEASE_TTL = 30.0
DEFAULT_POLL_INTERVAL = 0.025  # await_latest: one GET per poll

_SLOT = ".slot"
_DONE = ".done"
_HINT = "_latest"
_TABLE_ID = "_table_id"
_CLOCK = "_clock"  # rewritten by claim_age: the server's "now"
_LEASES = "_leases"
_COUNTERS = "_counters"
_COUNTER = ".ctr"
_HINT_EVERY = 16  # contiguous claims rewrite the hint only every this many versions
_HINT_REPAIR_DISTANCE = 32  # latest() rewrites a hint that lags by this many versions
_MINE_MAX = 4096  # own claims remembered (mark_complete skips the slot check for them)


def _slot_name(version: int) -> str:
    return f"{version:020d}{_SLOT}"


def _counter_name(seq: int) -> str:
    return f"{seq:020d}{_COUNTER}"


def _done_name(version: int) -> str:
    return f"{version:020d}{_DONE}"


class ObjectStoreSlotStore(SlotStore):
    """Version slots and leases as objects under ``root`` of ``filesystem`` (see the module
    docstring for the layout, the requests per call and what is not guaranteed).

    ``filesystem``: an fsspec file system whose ``pipe_file(mode="create")`` is an atomic
    put-if-absent (s3fs; fsspec's in-memory one within a process). ``root``: ``bucket/prefix``
    (a protocol prefix such as ``s3://`` is accepted and stripped). ``lease_ttl``: seconds a
    lease outlives its holder's last heartbeat. ``poll_interval``: seconds between the
    requests of :meth:`await_latest`.

    Guarantees: exclusive grant (put-if-absent), durable record (slot objects are never
    rewritten), monotone ``latest`` under the engine's "claim latest + 1" rule, idempotent
    ``mark_complete``, persistent ``bind``, TTL-bound leases. Errors of the file system
    other than "exists"/"missing" raise :class:`SlotStoreUnavailableError` (outcome unknown).
    Thread-safe.
    """

    def __init__(
        self,
        filesystem: fsspec.AbstractFileSystem,
        root: str,
        *,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        if not isinstance(filesystem, fsspec.AbstractFileSystem):
            raise TypeError(f"filesystem must be an fsspec file system, not {type(filesystem).__name__}")
        if not has_own_put(filesystem):
            raise LockstoreError(
                f"{type(filesystem).__name__} has no atomic put-if-absent (its pipe_file(mode='create') "
                "checks, then writes): it cannot grant version slots exclusively. For a local "
                "directory use LocalFileSlotStore; for S3 pass an s3fs file system"
            )
        if not lease_ttl > 0:
            raise ValueError(f"lease_ttl must be > 0, got {lease_ttl}")
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        stripped = str(filesystem._strip_protocol(root)).rstrip("/")
        if not stripped:
            raise ValueError(f"root must name a bucket (and prefix), got {root!r}")
        self._fs = filesystem
        self._objects = Objects(filesystem)
        self._root = stripped
        self._lease_ttl = float(lease_ttl)
        self._poll_interval = float(poll_interval)
        self._lock = threading.Lock()
        self._dirs: dict[str, str] = {}
        self._known: dict[str, int] = {}  # table -> highest version this handle saw exist
        self._counter_seq: dict[str, int] = {}  # counter directory -> last link this handle saw
        self._mine: OrderedDict[tuple[str, int], None] = OrderedDict()  # own recent claims
        self._leases = LeaseSet()

    # ------------------------------------------------------------------ properties

    @property
    def filesystem(self) -> fsspec.AbstractFileSystem:
        return self._fs

    @property
    def root(self) -> str:
        """``bucket/prefix`` of the store (without protocol)."""
        return self._root

    @property
    def lease_ttl(self) -> float:
        return self._lease_ttl

    @property
    def poll_interval(self) -> float:
        return self._poll_interval

    def table_dir(self, table: str) -> str:
        """The key prefix ("directory") of ``table``'s slots, without a trailing slash."""
        directory = self._dirs.get(table)
        if directory is None:
            directory = f"{self._root}/{table_dir_name(table)}"
            self._dirs[table] = directory
        return directory

    def lease_dir(self, name: str) -> str:
        """The key prefix of lease ``name``'s generations."""
        return f"{self._root}/{_LEASES}/{lease_node_name(name)}"

    # ------------------------------------------------------------------ slots

    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        """One put-if-absent of ``<version>.slot``: True for exactly one caller per slot."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        nonce = secrets.token_hex(8)
        record = {"claim": claim.to_dict(), "claimed_at": round(time.time(), 3), "nonce": nonce}
        payload = json.dumps(record, separators=(",", ":")).encode("utf-8")
        directory = self.table_dir(table)
        slot = f"{directory}/{_slot_name(version)}"
        if not self._objects.create(slot, payload):
            # Refused: another writer's claim, or our own first attempt whose response was
            # lost and which the client retried. Only our exact record (nonce) is ours.
            stored = self._objects.get(slot)
            if stored != payload:
                if stored is not None:
                    self._saw(table, version)  # the next latest() probes from here
                return False
        with self._lock:
            known = self._known.get(table, -1)
            if version > known:
                self._known[table] = version
            self._mine[(table, version)] = None
            if len(self._mine) > _MINE_MAX:
                self._mine.popitem(last=False)
        # The hint is best-effort: a failure must not turn a granted claim into an error.
        # Skip it when the forward probe from what readers know reaches this slot anyway.
        if version > known and (version != known + 1 or version % _HINT_EVERY == 0):
            try:
                self._objects.put(f"{directory}/{_HINT}", str(version).encode())
            except LockstoreError as exc:
                log.debug("hint update of %r failed: %s", table, exc)
        return True

    def latest(self, table: str) -> int:
        """The highest claimed version (exact under the claim-latest+1 rule), or -1."""
        directory = self.table_dir(table)
        with self._lock:
            known = self._known.get(table, -1)
        repair_hint = False
        if known >= 0:
            start = known  # seen to exist by this handle: probe forward from it
        else:
            hint = self._read_hint(directory)
            if hint is not None and hint >= 0 and self._objects.exists(f"{directory}/{_slot_name(hint)}"):
                start = hint
            elif hint is None and not self._objects.exists(f"{directory}/{_slot_name(0)}"):
                return -1  # fresh table: no hint and no version 0
            else:
                # No usable hint although slots exist (a crash between claim and hint, or
                # damage): one listing, then repair the hint so the next handle is fast.
                start = self._scan(directory)
                if start < 0:
                    return -1
                repair_hint = True
        version = self._probe_forward(directory, start)
        if repair_hint or version - start >= _HINT_REPAIR_DISTANCE:
            try:
                self._objects.put(f"{directory}/{_HINT}", str(version).encode())
            except LockstoreError as exc:
                log.debug("hint repair of %r failed: %s", table, exc)
        with self._lock:
            if version > self._known.get(table, -1):
                self._known[table] = version
            return max(version, self._known[table])

    def _saw(self, table: str, version: int) -> None:
        with self._lock:
            if version > self._known.get(table, -1):
                self._known[table] = version

    def await_latest(self, table: str, seen: int, timeout: float) -> int:
        """Poll :meth:`latest` every ``poll_interval`` seconds (one GET each) until it passes
        ``seen`` or ``timeout`` seconds passed; return it."""
        deadline = time.monotonic() + timeout
        while True:
            latest = self.latest(table)
            remaining = deadline - time.monotonic()
            if latest > seen or remaining <= 0:
                return latest
            time.sleep(min(self._poll_interval, remaining))

    def get(self, table: str, version: int) -> SlotRecord | None:
        """The stored claim of ``version`` or None; raises :class:`LockstoreError` for a slot
        object that is not a valid record (it is only ever created whole: outside damage)."""
        if version < 0:
            return None
        directory = self.table_dir(table)
        path = f"{directory}/{_slot_name(version)}"
        raw = self._objects.get(path)
        if raw is None:
            return None
        complete = self._objects.exists(f"{directory}/{_done_name(version)}")
        try:
            data: dict[str, Any] = json.loads(raw)
            claim = SlotClaim.from_dict(data["claim"])
            return SlotRecord(version, claim, complete, float(data["claimed_at"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LockstoreError(f"corrupt slot object {path}: {exc}") from exc

    def claim_age(self, table: str, version: int) -> float | None:
        """The slot object's age by the server's clock: its ``LastModified`` against that of
        the table's ``_clock`` object, rewritten now (a HEAD, a PUT and a HEAD). S3 stamps
        whole seconds: the age is within a second of the truth."""
        if version < 0:
            return None
        directory = self.table_dir(table)
        claimed = self._objects.modified(f"{directory}/{_slot_name(version)}")
        if claimed is None:
            return None
        # Concurrent callers rewrite the clock object too: whichever stamp the HEAD reads was
        # made between this PUT and that HEAD, so it is "now" for this call.
        self._objects.put(f"{directory}/{_CLOCK}", b"")
        now = self._objects.modified(f"{directory}/{_CLOCK}")
        return None if now is None else max(0.0, now - claimed)

    def mark_complete(self, table: str, version: int) -> None:
        """Create ``<version>.done`` (put-if-absent; an existing marker is success).

        Raises :class:`SlotNotClaimedError` for a version nobody claimed."""
        if version < 0:
            raise SlotNotClaimedError(table, version)
        directory = self.table_dir(table)
        with self._lock:
            mine = (table, version) in self._mine
        if not mine and not self._objects.exists(f"{directory}/{_slot_name(version)}"):
            raise SlotNotClaimedError(table, version)
        self._objects.create(f"{directory}/{_done_name(version)}", b"")

    def reserve_range(self, table: str, name: str, count: int, floor: int = 0) -> int:
        """A chain of put-if-absent objects ``_counters/<name>/<seq>.ctr``, each holding the
        counter's value after one reservation: creating ``seq + 1`` from the value at ``seq``
        is the compare-and-swap. A refused create (another reservation won) moves on to it."""
        check_range_request(count, floor)
        directory = f"{self.table_dir(table)}/{_COUNTERS}/{lease_node_name(name)}"
        with self._lock:
            seq = self._counter_seq.get(directory)
        if seq is None:
            seq = max((parse_numbered(n, _COUNTER) for n in self._objects.list(directory)), default=-1)
        while True:
            value = 0
            if seq >= 0:
                raw = self._objects.get(f"{directory}/{_counter_name(seq)}")
                if raw is None:  # links are never deleted: a listed or created one is there
                    raise SlotStoreUnavailableError(
                        f"counter object {directory}/{_counter_name(seq)} vanished"
                    )
                value = int(json.loads(raw)["value"])
            first = max(value, floor)
            record = {"value": first + count, "nonce": secrets.token_hex(8)}
            payload = json.dumps(record, separators=(",", ":")).encode("utf-8")
            target = f"{directory}/{_counter_name(seq + 1)}"
            # A refused create may be our own first attempt whose response was lost: only our
            # exact record (nonce) is ours.
            if self._objects.create(target, payload) or self._objects.get(target) == payload:
                with self._lock:
                    self._counter_seq[directory] = seq + 1
                return first
            seq += 1

    def bind(self, table: str, table_id: str) -> None:
        """Bind ``table``'s slots to ``table_id`` (put-if-absent of ``_table_id``, then a read
        and compare); raise :class:`TableBindingError` when bound to another id."""
        path = f"{self.table_dir(table)}/{_TABLE_ID}"
        if self._objects.create(path, table_id.encode("utf-8")):
            return
        raw = self._objects.get(path)
        if raw is None:
            raise SlotStoreUnavailableError(f"binding {table!r}: {path} exists but cannot be read back")
        try:
            bound = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LockstoreError(f"corrupt table id object {path}: {exc}") from exc
        if bound != table_id:
            raise TableBindingError(table, bound, table_id)

    # ------------------------------------------------------------------ leases

    def acquire_lease(self, name: str, owner: LeaseOwner) -> Lease:
        """Win the next generation of lease ``name`` if the current one ended (released, or
        its heartbeat silent for ``lease_ttl``); else :class:`LeaseHeldError` naming its owner."""
        stamped = owner.stamped()
        directory = self.lease_dir(name)
        return self._leases.add(acquire_generation(self._objects, directory, name, stamped, self._lease_ttl))

    def lease_owner(self, name: str) -> LeaseOwner | None:
        """The owner of the live generation of lease ``name``, or None."""
        directory = self.lease_dir(name)
        current, live = current_generation(self._objects, directory, self._lease_ttl)
        return read_owner(self._objects, directory, current) if live else None

    def close(self) -> None:
        """Stop the heartbeats and release the leases acquired through this store. The
        store stays usable (it holds no connection; the file system is the caller's)."""
        self._leases.release_all()

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild,
            (self._fs, self._root, self._lease_ttl, self._poll_interval),
        )

    def __repr__(self) -> str:
        protocol = self._fs.protocol if isinstance(self._fs.protocol, str) else self._fs.protocol[0]
        return f"{type(self).__name__}('{protocol}://{self._root}', lease_ttl={self._lease_ttl})"

    # ------------------------------------------------------------------ helpers

    def _read_hint(self, directory: str) -> int | None:
        """The hinted version; None if there is no hint, -1 if it is not a valid one."""
        raw = self._objects.get(f"{directory}/{_HINT}")
        if raw is None:
            return None
        try:
            value = int(raw.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            return -1
        return value if value >= 0 else -1

    def _probe_forward(self, directory: str, start: int) -> int:
        """The highest version of the run of slots that starts at ``start`` (which exists):
        gallop ``start + 1, + 2, + 4, ...`` to the first missing one, then bisect."""
        low, step = start, 1
        while True:
            candidate = start + step
            if not self._objects.exists(f"{directory}/{_slot_name(candidate)}"):
                high = candidate
                break
            low, step = candidate, step * 2
        while high - low > 1:
            middle = (low + high) // 2
            if self._objects.exists(f"{directory}/{_slot_name(middle)}"):
                low = middle
            else:
                high = middle
        return low

    def _scan(self, directory: str) -> int:
        """The highest version with a slot object, by listing (repair path only)."""
        best = -1
        for name in self._objects.list(directory):
            best = max(best, parse_numbered(name, _SLOT))
        return best


def _rebuild(
    filesystem: fsspec.AbstractFileSystem, root: str, lease_ttl: float, poll_interval: float
) -> ObjectStoreSlotStore:
    return ObjectStoreSlotStore(filesystem, root, lease_ttl=lease_ttl, poll_interval=poll_interval)
