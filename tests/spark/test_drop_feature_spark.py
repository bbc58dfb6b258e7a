"""EventlogTable.dropFeature: ALTER TABLE ... DROP FEATURE from the Spark table API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventlog import FeatureDropError, Table
from spark_adapter.table import EventlogTable
from tests.conftest import SCHEMA, rows

pytestmark = pytest.mark.spark


def test_drop_feature_from_spark(spark: Any, tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties={"delta.enableDeletionVectors": "true"})
    t.append(rows([1, 2, 3]))
    st = EventlogTable.forPath(spark, t.uri)
    st.delete("id = 2")
    result = st.dropFeature("deletionVectors")
    assert result.operation == "DROP FEATURE"
    assert "deletionVectors" not in set(t.snapshot().protocol.writer_features or ())
    assert sorted(r["id"] for r in st.toDF().collect()) == [1, 3]
    with pytest.raises(FeatureDropError) as err:
        st.dropFeature("deletionVectors", truncateHistory=True)
    assert err.value.reason == "not present"
