"""Tests specific to :class:`lockstore.ObjectStoreSlotStore` (the contract suite in
``test_contract.py`` runs it too): real processes racing on the S3 server, the object
layout, the ``_latest`` hint (never trusted, repaired), requests per call, lease heartbeats
and takeover, error translation, pickling, and the registry's ``s3://`` specs.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from lockstore import (
    LeaseHeldError,
    LockstoreError,
    ObjectStoreSlotStore,
    SlotNotClaimedError,
    SlotStoreUnavailableError,
    TableBindingError,
    lease_owner_here,
    registry,
)
from lockstore.base import lease_node_name
from lockstore.localfs import table_dir_name
from lockstore.registry import UnknownSlotStoreError, open_slot_store, release_slot_store
from tests.lockstore.test_contract import (
    CHECKPOINT,
    TABLE,
    _claim,
    _Holder,
    _query_owner,
    race_processes,
    report_from_forked_child,
)

s3fs = pytest.importorskip("s3fs")

Failure = Callable[[str, str], BaseException | None]


class CountingMemoryFS(MemoryFileSystem):
    """fsspec's in-memory file system that counts the calls the store makes (``calls``:
    operation -> count; ``paths``: every (operation, path)) and fails them on demand:
    ``fail(operation, path)`` returns the exception to raise, or None."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: Counter[str] = Counter()
        self.paths: list[tuple[str, str]] = []
        self.fail: Failure | None = None

    def _note(self, operation: str, path: str) -> None:
        self.calls[operation] += 1
        self.paths.append((operation, path))
        error = self.fail(operation, path) if self.fail is not None else None
        if error is not None:
            raise error

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self._note("create" if mode == "create" else "put", path)
        super().pipe_file(path, value, mode=mode, **kwargs)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        self._note("get", path)
        return bytes(super().cat_file(path, start=start, end=end, **kwargs))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        self._note("list", path)
        return super().ls(path, detail=detail, **kwargs)

    def reset(self) -> None:
        self.calls.clear()
        self.paths.clear()


@pytest.fixture
def memfs() -> Iterator[CountingMemoryFS]:
    fs = CountingMemoryFS(skip_instance_cache=True)
    yield fs
    for path in list(fs.store):
        if path.startswith("/objectstore-tests/"):
            del fs.store[path]


@pytest.fixture
def root() -> str:
    return f"/objectstore-tests/{uuid.uuid4().hex}"


@pytest.fixture
def s3(s3_storage_options: dict[str, str]) -> Any:
    return s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options)


def _s3_requests(fs: Any) -> Counter[str]:
    """A counter of the S3 API calls ``fs`` sends from now on (by operation name)."""
    calls: Counter[str] = Counter()
    fs.connect()

    def count(event_name: str, **_: Any) -> None:
        calls[event_name.rsplit(".", 1)[-1]] += 1

    fs.s3.meta.events.register("before-send.s3", count)
    return calls


# ============================================================== processes racing on S3


def _s3_store(options: dict[str, str], root: str) -> ObjectStoreSlotStore:
    """A store with its own s3fs client (made in the process that calls it)."""
    return ObjectStoreSlotStore(s3fs.S3FileSystem(skip_instance_cache=True, **options), root)


def test_multiprocess_race_on_s3_grants_every_version_exactly_once(
    s3_bucket: str, s3_storage_options: dict[str, str]
) -> None:
    make_store = functools.partial(_s3_store, s3_storage_options, f"{s3_bucket}/slots")
    reports = race_processes(make_store, workers=4, target=60, timeout=120)
    assert sum(lost for _w, _p, _won, lost in reports) > 0


# ====================================================================== layout


