"""tests/spark/test_sql.py and tests/spark/test_sql_documents.py, every test, on the Spark
Connect session: this module's ``spark`` fixture is the Connect session, so each statement
kind runs on both kinds of session and is compared with the Python API the same way."""

from __future__ import annotations

from typing import Any

import pytest

from tests.spark.test_sql import *  # noqa: F403  (re-collects the classic suite's tests here)
from tests.spark.test_sql import table  # noqa: F401  (its fixture)
from tests.spark.test_sql_documents import *  # noqa: F403
from tests.spark.test_sql_documents import named_t  # noqa: F401  (its fixture)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]  # type: ignore[assignment]


@pytest.fixture
def spark(connect_spark: Any) -> Any:
    return connect_spark


def test_the_session_here_is_a_connect_session(spark: Any) -> None:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    assert isinstance(spark, ConnectSession)
