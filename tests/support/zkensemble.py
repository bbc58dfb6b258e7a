"""Several ZooKeeper nodes forming one ensemble, with the waits (a leader, a healthy quorum)
and the failures (stop, kill, restart, heal) the tests need. On loopback by default; with
``placements``, each node on a host of its own (e.g. a network namespace of
:mod:`tests.support.netns`), so a network partition can separate them."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from tests.support.processes import Managed
from tests.support.zkjvm import (
    NodePorts,
    NoLeaderError,
    Placement,
    ZooKeeperError,
    deadline_loop,
    make_owned_dir,
    pick_free_ports,
    release_owned_dir,
)
from tests.support.zknode import ZooKeeperServer

__all__ = ["ZooKeeperEnsemble"]


#: The ports of a node on an address of its own (nothing else binds there).
PLACED_PORTS = (2181, 2888, 3888)


class ZooKeeperEnsemble(Managed):
    """``size`` ZooKeeper nodes forming one ensemble (size 1 is a standalone node).

    On loopback ports picked by the kernel, unless ``placements`` (one per node) put each
    node on an address of its own, launched with its command prefix, on ports 2181, 2888
    and 3888 there. ``jvm_options`` go to every node's JVM.
    """

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
        placements: Sequence[Placement] | None = None,
        jvm_options: Sequence[str] = (),
    ) -> None:
        if size < 1:
            raise ValueError("an ensemble needs at least one node")
        if placements is not None and len(placements) != size:
            raise ValueError(f"{len(placements)} placements for {size} nodes")
        self.size = size
        self.placements = tuple(placements) if placements is not None else None
        self.start_timeout = start_timeout
        self._owned_dir: Path | None = None
        if base_dir is None:
            self._owned_dir = make_owned_dir()
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
                command_prefix=self.placements[i].command_prefix if self.placements else (),
                connect=self.placements[i].connect if self.placements else None,
                jvm_options=jvm_options,
            )
            for i in range(size)
        ]

    def _new_topology(self) -> list[NodePorts]:
        if self.placements is not None:
            return [NodePorts(*PLACED_PORTS, host=place.address) for place in self.placements]
        flat = pick_free_ports(3 * self.size)
        return [NodePorts(flat[3 * i], flat[3 * i + 1], flat[3 * i + 2]) for i in range(self.size)]

    @property
    def quorum(self) -> int:
        return self.size // 2 + 1

    @property
    def hosts(self) -> str:
        """Connection string naming every node, e.g. ``127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``
        (with placements: ``address1:2181,address2:2181,...``)."""
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
        more = deadline_loop(timeout)
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
        more = deadline_loop(timeout)
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
            release_owned_dir(self._owned_dir)
            self._owned_dir = None

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble size={self.size} hosts={self.hosts} modes={self.modes()}>"