def test_object_layout_and_payload(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root)
    claim = _claim("txn-layout")
    before = time.time()
    assert store.claim(TABLE, 0, claim) is True
    assert store.claim(TABLE, 0, _claim("txn-loser")) is False
    store.mark_complete(TABLE, 0)
    store.bind(TABLE, "table-id-1")
    lease = store.acquire_lease(CHECKPOINT, _query_owner())

    directory = f"{root}/{table_dir_name(TABLE)}"
    assert store.table_dir(TABLE) == directory
    assert sorted(memfs.find(directory)) == [
        f"{directory}/00000000000000000000.done",
        f"{directory}/00000000000000000000.slot",
        f"{directory}/_latest",
        f"{directory}/_table_id",
    ]
    payload = json.loads(memfs.cat_file(f"{directory}/00000000000000000000.slot"))
    assert payload["claim"] == claim.to_dict()
    assert before - 0.01 <= payload["claimed_at"] <= time.time() + 0.01
    assert isinstance(payload["nonce"], str) and len(payload["nonce"]) == 16
    assert memfs.cat_file(f"{directory}/00000000000000000000.done") == b""
    assert memfs.cat_file(f"{directory}/_latest") == b"0"
    assert memfs.cat_file(f"{directory}/_table_id") == b"table-id-1"

    leases = f"{root}/_leases/{lease_node_name(CHECKPOINT)}"
    assert store.lease_dir(CHECKPOINT) == leases
    record = json.loads(memfs.cat_file(f"{leases}/00000000000000000000.lease"))
    assert {k: v for k, v in record.items() if k != "token"} == {**lease.owner.to_dict(), "name": CHECKPOINT}
    lease.release()
    assert memfs.exists(f"{leases}/00000000000000000000.released")
    again = store.acquire_lease(CHECKPOINT, _query_owner("q-2"))
    assert memfs.exists(f"{leases}/00000000000000000001.lease")  # the next generation
    again.release()


def test_a_local_file_system_is_refused(tmp_path: Path) -> None:
    """fsspec's local put-if-absent checks, then writes: not exclusive across processes."""
    with pytest.raises(LockstoreError, match="no atomic put-if-absent"):
        ObjectStoreSlotStore(LocalFileSystem(), str(tmp_path))
    with pytest.raises(ValueError, match="lease_ttl"):
        ObjectStoreSlotStore(MemoryFileSystem(), "/x", lease_ttl=0)
    with pytest.raises(ValueError, match="root"):
        ObjectStoreSlotStore(MemoryFileSystem(), "/")


# ======================================================================= the hint


def _hint(fs: CountingMemoryFS, store: ObjectStoreSlotStore) -> bytes:
    return bytes(fs.cat_file(f"{store.table_dir(TABLE)}/_latest"))


def test_latest_does_not_trust_a_bad_hint(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root)
    for version in range(10):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True
    hint = f"{store.table_dir(TABLE)}/_latest"
    assert _hint(memfs, store) == b"0"  # contiguous claims rewrite it every 16 versions only

    def fresh() -> int:
        return ObjectStoreSlotStore(memfs, root).latest(TABLE)

    assert fresh() == 9
    memfs.pipe_file(hint, b"3")  # stale
    assert fresh() == 9
    memfs.rm_file(hint)  # missing (a crash between claim and hint)
    assert fresh() == 9
    assert _hint(memfs, store) == b"9"  # repaired
    memfs.pipe_file(hint, b"garbage")
    assert fresh() == 9
    assert _hint(memfs, store) == b"9"  # repaired
    memfs.pipe_file(hint, b"42")  # ahead of reality: its slot was removed
    memfs.rm_file(f"{store.table_dir(TABLE)}/00000000000000000009.slot")
    assert fresh() == 8
    assert _hint(memfs, store) == b"8"
    other = ObjectStoreSlotStore(memfs, root)
    assert other.claim(TABLE, 9, _claim("txn-9b")) is True
    assert other.latest(TABLE) == 9


def test_latest_repairs_a_far_behind_hint(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root)
    for version in range(50):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True
    hint = f"{store.table_dir(TABLE)}/_latest"
    assert _hint(memfs, store) == b"48"
    memfs.pipe_file(hint, b"3")
    assert ObjectStoreSlotStore(memfs, root).latest(TABLE) == 49
    assert _hint(memfs, store) == b"49"
    memfs.pipe_file(hint, b"45")  # a short lag is left alone
    assert ObjectStoreSlotStore(memfs, root).latest(TABLE) == 49
    assert _hint(memfs, store) == b"45"


