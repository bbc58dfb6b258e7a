"""EventlogTable.reorgPurge: REORG TABLE ... APPLY (PURGE) from the Spark table API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventlog import Table
from eventlog.errors import InvalidInputError
from spark_adapter.table import EventlogTable
from tests.conftest import SCHEMA, rows

pytestmark = pytest.mark.spark

DV = {"delta.enableDeletionVectors": "true"}


def test_reorg_purge_from_spark(spark: Any, tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"], properties=DV)
    t.append(rows([1, 2, 3], "2024-01-01"))
    t.append(rows([4, 5], "2024-01-02"))
    st = EventlogTable.forPath(spark, t.uri)
    st.delete("id IN (2, 5)")  # a deletion vector in each partition
    result = st.reorgPurge("date = '2024-01-01'")
    assert (result.version, result.operation) == (4, "REORG")
    dvs = [a.partition_values for a in t.snapshot().add_files if a.deletion_vector is not None]
    assert dvs == [{"date": "2024-01-02"}]
    st.reorgPurge()
    assert all(a.deletion_vector is None for a in t.snapshot().add_files)
    assert sorted(r["id"] for r in st.toDF().collect()) == [1, 3, 4]
    history = st.history(2).collect()
    assert [h["operation"] for h in history] == ["REORG", "REORG"]
    assert history[0]["operationParameters"] == {"predicate": "[]", "applyPurge": "true"}
    with pytest.raises(InvalidInputError):
        st.reorgPurge("id = 1")
