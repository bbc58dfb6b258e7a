"""Real ZooKeeper servers for tests: one standalone node, or an ensemble built from the same node.

Each node is a ``QuorumPeerMain`` JVM from the Debian ``zookeeper`` package, bound to loopback
ports picked by the kernel, with its own data directory. Nothing here waits without a bound, and
every JVM runs in its own process group, which is killed at interpreter exit at the latest.

This module is the entry point: it names the public pieces, which live in
:mod:`tests.support.zkjvm` (prerequisites, errors, ports, owned directories),
:mod:`tests.support.zknode` (:class:`ZooKeeperServer`) and :mod:`tests.support.zkensemble`
(:class:`ZooKeeperEnsemble`), and starts the server the test suite uses.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from tests.support.zkensemble import ZooKeeperEnsemble
from tests.support.zkjvm import (
    FOUR_LETTER_WORDS,
    HOSTS_ENV,
    INSTALL_HINT,
    NodePorts,
    NoLeaderError,
    ZooKeeperError,
    ZooKeeperUnavailable,
    check_prerequisites,
    deadline_loop,
    four_letter_word,
    mode_from_srvr,
)
from tests.support.zknode import ZooKeeperServer

__all__ = [
    "HOSTS_ENV",
    "INSTALL_HINT",
    "NoLeaderError",
    "NodePorts",
    "ZooKeeperEnsemble",
    "ZooKeeperError",
    "ZooKeeperServer",
    "ZooKeeperUnavailable",
    "check_prerequisites",
    "four_letter_word",
    "start_zookeeper_for_tests",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# The server used by the test suite


def _parse_hosts(hosts: str) -> list[tuple[str, int]]:
    pairs = []
    for item in hosts.split("/", 1)[0].split(","):
        host, _, port = item.strip().rpartition(":")
        pairs.append((host or item.strip(), int(port) if host else 2181))
    return pairs


def _wait_for_any_host(hosts: str, timeout: float) -> None:
    """Wait until some host of a connection string accepts TCP connections."""
    pairs = _parse_hosts(hosts)
    more = deadline_loop(timeout)
    while more():
        for host, port in pairs:
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
                return
    raise ZooKeeperError(f"none of {hosts} ({HOSTS_ENV}) accepted a connection within {timeout:.0f} s")


def _try_testcontainers(timeout: float) -> tuple[str, Callable[[], None]] | None:
    """A ZooKeeper 3.8 container, if testcontainers is installed and a Docker engine answers."""
    try:
        container_module: Any = importlib.import_module("testcontainers.core.container")
        docker: Any = importlib.import_module("docker")
    except ImportError:
        return None
    container: Any = None
    try:
        # Without a daemon this raises docker.errors.DockerException in ~0.2 s; it does not hang.
        client = docker.from_env(timeout=10)
        try:
            client.ping()
        finally:
            client.close()
        container = (
            container_module.DockerContainer("zookeeper:3.8")
            .with_exposed_ports(2181)
            .with_env("ZOO_4LW_COMMANDS_WHITELIST", FOUR_LETTER_WORDS)
        )
        container.start()
        host = str(container.get_container_host_ip())
        port = int(container.get_exposed_port(2181))
        more = deadline_loop(timeout)
        while more():
            if mode_from_srvr(four_letter_word(port, "srvr", host=host)) is not None:
                return f"{host}:{port}", container.stop
        raise ZooKeeperError(f"ZooKeeper container on {host}:{port} did not serve within {timeout:.0f} s")
    except Exception as exc:  # any failure means "no usable Docker": fall back to a local JVM
        log.info("testcontainers unusable (%s: %s); using a local ZooKeeper", type(exc).__name__, exc)
        if container is not None:
            with contextlib.suppress(Exception):
                container.stop()
        return None


def start_zookeeper_for_tests(
    *, tick_ms: int = 500, force_sync: bool = False, timeout: float = 60.0
) -> tuple[str, Callable[[], None]]:
    """Start (or find) the ZooKeeper the test suite uses; return (connection string, stop).

    In order: the servers named by ``EVENTLOG_TEST_ZK_HOSTS`` (nothing is started); a
    ``zookeeper:3.8`` container when testcontainers and a Docker engine are available; a local
    ``ZooKeeperServer``. The local server uses a 500 ms tick so tests may ask for session
    timeouts down to 1 s, and skips fsync because test data need not survive a power cut.
    Raises ZooKeeperUnavailable (with install instructions) when the local server cannot run.
    """
    external = os.environ.get(HOSTS_ENV, "").strip()
    if external:
        _wait_for_any_host(external, timeout)
        return external, lambda: None
    container = _try_testcontainers(timeout)
    if container is not None:
        return container
    check_prerequisites()
    server = ZooKeeperServer(tick_ms=tick_ms, force_sync=force_sync, start_timeout=timeout)
    try:
        server.start()
    except BaseException:
        server.cleanup()
        raise
    return server.hosts, server.close
