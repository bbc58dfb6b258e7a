"""One ZooKeeper node for the tests: a ``QuorumPeerMain`` JVM from the Debian ``zookeeper``
package, standalone or a member of a :class:`tests.support.zkensemble.ZooKeeperEnsemble`,
bound to loopback ports picked by the kernel, with its own data directory, in its own
process group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from tests.support.processes import Managed, killpg, launch, log_tail, reap
from tests.support.zkjvm import (
    FOUR_LETTER_WORDS,
    MAIN_CLASS,
    Connector,
    NodePorts,
    ZooKeeperError,
    check_prerequisites,
    deadline_loop,
    four_letter_word,
    make_owned_dir,
    mode_from_srvr,
    pick_free_ports,
    release_owned_dir,
)

__all__ = ["ZooKeeperServer"]

log = logging.getLogger(__name__)

_LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
"""


class ZooKeeperServer(Managed):
    """One ZooKeeper JVM: standalone by default, or a member of a ``ZooKeeperEnsemble``.

    ``tick_ms`` sets tickTime; sessions may last from 2 to 20 ticks, so a short tick (e.g. 500)
    allows short session timeouts in expiry tests. ``force_sync=False`` skips fdatasync of the
    transaction log: faster, and only unsafe if the machine itself crashes.

    The node binds to ``ports.host`` (loopback by default). ``command_prefix`` goes before
    the ``java`` command (e.g. ``ip netns exec NS`` to run it in a network namespace),
    ``connect`` is how this process reaches it for four-letter words (default: directly),
    and ``jvm_options`` are extra JVM flags (e.g. ``-Dzookeeper.cnxTimeout=1000``).
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
        command_prefix: Sequence[str] = (),
        connect: Connector | None = None,
        jvm_options: Sequence[str] = (),
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
        self.command_prefix = tuple(command_prefix)
        self.connect = connect
        self.jvm_options = tuple(jvm_options)
        self._explicit_ports = ports is not None
        self._ports = ports if ports is not None else self._new_ports()
        self._owned_dir: Path | None = None
        if data_dir is None:
            self._owned_dir = make_owned_dir()
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
        return f"{self._ports.host}:{self._ports.client}"

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
            f"clientPortAddress={self._ports.host}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            f"4lw.commands.whitelist={FOUR_LETTER_WORDS}",
            f"forceSync={'yes' if self.force_sync else 'no'}",
        ]
        if self._peers:
            assert self.myid is not None
            (data / "myid").write_text(f"{self.myid}\n")
            lines += [f"server.{i}={p.host}:{p.quorum}:{p.election}" for i, p in enumerate(self._peers, 1)]
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

    def four_letter_word(self, command: str, timeout: float = 2.0) -> str | None:
        """Send ``command`` to this node; its reply, or None if nothing answered."""
        return four_letter_word(self._ports.client, command, self._ports.host, timeout, self.connect)

    def srvr(self) -> str | None:
        return self.four_letter_word("srvr")

    def mode(self) -> str | None:
        """'standalone', 'leader' or 'follower'; None when not serving (or not running)."""
        if not self.is_running():
            return None
        return mode_from_srvr(self.srvr())

    # -- life cycle ------------------------------------------------------------------------

    def launch(self) -> None:
        """Spawn the JVM without waiting for it to serve."""
        if self.is_running():
            raise ZooKeeperError(f"ZooKeeper node in {self.dir} is already running (pid {self.pid})")
        java, classpath = check_prerequisites()
        self._write_config()
        cmd = [
            *self.command_prefix,
            java,
            f"-Xmx{self.heap}",
            # Several short-lived JVMs share 2 cores: a serial GC and C1-only JIT start faster
            # and leave more CPU to the tests than the server-class defaults.
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            "-Djava.awt.headless=true",
            *self.jvm_options,
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
        more = deadline_loop(timeout)
        while more():
            if not self.is_running():
                code = self._proc.returncode if self._proc is not None else None
                raise self._error(f"ZooKeeper node in {self.dir} exited (rc {code})")
            imok = self.four_letter_word("ruok", timeout=1.0) == "imok"
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
            release_owned_dir(self._owned_dir)
            self._owned_dir = None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"<ZooKeeperServer {self.hosts} myid={self.myid} {state} dir={self.dir}>"
