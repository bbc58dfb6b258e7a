"""The SQL of the isolation-and-conflicts documents, run verbatim on a table named ``t``
through ``spark_adapter.sql``, compared with the Python API on an identical table.

The documents' statements (the literal ``...`` of their fragments filled in the least way):
their ALTER/REORG/DROP FEATURE/MERGE examples, and the pair ``UPDATE ... WHERE date >
'2010-01-01'`` / ``DELETE ... WHERE date < '2010-01-01'``, which "conflict on a table not
partitioned by ``date``, and do not when it is". tests/spark_connect re-runs this module on
a Spark Connect session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.errors import ConcurrentAppendException
from spark_adapter.ops import jobs
from spark_adapter.sql import sql
from tests.conftest import SCHEMA, rows

pytestmark = pytest.mark.spark

SET_SERIALIZABLE = "ALTER TABLE t SET TBLPROPERTIES ('delta.isolationLevel' = 'Serializable')"
MERGE = (
    "MERGE INTO t USING updates s ON t.id = s.id "
    "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
)
UPDATE_LATER = "UPDATE t SET x = 0 WHERE date > '2010-01-01'"
DELETE_EARLIER = "DELETE FROM t WHERE date < '2010-01-01'"
REORG = "REORG TABLE t APPLY (PURGE)"
DROP_DVS = "ALTER TABLE t DROP FEATURE deletionVectors"


def _data() -> pa.Table:
    """One file: rows before, on and after the documents' date."""
    return pa.concat_tables(
        [rows([1, 2, 3], "2009-12-30"), rows([8, 9], "2010-01-01"), rows([4, 5, 6], "2010-01-02")]
    )


def _content(table: Table) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["date"], r["x"]) for r in table.to_arrow().to_pylist())


@pytest.fixture
def named_t(spark: Any, tmp_path: Path) -> Iterator[Any]:
    """``t`` names a fresh table for one test (a registered name, as users create it)."""

    def make(partitioned: bool, properties: dict[str, str] | None = None) -> Table:
        loc = str(tmp_path / "t")
        table = Table.create(
            loc, SCHEMA, partition_by=["date"] if partitioned else None, properties=properties
        )
        table.append(_data())
        sql(spark, f"CREATE TABLE t USING eventlog LOCATION '{loc}'")
        return table

    yield make
    sql(spark, "DROP TABLE IF EXISTS t")


def test_the_documents_statements_run_verbatim(spark: Any, named_t: Any, tmp_path: Path) -> None:
    ours = named_t(False, {"delta.enableDeletionVectors": "true"})
    ref = Table.create(str(tmp_path / "ref"), SCHEMA, properties={"delta.enableDeletionVectors": "true"})
    ref.append(_data())
    sql(spark, SET_SERIALIZABLE)
    ref.set_properties({"delta.isolationLevel": "Serializable"})
    assert ours.properties["delta.isolationLevel"] == "Serializable"
    updates = rows([3, 7], "2010-01-02", x=30)
    spark.createDataFrame(updates.to_pandas()).createOrReplaceTempView("updates")
    counts = sql(spark, MERGE).collect()[0]
    assert (counts["num_updated_rows"], counts["num_inserted_rows"]) == (1, 1)
    ref.merge(
        updates, "t.id = s.id", source_alias="s", target_alias="t"
    ).when_matched_update_all().when_not_matched_insert_all().execute()
    assert sql(spark, UPDATE_LATER).collect()[0][0] == 5  # 3 moved past the date by the MERGE
    assert (
        ref.update("date > '2010-01-01'", {"x": "0"}).metrics["numUpdatedRows"] == "5"
    )  # as Delta records it
    assert sql(spark, DELETE_EARLIER).collect()[0][0] == 2
    ref.delete("date < '2010-01-01'")
    assert any(a.deletion_vector is not None for a in ours.snapshot().add_files)
    sql(spark, REORG)
    assert all(a.deletion_vector is None for a in ours.snapshot().add_files)
    sql(spark, DROP_DVS)
    assert "deletionVectors" not in (ours.snapshot().protocol.writer_features or ())
    assert ours.properties["delta.enableDeletionVectors"] == "false"
    assert (
        _content(ours)
        == _content(ref)
        == [
            (3, "2010-01-02", 0),
            (4, "2010-01-02", 0),
            (5, "2010-01-02", 0),
            (6, "2010-01-02", 0),
            (7, "2010-01-02", 0),
            (8, "2010-01-01", 8),
            (9, "2010-01-01", 9),
        ]
    )
    ops = [h["operation"] for h in reversed(ours.history())]
    assert ops[: ops.index("SET TBLPROPERTIES", 3) + 1] == [
        "CREATE TABLE", "WRITE", "SET TBLPROPERTIES", "MERGE", "UPDATE", "DELETE", "REORG",
        "SET TBLPROPERTIES",  # DROP FEATURE: disable, barrier commits (Empty Commit), downgrade
    ]  # fmt: skip
    assert ops[-1] == "DROP FEATURE"


@pytest.mark.parametrize("partitioned", [False, True])
def test_update_and_delete_on_either_side_of_a_date(
    spark: Any, named_t: Any, monkeypatch: pytest.MonkeyPatch, partitioned: bool
) -> None:
    """The SQL UPDATE runs its Spark jobs; before it commits, the DELETE wins (Python API)."""
    table = named_t(partitioned)
    won: list[int] = []
    commit = jobs.PendingCommit.commit

    def delete_first(self: jobs.PendingCommit) -> Any:
        if not won:
            won.append(Table.open(table.uri).delete("date < '2010-01-01'").version)
        return commit(self)

    monkeypatch.setattr(jobs.PendingCommit, "commit", delete_first)
    if partitioned:
        assert sql(spark, UPDATE_LATER).collect()[0][0] == 3
        assert table.version == won[0] + 1 == 3
        assert _content(table) == [
            (4, "2010-01-02", 0),
            (5, "2010-01-02", 0),
            (6, "2010-01-02", 0),
            (8, "2010-01-01", 8),
            (9, "2010-01-01", 9),
        ]
        return
    # The DELETE rewrote the one file (adding its kept rows), and Delta checks added files first.
    with pytest.raises(ConcurrentAppendException) as err:
        sql(spark, UPDATE_LATER)
    assert (err.value.winning_version, err.value.operation, err.value.partition) == (won[0], "DELETE", None)
    assert err.value.isolation_level == "WriteSerializable" and err.value.table == table.uri
    assert table.version == won[0] == 2  # the UPDATE wrote nothing that stays
    assert _content(table) == [
        (4, "2010-01-02", 4),
        (5, "2010-01-02", 5),
        (6, "2010-01-02", 6),
        (8, "2010-01-01", 8),
        (9, "2010-01-01", 9),
    ]
