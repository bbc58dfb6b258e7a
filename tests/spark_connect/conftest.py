"""Every test here runs as in a Spark Connect client process (see tests/support/spark_connect.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.spark_connect import connect_mode


@pytest.fixture(autouse=True)
def _connect_mode() -> Iterator[None]:
    with connect_mode():
        yield