def test_claims_past_a_gap_rewrite_the_hint(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root)
    assert store.claim(TABLE, 5, _claim("txn-5")) is True
    assert _hint(memfs, store) == b"5"
    assert store.claim(TABLE, 2, _claim("txn-2")) is True  # below: never lowers the hint
    assert _hint(memfs, store) == b"5"
    assert ObjectStoreSlotStore(memfs, root).latest(TABLE) == 5


# ================================================================= requests per call


def test_latest_costs_a_few_gets_and_never_lists(memfs: CountingMemoryFS, root: str) -> None:
    writer = ObjectStoreSlotStore(memfs, root)
    for version in range(1000):
        assert writer.claim(TABLE, version, _claim(f"txn-{version}")) is True
    memfs.reset()
    memfs.fail = lambda op, path: AssertionError(f"listed {path}") if op == "list" else None

    reader = ObjectStoreSlotStore(memfs, root)
    assert reader.latest(TABLE) == 999
    # hint (992), its slot, then 993, 994, 996, 1000 (missing), 998, 999: 8 GETs
    assert dict(memfs.calls) == {"get": 8}
    memfs.reset()
    assert reader.latest(TABLE) == 999  # nothing new: one GET (version 1000 is missing)
    assert dict(memfs.calls) == {"get": 1}

    memfs.reset()
    assert writer.claim(TABLE, 1000, _claim("txn-1000")) is True  # contiguous: no hint
    assert dict(memfs.calls) == {"create": 1}
    memfs.reset()
    writer.mark_complete(TABLE, 1000)  # its own claim: no check of the slot
    assert dict(memfs.calls) == {"create": 1}
    memfs.reset()
    reader.mark_complete(TABLE, 1000)  # another handle checks the slot first
    assert dict(memfs.calls) == {"get": 1, "create": 1}
    memfs.reset()
    assert reader.latest(TABLE) == 1000  # 1000 found, 1001 missing
    assert dict(memfs.calls) == {"get": 2}


def test_one_commit_on_s3_is_three_requests(s3_bucket: str, s3: Any) -> None:
    store = ObjectStoreSlotStore(s3, f"{s3_bucket}/slots")
    for version in range(3):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True
    calls = _s3_requests(s3)
    version = store.latest(TABLE) + 1
    assert store.claim(TABLE, version, _claim("txn-next")) is True
    store.mark_complete(TABLE, version)
    assert dict(calls) == {"GetObject": 1, "PutObject": 2}  # latest, claim, completion mark
    calls.clear()
    assert store.claim(TABLE, version, _claim("txn-late")) is False  # refused, then read back
    assert dict(calls) == {"PutObject": 1, "GetObject": 1}


def test_await_latest_polls_at_the_poll_interval(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root, poll_interval=0.05)
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    memfs.reset()
    started = time.monotonic()
    assert store.await_latest(TABLE, 0, timeout=0.5) == 0
    waited = time.monotonic() - started
    assert 0.45 <= waited < 2.0
    assert 3 <= memfs.calls["get"] <= 13  # ~one GET per 50 ms, not per millisecond

    timer = threading.Timer(0.2, lambda: ObjectStoreSlotStore(memfs, root).claim(TABLE, 1, _claim("txn-1")))
    timer.start()
    try:
        assert store.await_latest(TABLE, 0, timeout=10) == 1
    finally:
        timer.join()


# ========================================================================== leases


