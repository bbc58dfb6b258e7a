"""``eventlog changes``: the change data feed from the shell (JSON, CSV and tables; exit codes)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.cli import main
from tests.eventlog.test_cli import _plain_output  # noqa: F401  (autouse: plain output, no outside settings)


@pytest.fixture
def uri(tmp_path: Path) -> str:
    """Versions: 0 create (change data on), 1 append ids 1-3, 2 append id 4."""
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    with Table.create(str(tmp_path / "t"), schema, properties={"delta.enableChangeDataFeed": "true"}) as t:
        t.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]}))
        t.append(pa.table({"id": pa.array([4], pa.int64()), "name": ["d"]}))
        return t.uri


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_rows_are_table_changes(uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "changes", uri, "--start-version", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["columns"] == ["id", "name", "_change_type", "_commit_version", "_commit_timestamp"]
    (row,) = data["rows"]
    with Table.open(uri) as t:
        ts = t.changes(2).column("_commit_timestamp")[0].as_py()
    assert row == {
        "id": 4,
        "name": "d",
        "_change_type": "insert",
        "_commit_version": 2,
        "_commit_timestamp": ts.isoformat(),
    }
    assert (data["num_rows"], data["matched_rows"], data["truncated"]) == (1, 1, False)


def test_csv_with_where_columns_and_end_version(uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["changes", uri, "--start-version", "1", "--end-version", "1", "--where", "id >= 2"]
    code, out, err = _run(capsys, *args, "--columns", "_commit_version,id", "--format", "csv")
    assert code == 0, err
    assert list(csv.reader(io.StringIO(out))) == [["_commit_version", "id"], ["1", "2"], ["1", "3"]]


def test_table_output_and_limit(uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "changes", uri, "--start-version", "1", "--limit", "2")
    assert code == 0, err
    assert "Changes of" in out and "insert" in out and "2 of 4 rows" in out


def test_bad_input_exits_2(uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "changes", uri, "--start-version", "5")
    assert code == 2 and "InvalidChangeRangeError" in err
    code, _, err = _run(capsys, "changes", uri)
    assert code == 2 and "--start-version" in err
    code, _, err = _run(capsys, "changes", uri, "--start-version", "0", "--format", "xml")
    assert code == 2
