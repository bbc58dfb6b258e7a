"""A failing S3: writer processes on an ``s3://`` table whose every request (data files, the
log, the version slots granted by conditional writes) goes through the fault-injecting proxy
of :mod:`tests.support.faultproxy`, in front of the suite's S3 server.

- 500 InternalError and 503 SlowDown at a rate, throttling and slow answers: botocore and
  s3fs retry them, so every commit lands and the invariants hold;
- connections reset mid-request and mid-response, and answers dropped after the server
  handled the request, including the conditional PUTs that claim a version (``.slot``) and
  publish it (``_delta_log/<v>.json``): the retried ``If-None-Match`` PUT then answers 412
  for the writer's own first attempt, which must count as its write, not as a lost race;
- persistent failure: every answer a 503 (or every connection refused) past the retries: the
  user gets :class:`~eventlog.errors.StorageError` or the documented slot error, the cause
  chained, and the table is left exactly as it was.

Each test ends with the checks: the invariants with a fresh handle (on the server directly),
``verify``, a new write, and the writers all returned (``run_writers`` joins them, bounded).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.errors import CommitStateUnknownError, SlotStoreError, StorageError, storage_step
from tests.support.faultproxy import FaultProxy, Rule
from tests.support.fixtures import s3_admin_client
from tests.support.invariants import SCHEMA, WriterResult, check_invariants, run_writers

pytest.importorskip("s3fs")

pytestmark = pytest.mark.timeout(180)

#: The conditional PUTs of a commit: the version's claim and its publication.
CONDITIONAL = r"(\.slot|/_delta_log/\d{20}\.json)$"


@pytest.fixture
def proxy(s3_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.removeprefix("http://"), mode="http", seed=28) as proxy:
        yield proxy


def _through(options: dict[str, Any], proxy: FaultProxy, **extra: Any) -> dict[str, Any]:
    return dict(options, endpoint_url=proxy.url, **extra)


def _slots(bucket: str) -> str:
    return f"s3://{bucket}/slots"


def _create(uri: str, bucket: str, options: dict[str, Any]) -> None:
    Table.create(uri, SCHEMA, slots=_slots(bucket), storage_options=options).close()


def _checks(uri: str, bucket: str, options: dict[str, Any], results: list[WriterResult], ops: int) -> Table:
    """Every writer finished its operations; the invariants hold with a fresh handle on the
    server itself; ``verify`` passes; the table takes a new write."""
    acks = [a for r in results for a in r.acks]
    assert len(acks) == ops * len(results), [r.errors for r in results]
    table = check_invariants(uri, acks, slots=_slots(bucket), storage_options=options)
    report = table.verify()
    assert report.ok, report
    before = table.version
    batch = pa.table({"id": [-1], "worker": [-1], "batch": [-1]}, schema=SCHEMA)
    assert table.append(batch).version == before + 1
    assert -1 in Table.open(uri, storage_options=options).to_arrow().column("id").to_pylist()
    return table


def test_500s_and_503s_at_a_rate_are_retried_and_every_commit_lands(
    s3_bucket: str, s3_uri: str, s3_storage_options: dict[str, Any], proxy: FaultProxy
) -> None:
    _create(s3_uri, s3_bucket, s3_storage_options)
    slow_down = proxy.add_rule(Rule("error", status=503, rate=0.06))
    internal = proxy.add_rule(Rule("error", status=500, rate=0.04))
    results = run_writers(
        s3_uri, workers=3, ops=6, slots=_slots(s3_bucket), merge_share=0.3,
        storage_options=_through(s3_storage_options, proxy),
    )  # fmt: skip
    assert slow_down.fired >= 5 and internal.fired >= 3, proxy.stats()
    assert not any(r.errors for r in results)
    proxy.heal()
    _checks(s3_uri, s3_bucket, s3_storage_options, results, ops=6).close()


def test_throttled_and_slow_answers(
    s3_bucket: str, s3_uri: str, s3_storage_options: dict[str, Any], proxy: FaultProxy
) -> None:
    """Bandwidth throttled, latency with jitter on every exchange, and some answers held a
    second: slower, but nothing fails."""
    _create(s3_uri, s3_bucket, s3_storage_options)
    proxy.configure(latency=0.005, jitter=0.01, bandwidth=2_000_000)
    slow = proxy.add_rule(Rule("delay", delay=1.0, rate=0.05))
    results = run_writers(
        s3_uri, workers=3, ops=4, slots=_slots(s3_bucket),
        storage_options=_through(s3_storage_options, proxy),
    )  # fmt: skip
    assert slow.fired >= 3, proxy.stats()
    assert not any(r.errors for r in results)
    proxy.heal()
    _checks(s3_uri, s3_bucket, s3_storage_options, results, ops=4).close()


@pytest.mark.parametrize("where", ["conditional", "any"])
def test_connections_reset_mid_request_and_mid_response(
    s3_bucket: str, s3_uri: str, s3_storage_options: dict[str, Any], proxy: FaultProxy, where: str
) -> None:
    """``conditional``: half of the claims and publications are handled by the server and
    their answers lost (the client retries the ``If-None-Match`` PUT and gets 412 for its own
    write). ``any``: requests of every kind cut before the server has them whole, answers cut
    halfway, answers dropped."""
    _create(s3_uri, s3_bucket, s3_storage_options)
    if where == "conditional":
        rules = [proxy.add_rule(Rule("drop_response", method="PUT", path=CONDITIONAL, rate=0.5))]
    else:
        rules = [
            proxy.add_rule(Rule("reset_request", rate=0.04, after_bytes=120)),
            proxy.add_rule(Rule("reset_response", rate=0.04, after_bytes=60)),
            proxy.add_rule(Rule("drop_response", rate=0.04)),
        ]
    results = run_writers(
        s3_uri, workers=3, ops=5, slots=_slots(s3_bucket), merge_share=0.3,
        storage_options=_through(s3_storage_options, proxy),
    )  # fmt: skip
    assert all(rule.fired >= 3 for rule in rules), proxy.stats()
    if where == "conditional":  # retried conditional PUTs refused for the writers' own writes
        assert proxy.stats()["statuses"].get("412", 0) >= 3, proxy.stats()
    assert not any(r.errors for r in results)
    proxy.heal()
    _checks(s3_uri, s3_bucket, s3_storage_options, results, ops=5).close()


def _objects(bucket: str, endpoint: str) -> dict[str, str]:
    """Every object of ``bucket`` -> its ETag, read from the server directly."""
    pages = s3_admin_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"]: o["ETag"] for page in pages for o in page.get("Contents", [])}


#: Fewer retries (botocore's; s3fs's own five stay) and short timeouts: persistent failure
#: surfaces within seconds.
QUICK = {"config_kwargs": {"retries": {"max_attempts": 2}, "connect_timeout": 2, "read_timeout": 5}}


@pytest.mark.parametrize("fault", ["503-for-everything", "503-for-the-commit", "refused"])
def test_persistent_failure_raises_a_typed_error_and_leaves_the_table_as_it_was(
    s3_bucket: str,
    s3_uri: str,
    s3_server: str,
    s3_storage_options: dict[str, Any],
    proxy: FaultProxy,
    fault: str,
) -> None:
    _create(s3_uri, s3_bucket, s3_storage_options)
    first = pa.table({"id": [1, 2], "worker": [0, 0], "batch": [0, 0]}, schema=SCHEMA)
    Table.open(s3_uri, slots=_slots(s3_bucket), storage_options=s3_storage_options).append(first)
    before = _objects(s3_bucket, s3_server)
    handle = Table.open(
        s3_uri, slots=_slots(s3_bucket), storage_options=_through(s3_storage_options, proxy, **QUICK)
    )
    if fault == "refused":
        proxy.configure(refuse=True)
    else:  # the commit: the staged commit, the version's claim and its publication
        path = r"/_eventlog/staged/|\.slot$|/_delta_log/" if fault == "503-for-the-commit" else None
        proxy.add_rule(Rule("error", status=503, method="PUT" if path else None, path=path))
    batch = pa.table({"id": [3], "worker": [0], "batch": [1]}, schema=SCHEMA)
    with pytest.raises((StorageError, SlotStoreError, CommitStateUnknownError)) as failed:
        handle.append(batch)
    error = failed.value
    assert error.__cause__ is not None
    if isinstance(error, StorageError):
        assert isinstance(error, OSError) and error.uri == handle.uri
        assert error.step in ("data file", "staged commit", "commit log") and error.path
    proxy.heal()
    assert _objects(s3_bucket, s3_server) == before  # nothing left behind: the table as it was
    fresh = Table.open(s3_uri, slots=_slots(s3_bucket), storage_options=s3_storage_options)
    assert fresh.version == 1 and sorted(fresh.to_arrow().column("id").to_pylist()) == [1, 2]
    assert fresh.verify().ok
    assert handle.append(batch).version == 2  # the failed handle works again once healed
    assert sorted(
        Table.open(s3_uri, storage_options=s3_storage_options).to_arrow().column("id").to_pylist()
    ) == [1, 2, 3]


def test_an_object_store_clients_own_error_is_a_storage_error() -> None:
    """s3fs raises botocore's errors as they are when no HTTP answer came (a refused
    connection after the retries): they are storage failures too, not untyped errors."""
    from botocore.exceptions import EndpointConnectionError  # type: ignore[import-untyped]

    with (
        pytest.raises(StorageError) as failed,
        storage_step("s3://b/t", "_delta_log/00000000000000000002.json", "commit log"),
    ):
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b")
    assert failed.value.step == "commit log" and failed.value.errno is None
    assert isinstance(failed.value.__cause__, EndpointConnectionError)
    with pytest.raises(TypeError), storage_step("s3://b/t", "x"):  # a bug stays a bug
        raise TypeError("not storage")
