"""Lost updates across processes: bank transfers as MERGEs staged in explicit transactions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bank import check_bank, create_bank, run_transfers

LEVELS = ["Serializable", "WriteSerializable"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["rewrite", "deletion-vectors"])
@pytest.mark.parametrize("level", LEVELS)
def test_three_processes_transfer_without_losing_updates(
    tmp_path: Path, level: str, deletion_vectors: bool
) -> None:
    uri = str(tmp_path / "bank")
    props = {"delta.isolationLevel": level}
    if deletion_vectors:
        props["delta.enableDeletionVectors"] = "true"
    create_bank(uri, props)
    results = run_transfers(uri, workers=3, transfers=8)
    check_bank(uri, results)
    assert sum(len(r.acks) for r in results) == 3 * 8
