"""The ZooKeeper test harness, proved with real servers and real kazoo clients."""

from __future__ import annotations

import sys
import time
import types
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from tests.support import zkserver
from tests.support.fixtures import ZkChroots
from tests.support.zkserver import ZooKeeperEnsemble, ZooKeeperServer, ZooKeeperUnavailable

pytestmark = pytest.mark.zookeeper

# Bounds asserted below. Measured here (2 cores, busy): re-election 0.4-1 s, quorum-loss
# failure under 1 s, recovery after restarting two nodes 1-3 s. The bounds leave room for load.
FAILOVER_BOUND_S = 15.0
NO_QUORUM_FAILURE_BOUND_S = 5.0
RECOVERY_BOUND_S = 30.0

_FAST_RETRY = {"max_tries": -1, "delay": 0.05, "backoff": 1.5, "max_delay": 0.5, "max_jitter": 0.2}


@contextmanager
def kazoo_client(hosts: str, *, timeout: float = 10.0, retry_deadline: float = 30.0) -> Iterator[Any]:
    """A started KazooClient that reconnects and retries quickly, always closed afterwards."""
    client = KazooClient(
        hosts=hosts,
        timeout=timeout,
        connection_retry=dict(_FAST_RETRY),
        command_retry=dict(_FAST_RETRY, deadline=retry_deadline),
    )
    client.start(timeout=20)
    try:
        yield client
    finally:
        client.stop()
        client.close()


# --- standalone -------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_standalone_round_trip(zk_hosts: str) -> None:
    path = f"/harness-{uuid.uuid4().hex}"
    with kazoo_client(zk_hosts) as client:
        client.create(path, b"v1")
        assert client.get(path)[0] == b"v1"
        client.set(path, b"v2", version=0)
        data, stat = client.get(path)
        assert (data, stat.version) == (b"v2", 1)
        client.create(f"{path}/seq-", b"", sequence=True, ephemeral=True)
        assert [c.startswith("seq-") for c in client.get_children(path)] == [True]
        client.delete(path, recursive=True)
        assert client.exists(path) is None


@pytest.mark.timeout(60)
def test_chroots_are_isolated(zk_hosts: str, zk_chroot: str, zk_chroot_factory: ZkChroots) -> None:
    other = zk_chroot_factory.new()
    assert zk_chroot.startswith(zk_hosts + "/t-") and other.startswith(zk_hosts + "/t-")
    assert zk_chroot != other
    with kazoo_client(zk_chroot) as a, kazoo_client(other) as b:
        assert a.get_children("/") == [] and b.get_children("/") == []
        a.create("/slots/1", b"from-a", makepath=True)
        b.create("/slots/1", b"from-b", makepath=True)
        assert a.get("/slots/1")[0] == b"from-a"
        assert b.get("/slots/1")[0] == b"from-b"
        a.create("/only-a")
        assert b.exists("/only-a") is None
    with kazoo_client(zk_hosts) as root:
        assert root.get("/" + zk_chroot.rsplit("/", 1)[1] + "/slots/1")[0] == b"from-a"


@pytest.mark.timeout(60)
def test_chroot_cleanup_deletes_the_tree(zk_hosts: str) -> None:
    chroots = ZkChroots(zk_hosts)
    chroot = chroots.new()
    with kazoo_client(chroot) as client:
        client.create("/a/b/c", b"x", makepath=True)
    chroots.cleanup()
    with kazoo_client(zk_hosts) as root:
        assert root.exists("/" + chroot.rsplit("/", 1)[1]) is None


@pytest.mark.timeout(90)
def test_standalone_server_kill_restart_keeps_data() -> None:
    with ZooKeeperServer(tick_ms=500) as server:
        assert server.mode() == "standalone"
        with kazoo_client(server.hosts) as client:
            client.create("/durable", b"kept")
        pid = server.pid
        server.kill()
        assert not server.is_running() and server.mode() is None
        server.restart()
        assert server.pid != pid
        with kazoo_client(server.hosts, timeout=1.0) as client:
            assert client.get("/durable")[0] == b"kept"
        data_dir = server.dir
    assert not data_dir.exists()
    assert not server.is_running()


