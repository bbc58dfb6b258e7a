"""Writer processes on hosts of a :class:`tests.support.netns.Network`, for partition tests,
and the :class:`Lab` they run in (the network, a ZooKeeper ensemble, an S3 server).

Each process is spawned (:class:`Fleet`), enters its host's network namespace (``setns(2)``)
before it opens a socket, then runs its target:

* :func:`fixed_writer`: :func:`tests.support.invariants.writer` (appends and deletes);
* :func:`appender`: appends until told to stop, recording acks, commits of unknown outcome
  and the exceptions it saw, themselves (pickled back), for type checks;
* :func:`victim`: appends held right after their claim was granted, or right before the
  claim is sent, until the test releases them;
* :func:`cut_off_calls`: the table API called from a host that is cut off;
* :func:`create_table` and :func:`final_checks` (the invariant check, ``verify`` and a new
  write, with fresh handles).

The table's files are shared (one file system) unless the table is on S3; only ZooKeeper
and S3 traffic crosses the virtual network.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import pickle
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa

from eventlog import CommitStateUnknownError, RetryPolicy, SlotStoreError, Table
from eventlog.log.commit import member_txn_ids
from lockstore.zookeeper import ZooKeeperSlotStore
from tests.support.invariants import SCHEMA, check_invariants, writer
from tests.support.netns import Network, enter
from tests.support.processes import killpg, launch, log_tail, reap
from tests.support.zkensemble import ZooKeeperEnsemble
from tests.support.zkjvm import Placement

__all__ = [
    "Fleet",
    "Lab",
    "Outcome",
    "UntypedError",
    "appender",
    "batch",
    "create_table",
    "cut_off_calls",
    "final_checks",
    "fixed_writer",
    "victim",
]

_CTX = mp.get_context("spawn")
APPEND_PAUSE = 0.05


class UntypedError(Exception):
    """Stands for an exception that could not be pickled back to the test (its type's name)."""


def _portable(exc: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return UntypedError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
    return exc


@dataclass
class Outcome:
    """What one process saw: acks as :func:`tests.support.invariants.writer` records them
    (plus ``at``, the time.time() of the ack), commits whose outcome stayed unknown (their
    ``txn`` and ``ids``), and every exception, in order."""

    worker: int
    acks: list[dict[str, Any]] = field(default_factory=list)
    unknown: list[dict[str, Any]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)  # one per error (for failure messages)
    failure: str | None = None  # a traceback if the process itself failed


def batch(ids: Sequence[int], worker: int, number: int) -> pa.Table:
    n = len(ids)
    return pa.table({"id": list(ids), "worker": [worker] * n, "batch": [number] * n}, schema=SCHEMA)


def _ids(worker: int, number: int) -> list[int]:
    return [worker * 1_000_000 + number * 10 + k for k in range(3)]


def _append(table: Table, worker: int, number: int, out: Outcome) -> bool:
    """One append of batch ``number``; True when it is decided (acknowledged or unknown)."""
    ids = _ids(worker, number)
    try:
        res = table.append(batch(ids, worker, number))
    except CommitStateUnknownError as exc:
        out.errors.append(exc)
        out.tracebacks.append(f"at {time.time():.3f}: {traceback.format_exc()}")
        out.unknown.append({"txn": exc.txn_id, "ids": ids})
        return True  # never re-sent under a new transaction id: it may have landed
    except Exception as exc:
        out.errors.append(_portable(exc))
        out.tracebacks.append(f"at {time.time():.3f}: {traceback.format_exc()}")
        return False
    out.acks.append(
        {"kind": "append", "version": res.version, "txn": res.txn_id, "ids": ids, "at": time.time()}
    )
    return True


def create_table(uri: str, slots: str, storage_options: dict[str, Any] | None, out: Any) -> None:
    """Create the table (and its S3 bucket for an ``s3://`` URI); puts its version on ``out``."""
    if uri.startswith("s3://"):
        fsspec.filesystem("s3", **(storage_options or {})).mkdir(uri[len("s3://") :].split("/")[0])
    table = Table.create(uri, SCHEMA, slots=slots, storage_options=storage_options)
    out.put(table.version)
    table.close()


def fixed_writer(
    uri: str, worker: int, ops: int, slots: str, storage_options: dict[str, Any] | None, out: Any
) -> None:
    """:func:`tests.support.invariants.writer`: ``ops`` appends and deletes; an unreachable
    slot store (nothing committed) is retried and recorded."""
    writer(
        uri, worker, ops, 1000 + worker, out, slots,
        retry_errors=(SlotStoreError,), storage_options=storage_options,
    )  # fmt: skip


def appender(
    uri: str,
    worker: int,
    slots: str,
    storage_options: dict[str, Any] | None,
    retry_seconds: float,
    group_commit: bool,
    ready: Any,
    start: Any,
    stop: Any,
    acked: Any,
    out: Any,
) -> None:
    """Open the table, set ``ready``, wait for ``start``, then append 3-row batches until
    ``stop`` is set, pausing ``APPEND_PAUSE`` between them (tens of commits a second, not
    hundreds: a writer back from a partition is not starved by the others' pace); a failed
    one is retried after 0.2 s. ``acked`` (a shared integer) counts the acknowledged ones
    as they come."""
    result = Outcome(worker)
    policy = RetryPolicy(max_duration=retry_seconds)
    table = Table.open(
        uri, slots=slots, storage_options=storage_options, retry_policy=policy, group_commit=group_commit
    )
    ready.set()
    start.wait(60)
    number = 0
    while not stop.is_set():
        if _append(table, worker, number, result):
            number += 1
            with acked.get_lock():
                acked.value = len(result.acks)
            time.sleep(APPEND_PAUSE)
        else:
            time.sleep(0.2)
    table.close()
    out.put(result)


def victim(
    uri: str,
    worker: int,
    slots: str,
    storage_options: dict[str, Any] | None,
    retry_seconds: float,
    hold_at: str,
    steps: Sequence[tuple[Any, Any]],
    out: Any,
) -> None:
    """One append per step ``(held, release)``. Where ``held`` is not None, the append stops
    at ``hold_at`` (``"publish"``: right after its claim was granted; ``"claim"``: right
    before the claim is sent), sets ``held`` and waits (at most 60 s) for ``release``;
    otherwise it waits for ``release`` first, then appends. Each step's outcome is put on
    ``out`` as it happens."""
    hold: list[tuple[Any, Any]] = []

    def holding(original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if hold:
                held, release = hold.pop()
                held.set()
                release.wait(60)
            return original(self, *args, **kwargs)

        return method

    if hold_at == "publish":
        Table.publish_claimed = holding(Table.publish_claimed)  # type: ignore[method-assign]
    else:
        assert hold_at == "claim", hold_at
        ZooKeeperSlotStore.claim = holding(ZooKeeperSlotStore.claim)  # type: ignore[method-assign]
    policy = RetryPolicy(max_duration=retry_seconds)
    table = Table.open(uri, slots=slots, storage_options=storage_options, retry_policy=policy)
    for number, (held, release) in enumerate(steps):
        result = Outcome(worker)
        if held is not None:
            hold.append((held, release))
        else:
            release.wait(60)
        _append(table, worker, number, result)
        out.put(result)
    table.close()


def cut_off_calls(
    uri: str, slots: str, storage_options: dict[str, Any] | None, ready: Any, go: Any, out: Any
) -> None:
    """Open the table, set ``ready``, wait for ``go`` (the test cut this host off), then call
    the table's API: a fresh open, refresh, history, verify, repair (dry run), an append and
    a delete. Puts ``{call: result or exception}`` and the tracebacks on ``out``."""
    table = Table.open(
        uri, slots=slots, storage_options=storage_options, retry_policy=RetryPolicy(max_duration=1)
    )
    ready.set()
    go.wait(60)
    calls: dict[str, Callable[[], Any]] = {
        "open": lambda: Table.open(uri, slots=slots, storage_options=storage_options).version,
        "refresh": lambda: table.refresh().version,
        "history": lambda: len(table.history()),
        "verify": lambda: table.verify().ok,
        "repair_slots": lambda: table.repair_slots(dry_run=True),
        "append": lambda: table.append(batch([999_999_000], 999, 0)).version,
        "delete": lambda: table.delete("id = -1").version,
    }
    results: dict[str, Any] = {}
    traces: dict[str, str] = {}
    for name, call in calls.items():
        try:
            results[name] = call()
        except CommitStateUnknownError as exc:
            results[name] = exc
            traces[name] = traceback.format_exc()
        except Exception as exc:
            results[name] = _portable(exc)
            traces[name] = traceback.format_exc()
    out.put((results, traces))


def final_checks(
    uri: str,
    slots: str,
    storage_options: dict[str, Any] | None,
    acks: list[dict[str, Any]],
    unknown: list[dict[str, Any]],
    out: Any,
) -> None:
    """With fresh handles: the invariants (a commit of unknown outcome landed whole, once,
    or not at all), ``verify``, then one more append; puts ``(verify report, latest version
    before the append, the append's version)`` on ``out``."""
    probe = Table.open(uri, slots=slots, storage_options=storage_options)
    carried = {h["version"]: set(member_txn_ids(h)) for h in probe.history() if h["version"] > 0}
    probe.close()
    acked, in_doubt = {a["txn"] for a in acks}, {u["txn"] for u in unknown}
    stray = {v: txns - acked - in_doubt for v, txns in carried.items() if txns - acked - in_doubt}
    assert not stray, f"commits that landed neither acknowledged nor in doubt: {stray}"
    where = {txn: version for version, txns in carried.items() for txn in txns}
    landed = where.keys() & in_doubt
    # A commit of unknown outcome that landed (once: check_invariants finds doubles) is as
    # good as acknowledged at its version; the others must have left no row behind.
    known = [
        *acks,
        *({"kind": "append", "version": where[u["txn"]], **u} for u in unknown if u["txn"] in landed),
    ]
    table = check_invariants(uri, known, slots=slots, storage_options=storage_options)
    rows = set(table.to_arrow().column("id").to_pylist())
    for u in unknown:
        assert u["txn"] in landed or not set(u["ids"]) & rows, f"rows of a commit that did not land: {u}"
    report = table.verify()
    latest = table.version
    new = table.append(batch([999_999_990], 999, 0))
    table.close()
    out.put((report, latest, new.version))


def _bootstrap(ns: str, target: Callable[..., None], args: tuple[Any, ...], out: Any) -> None:
    enter(ns)  # before anything opens a socket
    try:
        target(*args, out)
    except BaseException:
        out.put(Outcome(-1, failure=traceback.format_exc()))
        raise


class Fleet:
    """Processes on hosts of ``net``, each with its own result queue."""

    def __init__(self, net: Network) -> None:
        self.net = net
        self.procs: list[tuple[Any, Any]] = []

    def event(self) -> Any:
        return _CTX.Event()

    def counter(self) -> Any:
        """A shared integer, 0 to start with."""
        return _CTX.Value("i", 0)

    def spawn(self, host: str, target: Callable[..., None], *args: Any) -> Any:
        """Start ``target(*args, out)`` in a process on ``host``; returns its result queue."""
        out = _CTX.Queue()
        proc = _CTX.Process(target=_bootstrap, args=(self.net.hosts[host].ns, target, args, out), daemon=True)
        proc.start()
        self.procs.append((proc, out))
        return out

    @staticmethod
    def get(out: Any, timeout: float) -> Any:
        """The next result on ``out``; AssertionError if none came within ``timeout`` (a hung
        writer) or the process failed."""
        try:
            item = out.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no result within {timeout:.0f} s: a writer hung") from None
        if isinstance(item, Outcome) and item.failure is not None:
            raise AssertionError(f"a process failed:\n{item.failure}")
        return item

    def exited(self, out: Any, timeout: float) -> int | None:
        """The exit code of the process whose result queue is ``out`` (None: still running
        after ``timeout`` seconds)."""
        proc = next(p for p, q in self.procs if q is out)
        proc.join(timeout)
        return None if proc.is_alive() else proc.exitcode

    def run(self, host: str, target: Callable[..., None], *args: Any, timeout: float = 60.0) -> Any:
        """Run ``target`` on ``host`` to its end; its result."""
        return self.get(self.spawn(host, target, *args), timeout)

    def join(self, timeout: float = 30.0) -> None:
        """Every process exited within ``timeout`` (together), each with exit code 0."""
        end = time.monotonic() + timeout
        for proc, _ in self.procs:
            proc.join(max(0.1, end - time.monotonic()))
        alive = [p.pid for p, _ in self.procs if p.is_alive()]
        assert not alive, f"writer processes {alive} still running {timeout:.0f} s after the heal"
        codes = [p.exitcode for p, _ in self.procs]
        assert all(code == 0 for code in codes), f"writer exit codes {codes}"

    def close(self) -> None:
        for proc, out in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            out.close()
        self.procs.clear()


# ---------------------------------------------------------------------------------------------
# The lab: a network of namespaces with a ZooKeeper ensemble and (on demand) an S3 server.

#: Store calls and ZooKeeper sessions of the writers: short, so a cut is noticed in seconds.
ZK_TIMEOUT = 4.0
TICK_MS = 500  # sessions may last 1-10 s; a follower cut off is dropped after 5 ticks
S3_PORT = 9000


class Lab:
    """Hosts ``zk1``-``zk3`` (a ZooKeeper ensemble), ``wa`` and ``wb`` (writers), ``s3`` (moto,
    started by :meth:`start_s3`, also on a direct link to ``wa``) and ``ctl`` (this test's
    table creation and final checks)."""

    ZK_HOSTS = ("zk1", "zk2", "zk3")

    def __init__(self) -> None:
        self.net = Network()
        self.ensemble: ZooKeeperEnsemble | None = None
        self.s3: subprocess.Popen[bytes] | None = None
        self.s3_dir: Path | None = None
        self.wa_s3_address = ""

    def start(self) -> Lab:
        self.net.start()
        for name in (*self.ZK_HOSTS, "s3", "wa", "wb", "ctl"):
            self.net.add_host(name)
        self.wa_s3_address = self.net.link("wa", "s3")[1]
        placements = [
            Placement(self.net.hosts[h].address, tuple(self.net.exec_prefix(h)), self._probe)
            for h in self.ZK_HOSTS
        ]
        self.ensemble = ZooKeeperEnsemble(
            3, tick_ms=TICK_MS, force_sync=False, placements=placements,
            # A peer that does not answer is given up on after 1 s (default 5 s) in elections.
            jvm_options=["-Dzookeeper.cnxTimeout=1000"],
        )  # fmt: skip
        self.ensemble.start()
        return self

    def _probe(self, address: tuple[str, int], timeout: float) -> socket.socket:
        return self.net.connect("ctl", address, timeout)

    @property
    def zk(self) -> ZooKeeperEnsemble:
        assert self.ensemble is not None
        return self.ensemble

    def spec(self) -> str:
        """A fresh ``zk://`` slot spec (its own chroot) on the ensemble."""
        return f"zk://{self.zk.hosts}/partitions-{uuid.uuid4().hex[:12]}?timeout={ZK_TIMEOUT:g}"

    def leader_host(self) -> str:
        return self.ZK_HOSTS[self.zk.wait_for_leader(30)]

    def wait_all_serving(self, timeout: float = 45.0) -> None:
        """Every node serves again, one of them leading."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            modes = self.zk.modes()
            if None not in modes and modes.count("leader") == 1:
                return
            time.sleep(0.1)
        raise AssertionError(f"the ensemble did not heal within {timeout:.0f} s: modes {self.zk.modes()}")

    def heal_all(self) -> None:
        """Every link up again and every node serving (a reset between tests)."""
        self.net.heal(*self.net.hosts)
        self.net.heal_split()
        self.net.heal_link("wa", "s3")
        self.wait_all_serving()

    # -- S3 ----------------------------------------------------------------------------------

    def start_s3(self) -> None:
        """moto's S3 server (tests/support/moto_serve.py, writes serialized) on host ``s3``,
        listening on all its addresses: the bridge and the direct link to ``wa``."""
        if self.s3 is not None:
            return
        self.s3_dir = Path(tempfile.mkdtemp(prefix="eventlog-netns-s3-"))
        support = Path(__file__).resolve().parent.parent / "support"
        cmd = [
            *self.net.exec_prefix("s3"), sys.executable, "-P", str(support / "moto_serve.py"), "serve",
            "--host", "0.0.0.0", "--port", str(S3_PORT), "--dir", str(self.s3_dir), "--serialize-writes",
        ]  # fmt: skip
        self.s3 = launch(cmd, log=self.s3_dir / "moto.log", cwd=self.s3_dir)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            assert self.s3.poll() is None, f"moto exited:\n{log_tail(self.s3_dir / 'moto.log')}"
            with contextlib.suppress(OSError), self._probe((self.s3_host, S3_PORT), 1.0) as sock:
                sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
                if sock.recv(16).startswith(b"HTTP/"):
                    return
            time.sleep(0.2)
        raise AssertionError(f"moto did not serve within 60 s:\n{log_tail(self.s3_dir / 'moto.log')}")

    @property
    def s3_host(self) -> str:
        return self.net.hosts["s3"].address

    def s3_options(self, address: str | None = None) -> dict[str, Any]:
        """s3fs options for the server at ``address`` (default: its bridge address), with
        short timeouts so that a cut is an error within seconds."""
        return {
            "endpoint_url": f"http://{address or self.s3_host}:{S3_PORT}",
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "eu-west-1"},
            "config_kwargs": {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 1}},
        }

    def close(self) -> None:
        try:
            if self.s3 is not None:
                killpg(self.s3.pid, signal.SIGKILL)
                reap(self.s3, 10)
            if self.ensemble is not None:
                self.ensemble.close()
        finally:
            self.net.close()
            if self.s3_dir is not None:
                shutil.rmtree(self.s3_dir, ignore_errors=True)
