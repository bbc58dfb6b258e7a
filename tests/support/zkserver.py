"""Real ZooKeeper servers for tests: one standalone node, or an ensemble built from the same node.

Each node is a ``QuorumPeerMain`` JVM from the Debian ``zookeeper`` package, bound to loopback
ports picked by the kernel, with its own data directory. Nothing here waits without a bound, and
every JVM runs in its own process group, which is killed at interpreter exit at the latest.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from tests.support.processes import Managed, kill_all, killpg, launch, log_tail, pid_alive, reap

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

_LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
"""


class ZooKeeperError(RuntimeError):
    """A server did not start, did not stop, or did not reach the state we waited for."""


class ZooKeeperUnavailable(ZooKeeperError):
    """Java or the ZooKeeper jars are missing on this machine."""


class NoLeaderError(ZooKeeperError):
    """The running nodes do not report exactly one leader."""


@dataclass(frozen=True)
class NodePorts:
    """The three loopback ports of one node."""

    client: int
    quorum: int
    election: int


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


def _make_owned_dir() -> Path:
    global _reaped
    if not _reaped:
        _reaped = True
        reap_orphans()
    directory = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
    (directory / "owner.pid").write_text(f"{os.getpid()}\n")
    with _registry_lock:
        _owned_dirs.add(directory)
    return directory


def _release_owned_dir(directory: Path) -> None:
    with _registry_lock:
        _owned_dirs.discard(directory)
    shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Small helpers