def test_a_lease_whose_heartbeat_fails_is_no_longer_held(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root, lease_ttl=1.5)
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    time.sleep(0.8)
    assert lease.held  # beats every 0.5 s
    beats = [path for op, path in memfs.paths if op == "put" and path.endswith(".beat")]
    assert beats and all(path.endswith("00000000000000000000.beat") for path in beats)

    memfs.fail = lambda op, path: ConnectionError("network down") if path.endswith(".beat") else None
    deadline = time.monotonic() + 5
    while lease.held and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not lease.held
    memfs.fail = None
    time.sleep(0.5)
    assert not lease.held  # lost for good, even though the store answers again
    # Its beat is older than the TTL (+1 s of timestamp slack): another owner takes over.
    other = ObjectStoreSlotStore(memfs, root, lease_ttl=1.5)
    deadline = time.monotonic() + 8
    while True:
        try:
            taker = other.acquire_lease(CHECKPOINT, _query_owner("taker"))
            break
        except LeaseHeldError as exc:
            assert exc.owner == lease.owner
            assert time.monotonic() < deadline, "the silent lease was never taken over"
            time.sleep(0.05)
    assert taker.held and other.lease_owner(CHECKPOINT) == taker.owner
    lease.release()  # the stale handle's release does not free the taker's generation
    assert other.lease_owner(CHECKPOINT) == taker.owner
    taker.release()


def test_a_holder_that_sees_a_newer_generation_lets_go(memfs: CountingMemoryFS, root: str) -> None:
    """A holder paused past its TTL may find its lease taken; its next beat notices."""
    store = ObjectStoreSlotStore(memfs, root, lease_ttl=3.0)
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    directory = store.lease_dir(CHECKPOINT)
    taker = lease_owner_here(queryId="taker")
    written = time.monotonic()
    memfs.pipe_file(f"{directory}/00000000000000000001.lease", json.dumps(taker.to_dict()).encode())
    while lease.held and time.monotonic() - written < 5:
        time.sleep(0.02)
    assert not lease.held
    assert time.monotonic() - written < 2.9  # noticed by a beat (every 1 s), not by the TTL
    assert store.lease_owner(CHECKPOINT) == taker


def test_a_sigkilled_holder_keeps_the_lease_until_its_ttl_passes(
    s3_bucket: str, s3_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ttl = 3.0
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    spec = f"s3://{s3_bucket}/slots?lease_ttl={ttl}"
    child = _Holder(spec, "child-query", tmp_path / "stop")
    store = open_slot_store(spec, shared=False)
    try:
        os.kill(child.pid, signal.SIGKILL)
        child.proc.join(timeout=30)
        killed = time.monotonic()
        with pytest.raises(LeaseHeldError) as info:  # its last beat is at most ttl/3 old
            store.acquire_lease(CHECKPOINT, _query_owner("parent"))
        assert info.value.owner.pid == child.pid
        while True:
            try:
                lease = store.acquire_lease(CHECKPOINT, _query_owner("parent"))
                break
            except LeaseHeldError:
                assert time.monotonic() - killed < ttl + 6, "the dead owner's lease was never taken over"
                time.sleep(0.1)
        # Taken over only once the beat was silent for the TTL (its last one came at most
        # ttl/3 before the kill).
        assert time.monotonic() - killed >= ttl * 2 / 3 - 0.2
        assert isinstance(store, ObjectStoreSlotStore)
        assert store.filesystem.exists(f"{store.lease_dir(CHECKPOINT)}/00000000000000000001.lease")
        assert store.lease_owner(CHECKPOINT) == lease.owner
        lease.release()
    finally:
        child.end()
        store.close()


def test_lease_in_a_forked_child_is_not_held(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root)
    lease = store.acquire_lease(CHECKPOINT, _query_owner())

    def in_child() -> dict[str, Any]:
        report = {"held": lease.held}
        lease.release()  # a no-op in the child: the lease is the parent's
        return report

    assert report_from_forked_child(in_child) == {"held": False}
    assert lease.held and store.lease_owner(CHECKPOINT) == lease.owner
    lease.release()


# ==================================================================== errors


def test_file_system_errors_become_slot_store_unavailable(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root)
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    cause = ConnectionError("connection reset by peer")
    memfs.fail = lambda op, path: cause
    calls: list[Callable[[], object]] = [
        lambda: store.claim(TABLE, 1, _claim("txn-1")),
        lambda: ObjectStoreSlotStore(memfs, root).latest(TABLE),
        lambda: store.get(TABLE, 0),
        lambda: ObjectStoreSlotStore(memfs, root).mark_complete(TABLE, 0),
        lambda: store.bind(TABLE, "id-1"),
        lambda: store.acquire_lease(CHECKPOINT, _query_owner()),
        lambda: store.lease_owner(CHECKPOINT),
    ]
    for call in calls:
        with pytest.raises(SlotStoreUnavailableError) as info:
            call()
        assert info.value.__cause__ is cause
        assert root in str(info.value)
    memfs.fail = None
    assert store.latest(TABLE) == 0  # nothing was changed by the failed calls
    assert store.get(TABLE, 1) is None


def test_s3_errors_become_slot_store_unavailable(s3_bucket: str, s3_storage_options: dict[str, str]) -> None:
    with socket_bound() as port:  # nothing answers on it
        options = {**s3_storage_options, "endpoint_url": f"http://127.0.0.1:{port}"}
        config = {"connect_timeout": 1, "retries": {"max_attempts": 1}}
        fs = s3fs.S3FileSystem(skip_instance_cache=True, config_kwargs=config, **options)
        fs.retries = 1  # s3fs's own retries (with backoff) on top of botocore's
        store = ObjectStoreSlotStore(fs, f"{s3_bucket}/slots")
        for call in (lambda: store.claim(TABLE, 0, _claim("txn-0")), lambda: store.latest(TABLE)):
            with pytest.raises(SlotStoreUnavailableError):
                call()
    # A missing bucket: writes fail as unavailable (reads find nothing).
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options)
    store = ObjectStoreSlotStore(fs, f"no-such-bucket-{uuid.uuid4().hex[:12]}/slots")
    with pytest.raises(SlotStoreUnavailableError, match="bucket"):
        store.claim(TABLE, 0, _claim("txn-0"))


