"""What bench_zookeeper's three parts share: configurations and targets, running spawned
worker processes, the CPU time of other processes (the ZooKeeper JVMs), and the
instrumentation that counts ZooKeeper requests and times the phases of a commit.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench._common import SMALL_SCHEMA

REPO_ROOT = str(Path(__file__).resolve().parents[1])


OUR_PACKAGES = tuple(os.path.join(REPO_ROOT, p) + os.sep for p in ("eventlog", "lockstore"))
SCHEMA = SMALL_SCHEMA
CONFIGS = ("embedded", "zk-standalone", "zk-ensemble", "zk-ensemble-group", "deltalake")
ZK_CONFIGS = ("zk-standalone", "zk-ensemble", "zk-ensemble-group")
GROUP_CONFIGS = ("zk-ensemble-group",)  # Table.open(..., group_commit=True)
CLAIM_MODES = ("cas", "seq", "store")
PARTS = ("appends", "claims", "profile")
TARGET_VS_DELTALAKE = 10.0
TARGET_VS_EMBEDDED = 0.5
ZK_TIMEOUT = 10.0
RESULT_TIMEOUT = 900.0
CLAIM_PAYLOAD = b"x" * 200  # about the size of our slot payload (claim JSON)
# Phases of a commit (part 3)
LOG_IO = "_delta_log file I/O (LogStore)"
DATA_FILES = "data file write (write_rows)"
CHECKPOINT = "checkpoint (every 100 versions)"
BACKOFF = "back-off sleep after a lost claim"
REST = "rest: our Python, pyarrow, encode/decode"
IDLE_SECONDS = 3.0


def run_processes(procs: Sequence[Any], results: Any) -> list[Any]:
    """Start ``procs``, collect one result row from each, then join them (killing stragglers)."""
    for p in procs:
        p.start()
    try:
        return [results.get(timeout=RESULT_TIMEOUT) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()


def count_requests() -> Counter[str]:
    """Count every request a KazooClient sends in this process (by request type)."""
    from kazoo.client import KazooClient

    counts: Counter[str] = Counter()
    original = KazooClient._call

    @functools.wraps(original)
    def counted(self: Any, request: Any, async_object: Any) -> Any:
        counts[type(request).__name__] += 1
        return original(self, request, async_object)

    KazooClient._call = counted
    return counts


class Phases:
    """Wall time of the outermost wrapped call per phase (nested wrapped calls are not re-counted)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._depth = threading.local()

    def clear(self) -> None:
        self.seconds.clear()

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._depth, "n", 0) or threading.current_thread() is not threading.main_thread():
                return fn(*args, **kwargs)
            self._depth.n = 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0
                self._depth.n = 0

        return timed


@contextlib.contextmanager
def instrumented(phases: Phases) -> Iterator[Counter[str]]:
    """Count ZooKeeper requests and time the phases of commits into ``phases``.

    Patches classes in this process (undone on exit): every request a kazoo client sends
    (``KazooClient._call``, by request type; each is one round trip), the time spent in the
    ZooKeeper slot store's methods (almost all of it waiting for replies), the ``_delta_log``
    operations of ``LogStore``, data-file writes and checkpoints. Only calls on the main
    thread are timed; a call made inside another timed call counts for the outer one.
    """
    from kazoo.client import KazooClient

    from eventlog.log.storage import LogStore
    from eventlog.ops import common, dml, merge, optimize, rows, write
    from eventlog.table import Table
    from lockstore.zookeeper import ZooKeeperSlotStore

    patches: list[tuple[Any, str, Any]] = []
    for name in ("latest", "claim", "mark_complete", "get", "find_txn", "owner_alive", "bind"):
        fn = getattr(ZooKeeperSlotStore, name)
        patches.append((ZooKeeperSlotStore, name, phases.wrap(f"ZooKeeper slot store: {name}()", fn)))
    for name in (
        "stage",
        "publish",
        "commit_exists",
        "read_commit",
        "read_staged",
        "delete_staged",
        "list_log",
    ):
        patches.append((LogStore, name, phases.wrap(LOG_IO, getattr(LogStore, name))))
    timed_write_rows = phases.wrap(DATA_FILES, common.write_rows)
    for module in (common, dml, merge, optimize, rows, write):  # each holds the name it imported
        patches.append((module, "write_rows", timed_write_rows))
    patches.append((Table, "checkpoint", phases.wrap(CHECKPOINT, Table.checkpoint)))
    originals = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    original_call = KazooClient.__dict__["_call"]
    try:
        counts = count_requests()
        for owner, name, wrapped in patches:
            setattr(owner, name, wrapped)
        yield counts
    finally:
        KazooClient._call = original_call
        for owner, name, original in originals:
            setattr(owner, name, original)


def process_cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of processes (all their threads), from /proc; 0 for gone ones."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return total


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"