def test_external_hosts_are_used_as_given(zk_hosts: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(zkserver.HOSTS_ENV, zk_hosts)
    hosts, stop = zkserver.start_zookeeper_for_tests()
    assert hosts == zk_hosts
    stop()  # starts nothing, so stops nothing: the session server still answers
    assert zkserver.four_letter_word(int(zk_hosts.rsplit(":", 1)[1]), "ruok") == "imok"


def test_no_docker_engine_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    class DockerException(Exception):
        """Stands in for docker.errors.DockerException (raised when no engine answers)."""

    def from_env(**_: object) -> None:
        raise DockerException("Error while fetching server API version")

    monkeypatch.setitem(sys.modules, "testcontainers.core.container", types.ModuleType("container"))
    monkeypatch.setitem(sys.modules, "docker", types.SimpleNamespace(from_env=from_env))
    assert zkserver._try_testcontainers(timeout=1.0) is None


def test_missing_java_is_reported_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(ZooKeeperUnavailable, match=r"no 'java' on PATH.*bootstrap\.sh"):
        zkserver.check_prerequisites()


# --- ensemble ---------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_ensemble_write_on_one_node_read_on_another(zk_ensemble: ZooKeeperEnsemble) -> None:
    assert sorted(m or "" for m in zk_ensemble.modes()) == ["follower", "follower", "leader"]
    assert zk_ensemble.hosts.count(",") == 2
    path = f"/replicated-{uuid.uuid4().hex}"
    with (
        kazoo_client(zk_ensemble.node_hosts(0)) as first,
        kazoo_client(zk_ensemble.node_hosts(1)) as second,
        kazoo_client(zk_ensemble.node_hosts(2)) as third,
    ):
        first.create(path, b"one")
        second.sync(path)  # a follower may lag the leader until it syncs
        assert second.get(path)[0] == b"one"
        second.set(path, b"two", version=0)
        third.sync(path)
        assert third.get(path)[0] == b"two"


@pytest.mark.timeout(90)
def test_leader_killed_new_leader_elected_and_writes_resume(zk_ensemble: ZooKeeperEnsemble) -> None:
    path = f"/failover-{uuid.uuid4().hex}"
    with kazoo_client(zk_ensemble.hosts, timeout=4.0) as client:
        client.create(path, b"0")
        old_leader = zk_ensemble.leader()

        killed_at = time.monotonic()
        zk_ensemble.kill(old_leader)
        client.retry(client.set, path, b"1")
        first_write_s = time.monotonic() - killed_at
        new_leader = zk_ensemble.wait_for_leader(timeout=FAILOVER_BOUND_S, not_node=old_leader)
        elected_s = time.monotonic() - killed_at
        print(
            f"leader kill: first write after {first_write_s:.2f} s, new leader seen after {elected_s:.2f} s"
        )
        assert first_write_s < FAILOVER_BOUND_S
        assert new_leader != old_leader

        for i in range(2, 22):
            client.retry(client.set, path, str(i).encode())
        assert client.get(path)[0] == b"21"

        zk_ensemble.restart(old_leader)  # rejoins from its own data directory and catches up
        assert zk_ensemble.leader() == new_leader
    with kazoo_client(zk_ensemble.node_hosts(old_leader)) as rejoined:
        rejoined.sync(path)
        assert rejoined.get(path)[0] == b"21"


@pytest.mark.timeout(90)
def test_quorum_lost_writes_fail_then_recover(zk_ensemble: ZooKeeperEnsemble) -> None:
    path = f"/quorum-{uuid.uuid4().hex}"
    with kazoo_client(zk_ensemble.hosts, timeout=4.0) as client:
        client.create(path, b"before")
    leader = zk_ensemble.leader()
    survivor = next(i for i in range(3) if i != leader)
    stopped = [i for i in range(3) if i != survivor]

    with kazoo_client(zk_ensemble.hosts, timeout=4.0) as probe:
        for i in stopped:
            zk_ensemble.stop(i)
        started = time.monotonic()
        # In flight when the survivor drops its clients -> ConnectionLoss; sent while kazoo is
        # reconnecting -> queued, so only the timeout ends it. Either way it must not succeed.
        with pytest.raises((ConnectionLoss, SessionExpiredError, KazooTimeoutError)) as failure:
            probe.set_async(path, b"without quorum").get(timeout=NO_QUORUM_FAILURE_BOUND_S)
        failed_s = time.monotonic() - started
        print(f"no quorum: {failure.type.__name__} after {failed_s:.2f} s")
        assert failed_s <= NO_QUORUM_FAILURE_BOUND_S + 1.0
        assert zk_ensemble.nodes[survivor].mode() is None  # alone, it refuses to serve
    # Closing the probe discarded its queued write, so it cannot land once the quorum is back.

    restarted_at = time.monotonic()
    zk_ensemble.restart(*stopped)
    quorum_s = time.monotonic() - restarted_at
    with kazoo_client(zk_ensemble.hosts, timeout=4.0) as client:
        assert client.get(path)[0] == b"before"
        client.retry(client.set, path, b"after")
        recovered_s = time.monotonic() - restarted_at
        assert client.get(path)[0] == b"after"
    print(f"quorum back after {quorum_s:.2f} s, first write after {recovered_s:.2f} s")
    assert recovered_s < RECOVERY_BOUND_S
    assert len(zk_ensemble.running()) == 3