class socket_bound:
    """A loopback port that is bound but never listens: connections to it are refused."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_corrupt_records_are_reported(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root)
    directory = store.table_dir(TABLE)
    memfs.pipe_file(f"{directory}/00000000000000000000.slot", b'{"claim": {"txn_id": "tr')
    with pytest.raises(LockstoreError, match="corrupt slot object") as info:
        store.get(TABLE, 0)
    assert not isinstance(info.value, SlotStoreUnavailableError)
    memfs.pipe_file(f"{directory}/_table_id", b"\xff\xfe")
    with pytest.raises(LockstoreError, match="corrupt table id object"):
        store.bind(TABLE, "id-1")


def test_a_retried_claim_that_finds_its_own_record_is_granted(memfs: CountingMemoryFS, root: str) -> None:
    """s3fs retries a PUT whose response was lost; the retry is refused ("exists"), but the
    record there is this call's own (same nonce): the claim is granted, not lost."""
    store = ObjectStoreSlotStore(memfs, root)
    original = MemoryFileSystem.pipe_file

    def put_twice(self: MemoryFileSystem, path: str, value: bytes, mode: str = "overwrite", **kw: Any) -> Any:
        original(self, path, value, mode=mode, **kw)  # the first attempt lands...
        original(self, path, value, mode=mode, **kw)  # ...and the retry is refused

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MemoryFileSystem, "pipe_file", put_twice)
        assert store.claim(TABLE, 0, _claim("txn-0")) is True
    record = store.get(TABLE, 0)
    assert record is not None and record.claim.txn_id == "txn-0"
    assert store.claim(TABLE, 0, _claim("txn-0")) is False  # a new call is a new record
    store.mark_complete(TABLE, 0)
    with pytest.raises(SlotNotClaimedError):
        store.mark_complete(TABLE, 1)


