"""Lost updates across processes with version slots in ZooKeeper (see tests/support/bank.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support.bank import check_bank, create_bank, run_transfers


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["rewrite", "deletion-vectors"])
@pytest.mark.parametrize("level", ["Serializable", "WriteSerializable"])
def test_transfers_through_zookeeper_slots(
    tmp_path: Path, zk_hosts: str, level: str, deletion_vectors: bool
) -> None:
    spec = f"zk://{zk_hosts}/bank-{uuid.uuid4().hex[:12]}?timeout=10"
    uri = str(tmp_path / "bank")
    props = {"delta.isolationLevel": level}
    if deletion_vectors:
        props["delta.enableDeletionVectors"] = "true"
    create_bank(uri, props, slots=spec)
    results = run_transfers(uri, workers=3, transfers=8, slots=spec)
    check_bank(uri, results, slots=spec)
    assert sum(len(r.acks) for r in results) == 3 * 8
