"""pytest fixtures for tests that need a real ZooKeeper or a real S3 API.

``zk_hosts``          session: connection string of the suite's one server, started on first use.
``zk_chroot``         function: ``zk_hosts`` plus a fresh chroot (``/t-<uuid>``), deleted afterwards.
``zk_chroot_factory`` function: a ``ZkChroots``; call ``.new()`` for each extra fresh chroot.
``zk_ensemble``       module: a running 3-node ``ZooKeeperEnsemble`` (500 ms tick) to kill nodes of;
                      every test that uses it starts with all nodes running and one leader.
``zk_clients_closed`` autouse: fails a test that leaves a kazoo client running (a store or table it
                      did not close, and that garbage collection does not close either). Such a
                      client keeps reconnecting after its server stops, printing errors after the
                      test run. Servers stop only after their clients are stopped.

``s3_server``           session: endpoint URL (``http://127.0.0.1:PORT``) of the suite's one S3 API,
                      moto's standalone server in its own process (tests/support/s3server.py),
                      started on first use; writer processes a test starts reach it too.
``s3_fake_aws_env``     function: every ``AWS_*`` variable of the environment removed, then fake
                      credentials (``testing``), region ``us-east-1``, no config files and no
                      instance metadata set: a client given incomplete options cannot find real
                      credentials. Processes the test starts inherit it. No endpoint is set in
                      the environment, so an option not passed through fails instead of passing.
``s3_bucket``           function: a fresh, empty bucket (``eventlog-<uuid>``), emptied and deleted
                      afterwards.
``s3_uri``              function: ``s3://<fresh bucket>/table``.
``s3_storage_options``  function: what a user passes to fsspec/s3fs (``storage_options=``):
                      ``{"endpoint_url": ..., "key": "testing", "secret": "testing"}``.
``deltalake_s3_options`` function: the same for ``deltalake`` (``AWS_ENDPOINT_URL``, keys, region,
                      ``AWS_ALLOW_HTTP``). deltalake >= 1.0 commits with ``If-None-Match: *`` by
                      default, which the server honours: no locking provider or unsafe rename.

Load them with ``from tests.support.fixtures import *`` in a conftest, or ``-p tests.support.fixtures``.
Missing Java or ZooKeeper, or moto[server], makes these fixtures fail (never skip) with instructions.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

from tests.support.s3server import (
    ACCESS_KEY,
    REGION,
    SECRET_KEY,
    S3ServerUnavailable,
    start_s3_server_for_tests,
)
from tests.support.zkserver import (
    ZooKeeperEnsemble,
    ZooKeeperUnavailable,
    check_prerequisites,
    start_zookeeper_for_tests,
)

__all__ = [
    "deltalake_s3_options",
    "s3_bucket",
    "s3_fake_aws_env",
    "s3_server",
    "s3_storage_options",
    "s3_uri",
    "zk_chroot",
    "zk_chroot_factory",
    "zk_clients_closed",
    "zk_ensemble",
    "zk_ensemble_all_nodes_up",
    "zk_hosts",
]

# Reconnect and retry quickly: the kazoo defaults back off up to an hour between attempts.
_FAST_RETRY = {"max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_delay": 0.5, "max_jitter": 0.2}


def _fail(problem: str) -> NoReturn:
    # Called outside the except block so pytest shows only the message, not a chained traceback.
    pytest.fail(problem, pytrace=False)


def _kazoo_client_class() -> Any:
    try:
        from kazoo.client import KazooClient
    except ImportError:
        KazooClient = None
    if KazooClient is None:
        _fail(
            "kazoo is not installed: ./scripts/bootstrap.sh installs the project's 'zookeeper' "
            "extra (or: pip install -e '.[zookeeper]')"
        )
    return KazooClient


def running_kazoo_clients() -> list[Any]:
    """Kazoo clients of this process whose connection thread runs (connected or reconnecting)."""
    clients: dict[int, Any] = {}
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)  # kazoo's ConnectionHandler.zk_loop
        handler = getattr(target, "__self__", None)
        if getattr(target, "__name__", "") == "zk_loop" and handler is not None:
            clients[id(handler.client)] = handler.client
    return list(clients.values())


def _describe(clients: list[Any]) -> str:
    return ", ".join(",".join(f"{host}:{port}" for host, port in client.hosts) for client in clients)


def stop_kazoo_clients(clients: list[Any]) -> None:
    for client in clients:
        client.stop()
        client.close()


def stop_leftover_clients(ports: set[int] | None = None) -> None:
    """Stop clients still running (of servers on ``ports``, or all): before a server stops."""
    gc.collect()  # unreferenced stores in reference cycles close when collected
    stop_kazoo_clients(
        [c for c in running_kazoo_clients() if ports is None or any(p in ports for _, p in c.hosts)]
    )


class ZkChroots:
    """Makes fresh chroot nodes on one server and deletes all of them in ``cleanup()``."""

    def __init__(self, hosts: str, prefix: str = "t") -> None:
        self.hosts = hosts
        self.prefix = prefix
        self.paths: list[str] = []
        self._client: Any = None

    def _admin(self) -> Any:
        if self._client is None:
            client = _kazoo_client_class()(
                hosts=self.hosts,
                timeout=10.0,
                connection_retry=dict(_FAST_RETRY),
                command_retry=dict(_FAST_RETRY, deadline=30.0),
            )
            client.start(timeout=30)
            self._client = client
        return self._client

    def new(self) -> str:
        """Create ``/<prefix>-<uuid>`` and return the connection string rooted there."""
        path = f"/{self.prefix}-{uuid.uuid4().hex}"
        client = self._admin()
        # ensure_path, not create: a create retried after ConnectionLoss may find its own node.
        client.retry(client.ensure_path, path)
        self.paths.append(path)
        return f"{self.hosts}{path}"

    def cleanup(self) -> None:
        """Delete every chroot made here (with everything under it) and close the admin client."""
        client, self._client = self._client, None
        if client is None:
            return
        from kazoo.exceptions import NotEmptyError

        try:
            for path in self.paths:
                # A client the test left open may still add children while we delete; retry briefly.
                for attempt in range(5):
                    try:
                        client.retry(client.delete, path, recursive=True)
                        break
                    except NotEmptyError:
                        if attempt == 4:
                            raise
                        time.sleep(0.2)
            self.paths.clear()
        finally:
            client.stop()
            client.close()


@pytest.fixture(scope="session")
def zk_hosts() -> Iterator[str]:
    """Connection string ("127.0.0.1:PORT") of the ZooKeeper shared by the whole test run."""
    problem = ""
    try:
        hosts, stop = start_zookeeper_for_tests()
    except ZooKeeperUnavailable as exc:
        problem = str(exc)
    if problem:
        _fail(problem)
    try:
        yield hosts
    finally:
        try:
            stop_leftover_clients()
        finally:
            stop()


@pytest.fixture
def zk_chroot_factory(zk_hosts: str) -> Iterator[ZkChroots]:
    """A ``ZkChroots`` on the session server; every chroot it made is deleted after the test."""
    chroots = ZkChroots(zk_hosts)
    try:
        yield chroots
    finally:
        chroots.cleanup()


@pytest.fixture
def zk_chroot(zk_chroot_factory: ZkChroots) -> str:
    """A connection string with a fresh, existing chroot: ``127.0.0.1:PORT/t-<uuid>``."""
    return zk_chroot_factory.new()


@pytest.fixture(scope="module")
def zk_ensemble() -> Iterator[ZooKeeperEnsemble]:
    """A running 3-node ensemble on loopback (tick 500 ms, no fsync) for failover tests."""
    problem = ""
    try:
        check_prerequisites()
    except ZooKeeperUnavailable as exc:
        problem = str(exc)
    if problem:
        _fail(problem)
    ensemble = ZooKeeperEnsemble(3, tick_ms=500, force_sync=False)
    try:
        ensemble.start()
        yield ensemble
    finally:
        try:
            stop_leftover_clients({node.client_port for node in ensemble.nodes})
        finally:
            ensemble.close()


@pytest.fixture(autouse=True)
def zk_clients_closed() -> Iterator[None]:
    """Fail a test that leaves kazoo clients running once its fixtures are torn down.

    Checked after every other function-scoped fixture's teardown (autouse fixtures are set up
    first). Stores only the garbage collector can reach are collected first (and so closed);
    a close running on a helper thread gets a few seconds.
    """
    before = {id(c) for c in running_kazoo_clients()}
    yield

    def leaked() -> list[Any]:
        return [c for c in running_kazoo_clients() if id(c) not in before]

    if not leaked():
        return
    gc.collect()
    deadline = time.monotonic() + 5.0
    while leaked() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = leaked()
    if left:
        stop_kazoo_clients(left)  # or they reconnect after their server stops
        _fail(
            f"the test left {len(left)} ZooKeeper client(s) running ({_describe(left)}): close "
            "every store, table and KazooClient it opens (Table.close() or 'with Table.open(...)')"
        )


@pytest.fixture(autouse=True)
def zk_ensemble_all_nodes_up(request: pytest.FixtureRequest) -> None:
    """Before each test using ``zk_ensemble``, restart nodes an earlier test stopped or killed."""
    if "zk_ensemble" in request.fixturenames:
        ensemble: ZooKeeperEnsemble = request.getfixturevalue("zk_ensemble")
        if len(ensemble.running()) < ensemble.size:
            ensemble.heal()


# ---------------------------------------------------------------------------------------------
# S3


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Endpoint URL ("http://127.0.0.1:PORT") of the S3 API shared by the whole test run."""
    problem = ""
    try:
        endpoint, stop = start_s3_server_for_tests()
    except S3ServerUnavailable as exc:
        problem = str(exc)
    if problem:
        _fail(problem)
    try:
        yield endpoint
    finally:
        stop()


