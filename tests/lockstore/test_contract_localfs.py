"""Slot-store contract tests specific to :class:`lockstore.LocalFileSlotStore`: lease files
(layout, dead owners, flock within one process, fork), real multi-process slot races
(``spawn`` start method), torn-read checks, the ``_latest`` hint, the file layout and
OS-error translation."""

from __future__ import annotations

import fcntl
import functools
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable
from multiprocessing.queues import Queue as MPQueue
from multiprocessing.synchronize import Barrier as MPBarrier
from pathlib import Path
from typing import Any

import pytest

from lockstore import (
    LeaseHeldError,
    LeaseOwner,
    LocalFileSlotStore,
    LockstoreError,
    SlotClaim,
    SlotRecord,
    SlotStoreUnavailableError,
    TableBindingError,
)
from lockstore.base import lease_node_name
from lockstore.localfs import table_dir_name
from tests.lockstore.contract_support import (
    CHECKPOINT,
    TABLE,
    _claim,
    _collect,
    _query_owner,
    fork_quietly,
    race_processes,
)


def test_lease_file_layout_and_record(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    path = Path(store.lease_path(CHECKPOINT))
    assert path.parent == tmp_path / "_leases"
    assert path.name == lease_node_name(CHECKPOINT) + ".lease"
    assert path.name.startswith("s3_bucket_checkpoints_query-1-")
    record = json.loads(path.read_text())
    assert record == {**lease.owner.to_dict(), "name": CHECKPOINT}  # the original name is kept
    fd = _held_fd(path)
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # never inherited by exec
    lease.release()
    assert path.exists()  # lease files are never removed (see the module docstring)
    assert store.lease_owner(CHECKPOINT) is None  # the stale record counts for nothing
    assert store.latest(TABLE) == -1  # leases do not touch slots, and vice versa
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_leases", table_dir_name(TABLE)]


def _held_fd(path: Path) -> int:
    from lockstore import localfs

    return localfs._HELD[str(path)].fd


def test_a_dead_owners_record_is_taken_over(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    path = Path(store.lease_path(CHECKPOINT))
    path.parent.mkdir(parents=True)
    dead = LeaseOwner("some-host", 999_999, {"queryId": "dead"}, 1).to_dict()
    path.write_text(json.dumps({**dead, "name": CHECKPOINT}))  # a record nobody locks
    assert store.lease_owner(CHECKPOINT) is None
    with store.acquire_lease(CHECKPOINT, _query_owner("alive")) as lease:
        assert json.loads(path.read_text())["info"] == {"queryId": "alive", "runId": "r-1"}
        assert LocalFileSlotStore(tmp_path).lease_owner(CHECKPOINT) == lease.owner
    path.write_text("")  # an owner that died between creating the file and writing it
    assert store.lease_owner(CHECKPOINT) is None
    store.acquire_lease(CHECKPOINT, _query_owner()).release()


def test_lease_held_by_another_open_file_in_this_process_is_detected(tmp_path: Path) -> None:
    """flock belongs to open file descriptions: an outside holder in this process counts."""
    store = LocalFileSlotStore(tmp_path)
    store.acquire_lease(CHECKPOINT, _query_owner("first")).release()
    path = store.lease_path(CHECKPOINT)
    record = {**LeaseOwner("elsewhere", 4321, {"queryId": "outside"}, 9).to_dict(), "name": CHECKPOINT}
    Path(path).write_text(json.dumps(record))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert store.lease_owner(CHECKPOINT) == LeaseOwner("elsewhere", 4321, {"queryId": "outside"}, 9)
        with pytest.raises(LeaseHeldError) as info:
            store.acquire_lease(CHECKPOINT, _query_owner())
        assert info.value.owner.pid == 4321
    finally:
        os.close(fd)
    store.acquire_lease(CHECKPOINT, _query_owner()).release()


def test_forked_child_does_not_keep_the_lease_alive(tmp_path: Path) -> None:
    """The child closes its inherited copy: the parent's release frees the lease while the
    child still lives, and the child can neither use nor release the parent's lease."""
    store = LocalFileSlotStore(tmp_path)
    lease = store.acquire_lease(CHECKPOINT, _query_owner("parent"))
    to_parent, from_child = os.pipe()
    to_child, from_parent = os.pipe()
    pid = fork_quietly()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(to_parent)
            os.close(from_parent)
            report: dict[str, Any] = {"held": lease.held}
            lease.release()  # a no-op: it must not unlock the parent's descriptor
            owner = store.lease_owner(CHECKPOINT)
            report["owner_pid"] = owner.pid if owner else None
            try:
                store.acquire_lease(CHECKPOINT, _query_owner("child"))
                report["acquired"] = True
            except LeaseHeldError:
                report["acquired"] = False
            os.write(from_child, json.dumps(report).encode())
            os.read(to_child, 1)  # stay alive until the parent has checked
        finally:
            os._exit(0)
    os.close(from_child)
    os.close(to_child)
    try:
        report = json.loads(os.read(to_parent, 4096))
        assert report == {"held": False, "owner_pid": os.getpid(), "acquired": False}
        assert lease.held
        lease.release()
        assert store.lease_owner(CHECKPOINT) is None  # although the child is still alive
        store.acquire_lease(CHECKPOINT, _query_owner("parent-again")).release()
    finally:
        os.close(from_parent)
        os.close(to_parent)
        os.waitpid(pid, 0)


def test_lease_os_errors_become_slot_store_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "a-file"
    root.write_text("not a directory")
    store = LocalFileSlotStore(root)
    with pytest.raises(SlotStoreUnavailableError):
        store.acquire_lease(CHECKPOINT, _query_owner())
    with pytest.raises(SlotStoreUnavailableError):
        store.lease_owner(CHECKPOINT)


# ------------------------------------------------------------------------------ slots


def test_multiprocess_race_grants_every_version_exactly_once(tmp_path: Path) -> None:
    make_store = functools.partial(LocalFileSlotStore, str(tmp_path / "slots"))
    race_processes(make_store, workers=4, target=400, timeout=90)


BIG = 256 * 1024  # large enough that a naive write-in-place is observable half-written


def _big_claim(version: int) -> SlotClaim:
    return SlotClaim(f"txn-big-{version}", f"_staged/{version}-" + "x" * BIG, {"host": "h", "pid": "1"})


def _mp_big_writer(root: str, table: str, count: int, barrier: MPBarrier, results: MPQueue[Any]) -> None:
    """Child process: claim ``count`` versions with large payloads."""
    store = LocalFileSlotStore(root)
    barrier.wait(timeout=60)
    granted = []
    for version in range(count):
        # The pause lets the reader catch up, so it is spinning on get(version) at the very
        # moment the slot appears: that is the window a torn write would be visible in.
        time.sleep(0.002)
        granted.append(store.claim(table, version, _big_claim(version)))
    results.put(granted)


def test_reader_never_sees_a_partially_written_slot(tmp_path: Path) -> None:
    """The parent spins on get(next) while a child claims: the first non-None read is whole."""
    ctx = multiprocessing.get_context("spawn")
    root, count = str(tmp_path / "slots"), 60
    barrier = ctx.Barrier(2)
    results: MPQueue[Any] = ctx.Queue()
    proc = ctx.Process(target=_mp_big_writer, args=(root, TABLE, count, barrier, results))
    proc.start()
    store = LocalFileSlotStore(root)
    seen: list[SlotRecord] = []
    misses = 0
    try:
        barrier.wait(timeout=60)
        deadline = time.monotonic() + 60
        while len(seen) < count:
            record = store.get(TABLE, len(seen))  # raises LockstoreError on a torn read
            if record is None:
                misses += 1
                assert proc.exitcode in (None, 0), "writer process failed"
                assert time.monotonic() < deadline, "timed out waiting for the writer"
                continue
            assert record.claim == _big_claim(len(seen))
            assert store.latest(TABLE) >= len(seen)
            seen.append(record)
        assert _collect(results, [proc], 1, timeout=60) == [[True] * count]
    finally:
        proc.join(timeout=30)
    assert proc.exitcode == 0
    assert [r.version for r in seen] == list(range(count))
    assert misses > 0  # the reader really polled ahead of the writer


def test_latest_does_not_list_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalFileSlotStore(tmp_path)
    for version in range(50):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True

    def forbidden(*_args: object) -> Any:
        raise AssertionError("latest() listed the directory")

    monkeypatch.setattr(os, "listdir", forbidden)
    monkeypatch.setattr(os, "scandir", forbidden)
    assert store.latest(TABLE) == 49
    assert LocalFileSlotStore(tmp_path).latest(TABLE) == 49


def test_latest_does_not_trust_a_bad_hint(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    for version in range(10):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True
    directory = Path(store.table_dir(TABLE))
    hint = directory / "_latest"
    # Contiguous claims refresh the hint only every 16 versions; the probe covers the rest.
    assert os.readlink(hint) == "00000000000000000000.slot"
    assert store.latest(TABLE) == 9

    hint.unlink()  # stale: pointing at an older slot
    hint.symlink_to("00000000000000000003.slot")
    assert store.latest(TABLE) == 9

    hint.unlink()  # missing entirely (a crash between link and hint update)
    assert store.latest(TABLE) == 9
    assert os.readlink(hint) == "00000000000000000009.slot"  # repaired

    hint.unlink()
    hint.write_text("garbage")  # not a symlink at all
    assert store.latest(TABLE) == 9
    assert os.readlink(hint) == "00000000000000000009.slot"  # repaired

    hint.unlink()  # ahead of reality: its slot was removed (repair)
    hint.symlink_to("00000000000000000042.slot")
    (directory / "00000000000000000009.slot").unlink()
    assert store.latest(TABLE) == 8
    assert store.claim(TABLE, 9, _claim("txn-9b")) is True
    assert store.latest(TABLE) == 9


def test_latest_repairs_a_far_behind_hint(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    for version in range(50):
        assert store.claim(TABLE, version, _claim(f"txn-{version}")) is True
    hint = Path(store.table_dir(TABLE)) / "_latest"
    hint.unlink()
    hint.symlink_to("00000000000000000003.slot")
    assert store.latest(TABLE) == 49
    assert os.readlink(hint) == "00000000000000000049.slot"
    hint.unlink()
    hint.symlink_to("00000000000000000045.slot")  # a short lag is left alone
    assert store.latest(TABLE) == 49
    assert os.readlink(hint) == "00000000000000000045.slot"


def test_file_layout_and_payload(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    claim = _claim("txn-layout")
    assert store.claim(TABLE, 0, claim) is True
    assert store.claim(TABLE, 0, _claim("txn-loser")) is False
    store.mark_complete(TABLE, 0)
    store.bind(TABLE, "table-id-1")

    directory = Path(store.table_dir(TABLE))
    assert directory.parent == tmp_path
    assert directory.name == table_dir_name(TABLE)
    assert directory.name.startswith("file_data_warehouse_events-")
    assert table_dir_name("s3://bucket/t") != table_dir_name("s3:/bucket/t")
    assert sorted(p.name for p in directory.iterdir()) == [
        "00000000000000000000.done",
        "00000000000000000000.slot",
        "_latest",
        "_table_id",
    ]  # no temp files left behind, winner's or loser's
    payload = json.loads(os.readlink(directory / "00000000000000000000.slot"))  # the claim is a symlink
    assert payload["claim"] == claim.to_dict()
    assert abs(payload["claimed_at"] - time.time()) < 60
    assert (directory / "_table_id").read_text() == "table-id-1"


def test_missing_root_is_created_on_first_claim(tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet" / "there"
    store = LocalFileSlotStore(root)
    assert store.latest(TABLE) == -1
    assert store.get(TABLE, 0) is None
    assert not root.exists()  # reads do not create anything
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    assert root.is_dir()
    assert store.latest(TABLE) == 0


def test_root_removed_under_a_live_store_is_recreated(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = LocalFileSlotStore(root)
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    shutil.rmtree(root)
    assert store.latest(TABLE) == -1
    assert store.claim(TABLE, 0, _claim("txn-again")) is True
    record = store.get(TABLE, 0)
    assert record is not None
    assert record.claim.txn_id == "txn-again"


def test_os_errors_become_slot_store_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "a-file"
    root.write_text("not a directory")
    store = LocalFileSlotStore(root)
    calls: list[Callable[[], object]] = [
        lambda: store.claim(TABLE, 0, _claim("txn-0")),
        lambda: store.latest(TABLE),
        lambda: store.get(TABLE, 0),
        lambda: store.mark_complete(TABLE, 0),
        lambda: store.bind(TABLE, "id-1"),
    ]
    for call in calls:
        with pytest.raises(SlotStoreUnavailableError) as info:
            call()
        assert isinstance(info.value, LockstoreError)
        assert isinstance(info.value.__cause__, NotADirectoryError)
    assert root.read_text() == "not a directory"


def test_corrupt_slot_file_is_reported(tmp_path: Path) -> None:
    store = LocalFileSlotStore(tmp_path)
    assert store.claim(TABLE, 0, _claim("txn-0")) is True
    slot = Path(store.table_dir(TABLE)) / "00000000000000000000.slot"
    slot.unlink()
    slot.write_text('{"claim": {"txn_id": "tr')
    with pytest.raises(LockstoreError, match="corrupt slot file"):
        store.get(TABLE, 0)


def test_fsync_mode_is_compatible(tmp_path: Path) -> None:
    durable, plain = LocalFileSlotStore(tmp_path, fsync=True), LocalFileSlotStore(tmp_path)
    assert durable.claim(TABLE, 0, _claim("txn-0")) is True
    assert plain.claim(TABLE, 0, _claim("txn-x")) is False
    assert plain.claim(TABLE, 1, _claim("txn-1")) is True
    assert durable.latest(TABLE) == 1
    durable.mark_complete(TABLE, 0)
    durable.bind(TABLE, "id-1")
    with pytest.raises(TableBindingError):
        plain.bind(TABLE, "id-2")
    record = plain.get(TABLE, 0)
    assert record is not None
    assert (record.claim.txn_id, record.complete) == ("txn-0", True)
