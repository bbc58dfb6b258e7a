"""Writers racing on an empty path: one creates the table, losers get ProtocolChanged."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import ProtocolChangedException, Table, TableAlreadyExistsError, write_table
from tests.conftest import SCHEMA, rows, sorted_ids


def test_write_table_creates_then_appends(local_uri: str) -> None:
    first = write_table(local_uri, rows([1]), partition_by=["date"])
    assert (first.version, first.operation) == (0, "CREATE TABLE AS SELECT")
    second = write_table(local_uri, rows([2]), partition_by=["date"])
    assert second.version == 1
    t = Table.open(local_uri)
    assert sorted_ids(t) == [1, 2] and t.partition_columns == ("date",)
    with pytest.raises(TableAlreadyExistsError):
        write_table(local_uri, rows([3]), mode="error")
    assert write_table(local_uri, rows([3]), mode="ignore").skipped
    write_table(local_uri, rows([4]), mode="overwrite")
    assert sorted_ids(t) == [4]


@pytest.mark.parametrize("round_", range(4))
def test_threads_racing_on_an_empty_path(tmp_path: Path, round_: int) -> None:
    uri = str(tmp_path / f"race{round_}")
    writers = 4
    barrier = threading.Barrier(writers)
    outcomes: dict[int, object] = {}

    def write(worker: int) -> None:
        barrier.wait()
        try:
            outcomes[worker] = write_table(uri, rows([worker]))
        except ProtocolChangedException as exc:
            outcomes[worker] = exc

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert len(outcomes) == writers
    t = Table.open(uri)
    history = t.history()
    assert [h["operation"] for h in history].count("CREATE TABLE AS SELECT") == 1
    assert history[-1]["version"] == 0 and history[-1]["operation"] == "CREATE TABLE AS SELECT"
    lost = {w for w, o in outcomes.items() if isinstance(o, ProtocolChangedException)}
    for w in lost:
        err = outcomes[w]
        assert isinstance(err, ProtocolChangedException)
        assert err.winning_version == 0 and "empty directory" in str(err)
    # Exactly the writers that did not lose are in the table, each once; losers left no file.
    assert sorted_ids(t) == sorted(set(range(writers)) - lost)
    live = {Path(uri, p).name for p in t.files()}
    on_disk = {p.name for p in Path(uri).rglob("*.parquet") if "_delta_log" not in p.parts}
    assert on_disk == live


def test_create_with_data_and_inferred_schema(any_uri: str) -> None:
    data = rows([1, 2])
    t = Table.create(any_uri, data=data, partition_by=["date"])
    assert t.schema == SCHEMA
    assert sorted_ids(t) == [1, 2]
    assert t.history(1)[0]["operationMetrics"]["numOutputRows"] == "2"
    with pytest.raises(Exception) as info:
        Table.create(any_uri + "-x", schema=None)
    assert "schema or data" in str(info.value)
    assert pa.types.is_int64(t.schema.field("id").type)
