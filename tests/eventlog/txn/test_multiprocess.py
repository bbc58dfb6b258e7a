"""Real processes appending and deleting on one table; invariants checked at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlog import Table
from tests.support.invariants import SCHEMA, check_invariants, run_writers


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("deletion_vectors", [False, True], ids=["rewrite", "deletion-vectors"])
def test_four_processes_append_and_delete(tmp_path: Path, deletion_vectors: bool) -> None:
    """With deletion vectors, deletes of different rows of one file resolve row by row."""
    uri = str(tmp_path / "t")
    props = {"delta.enableDeletionVectors": "true"} if deletion_vectors else {}
    Table.create(uri, SCHEMA, properties=props)
    results = run_writers(uri, workers=4, ops=40)
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 4 * 40 and not any(r.errors for r in results)
    table = check_invariants(uri, acks)
    if deletion_vectors:  # partial deletes were recorded as deletion vectors
        assert any(a.deletion_vector is not None for a in table.snapshot().add_files)
