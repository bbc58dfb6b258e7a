"""pytest fixtures for tests that need a real ZooKeeper.

``zk_hosts``          session: connection string of the suite's one server, started on first use.
``zk_chroot``         function: ``zk_hosts`` plus a fresh chroot (``/t-<uuid>``), deleted afterwards.
``zk_chroot_factory`` function: a ``ZkChroots``; call ``.new()`` for each extra fresh chroot.
``zk_ensemble``       module: a running 3-node ``ZooKeeperEnsemble`` (500 ms tick) to kill nodes of;
                      every test that uses it starts with all nodes running and one leader.
``zk_clients_closed`` autouse: fails a test that leaves a kazoo client running (a store or table it
                      did not close, and that garbage collection does not close either). Such a
                      client keeps reconnecting after its server stops, printing errors after the
                      test run. Servers stop only after their clients are stopped.

Load them with ``from tests.support.fixtures import *`` in a conftest, or ``-p tests.support.fixtures``.
Missing Java or ZooKeeper makes these fixtures fail (never skip) with instructions.
"""

from __future__ import annotations

import gc
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

from tests.support.zkserver import (
    ZooKeeperEnsemble,
    ZooKeeperUnavailable,
    check_prerequisites,
    start_zookeeper_for_tests,
)

__all__ = [
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
