"""Many machines, simulated: writer processes on one ``s3://`` table (a real S3 API on
loopback), each with its own S3 client and its own ZooKeeper session, version slots in a
3-node ensemble. Every run ends with the invariant check of :mod:`tests.support.invariants`:
gapless versions, every acknowledged commit present exactly once, contents equal to a
replay of the history.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import uuid
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.log.storage import LogStore
from tests.support.invariants import SCHEMA, check_invariants, run_writers

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(300)]


def _spec(hosts: str) -> str:
    return f"zk://{hosts}/s3-{uuid.uuid4().hex[:12]}?timeout=10"


@pytest.mark.parametrize("group_commit", [False, True], ids=["own-slots", "group-commit"])
def test_four_writer_processes_append_delete_and_merge_on_s3(
    s3_uri: str, s3_storage_options: dict[str, Any], zk_ensemble: Any, group_commit: bool
) -> None:
    """With group commit, blind appends also queue on S3 and share versions."""
    spec = _spec(zk_ensemble.hosts)
    Table.create(s3_uri, SCHEMA, slots=spec, storage_options=s3_storage_options).close()
    results = run_writers(
        s3_uri, workers=4, ops=12, slots=spec, storage_options=s3_storage_options, merge_share=0.3,
        group_commit=group_commit,
    )  # fmt: skip
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 48 and not any(r.errors for r in results)
    kinds = {a["kind"] for a in acks}
    assert {"append", "merge"} <= kinds
    check_invariants(s3_uri, acks, slots=spec, storage_options=s3_storage_options).close()


def _claim_then_die(uri: str, spec: str, options: dict[str, Any]) -> None:
    def die(*args: Any, **kwargs: Any) -> bool:
        os.kill(os.getpid(), signal.SIGKILL)
        return False  # pragma: no cover - never reached

    Table.publish_claimed = die  # type: ignore[method-assign]
    batch = pa.table({"id": [424242], "worker": [99], "batch": [0]}, schema=SCHEMA)
    Table.open(uri, slots=spec, storage_options=options).append(batch)


def test_a_writer_killed_between_claim_and_publish_on_s3(
    s3_uri: str, s3_storage_options: dict[str, Any], zk_ensemble: Any
) -> None:
    spec = _spec(zk_ensemble.hosts)
    t = Table.create(s3_uri, SCHEMA, slots=spec, storage_options=s3_storage_options)
    victim = mp.get_context("spawn").Process(target=_claim_then_die, args=(s3_uri, spec, s3_storage_options))
    victim.start()
    victim.join(timeout=60)
    assert victim.exitcode == -signal.SIGKILL
    assert t.slots.latest(t.key) == 1
    assert not LogStore(s3_uri, storage_options=s3_storage_options).commit_exists(1)  # claimed only
    results = run_writers(
        s3_uri, workers=4, ops=8, slots=spec, storage_options=s3_storage_options, merge_share=0.3
    )
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 32
    table = check_invariants(s3_uri, acks, slots=spec, unacknowledged=1, storage_options=s3_storage_options)
    # The killed writer's claim was its commit point: another process published it from its
    # staged commit on S3.
    assert 424242 in table.to_arrow().column("id").to_pylist()
    table.close()
    t.close()
