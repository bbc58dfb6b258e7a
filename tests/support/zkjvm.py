"""What every ZooKeeper JVM of the tests shares: where Java and the jars are, the errors,
loopback ports, four-letter words, bounded waits, and the data directories this process owns
(removed at interpreter exit, and reaped from earlier runs whose process died).

The servers themselves are :mod:`tests.support.zknode` (one node) and
:mod:`tests.support.zkensemble`; :mod:`tests.support.zkserver` is the public entry point.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import kill_all, killpg, pid_alive

__all__ = [
    "CLASSPATH_ENV",
    "DIR_PREFIX",
    "Connector",
    "FOUR_LETTER_WORDS",
    "HOSTS_ENV",
    "INSTALL_HINT",
    "LOOPBACK",
    "MAIN_CLASS",
    "NoLeaderError",
    "NodePorts",
    "Placement",
    "ZooKeeperError",
    "ZooKeeperUnavailable",
    "check_prerequisites",
    "deadline_loop",
    "four_letter_word",
    "make_owned_dir",
    "mode_from_srvr",
    "pick_free_ports",
    "reap_orphans",
    "release_owned_dir",
]

#: Set to a connection string ("host:port,host:port") to test against servers started elsewhere.
HOSTS_ENV = "EVENTLOG_TEST_ZK_HOSTS"
#: Overrides the JVM class path (e.g. ``/opt/zookeeper/lib/*:/opt/zookeeper/conf``).
CLASSPATH_ENV = "EVENTLOG_ZK_CLASSPATH"

JAVA_DIR = Path("/usr/share/java")
# zookeeper.jar's manifest Class-Path brings jute, netty, jackson, slf4j-api...; it lacks an slf4j
# binding, without which the server logs nothing at all. slf4j-log4j12 + log4j 1.2 provide one.
DEBIAN_JARS = ("zookeeper.jar", "slf4j-log4j12.jar", "log4j-1.2.jar")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
FOUR_LETTER_WORDS = "ruok,srvr,stat,mntr,conf,cons,isro"
LOOPBACK = "127.0.0.1"
DIR_PREFIX = "eventlog-zk-"
INSTALL_HINT = (
    "Install Java and the Debian package 'zookeeper' with ./scripts/bootstrap.sh "
    "(or: sudo apt-get install -y zookeeper), or set "
    f"{HOSTS_ENV}=host:port,... to use ZooKeeper servers that are already running."
)
_POLL = 0.05


class ZooKeeperError(RuntimeError):
    """A server did not start, did not stop, or did not reach the state we waited for."""


class ZooKeeperUnavailable(ZooKeeperError):
    """Java or the ZooKeeper jars are missing on this machine."""


class NoLeaderError(ZooKeeperError):
    """The running nodes do not report exactly one leader."""


#: Opens a TCP connection to (host, port) within a timeout: how this process reaches a node
#: (``socket.create_connection`` unless the node lives in another network namespace).
Connector = Callable[[tuple[str, int], float], socket.socket]


@dataclass(frozen=True)
class NodePorts:
    """The address and three ports of one node (loopback unless ``host`` says otherwise)."""

    client: int
    quorum: int
    election: int
    host: str = LOOPBACK


@dataclass(frozen=True)
class Placement:
    """Where an ensemble member runs: its own address (it binds its ports there), the argv
    prefix its JVM is launched with (e.g. ``ip netns exec NS``) and how this process
    reaches it for four-letter words (None: directly)."""

    address: str
    command_prefix: tuple[str, ...] = ()
    connect: Connector | None = None


# ---------------------------------------------------------------------------------------------
# Process bookkeeping: every JVM we spawn is killed at exit even if a test forgot to stop it.

_owned_dirs: set[Path] = set()
_registry_lock = threading.Lock()
_reaped = False


@atexit.register
def _remove_owned_dirs_at_exit() -> None:
    kill_all()  # the JVMs first: they write into these directories
    with _registry_lock:
        dirs = list(_owned_dirs)
        _owned_dirs.clear()
    for directory in dirs:
        shutil.rmtree(directory, ignore_errors=True)


def reap_orphans() -> None:
    """Kill JVMs (and remove directories) left by earlier test runs whose process has died.

    atexit does not run when pytest itself is SIGKILLed; this catches those leftovers. A
    directory is only touched when the process that created it is gone, and a pid is only
    killed when its command line names that directory.
    """
    tmp = Path(tempfile.gettempdir())
    for directory in tmp.glob(DIR_PREFIX + "*"):
        try:
            owner = int((directory / "owner.pid").read_text().strip())
        except (OSError, ValueError):
            continue
        if pid_alive(owner):
            continue
        for pidfile in list(directory.glob("zookeeper.pid")) + list(directory.glob("*/zookeeper.pid")):
            try:
                pid = int(pidfile.read_text().strip())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if str(directory).encode() in cmdline and MAIN_CLASS.encode() in cmdline:
                killpg(pid, signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)


def make_owned_dir() -> Path:
    global _reaped
    if not _reaped:
        _reaped = True
        reap_orphans()
    directory = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
    (directory / "owner.pid").write_text(f"{os.getpid()}\n")
    with _registry_lock:
        _owned_dirs.add(directory)
    return directory


def release_owned_dir(directory: Path) -> None:
    with _registry_lock:
        _owned_dirs.discard(directory)
    shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Small helpers


def four_letter_word(
    port: int, command: str, host: str = LOOPBACK, timeout: float = 2.0, connect: Connector | None = None
) -> str | None:
    """Send a ZooKeeper four-letter word and return the reply, or None if nothing answered."""
    try:
        with (connect or socket.create_connection)((host, port), timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(command.encode("ascii"))
            chunks: list[bytes] = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    return b"".join(chunks).decode("utf-8", errors="replace")


def mode_from_srvr(reply: str | None) -> str | None:
    for line in (reply or "").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def pick_free_ports(count: int) -> list[int]:
    """Distinct free loopback ports, chosen by the kernel (bind to port 0).

    All sockets stay open until every port is chosen, so the ports are distinct. Another process
    may still take one before the JVM binds it; starts retry with new ports when that happens.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            socks.append(sock)
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _find_java() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home, "bin", "java"), os.X_OK):
        return str(Path(java_home, "bin", "java"))
    return shutil.which("java")


def _classpath() -> str:
    override = os.environ.get(CLASSPATH_ENV)
    if override:
        return override
    return os.pathsep.join(str(JAVA_DIR / jar) for jar in DEBIAN_JARS)


def check_prerequisites() -> tuple[str, str]:
    """Return (java executable, class path), or raise ZooKeeperUnavailable saying what to install."""
    java = _find_java()
    problems = []
    if java is None:
        problems.append("no 'java' on PATH (and JAVA_HOME unset)")
    if not os.environ.get(CLASSPATH_ENV):
        missing = [str(JAVA_DIR / jar) for jar in DEBIAN_JARS if not (JAVA_DIR / jar).is_file()]
        if missing:
            problems.append("missing " + ", ".join(missing))
    if problems or java is None:
        raise ZooKeeperUnavailable(
            "cannot run a local ZooKeeper: " + "; ".join(problems) + ". " + INSTALL_HINT
        )
    return java, _classpath()


def deadline_loop(timeout: float) -> Callable[[], bool]:
    """A predicate that is True until ``timeout`` seconds have passed (it sleeps between calls)."""
    end = time.monotonic() + timeout
    first = True

    def more() -> bool:
        nonlocal first
        if not first:
            time.sleep(_POLL)
        first = False
        return time.monotonic() < end

    return more
