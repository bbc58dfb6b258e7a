"""Lost updates across processes: bank transfers as MERGEs staged in explicit transactions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bank import check_bank, create_bank, run_transfers

LEVELS = ["Serializable", "WriteSerializable"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("deletion_vectors", "partitioned", "clustered"),
    [(False, False, False), (True, False, False), (True, True, False), (True, False, True)],
    ids=["rewrite", "deletion-vectors", "partitioned-deletion-vectors", "clustered-deletion-vectors"],
)
@pytest.mark.parametrize("level", LEVELS)
def test_three_processes_transfer_without_losing_updates(
    tmp_path: Path, level: str, deletion_vectors: bool, partitioned: bool, clustered: bool
) -> None:
    """Row-level concurrency included: on deletion-vector tables, partitioned, clustered or
    neither, transfers between different accounts of one data file both commit."""
    uri = str(tmp_path / "bank")
    props = {"delta.isolationLevel": level}
    if deletion_vectors:
        props["delta.enableDeletionVectors"] = "true"
    create_bank(uri, props, partitioned=partitioned, clustered=clustered)
    results = run_transfers(uri, workers=3, transfers=8, partitioned=partitioned)
    check_bank(uri, results)
    assert sum(len(r.acks) for r in results) == 3 * 8
