"""Leases of a ``fsync=True`` local-file slot store: the lease record, the lease file's entry
in ``_leases`` and the entry of every directory made for it are fsynced before
``acquire_lease`` returns (:mod:`lockstore.localfs_leases`); a store without ``fsync``
syncs nothing.

``os.fsync`` is wrapped to record each call: the path synced and, for a directory, its
entries at that moment (a directory sync makes exactly those entries durable).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstore import LocalFileSlotStore
from tests.lockstore.contract_support import CHECKPOINT, _query_owner
from tests.support.fsyncs import Synced, record_fsyncs


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Synced:
    return record_fsyncs(monkeypatch)


def test_first_lease_syncs_its_record_its_entry_and_every_new_directory(
    tmp_path: Path, synced: Synced
) -> None:
    root = tmp_path / "a" / "store"  # neither exists yet
    store = LocalFileSlotStore(root, fsync=True)
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    path = Path(store.lease_path(CHECKPOINT))
    try:
        # Top down: each new directory's entry in its parent, then the record, then the
        # lease file's entry in _leases.
        order = [
            synced.entry_durable(tmp_path / "a"),
            synced.entry_durable(root),
            synced.entry_durable(root / "_leases"),
            synced.file_synced(path),
            synced.entry_durable(path),
        ]
        assert order == sorted(order) and order[0] >= 0, order
        assert len(synced.calls) == 5
        assert store.lease_owner(CHECKPOINT) == lease.owner
    finally:
        lease.release()


def test_later_lease_syncs_its_record_and_entry_only(tmp_path: Path, synced: Synced) -> None:
    store = LocalFileSlotStore(tmp_path, fsync=True)
    store.acquire_lease(CHECKPOINT, _query_owner()).release()
    synced.calls.clear()
    other = "s3://bucket/checkpoints/query-2"
    lease = store.acquire_lease(other, _query_owner("q-2"))
    try:
        path = Path(store.lease_path(other))
        assert 0 <= synced.file_synced(path) < synced.entry_durable(path)
        assert len(synced.calls) == 2  # the directories exist: nothing else to sync
    finally:
        lease.release()


def test_lease_without_fsync_syncs_nothing(tmp_path: Path, synced: Synced) -> None:
    store = LocalFileSlotStore(tmp_path / "a" / "store")
    lease = store.acquire_lease(CHECKPOINT, _query_owner())
    try:
        assert Path(store.lease_path(CHECKPOINT)).exists()
        assert synced.calls == []
    finally:
        lease.release()