def test_bind_retried_after_its_own_write_is_accepted(memfs: CountingMemoryFS, root: str) -> None:
    store = ObjectStoreSlotStore(memfs, root)
    store.bind(TABLE, "id-1")
    ObjectStoreSlotStore(memfs, root).bind(TABLE, "id-1")
    with pytest.raises(TableBindingError) as info:
        ObjectStoreSlotStore(memfs, root).bind(TABLE, "id-2")
    assert (info.value.bound_id, info.value.requested_id) == ("id-1", "id-2")


# ==================================================================== pickling


def test_a_pickled_store_reaches_the_same_slots_without_the_leases(
    memfs: CountingMemoryFS, root: str
) -> None:
    store = ObjectStoreSlotStore(memfs, root, lease_ttl=7.0, poll_interval=0.1)
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    copy = pickle.loads(pickle.dumps(store))
    assert isinstance(copy, ObjectStoreSlotStore) and copy is not store
    assert (copy.root, copy.lease_ttl, copy.poll_interval) == (root, 7.0, 0.1)
    assert copy.latest(TABLE) == 0
    assert copy.lease_owner(CHECKPOINT) == lease.owner
    copy.close()  # closes nothing of the original's
    assert lease.held
    lease.release()


# ==================================================================== registry


def test_registry_opens_s3_specs_and_shares_per_options(
    s3_bucket: str, s3_storage_options: dict[str, str]
) -> None:
    spec = f"s3://{s3_bucket}/slots"
    store = open_slot_store(spec, storage_options=s3_storage_options)
    try:
        assert isinstance(store, ObjectStoreSlotStore)
        assert store.root == f"{s3_bucket}/slots"
        assert store.lease_ttl == 30.0
        assert open_slot_store(spec, storage_options=dict(s3_storage_options)) is store  # same options
        release_slot_store(store)
        other = open_slot_store(spec, storage_options={**s3_storage_options, "use_ssl": False})
        assert other is not store  # other options: another store
        release_slot_store(other)
        assert store.claim(TABLE, 0, _claim("txn-0")) is True
        secret = s3_storage_options["secret"] + "-never-shown"
        hidden = open_slot_store(spec, storage_options={**s3_storage_options, "secret": secret})
        try:
            assert secret not in repr(hidden)
            assert all(secret not in repr(key) for key in registry._SHARED)
        finally:
            release_slot_store(hidden)
    finally:
        release_slot_store(store)

    tuned_spec = f"s3a://{s3_bucket}/slots?lease_ttl=5&poll_interval=0.2"
    tuned = open_slot_store(tuned_spec, shared=False, storage_options=s3_storage_options)
    assert isinstance(tuned, ObjectStoreSlotStore)
    assert (tuned.root, tuned.lease_ttl, tuned.poll_interval) == (f"{s3_bucket}/slots", 5.0, 0.2)
    assert tuned.get(TABLE, 0) is not None  # the same slots as s3://

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options)
    given = open_slot_store(spec, filesystem=fs)
    try:
        assert isinstance(given, ObjectStoreSlotStore) and given.filesystem is fs
        assert open_slot_store(spec, filesystem=fs) is given
        release_slot_store(given)
        assert given.latest(TABLE) == 0
    finally:
        release_slot_store(given)


def test_registry_refuses_bad_s3_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnknownSlotStoreError, match="unknown parameter 'timeout'"):
        open_slot_store("s3://bucket/slots?timeout=3", shared=False, filesystem=MemoryFileSystem())
    with pytest.raises(UnknownSlotStoreError, match="lease_ttl must be a number"):
        open_slot_store("s3://bucket/slots?lease_ttl=soon", shared=False, filesystem=MemoryFileSystem())
    with pytest.raises(UnknownSlotStoreError, match="name a bucket"):
        open_slot_store("s3://", shared=False, filesystem=MemoryFileSystem())

    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "s3fs" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(UnknownSlotStoreError, match=r"install the 's3' extra") as info:
        open_slot_store("s3://bucket/slots", shared=False)
    assert info.value.spec == "s3://bucket/slots"
    clone = pickle.loads(pickle.dumps(info.value))
    assert (type(clone), clone.spec, str(clone)) == (UnknownSlotStoreError, info.value.spec, str(info.value))
