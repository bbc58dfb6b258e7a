"""The S3 test harness itself: moto's server on loopback, reached with s3fs, botocore and
deltalake through the fixtures' options, from this process and from a child process.

It also records what a slot store built on S3 conditional writes can rely on here: a put
with ``If-None-Match: *`` of an existing key fails (s3fs: FileExistsError; botocore: 412
PreconditionFailed), and of many concurrent creators of one key exactly one wins.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from tests.support.fixtures import s3_admin_client
from tests.support.s3server import LOOPBACK, MotoS3Server, S3ServerError, http_answers

s3fs = pytest.importorskip("s3fs")
deltalake = pytest.importorskip("deltalake")


def _fs(options: dict[str, str]) -> Any:
    # A private instance: fsspec caches filesystems by their arguments.
    return s3fs.S3FileSystem(skip_instance_cache=True, **options)


def test_s3fs_writes_lists_and_reads_back_through_the_server(
    s3_uri: str, s3_storage_options: dict[str, str]
) -> None:
    fs = _fs(s3_storage_options)
    root = s3_uri.removeprefix("s3://")
    payload = bytes(range(256)) * 64
    fs.pipe_file(f"{root}/_delta_log/00000000000000000000.json", b'{"commitInfo":{}}\n')
    fs.pipe_file(f"{root}/part-0.parquet", payload)
    with fs.open(f"{root}/date=2024-01-01/part-1.parquet", "wb") as f:
        f.write(b"streamed")

    assert sorted(fs.find(root)) == [
        f"{root}/_delta_log/00000000000000000000.json",
        f"{root}/date=2024-01-01/part-1.parquet",
        f"{root}/part-0.parquet",
    ]
    assert sorted(fs.ls(f"{root}/_delta_log", detail=False)) == [
        f"{root}/_delta_log/00000000000000000000.json"
    ]
    assert fs.cat_file(f"{root}/part-0.parquet") == payload
    assert fs.cat_file(f"{root}/part-0.parquet", start=256, end=260) == bytes(range(4))
    assert fs.cat_file(f"{root}/date=2024-01-01/part-1.parquet") == b"streamed"
    info = fs.info(f"{root}/part-0.parquet")
    assert info["size"] == len(payload)
    assert fs.modified(f"{root}/part-0.parquet").tzinfo is not None  # VACUUM reads these

    fs.rm_file(f"{root}/part-0.parquet")
    fs.invalidate_cache()
    assert not fs.exists(f"{root}/part-0.parquet")


def test_a_second_process_reaches_the_server_with_the_same_options(
    s3_uri: str, s3_storage_options: dict[str, str]
) -> None:
    """Writers on "other machines" are processes with their own client and these options."""
    root = s3_uri.removeprefix("s3://")
    _fs(s3_storage_options).pipe_file(f"{root}/from-parent", b"parent")
    child = (
        "import json, sys, s3fs\n"
        "opts, root = json.loads(sys.argv[1]), sys.argv[2]\n"
        "fs = s3fs.S3FileSystem(**opts)\n"
        "fs.pipe_file(root + '/from-child', fs.cat_file(root + '/from-parent') + b'+child')\n"
    )
    subprocess.run(
        [sys.executable, "-c", child, json.dumps(s3_storage_options), root],
        check=True,
        timeout=60,
        capture_output=True,
    )
    assert _fs(s3_storage_options).cat_file(f"{root}/from-child") == b"parent+child"


def test_fake_credentials_only(s3_storage_options: dict[str, str]) -> None:
    assert os.environ["AWS_ACCESS_KEY_ID"] == s3_storage_options["key"] == "testing"
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == "testing"
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        assert name not in os.environ
    assert os.environ["AWS_SHARED_CREDENTIALS_FILE"] == os.devnull
    assert s3_storage_options["endpoint_url"].startswith(f"http://{LOOPBACK}:")


def test_a_create_only_put_of_an_existing_key_fails(s3_uri: str, s3_storage_options: dict[str, str]) -> None:
    """S3 conditional writes: ``If-None-Match: *`` (put-if-absent)."""
    from botocore.exceptions import ClientError  # type: ignore[import-untyped]

    fs = _fs(s3_storage_options)
    bucket, _, prefix = s3_uri.removeprefix("s3://").partition("/")
    path = f"{bucket}/{prefix}/_slots/00000000000000000001"
    fs.pipe_file(path, b"first", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file(path, b"second", mode="create")
    with pytest.raises(FileExistsError), fs.open(path, "xb") as f:  # open(mode="xb") too
        f.write(b"third")
    assert fs.cat_file(path) == b"first"

    client = s3_admin_client(s3_storage_options["endpoint_url"])
    with pytest.raises(ClientError) as failed:
        client.put_object(Bucket=bucket, Key=path.partition("/")[2], Body=b"fourth", IfNoneMatch="*")
    assert failed.value.response["Error"]["Code"] == "PreconditionFailed"
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert fs.cat_file(path) == b"first"


def _race(clients: list[Any], bucket: str, key: str) -> Counter[str]:
    """Every client puts ``key`` with ``If-None-Match: *`` at once; count the outcomes."""
    from botocore.exceptions import ClientError  # type: ignore[import-untyped]

    barrier = threading.Barrier(len(clients), timeout=30)
    outcome: Counter[str] = Counter()
    lock = threading.Lock()

    def put(i: int) -> None:
        barrier.wait()
        try:
            clients[i].put_object(Bucket=bucket, Key=key, Body=f"writer {i}".encode(), IfNoneMatch="*")
            result = "won"
        except ClientError as exc:
            result = exc.response["Error"]["Code"]
        with lock:
            outcome[result] += 1

    threads = [threading.Thread(target=put, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    return outcome


def test_of_concurrent_create_only_puts_of_one_key_exactly_one_wins() -> None:
    """moto checks and stores in two steps; MotoS3Server serialises writes to make the pair
    atomic. With a 1 µs GIL switch interval in the server, an unserialised server lets two
    creators win in a few percent of rounds; serialised, never."""
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    writers, rounds = 8, 25
    with MotoS3Server(switch_interval=1e-6) as server:
        clients = [
            boto3.session.Session().client(
                "s3",
                endpoint_url=server.endpoint_url,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
                region_name="us-east-1",
                config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 1}),
            )
            for _ in range(writers)
        ]
        clients[0].create_bucket(Bucket="race")
        results = [_race(clients, "race", f"slot-{n}") for n in range(rounds)]
    assert all(r == Counter(won=1, PreconditionFailed=writers - 1) for r in results), results


def test_deltalake_writes_and_reads_a_table_on_the_server(
    s3_uri: str, deltalake_s3_options: dict[str, str], s3_storage_options: dict[str, str]
) -> None:
    first = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]})
    deltalake.write_deltalake(s3_uri, first, storage_options=deltalake_s3_options)
    deltalake.write_deltalake(s3_uri, first.slice(0, 1), mode="append", storage_options=deltalake_s3_options)

    theirs = deltalake.DeltaTable(s3_uri, storage_options=deltalake_s3_options)
    assert theirs.version() == 1
    got = theirs.to_pyarrow_table().sort_by("id")
    assert got.column("id").to_pylist() == [1, 1, 2, 3]
    assert got.column("name").to_pylist() == ["a", "a", "b", "c"]
    # The same objects through s3fs: what our engine will see.
    log = _fs(s3_storage_options).ls(f"{s3_uri.removeprefix('s3://')}/_delta_log", detail=False)
    assert sorted(p.rsplit("/", 1)[1] for p in log) == [
        "00000000000000000000.json",
        "00000000000000000001.json",
    ]


def test_the_server_stops_and_a_failed_start_says_why() -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MotoS3Server(port=port, start_timeout=30)
        with pytest.raises(S3ServerError, match=r"(?s)exited.*Address already in use"):
            server.start()
        server.cleanup()

    with MotoS3Server() as server:
        assert http_answers(server.endpoint_url + "/")
        pid, directory = server.pid, server.dir
        assert pid is not None and directory is not None and directory.is_dir()
    assert not server.is_running() and not directory.exists()
    assert not http_answers(server.endpoint_url + "/", timeout=0.5)
