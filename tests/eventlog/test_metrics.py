"""Prometheus metrics scraped over HTTP, and the structured log line of a conflict."""

from __future__ import annotations

import logging
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog import ConcurrentAppendException, Table, metrics
from tests.conftest import SCHEMA, rows

SERIALIZABLE = {"delta.isolationLevel": "Serializable"}  # a concurrent append conflicts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def scrape() -> Iterator[dict[str, float]]:
    port = _free_port()
    metrics.enable(port=port)
    values: dict[str, float] = {}

    def read() -> dict[str, float]:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        values.clear()
        for line in body.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    yield read  # type: ignore[misc]
    metrics.disable()
    assert not metrics.enabled()


def test_metrics_count_commits_attempts_conflicts_and_phases(tmp_path: Path, scrape) -> None:  # type: ignore[no-untyped-def]
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"], properties=SERIALIZABLE)
    t.append(rows([1]))
    loser = t.transaction()
    loser.delete("date = '2024-01-01'")
    t.append(rows([2]))  # lands in the partition the DELETE read
    with pytest.raises(ConcurrentAppendException):
        loser.commit()
    got = scrape()
    assert got['eventlog_commits_total{operation="WRITE"}'] == 2
    assert got['eventlog_commits_total{operation="CREATE TABLE"}'] == 1
    assert got["eventlog_commit_attempts_total"] >= 3
    assert got['eventlog_conflicts_total{exception="ConcurrentAppendException"}'] == 1
    assert got['eventlog_commit_phase_seconds_count{phase="total"}'] == 3
    assert got['eventlog_commit_phase_seconds_count{phase="claim"}'] == 3


def test_group_commit_sizes_are_observed(tmp_path: Path, scrape) -> None:  # type: ignore[no-untyped-def]
    t = Table.create(str(tmp_path / "t"), SCHEMA)
    g = Table.open(t.uri, group_commit=True)
    g.append(rows([1]))
    got = scrape()
    assert got["eventlog_group_commit_size_count"] == 1 and got["eventlog_group_commit_size_sum"] == 1


def test_disabled_metrics_record_nothing(tmp_path: Path) -> None:
    assert not metrics.enabled()
    t = Table.create(str(tmp_path / "t"), SCHEMA)
    t.append(rows([1]))  # the hooks are no-ops


def test_a_conflict_logs_one_structured_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"], properties=SERIALIZABLE)
    t.append(rows([1]))
    loser = t.transaction()
    loser.delete("date = '2024-01-01'")
    won = t.append(rows([2]))
    with caplog.at_level(logging.INFO, logger="eventlog.commit"), pytest.raises(ConcurrentAppendException):
        loser.commit()
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.table == t.uri and record.txn_id == loser.txn_id  # type: ignore[attr-defined]
    assert (record.winning_version, record.winning_operation) == (won.version, "WRITE")  # type: ignore[attr-defined]
    assert record.exception == "ConcurrentAppendException"  # type: ignore[attr-defined]
