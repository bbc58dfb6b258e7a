"""Many machines, simulated, without ZooKeeper: writer processes on one ``s3://`` table (the
suite's S3 API on loopback), version slots granted by S3 conditional writes
(:class:`lockstore.ObjectStoreSlotStore`) in the same bucket. Each writer process gets its
own s3fs client for the table and for the slots (the store is pickled into the ``spawn``
child, which builds a new client). Every run ends with the invariant check of
:mod:`tests.support.invariants`, as the ZooKeeper runs in ``tests/zookeeper/test_zk_s3.py``.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from typing import Any

import pytest

from eventlog import Table
from eventlog.log.storage import LogStore
from lockstore import ObjectStoreSlotStore
from tests.support.invariants import SCHEMA, check_invariants, run_writers
from tests.zookeeper.test_zk_s3 import _claim_then_die

s3fs = pytest.importorskip("s3fs")

pytestmark = pytest.mark.timeout(240)


def _slots(bucket: str, options: dict[str, Any]) -> ObjectStoreSlotStore:
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    return ObjectStoreSlotStore(fs, f"{bucket}/slots")


def _assert_every_slot_complete(table: Table, slots: ObjectStoreSlotStore) -> None:
    latest = slots.latest(table.key)
    assert latest == table.version
    assert slots.recent(table.key, limit=latest + 1, incomplete_only=True) == []


@pytest.mark.parametrize("group_commit", [False, True], ids=["own-slots", "group-commit"])
def test_four_writer_processes_append_delete_and_merge_with_s3_slots(
    s3_bucket: str, s3_uri: str, s3_storage_options: dict[str, Any], group_commit: bool
) -> None:
    """With group commit, blind appends queue on S3 and their followers poll the slots."""
    slots = _slots(s3_bucket, s3_storage_options)
    Table.create(s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options).close()
    results = run_writers(
        s3_uri, workers=4, ops=6, slots=slots,  # type: ignore[arg-type]  # pickled into each child
        storage_options=s3_storage_options, merge_share=0.3, group_commit=group_commit,
    )  # fmt: skip
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 24 and not any(r.errors for r in results)
    assert {"append", "merge"} <= {a["kind"] for a in acks}
    table = check_invariants(s3_uri, acks, slots=slots, storage_options=s3_storage_options)
    _assert_every_slot_complete(table, slots)
    # The claims were granted to the writer processes, each with its own pid.
    records = [slots.get(table.key, v) for v in range(1, table.version + 1)]
    assert all(r is not None for r in records)
    assert len({r.claim.owner["pid"] for r in records if r is not None}) >= 2
    table.close()


def test_a_writer_killed_between_claim_and_publish_with_s3_slots(
    s3_bucket: str, s3_uri: str, s3_storage_options: dict[str, Any]
) -> None:
    slots = _slots(s3_bucket, s3_storage_options)
    t = Table.create(s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options)
    victim = mp.get_context("spawn").Process(target=_claim_then_die, args=(s3_uri, slots, s3_storage_options))
    victim.start()
    victim.join(timeout=60)
    assert victim.exitcode == -signal.SIGKILL
    assert slots.latest(t.key) == 1
    record = slots.get(t.key, 1)
    assert record is not None and record.complete is False
    assert not LogStore(s3_uri, storage_options=s3_storage_options).commit_exists(1)  # claimed only
    results = run_writers(
        s3_uri, workers=4, ops=4, slots=slots,  # type: ignore[arg-type]
        storage_options=s3_storage_options, merge_share=0.3,
    )  # fmt: skip
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 16
    table = check_invariants(s3_uri, acks, slots=slots, unacknowledged=1, storage_options=s3_storage_options)
    # The killed writer's claim was its commit point: another process published it from its
    # staged commit on S3 and marked the slot complete.
    assert 424242 in table.to_arrow().column("id").to_pylist()
    _assert_every_slot_complete(table, slots)
    table.close()
    t.close()
