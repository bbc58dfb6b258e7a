"""How many S3 requests, of which kinds, a commit and an open cost (against moto's server).

Every request the s3fs client sends goes through aiobotocore's ``_make_api_call`` once per
attempt (s3fs retries by calling it again), so wrapping it counts requests by S3 operation
name, and which of them answered "no such key". The numbers are exact on purpose: a change
that adds a request to the commit or open path fails here, and one that removes a request
updates the numbers together with the comment that justifies each of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.log.storage import PROBE_BYTES, LogStore
from lockstore import InMemorySlotStore

pytest.importorskip("s3fs")
aioclient = pytest.importorskip("aiobotocore.client")

SCHEMA = pa.schema([("id", pa.int64())])


@dataclass
class Requests:
    """S3 requests since the last :meth:`take`: by operation, and those that found no key."""

    kinds: Counter[str] = field(default_factory=Counter)
    missing: Counter[str] = field(default_factory=Counter)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        out = dict(self.kinds), dict(self.missing)
        self.kinds.clear()
        self.missing.clear()
        self.calls.clear()
        return out


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[Requests]:
    seen = Requests()
    original = aioclient.AioBaseClient._make_api_call

    async def counted(self: Any, operation: str, params: dict[str, Any]) -> Any:
        seen.kinds[operation] += 1
        seen.calls.append((operation, {k: v for k, v in params.items() if k != "Body"}))
        try:
            return await original(self, operation, params)
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                seen.missing[operation] += 1
            raise

    monkeypatch.setattr(aioclient.AioBaseClient, "_make_api_call", counted)
    yield seen


def _row(i: int) -> pa.Table:
    return pa.table({"id": [i]}, schema=SCHEMA)


def test_an_append_through_an_open_handle_costs_five_requests(
    s3_uri: str, s3_storage_options: dict[str, Any], requests: Requests
) -> None:
    slots = InMemorySlotStore()
    Table.create(s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options).close()
    t = Table.open(s3_uri, slots=slots, storage_options=s3_storage_options)
    requests.take()
    for i in range(3):  # the first append through a handle costs no more than the others
        assert t.append(_row(i)).version == i + 1
        calls = list(requests.calls)
        # GetObject: the refresh before the transaction probes for the next version, one
        #   ranged GET that finds no key (s3fs's exists would be a HEAD and a LIST).
        # PutObject: the data file, the staged commit (what recovery publishes if this
        #   writer dies after its claim), and the commit, put-if-absent (If-None-Match: *).
        # DeleteObject: the staged commit, once published.
        # No HeadBucket (nothing makes directories on S3), no HeadObject, no LIST.
        assert requests.take() == (
            {"GetObject": 1, "PutObject": 3, "DeleteObject": 1},
            {"GetObject": 1},
        )
        puts = [params for op, params in calls if op == "PutObject"]
        commit = [p for p in puts if p["Key"].endswith(f"_delta_log/{i + 1:020d}.json")]
        assert len(commit) == 1 and commit[0].get("IfNoneMatch") == "*"
    t.close()


def test_an_append_after_another_writer_reads_its_commit_once(
    s3_uri: str, s3_storage_options: dict[str, Any], requests: Requests
) -> None:
    slots = InMemorySlotStore()
    Table.create(s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options).close()
    mine = Table.open(s3_uri, slots=slots, storage_options=s3_storage_options)
    other = Table.open(s3_uri, slots=slots, storage_options=s3_storage_options)
    other.append(_row(1))
    requests.take()
    assert mine.append(_row(2)).version == 2
    # GetObject x2: the probe for version 1 finds the other writer's commit, and its bytes
    #   are kept for the snapshot update that follows (no second read); the probe for
    #   version 2 finds no key. Then the 3 PutObject and 1 DeleteObject of any append.
    assert requests.take() == (
        {"GetObject": 2, "PutObject": 3, "DeleteObject": 1},
        {"GetObject": 1},
    )
    assert sorted(mine.to_arrow().column("id").to_pylist()) == [1, 2]
    mine.close()
    other.close()


def test_a_refresh_with_nothing_new_is_one_request(
    s3_uri: str, s3_storage_options: dict[str, Any], requests: Requests
) -> None:
    t = Table.create(s3_uri, SCHEMA, slots=InMemorySlotStore(), storage_options=s3_storage_options)
    requests.take()
    assert t.version == 0
    assert requests.take() == ({"GetObject": 1}, {"GetObject": 1})  # the probe for version 1
    t.close()


def test_create_costs_four_requests(
    s3_uri: str, s3_storage_options: dict[str, Any], requests: Requests
) -> None:
    requests.take()
    Table.create(s3_uri, SCHEMA, slots=InMemorySlotStore(), storage_options=s3_storage_options).close()
    # GetObject: the probe for version 0 (no key: no table there yet). The storage options
    #   are checked by building s3fs's client (no request). PutObject: the staged commit and
    #   version 0 (put-if-absent). DeleteObject: the staged commit.
    assert requests.take() == ({"GetObject": 1, "PutObject": 2, "DeleteObject": 1}, {"GetObject": 1})


@pytest.mark.parametrize("commits", [1, 4])
def test_an_open_lists_once_and_reads_each_commit_with_one_get(
    s3_uri: str, s3_storage_options: dict[str, Any], requests: Requests, commits: int
) -> None:
    slots = InMemorySlotStore()
    t = Table.create(s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options)
    for i in range(commits - 1):
        t.append(_row(i))
    t.close()
    requests.take()
    opened = Table.open(s3_uri, slots=slots, storage_options=s3_storage_options)
    counted = requests.take()
    # GetObject (no key): ``_last_checkpoint``, one GET (s3fs's plain cat_file would ask
    #   for the size first: a HEAD, then a LIST as the directory fallback).
    # ListObjectsV2: the log, once. It is strongly consistent, so no probe for a version
    #   after the listed ones follows. GetObject: each commit file, one GET (no HEAD).
    assert counted == ({"ListObjectsV2": 1, "GetObject": commits + 1}, {"GetObject": 1})
    assert opened.snapshot().version == commits - 1
    opened.close()


def test_probed_and_streamed_commits_read_back_exactly(
    s3_uri: str, s3_storage_options: dict[str, Any], requests: Requests
) -> None:
    """The log store's one-GET reads: a probed small commit is not fetched again, a big one is
    read as its first ``PROBE_BYTES`` and then the rest, and an empty file (S3 refuses a range
    of it) still reads."""
    log = LogStore(s3_uri, storage_options=s3_storage_options)
    small = b'{"commitInfo":{}}\n'
    big = b"".join(b'{"add":{"path":"%d"}}\n' % i for i in range(3 * PROBE_BYTES // 20))
    assert len(big) > 2 * PROBE_BYTES
    log.fs.pipe_file(log.commit_path(0), small)
    log.fs.pipe_file(log.commit_path(1), big)
    log.fs.pipe_file(log.commit_path(2), b"")
    requests.take()

    assert log.commit_exists(0) and log.read_commit(0) == small
    assert requests.take() == ({"GetObject": 1}, {})  # the read reused the probe's bytes
    assert log.read_commit(0) == small  # kept only for one read: fetched again
    assert requests.take() == ({"GetObject": 1}, {})

    assert not log.commit_exists(3) and log.read_commit(3) is None and log.open_commit(3) is None
    assert requests.take() == ({"GetObject": 3}, {"GetObject": 3})

    f = log.open_commit(1)
    assert f is not None
    with f:
        first = f.read(PROBE_BYTES)
        assert first == big[:PROBE_BYTES]
        assert first + f.read() == big
    assert log.commit_exists(1) and log.read_commit(1) == big

    f = log.open_commit(0)
    assert f is not None and f.read() == small
    assert log.commit_exists(2) and log.read_commit(2) == b""
    f = log.open_commit(2)
    assert f is not None and f.read() == b""


def test_a_scan_reads_each_data_file_with_one_get_and_a_checkpointed_open_lists_nothing(
    s3_uri: str, s3_storage_options: dict[str, Any], requests: Requests
) -> None:
    slots = InMemorySlotStore()
    t = Table.create(
        s3_uri, SCHEMA, slots=slots, storage_options=s3_storage_options,
        properties={"delta.checkpointInterval": "3"},
    )  # fmt: skip
    for i in range(3):
        t.append(_row(i))  # version 3 writes a checkpoint
    t.close()
    requests.take()
    opened = Table.open(s3_uri, slots=slots, storage_options=s3_storage_options)
    # GetObject: ``_last_checkpoint``, the checkpoint (one GET each, no HEAD), and the probe
    #   for version 4 (no key). No LIST: the pointer names the checkpoint.
    assert requests.take() == ({"GetObject": 3}, {"GetObject": 1})
    assert sorted(opened.to_arrow().column("id").to_pylist()) == [0, 1, 2]
    # A read of the latest version refreshes first: the probe for version 4 (no key). Then
    # one GET per data file (three small files, no HEAD before each), nothing else.
    assert requests.take() == ({"GetObject": 4}, {"GetObject": 1})
    opened.close()
