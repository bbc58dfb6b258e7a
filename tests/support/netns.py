"""A virtual network for fault tests: one network namespace per host, joined by veth pairs
and bridges that live in a namespace of their own, so nothing of it touches the machine's
network and its addresses exist only inside those namespaces.

Topology::

    host ns "zk1"   host ns "w1"  ...          bridge ns
      eth0 10.77.0.1  eth0 10.77.0.4    ──►  p-zk1, p-w1, ... ports of "br-a" (or "br-b")
                                              br-a ── trunk-a ═ trunk-b ── br-b

* :meth:`Network.cut` / :meth:`Network.heal` take one host's bridge port down / up: the
  host keeps its address and routes, its packets are dropped silently (a cable pulled,
  not a refused connection), so clients find out by their own timeouts.
* :meth:`Network.split` moves some hosts' ports to ``br-b`` and takes the trunk between
  the two bridges down: a symmetric split, each side still a network of its own;
  :meth:`Network.heal_split` brings the trunk up again.
* :meth:`Network.link` adds a direct veth pair between two hosts (a /30 of its own), cut
  and healed on its own (:meth:`Network.cut_link`): e.g. a writer cut from one server only.

Names carry a per-run prefix (``evlnet-<pid>-<random>-``), so runs in parallel never
collide; :func:`reap_orphans` deletes the namespaces of runs whose process died. Teardown
(:meth:`Network.close`, also at interpreter exit) kills the processes left in the
namespaces and deletes them, whatever state a failed test left.

Processes run inside a host: ``ip netns exec <ns> <argv>`` (:meth:`Network.exec_prefix`,
for JVMs and servers), or :func:`enter` (``setns(2)`` through ctypes) at the start of a
spawned Python process, before it opens any socket. :meth:`Network.connect` opens a TCP
connection from inside a host for this process (probes such as ZooKeeper's ``srvr``): the
socket is created by a short-lived thread that entered the namespace, and keeps that
namespace after the thread is gone. Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass
from typing import Self

from tests.support.processes import pid_alive

__all__ = ["Host", "Network", "NetnsError", "enter", "netns_available", "reap_orphans"]

PREFIX = "evlnet-"
SUBNET = "10.77"  # hosts on the bridges: 10.77.0.N/16
LINK_SUBNET = "10.78"  # direct links: 10.78.K.1/30 and 10.78.K.2/30
NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-[0-9a-f]+-")
_open_networks: set[Network] = set()
_open_lock = threading.Lock()


class NetnsError(RuntimeError):
    """An ``ip`` command failed, or a namespace could not be entered."""


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: rc {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def netns_available() -> str | None:
    """None when namespaces can be made here; otherwise why not (for a skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        _ip("netns", "list")
    except (OSError, NetnsError) as exc:
        return f"no usable iproute2: {exc}"
    return None


def enter(ns: str) -> None:
    """Move the calling thread (and the threads it creates afterwards) into namespace ``ns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns into {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _kill_and_delete(ns: str) -> None:
    """SIGKILL every process in ``ns``, then delete it (gone already is fine)."""
    for pid in _ip("netns", "pids", ns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", ns, check=False)


def reap_orphans() -> None:
    """Delete the namespaces (and kill the processes in them) of runs whose process died."""
    for ns in _namespaces():
        match = _NAME.match(ns)
        if match and not pid_alive(int(match.group(1))):
            _kill_and_delete(ns)


@dataclass(frozen=True)
class Host:
    """One machine of the network: its namespace, its address on the bridges, its port."""

    name: str
    ns: str
    address: str
    port: str  # its veth end in the bridge namespace


class Network:
    """The namespaces, bridges and veth pairs of one test run (see the module docstring)."""

    def __init__(self) -> None:
        self.prefix = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}-"
        self.bridge_ns = f"{self.prefix}br"
        self.hosts: dict[str, Host] = {}
        self._links: dict[frozenset[str], tuple[str, str]] = {}  # pair -> b's (ns, ifname)
        self._made: list[str] = []

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> Self:
        """Create the bridge namespace with its two bridges and the trunk between them."""
        reap_orphans()
        with _open_lock:
            _open_networks.add(self)
        self._new_ns(self.bridge_ns)
        br = ("-n", self.bridge_ns)
        for bridge in ("br-a", "br-b"):
            _ip(*br, "link", "add", bridge, "type", "bridge")
        _ip(*br, "link", "add", "trunk-a", "type", "veth", "peer", "name", "trunk-b")
        _ip(*br, "link", "set", "trunk-a", "master", "br-a")
        _ip(*br, "link", "set", "trunk-b", "master", "br-b")
        for dev in ("br-a", "br-b", "trunk-a", "trunk-b"):
            _ip(*br, "link", "set", dev, "up")
        return self

    def _new_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def add_host(self, name: str) -> Host:
        """A new namespace with ``eth0`` on ``br-a`` at the next free address."""
        if name in self.hosts or not re.fullmatch(r"[a-z0-9]{1,8}", name):
            raise ValueError(f"host names are unique, 1-8 of [a-z0-9]: {name!r}")
        ns = f"{self.prefix}{name}"
        self._new_ns(ns)
        index = len(self.hosts) + 1
        host = Host(name, ns, f"{SUBNET}.{index // 250}.{index % 250 + 1}", f"p-{name}")
        br = ("-n", self.bridge_ns)
        _ip(*br, "link", "add", host.port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip(*br, "link", "set", host.port, "master", "br-a")
        _ip(*br, "link", "set", host.port, "up")
        _ip("-n", ns, "addr", "add", f"{host.address}/16", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        self.hosts[name] = host
        return host

    def close(self) -> None:
        """Kill what runs in the namespaces and delete them (idempotent)."""
        for ns in reversed(self._made):
            _kill_and_delete(ns)
        self._made.clear()
        with _open_lock:
            _open_networks.discard(self)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults ------------------------------------------------------------------------------

    def _port(self, host: str, state: str) -> None:
        _ip("-n", self.bridge_ns, "link", "set", self.hosts[host].port, state)

    def cut(self, *hosts: str) -> None:
        """Take each host's link down: its packets are dropped until :meth:`heal`."""
        for host in hosts:
            self._port(host, "down")

    def heal(self, *hosts: str) -> None:
        for host in hosts:
            self._port(host, "up")

    def split(self, side_b: list[str]) -> None:
        """Symmetric split: ``side_b`` on one side, every other host on the other."""
        for host in side_b:
            _ip("-n", self.bridge_ns, "link", "set", self.hosts[host].port, "master", "br-b")
        _ip("-n", self.bridge_ns, "link", "set", "trunk-a", "down")

    def heal_split(self) -> None:
        _ip("-n", self.bridge_ns, "link", "set", "trunk-a", "up")

    def link(self, a: str, b: str) -> tuple[str, str]:
        """A direct veth pair between hosts ``a`` and ``b``; returns (a's, b's) address on it."""
        if frozenset((a, b)) in self._links:
            raise ValueError(f"{a} and {b} are linked already")
        index = len(self._links) + 1
        if_a, if_b = f"to-{b}", f"to-{a}"  # host names are at most 8 characters
        addr_a, addr_b = f"{LINK_SUBNET}.{index}.1", f"{LINK_SUBNET}.{index}.2"
        ns_a, ns_b = self.hosts[a].ns, self.hosts[b].ns
        _ip("-n", ns_a, "link", "add", if_a, "type", "veth", "peer", "name", if_b, "netns", ns_b)
        _ip("-n", ns_a, "addr", "add", f"{addr_a}/30", "dev", if_a)
        _ip("-n", ns_b, "addr", "add", f"{addr_b}/30", "dev", if_b)
        _ip("-n", ns_a, "link", "set", if_a, "up")
        _ip("-n", ns_b, "link", "set", if_b, "up")
        self._links[frozenset((a, b))] = (ns_b, if_b)
        return addr_a, addr_b

    def _link_state(self, a: str, b: str, state: str) -> None:
        ns, ifname = self._links[frozenset((a, b))]
        _ip("-n", ns, "link", "set", ifname, state)

    def cut_link(self, a: str, b: str) -> None:
        """Take the direct link between ``a`` and ``b`` down (the far end: a's packets drop)."""
        self._link_state(a, b, "down")

    def heal_link(self, a: str, b: str) -> None:
        self._link_state(a, b, "up")

    # -- reaching hosts ----------------------------------------------------------------------

    def exec_prefix(self, host: str) -> list[str]:
        """The argv prefix that runs a command inside ``host``."""
        return ["ip", "netns", "exec", self.hosts[host].ns]

    def socket_in(self, host: str) -> socket.socket:
        """A TCP socket created inside ``host`` (usable from any thread of this process)."""
        box: list[socket.socket | BaseException] = []

        def make() -> None:
            try:
                enter(self.hosts[host].ns)  # this thread only; it ends right after
                box.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            except BaseException as exc:  # handed to the caller
                box.append(exc)

        thread = threading.Thread(target=make, name=f"netns-{host}")
        thread.start()
        thread.join(10)
        if not box:
            raise NetnsError(f"could not create a socket in {host} within 10 s")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def connect(self, host: str, address: tuple[str, int], timeout: float) -> socket.socket:
        """A TCP connection from inside ``host`` to ``address``."""
        sock = self.socket_in(host)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except BaseException:
            sock.close()
            raise
        return sock


@atexit.register
def _close_open_networks() -> None:
    with _open_lock:
        networks = list(_open_networks)
    for network in networks:
        network.close()
