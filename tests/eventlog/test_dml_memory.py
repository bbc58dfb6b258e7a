"""DELETE, UPDATE and MERGE work file by file: the rows they hold are about one touched
file's, not the table's (issue 27).

Two measures, neither timed:

* the rows handed to each data file write, and to each change data write, are at most about
  one touched file's (a whole-table rewrite writes them all at once);
* the peak of pyarrow's allocations during the operation, in a fresh process through a
  proxy memory pool that records its high-water mark, stays a few times one file's rows
  (holding every touched file costs more than the number of files times that).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

import eventlog.files.change_data as change_data
import eventlog.ops.common as common
from eventlog import Table

FILES = 12
ROWS = 20_000  # per file
SMALL_TARGET = str(1 << 20)  # below one file's rows in memory: every file is written alone


def _rows(start: int, n: int = ROWS) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "grp": ids % 7,
            "payload": pa.array([f"{i:08d}" + "x" * 92 for i in ids.tolist()], pa.string()),
        }
    )


def _make(uri: str, **props: str) -> Table:
    t = Table.create(uri, _rows(0, 0).schema, properties={"delta.targetFileSize": SMALL_TARGET, **props})
    for i in range(FILES):
        t.append(_rows(i * ROWS))
    return t


def _source() -> pa.Table:
    """Every fifth id of the table, and 100 new ones (inserted)."""
    ids = np.concatenate([np.arange(0, FILES * ROWS, 5), np.arange(FILES * ROWS, FILES * ROWS + 100)])
    return pa.table({"id": ids, "grp": ids % 7, "payload": pa.array(["z"] * len(ids))})


def _run(t: Table, op: str) -> None:
    if op == "delete":
        t.delete("grp = 3")
    elif op == "update":
        t.update("grp = 3", {"payload": "'y'"})
    else:
        merge = t.merge(_source(), "target.id = source.id")
        merge.when_matched_update(set={"payload": "source.payload"}).when_not_matched_insert_all().execute()


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The size in memory of every data file write (``write_rows``' call of ``write_data_files``)."""
    seen: list[int] = []
    real = common.write_data_files

    def counting(fs: Any, root: str, data: pa.Table, **kw: Any) -> Any:
        seen.append(data.nbytes)
        return real(fs, root, data, **kw)

    monkeypatch.setattr(common, "write_data_files", counting)
    yield seen


@pytest.mark.parametrize("dv", [False, True])
@pytest.mark.parametrize("op", ["delete", "update", "merge"])
def test_each_write_holds_the_rows_of_one_touched_file(
    tmp_path: Path, writes: list[int], op: str, dv: bool
) -> None:
    t = _make(str(tmp_path), **{"delta.enableDeletionVectors": str(dv).lower()})
    writes.clear()
    _run(t, op)
    metrics = t.history(1)[0]["operationMetrics"]
    hit = sum(1 for i in range(FILES * ROWS) if i % 7 == 3)
    if op == "delete":
        assert int(metrics["numDeletedRows"]) == hit and t.to_arrow().num_rows == FILES * ROWS - hit
    elif op == "update":
        assert int(metrics["numUpdatedRows"]) == hit
        assert int(metrics["numCopiedRows"]) == (0 if dv else FILES * ROWS - hit)
    else:
        assert int(metrics["numTargetRowsUpdated"]) == FILES * ROWS // 5
        assert int(metrics["numTargetRowsInserted"]) == 100
        assert int(metrics["numTargetFilesRemoved"]) == FILES
    assert t.to_arrow().num_rows == FILES * ROWS - (hit if op == "delete" else 0) + (
        100 if op == "merge" else 0
    )
    if not dv:  # every file rewritten, each on its own (a DV table writes only new images)
        assert len(writes) >= FILES
    # about one file's rows (or the target file size) a write, never the table's
    assert max(writes, default=0) <= _rows(0).nbytes + int(SMALL_TARGET)


@pytest.mark.parametrize("op", ["delete", "update", "merge"])
def test_change_data_is_written_in_bounded_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    uri = str(tmp_path)
    t = _make(uri, **{"delta.enableChangeDataFeed": "true"})
    monkeypatch.setattr(change_data, "CHANGE_GROUP_BYTES", 1 << 20)
    sizes: list[int] = []
    real = change_data.ChangeRecorder.write_rows

    def counting(fs: Any, root: str, schema: pa.Schema, parts: Any, rows: pa.Table, *a: Any) -> Any:
        sizes.append(rows.num_rows)
        return real(fs, root, schema, parts, rows, *a)

    monkeypatch.setattr(change_data.ChangeRecorder, "write_rows", staticmethod(counting))
    _run(t, op)
    changes = pa.table(DeltaTable(uri).load_cdf(starting_version=FILES + 1).read_all())
    kinds = changes.group_by("_change_type").aggregate([("id", "count")]).to_pylist()
    got = {k["_change_type"]: k["id_count"] for k in kinds}
    hit = sum(1 for i in range(FILES * ROWS) if i % 7 == 3)
    expected = {
        "delete": {"delete": hit},
        "update": {"update_preimage": hit, "update_postimage": hit},
        "merge": {"update_preimage": FILES * ROWS // 5, "update_postimage": FILES * ROWS // 5, "insert": 100},
    }[op]
    assert got == expected
    assert len(sizes) > 1 and max(sizes) <= 2 * ROWS  # about a group each, never all of them


_CHILD = """
import json, os, sys
import pyarrow as pa
from eventlog import Table
from tests.eventlog.test_dml_memory import _run
t = Table.open(sys.argv[1])
pool = pa.proxy_memory_pool(pa.default_memory_pool())
pa.set_memory_pool(pool)
_run(t, sys.argv[2])
print(json.dumps({"peak": pool.max_memory()}), flush=True)
os._exit(0)  # buffers of the proxy pool outlive it at interpreter exit
"""


@pytest.mark.parametrize("dv", [False, True])
@pytest.mark.parametrize("op", ["delete", "update", "merge"])
def test_peak_arrow_memory_is_a_few_files_not_the_table(tmp_path: Path, op: str, dv: bool) -> None:
    uri = str(tmp_path / "t")
    _make(uri, **{"delta.enableDeletionVectors": str(dv).lower()})
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, uri, op], cwd=root, capture_output=True, text=True, check=True
    )
    peak = json.loads(out.stdout.strip().splitlines()[-1])["peak"]
    one_file = _rows(0).nbytes
    # Holding every touched file would take more than FILES (12) times one file's rows.
    assert peak < 8 * one_file, (peak, one_file)
