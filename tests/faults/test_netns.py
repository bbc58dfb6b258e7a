"""The virtual network of :mod:`tests.support.netns` that the partition tests rely on: a cut
host's packets are dropped until healed, a split separates two groups that each still reach
their own side, a direct link is cut on its own, nothing appears in this machine's network,
and teardown (or a later run, for a dead one) removes every namespace."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.support.netns import PREFIX, Network, netns_available, reap_orphans

PORT = 7000


@pytest.fixture
def net() -> Iterator[Network]:
    problem = netns_available()
    if problem is not None:
        pytest.fail(f"the fault tests run as root: {problem}")
    with Network() as network:
        for name in ("a", "b", "c"):
            network.add_host(name)
        yield network


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _listen(net: Network, host: str) -> socket.socket:
    server = net.socket_in(host)
    server.bind(("0.0.0.0", PORT))
    server.listen()
    return server


def _reaches(net: Network, src: str, address: str) -> bool:
    """Whether ``src`` connects to ``address`` within 5 s (a link just brought up may need
    an address resolution first)."""
    end = time.monotonic() + 5
    while time.monotonic() < end:
        try:
            net.connect(src, (address, PORT), 1.0).close()
        except OSError:
            time.sleep(0.1)
            continue
        return True
    return False


def _blocked(net: Network, src: str, address: str) -> bool:
    """Whether a connection from ``src`` to ``address`` fails (dropped: a timeout)."""
    try:
        net.connect(src, (address, PORT), 0.5).close()
    except OSError:
        return True
    return False


def test_cut_heal_split_and_links(net: Network) -> None:
    b = net.hosts["b"].address
    with _listen(net, "b"):
        assert _reaches(net, "a", b) and _reaches(net, "c", b)
        net.cut("b")
        assert _blocked(net, "a", b)
        net.heal("b")
        assert _reaches(net, "a", b)
        net.split(["b", "c"])
        assert _blocked(net, "a", b) and _reaches(net, "c", b)
        net.heal_split()
        assert _reaches(net, "a", b)
        _, b_on_link = net.link("a", "b")
        net.cut("b")  # the direct link does not go through the bridges
        assert _reaches(net, "a", b_on_link) and _blocked(net, "c", b)
        net.cut_link("a", "b")
        assert _blocked(net, "a", b_on_link)
        net.heal_link("a", "b")
        assert _reaches(net, "a", b_on_link)


def test_addresses_exist_only_inside_and_teardown_removes_everything(net: Network) -> None:
    ours = [ns for ns in _namespaces() if ns.startswith(net.prefix)]
    assert sorted(ours) == sorted([net.bridge_ns] + [h.ns for h in net.hosts.values()])
    host_addresses = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert not any(h.address in host_addresses for h in net.hosts.values())
    net.close()
    assert not [ns for ns in _namespaces() if ns.startswith(net.prefix)]


def test_namespaces_of_a_dead_run_are_reaped() -> None:
    problem = netns_available()
    if problem is not None:
        pytest.fail(f"the fault tests run as root: {problem}")
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = f"{PREFIX}{dead.pid}-dead-x"
    subprocess.run(["ip", "netns", "add", leftover], check=True)
    try:
        reap_orphans()
        assert leftover not in _namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", leftover], capture_output=True, check=False)
