"""``eventlog reorg TABLE --purge [--where SQL]``: REORG TABLE ... APPLY (PURGE) from the shell."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlog import Table
from tests.conftest import SCHEMA, rows, sorted_ids
from tests.eventlog.test_cli import Run

DV = {"delta.enableDeletionVectors": "true"}


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(capsys)


def _table(tmp_path: Path) -> Table:
    t = Table.create(str(tmp_path / "r"), SCHEMA, partition_by=["date"], properties=DV)
    t.append(rows([1, 2, 3]))
    t.append(rows([7, 8], "2024-01-02"))
    t.delete("id IN (2, 8)")  # a deletion vector in each partition
    return t


def test_reorg_purge(tmp_path: Path, run: Run) -> None:
    t = _table(tmp_path)
    data = run.json("reorg", t.uri, "--purge", "--where", "date = '2024-01-02'")
    assert (data["version"], data["operation"], data["where"], data["purge"]) == (
        4,
        "REORG",
        "date = '2024-01-02'",
        True,
    )
    assert data["metrics"]["numDeletionVectorsRemoved"] == "1"
    dvs = [a.partition_values for a in t.snapshot().add_files if a.deletion_vector is not None]
    assert dvs == [{"date": "2024-01-01"}]
    code, out, _ = run("reorg", t.uri, "--purge")
    assert code == 0 and "REORG" in out
    assert all(a.deletion_vector is None for a in t.snapshot().add_files)
    assert sorted_ids(t) == [1, 3, 7]
    assert t.history(1)[0]["operationParameters"] == {"predicate": "[]", "applyPurge": "true"}


def test_reorg_refuses_bad_input(tmp_path: Path, run: Run) -> None:
    t = _table(tmp_path)
    assert "InvalidInputError" in run.fails(2, "reorg", t.uri)  # --purge is required
    assert "PredicateError" in run.fails(2, "reorg", t.uri, "--purge", "--where", "date = = 1")
    assert "InvalidInputError" in run.fails(2, "reorg", t.uri, "--purge", "--where", "id = 1")
    assert "No such option" in run.fails(2, "reorg", t.uri, "--zorder-by", "x")
    assert "TableNotFoundError" in run.fails(2, "reorg", str(tmp_path / "missing"), "--purge")
    assert t.version == 3  # nothing committed