def four_letter_word(port: int, command: str, host: str = LOOPBACK, timeout: float = 2.0) -> str | None:
    """Send a ZooKeeper four-letter word and return the reply, or None if nothing answered."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
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


def _mode_from_srvr(reply: str | None) -> str | None:
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


def _deadline_loop(timeout: float) -> Callable[[], bool]:
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


# ---------------------------------------------------------------------------------------------
# One node


class ZooKeeperServer(Managed):
    """One ZooKeeper JVM: standalone by default, or a member of a ``ZooKeeperEnsemble``.

    ``tick_ms`` sets tickTime; sessions may last from 2 to 20 ticks, so a short tick (e.g. 500)
    allows short session timeouts in expiry tests. ``force_sync=False`` skips fdatasync of the
    transaction log: faster, and only unsafe if the machine itself crashes.
    """

    def __init__(
        self,
        *,
        tick_ms: int = 2000,
        force_sync: bool = True,
        heap: str = "256m",
        data_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        myid: int | None = None,
        ports: NodePorts | None = None,
        peers: Sequence[NodePorts] = (),
    ) -> None:
        if tick_ms <= 0:
            raise ValueError("tick_ms must be positive")
        if peers and myid is None:
            raise ValueError("an ensemble member needs a myid")
        self.tick_ms = tick_ms
        self.force_sync = force_sync
        self.heap = heap
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.myid = myid
        self._peers = tuple(peers)
        self._explicit_ports = ports is not None
        self._ports = ports if ports is not None else self._new_ports()
        self._owned_dir: Path | None = None
        if data_dir is None:
            self._owned_dir = _make_owned_dir()
            self.dir = self._owned_dir
        else:
            self.dir = Path(data_dir).resolve()
            self.dir.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = False  # set by stop()/kill(), so an exit we caused is not a crash

    # -- addresses and files ---------------------------------------------------------------

    @staticmethod
    def _new_ports() -> NodePorts:
        client, quorum, election = pick_free_ports(3)
        return NodePorts(client, quorum, election)

    @property
    def ports(self) -> NodePorts:
        return self._ports

    @property
    def client_port(self) -> int:
        return self._ports.client

    @property
    def hosts(self) -> str:
        """Connection string of this node alone."""
        return f"{LOOPBACK}:{self._ports.client}"

    @property
    def log_path(self) -> Path:
        return self.dir / "zookeeper.log"

    @property
    def config_path(self) -> Path:
        return self.dir / "zoo.cfg"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _set_topology(self, ports: NodePorts, peers: Sequence[NodePorts]) -> None:
        """Used by ZooKeeperEnsemble when it re-picks ports for every member."""
        if self.is_running():
            raise ZooKeeperError("cannot change the ports of a running node")
        self._ports = ports
        self._peers = tuple(peers)

    def _write_config(self) -> None:
        data = self.dir / "data"
        data.mkdir(exist_ok=True)
        lines = [
            f"tickTime={self.tick_ms}",
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={data}",
            f"clientPort={self._ports.client}",
            f"clientPortAddress={LOOPBACK}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            f"4lw.commands.whitelist={FOUR_LETTER_WORDS}",
            f"forceSync={'yes' if self.force_sync else 'no'}",
        ]
        if self._peers:
            assert self.myid is not None
            (data / "myid").write_text(f"{self.myid}\n")
            lines += [f"server.{i}={LOOPBACK}:{p.quorum}:{p.election}" for i, p in enumerate(self._peers, 1)]
        self.config_path.write_text("\n".join(lines) + "\n")
        (self.dir / "log4j.properties").write_text(_LOG4J_PROPERTIES)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of this node's JVM output (for error messages)."""
        return log_tail(self.log_path, lines)

    def _error(self, message: str) -> ZooKeeperError:
        return ZooKeeperError(f"{message}\n--- last lines of {self.log_path} ---\n{self.log_tail()}")

    # -- state -----------------------------------------------------------------------------

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def crashed(self) -> bool:
        """True if the JVM exited although nobody stopped or killed it."""
        return self._proc is not None and not self._stopping and self._proc.poll() is not None

    def srvr(self) -> str | None:
        return four_letter_word(self._ports.client, "srvr")

    def mode(self) -> str | None:
        """'standalone', 'leader' or 'follower'; None when not serving (or not running)."""
        if not self.is_running():
            return None
        return _mode_from_srvr(self.srvr())

    # -- life cycle ------------------------------------------------------------------------

    def launch(self) -> None:
        """Spawn the JVM without waiting for it to serve."""
        if self.is_running():
            raise ZooKeeperError(f"ZooKeeper node in {self.dir} is already running (pid {self.pid})")
        java, classpath = check_prerequisites()
        self._write_config()
        cmd = [
            java,
            f"-Xmx{self.heap}",
            # Several short-lived JVMs share 2 cores: a serial GC and C1-only JIT start faster
            # and leave more CPU to the tests than the server-class defaults.
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{self.dir / 'log4j.properties'}",
            "-cp",
            classpath,
            MAIN_CLASS,
            str(self.config_path),
        ]
        proc = launch(cmd, log=self.log_path, cwd=self.dir)
        self._proc = proc
        self._stopping = False
        (self.dir / "zookeeper.pid").write_text(f"{proc.pid}\n")

    def wait_until_serving(self, timeout: float | None = None, *, require_mode: bool = True) -> float:
        """Wait until ``ruok`` answers ``imok`` (and ``srvr`` shows a Mode); return seconds waited."""
        timeout = self.start_timeout if timeout is None else timeout
        started = time.monotonic()
        more = _deadline_loop(timeout)
        while more():
            if not self.is_running():
                code = self._proc.returncode if self._proc is not None else None
                raise self._error(f"ZooKeeper node in {self.dir} exited (rc {code})")
            imok = four_letter_word(self._ports.client, "ruok", timeout=1.0) == "imok"
            if imok and (not require_mode or self.mode() is not None):
                return time.monotonic() - started
        raise self._error(f"ZooKeeper on {self.hosts} did not serve within {timeout:.0f} s")

    def start(self) -> Self:
        """Start and wait until serving (standalone) or answering ``ruok`` (ensemble member).

        A standalone node whose own ports were taken by another process in the meantime is
        retried on fresh ports.
        """
        standalone = not self._peers
        for attempt in range(3):
            self.launch()
            try:
                self.wait_until_serving(require_mode=standalone)
                return self
            except ZooKeeperError:
                retry = standalone and not self._explicit_ports and self._port_clash()
                self.kill()
                if not retry or attempt == 2:
                    raise
                self._ports = self._new_ports()
            except BaseException:
                self.kill()
                raise
        raise AssertionError("unreachable")

    def _port_clash(self) -> bool:
        return "Address already in use" in self.log_tail(200)

    def _signal(self, sig: signal.Signals) -> None:
        self._stopping = True
        if self._proc is not None and self._proc.poll() is None:
            killpg(self._proc.pid, sig)

    def _reap(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the JVM to exit; True if it has (or there is none)."""
        if not reap(self._proc, timeout):
            return False
        with contextlib.suppress(OSError):
            (self.dir / "zookeeper.pid").unlink()
        return True

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the JVM has not exited after ``stop_timeout`` seconds."""
        self._signal(signal.SIGTERM)
        if not self._reap(self.stop_timeout):
            log.warning(
                "ZooKeeper pid %s ignored SIGTERM for %.0f s; killing it",
                self.pid,
                self.stop_timeout,
            )
            self.kill()

    def kill(self) -> None:
        """SIGKILL the JVM (a crash: no clean shutdown)."""
        self._signal(signal.SIGKILL)
        if not self._reap(10.0):
            raise ZooKeeperError(f"ZooKeeper pid {self.pid} survived SIGKILL for 10 s")

    def restart(self) -> Self:
        """Stop the node if it runs, then start it again on the same ports and data directory."""
        if self.is_running():
            self.stop()
        self.launch()
        self.wait_until_serving(require_mode=not self._peers)
        return self

    def cleanup(self) -> None:
        """Kill the JVM if still running and delete the data directory if we created it."""
        if self.is_running():
            self.kill()
        if self._owned_dir is not None:
            _release_owned_dir(self._owned_dir)
            self._owned_dir = None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"<ZooKeeperServer {self.hosts} myid={self.myid} {state} dir={self.dir}>"


# ---------------------------------------------------------------------------------------------
# An ensemble of nodes


class ZooKeeperEnsemble(Managed):
    """``size`` ZooKeeper nodes on loopback forming one ensemble (size 1 is a standalone node)."""

    def __init__(
        self,
        size: int = 3,
        *,
        tick_ms: int = 2000,
        force_sync: bool = True,
        heap: str = "256m",
        base_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 10.0,
    ) -> None:
        if size < 1:
            raise ValueError("an ensemble needs at least one node")
        self.size = size
        self.start_timeout = start_timeout
        self._owned_dir: Path | None = None
        if base_dir is None:
            self._owned_dir = _make_owned_dir()
            self.dir = self._owned_dir
        else:
            self.dir = Path(base_dir).resolve()
            self.dir.mkdir(parents=True, exist_ok=True)
        ports = self._new_topology()
        self.nodes = [
            ZooKeeperServer(
                tick_ms=tick_ms,
                force_sync=force_sync,
                heap=heap,
                data_dir=self.dir / f"node-{i + 1}",
                start_timeout=start_timeout,
                stop_timeout=stop_timeout,
                myid=i + 1 if size > 1 else None,
                ports=ports[i],
                peers=ports if size > 1 else (),
            )
            for i in range(size)
        ]

    def _new_topology(self) -> list[NodePorts]:
        flat = pick_free_ports(3 * self.size)
        return [NodePorts(*flat[3 * i : 3 * i + 3]) for i in range(self.size)]

    @property
    def quorum(self) -> int:
        return self.size // 2 + 1

    @property
    def hosts(self) -> str:
        """Connection string naming every node, e.g. ``127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``."""
        return ",".join(node.hosts for node in self.nodes)

    def node_hosts(self, node: int) -> str:
        """Connection string of one node (0-based index)."""
        return self.nodes[node].hosts

    def running(self) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node.is_running()]

    def modes(self) -> list[str | None]:
        return [node.mode() for node in self.nodes]

    def leader(self) -> int:
        """Index of the current leader; NoLeaderError unless exactly one running node leads."""
        modes = self.modes()
        leaders = [i for i, mode in enumerate(modes) if mode in ("leader", "standalone")]
        if len(leaders) != 1:
            raise NoLeaderError(f"expected exactly one leader, node modes are {modes}")
        return leaders[0]

    def wait_for_leader(self, timeout: float | None = None, *, not_node: int | None = None) -> int:
        """Wait until exactly one node leads (and it is not ``not_node``); return its index."""
        timeout = self.start_timeout if timeout is None else timeout
        more = _deadline_loop(timeout)
        last: NoLeaderError | None = None
        while more():
            try:
                leader = self.leader()
            except NoLeaderError as exc:
                last = exc
                continue
            if leader != not_node:
                return leader
        raise self._error(f"no new leader within {timeout:.0f} s: {last or self.modes()}")

    def wait_until_healthy(self, timeout: float | None = None) -> float:
        """Wait until every running node serves with a Mode and exactly one leads; return seconds."""
        timeout = self.start_timeout if timeout is None else timeout
        started = time.monotonic()
        more = _deadline_loop(timeout)
        while more():
            crashed = [i for i, node in enumerate(self.nodes) if node.crashed()]
            if crashed:
                raise self._error(f"node(s) {crashed} exited on their own")
            running = self.running()
            modes = self.modes()
            if running and all(modes[i] is not None for i in running):
                with contextlib.suppress(NoLeaderError):
                    self.leader()
                    return time.monotonic() - started
        raise self._error(f"ensemble not healthy within {timeout:.0f} s: modes {self.modes()}")

    def _error(self, message: str) -> ZooKeeperError:
        tails = "\n".join(
            f"--- node {i} ({node.hosts}), last lines of {node.log_path} ---\n{node.log_tail(15)}"
            for i, node in enumerate(self.nodes)
        )
        return ZooKeeperError(f"{message}\n{tails}")

    def start(self) -> Self:
        """Start every node and wait until all serve and one leads (fresh ports on a port clash)."""
        if self.running():
            raise ZooKeeperError(f"nodes {self.running()} are already running; use restart() or heal()")
        for attempt in range(3):
            try:
                for node in self.nodes:
                    node.launch()
                self.wait_until_healthy()
                return self
            except ZooKeeperError:
                clash = any(node._port_clash() for node in self.nodes)
                for node in self.nodes:
                    node.kill()
                if not clash or attempt == 2:
                    raise
                topology = self._new_topology()
                for node, ports in zip(self.nodes, topology, strict=True):
                    node._set_topology(ports, topology if self.size > 1 else ())
            except BaseException:
                for node in self.nodes:
                    node.kill()
                raise
        raise AssertionError("unreachable")

    def stop(self, node: int | None = None) -> None:
        """Stop one node (SIGTERM, then SIGKILL after a bound), or every node when ``node`` is None."""
        if node is not None:
            self.nodes[node].stop()
            return
        # Signal all first so the nodes shut down in parallel rather than one after another.
        for member in self.nodes:
            member._signal(signal.SIGTERM)
        for member in self.nodes:
            member.stop()

    def kill(self, node: int) -> None:
        """SIGKILL one node."""
        self.nodes[node].kill()

    def restart(self, node: int, *more: int) -> None:
        """Start stopped or killed nodes again, each with its own data directory and ports.

        Several nodes are launched together (their JVMs start in parallel). Waits until each
        answers ``ruok`` and, when a quorum is running, until the ensemble is healthy.
        """
        chosen = [self.nodes[i] for i in (node, *more)]
        for member in chosen:
            if member.is_running():
                member.stop()
        for member in chosen:
            member.launch()
        for member in chosen:
            member.wait_until_serving(require_mode=False)
        if len(self.running()) >= self.quorum:
            self.wait_until_healthy()

    def heal(self) -> None:
        """Restart every node that is not running and wait until the ensemble is healthy."""
        for node in self.nodes:
            if not node.is_running():
                node.launch()
        self.wait_until_healthy()

    def cleanup(self) -> None:
        """Kill remaining JVMs and delete the directories we created."""
        for node in self.nodes:
            node.cleanup()
        if self._owned_dir is not None:
            _release_owned_dir(self._owned_dir)
            self._owned_dir = None

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble size={self.size} hosts={self.hosts} modes={self.modes()}>"


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
    more = _deadline_loop(timeout)
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
        more = _deadline_loop(timeout)
        while more():
            if _mode_from_srvr(four_letter_word(port, "srvr", host=host)) is not None:
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
