"""``eventlog drop-feature TABLE NAME [--truncate-history]``: DROP FEATURE from the shell."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlog import Table
from tests.conftest import SCHEMA, rows, sorted_ids
from tests.eventlog.test_cli import Run


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(capsys)


def _table(tmp_path: Path) -> Table:
    t = Table.create(str(tmp_path / "d"), SCHEMA, properties={"delta.enableDeletionVectors": "true"})
    t.append(rows([1, 2, 3]))
    t.delete("id = 2")
    return t


def test_drop_feature(tmp_path: Path, run: Run) -> None:
    t = _table(tmp_path)
    data = run.json("drop-feature", t.uri, "deletionVectors")
    assert data["operation"] == "DROP FEATURE" and data["feature"] == "deletionVectors"
    assert data["truncate_history"] is False and data["version"] == t.refresh().version
    p = t.snapshot().protocol
    assert "deletionVectors" not in set(p.writer_features or ())
    assert sorted_ids(t) == [1, 3]


def test_drop_feature_refusals(tmp_path: Path, run: Run) -> None:
    t = _table(tmp_path)
    assert "FeatureDropError" in run.fails(2, "drop-feature", t.uri, "changeDataFeed")
    assert "FeatureDropError" in run.fails(2, "drop-feature", t.uri, "deletionVectors", "--truncate-history")
    assert "TableNotFoundError" in run.fails(2, "drop-feature", str(tmp_path / "missing"), "x")