@pytest.fixture
def s3_fake_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake AWS credentials and nothing else of the machine's AWS set-up (see the module doc)."""
    for name in list(os.environ):
        if name.upper().startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("NO_PROXY", "no_proxy"):
        current = os.environ.get(name, "")
        monkeypatch.setenv(name, ",".join(filter(None, [current, "127.0.0.1", "localhost"])))


_s3_admin_clients: dict[str, Any] = {}


def s3_admin_client(endpoint: str) -> Any:
    """A boto3 S3 client of ``endpoint`` with the fake credentials, bounded timeouts and retries
    (one per endpoint, reused; create it with ``s3_fake_aws_env`` in force)."""
    client = _s3_admin_clients.get(endpoint)
    if client is None:
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]

        client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(
                connect_timeout=5, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}
            ),
        )
        _s3_admin_clients[endpoint] = client
    return client


def delete_bucket(client: Any, bucket: str) -> None:
    """Delete every object and unfinished multipart upload of ``bucket``, then the bucket."""
    from botocore.exceptions import ClientError  # type: ignore[import-untyped]

    try:
        for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "NoSuchBucket":  # the test deleted it
            raise


@pytest.fixture
def s3_bucket(s3_server: str, s3_fake_aws_env: None) -> Iterator[str]:
    """A fresh, empty bucket on the session's S3 server; emptied and deleted after the test."""
    client = s3_admin_client(s3_server)
    bucket = f"eventlog-{uuid.uuid4().hex}"
    client.create_bucket(Bucket=bucket)
    try:
        yield bucket
    finally:
        delete_bucket(client, bucket)


@pytest.fixture
def s3_uri(s3_bucket: str) -> str:
    """``s3://<fresh bucket>/table``: a table location nobody has written to."""
    return f"s3://{s3_bucket}/table"


@pytest.fixture
def s3_storage_options(s3_server: str, s3_fake_aws_env: None) -> dict[str, str]:
    """fsspec/s3fs ``storage_options`` for the session's S3 server (all values strings)."""
    return {"endpoint_url": s3_server, "key": ACCESS_KEY, "secret": SECRET_KEY}


@pytest.fixture
def deltalake_s3_options(s3_server: str, s3_fake_aws_env: None) -> dict[str, str]:
    """``deltalake`` ``storage_options`` for the session's S3 server."""
    return {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
    }
