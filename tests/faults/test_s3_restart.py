"""The S3 server killed (SIGKILL) mid-commit and started again on the same port.

moto keeps objects in memory, so the server here runs with its on-disk persistence
(``--persist``, tests/support/moto_serve.py): what it answered survives the kill, as on S3.
Writer processes reach it through the fault-injecting proxy, which kills the server when it
sees a PUT of a commit file (``_delta_log/<v>.json``): before forwarding it (the PUT never
lands) or after the server answered it (it landed; the writer never hears so). A thread
starts the server again a moment later; meanwhile every request of the writers fails (the
proxy cannot reach the server and resets their connections), botocore and s3fs retry, and
what still fails is retried by the writers (``retry_errors``: the typed storage and slot
errors). Then the checks: invariants with a fresh handle, ``verify``, a new write.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import Table
from eventlog.errors import SlotStoreError, StorageError
from tests.support.faultproxy import FaultProxy, HttpRequest, Rule
from tests.support.fixtures import s3_admin_client
from tests.support.invariants import SCHEMA, check_invariants, run_writers
from tests.support.s3server import ACCESS_KEY, LOOPBACK, SECRET_KEY, MotoS3Server

pytest.importorskip("s3fs")

pytestmark = pytest.mark.timeout(180)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def durable(tmp_path: Path, s3_fake_aws_env: None) -> Iterator[MotoS3Server]:
    """A moto server of its own that keeps its buckets in ``tmp_path``."""
    server = MotoS3Server(port=_free_port(), persist_dir=tmp_path / "s3")
    try:
        yield server.start()
    finally:
        server.cleanup()


def test_a_killed_persistent_server_starts_again_with_its_objects(durable: MotoS3Server) -> None:
    client = s3_admin_client(durable.endpoint_url)
    client.create_bucket(Bucket="durable-one")
    client.put_object(Bucket="durable-one", Key="a/kept", Body=b"kept", Metadata={"m": "1"})
    client.put_object(Bucket="durable-one", Key="a/gone", Body=b"gone")
    client.delete_object(Bucket="durable-one", Key="a/gone")
    client.put_object(Bucket="durable-one", Key="a/new", Body=b"v2", IfNoneMatch="*")
    before = client.head_object(Bucket="durable-one", Key="a/kept")
    durable.kill()
    durable.start()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="durable-one")["Contents"]]
    assert keys == ["a/kept", "a/new"]
    kept = client.get_object(Bucket="durable-one", Key="a/kept")
    assert kept["Body"].read() == b"kept" and kept["Metadata"] == {"m": "1"}
    assert kept["ETag"] == before["ETag"] and kept["LastModified"] == before["LastModified"]
    with pytest.raises(client.exceptions.ClientError) as refused:  # still exists: 412
        client.put_object(Bucket="durable-one", Key="a/new", Body=b"v3", IfNoneMatch="*")
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"


@pytest.mark.parametrize("when", ["request", "response"])
def test_writers_survive_the_s3_server_killed_mid_commit(durable: MotoS3Server, when: str) -> None:
    bucket = "restart-table"
    s3_admin_client(durable.endpoint_url).create_bucket(Bucket=bucket)
    uri, slots = f"s3://{bucket}/table", f"s3://{bucket}/slots"
    direct = {"endpoint_url": durable.endpoint_url, "key": ACCESS_KEY, "secret": SECRET_KEY}
    Table.create(uri, SCHEMA, slots=slots, storage_options=direct).close()
    restarted = threading.Event()

    def kill_and_restart(request: HttpRequest) -> None:
        durable.kill()

        def restart() -> None:
            time.sleep(1.0)
            durable.start()
            restarted.set()

        threading.Thread(target=restart, daemon=True).start()

    with FaultProxy(f"{LOOPBACK}:{durable.port}", mode="http") as proxy:
        action = "drop_response" if when == "response" else "forward"
        rule = Rule(action, method="PUT", path=r"/_delta_log/\d{20}\.json$", skip=4, times=1, when=when)
        rule.on_match = kill_and_restart
        proxy.add_rule(rule)
        results = run_writers(
            uri, workers=3, ops=5, slots=slots, merge_share=0.3,
            storage_options=dict(direct, endpoint_url=proxy.url),
            retry_errors=(StorageError, SlotStoreError),
        )  # fmt: skip
        assert rule.fired == 1 and restarted.wait(30)
    acks = [a for r in results for a in r.acks]
    assert len(acks) == 15, [r.errors for r in results]
    table = check_invariants(uri, acks, slots=slots, storage_options=direct)
    report = table.verify()
    assert report.ok, report
    batch = pa.table({"id": [-1], "worker": [-1], "batch": [-1]}, schema=SCHEMA)
    assert table.append(batch).version == len({a["version"] for a in acks}) + 1
    table.close()
