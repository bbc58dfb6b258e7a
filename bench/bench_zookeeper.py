"""ZooKeeper version slots: commits/s of small appends, claim strategies, and one commit's cost.

Three parts, all against real ZooKeeper servers started by this script on loopback
(``tests.support.zkserver``: a standalone node and a 3-node ensemble, both durable, i.e.
``forceSync=yes``), and all stopped again before it exits, also on failure:

1. **Small appends** -- 1 writer and 4 processes of 1-row blind appends, each run on a fresh
   table, in five configurations (interleaved, so drift in machine load hits all alike):

   * ``embedded``      -- ``Table.append``, default embedded (local-file) slot store
   * ``zk-standalone`` -- ``Table.append`` with ``slots="zk://<standalone>/<fresh chroot>"``
   * ``zk-ensemble``   -- ``Table.append`` with ``slots="zk://<3 nodes>/<fresh chroot>"``
   * ``zk-ensemble-group`` -- the same through the ensemble with ``group_commit=True``
     (concurrent appends may share a version: commits/s counts acknowledged appends)
   * ``deltalake``     -- ``deltalake.write_deltalake(path, batch, mode="append")``

   Writers are "spawn" processes released together by a barrier; throughput = successful
   appends / (last writer's end - first writer's start). Any exception from an append is a
   failed append. After each of our runs the table must hold one row per append, be at
   version == appends (<= with group commit), and carry exactly the acknowledged
   transaction ids, each once (asserted). Targets: 4 processes through the ensemble reach >= 10x
   deltalake's commits/s and >= 0.5x the embedded store's, with no failed append.

2. **Claim strategies** -- plain kazoo against the ensemble, 4 processes each taking
   consecutive slots: ``cas`` (``get(counter)`` then ``transaction(set_data(counter, v+1,
   version), create(slot v+1))``, retried at once on failure), ``seq`` (``create(prefix,
   sequence=True)``) and ``store`` (our ``ZooKeeperSlotStore``: ``latest()`` then
   ``claim(latest+1)`` until granted). Reports slots/s, retries and round trips per slot.

3. **One commit** -- a single writer appending through the ensemble: round trips to
   ZooKeeper per commit (every request counted at ``KazooClient._call``), where the wall time
   goes (ZooKeeper waits, log-file I/O, data-file writes, checkpoints, the rest), then the
   same appends under cProfile.

Run: ``.venv/bin/python bench/bench_zookeeper.py [--quick] [--repeat N] [--parts appends,claims,profile]``
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import multiprocessing as mp
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import pyarrow as pa

from bench._common import SMALL_SCHEMA, Stat, machine_note, print_table, ratio, small_batch, verdict

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


# ---------------------------------------------------------------------------------------------
# Part 1: small appends


@dataclass
class RunResult:
    config: str
    writers: int
    ok: int
    failed: int
    seconds: float
    errors: Counter[str] = field(default_factory=Counter)
    version: int = -1
    rows: int = -1
    retries: int = 0
    cpu: float = 0.0  # CPU seconds of the writer processes during their append loops
    server_cpu: float = 0.0  # CPU seconds of the ZooKeeper JVMs during the run (if pids given)
    writer_seconds: float = 0.0  # sum over writers of their loop's wall time
    requests: Counter[str] = field(default_factory=Counter)  # ZooKeeper requests (instrumented)
    phases: Counter[str] = field(default_factory=Counter)  # seconds per phase (instrumented)

    @property
    def commits_per_s(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0


def _run_processes(procs: Sequence[Any], results: Any) -> list[Any]:
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


def _close_slots(table: Any) -> None:
    with contextlib.suppress(Exception):
        table.slots.close()


def _append_worker(
    config: str,
    path: str,
    spec: str | None,
    n: int,
    writer: int,
    barrier: Any,
    results: Any,
    instrument: bool = False,
) -> None:
    """One writer process: set up, wait for the others, append ``n`` 1-row batches.

    ``instrument``: also count ZooKeeper requests and time the phases of each commit
    (see :func:`_instrumented`), including the back-off sleeps after lost claims.
    """
    table: Any = None
    try:
        batches = [small_batch(writer, i) for i in range(n)]
        phases = _Phases()
        if config == "deltalake":
            from deltalake import write_deltalake

            def append(b: pa.RecordBatch) -> int:
                write_deltalake(path, b, mode="append")
                return 0  # delta-rs retries internally and does not report it

        else:
            from eventlog.table import Table
            from eventlog.txn.retry import RetryPolicy

            # The default policy, with its sleep timed when instrumenting.
            policy = RetryPolicy(sleep=phases.wrap(BACKOFF, time.sleep)) if instrument else None
            table = Table.open(path, slots=spec, retry_policy=policy, group_commit=config in GROUP_CONFIGS)

            def append(b: pa.RecordBatch) -> int:
                result = table.append(b)
                acks.append(result.txn_id)
                return int(result.attempts) - 1  # slot claims lost before this commit

        errors: Counter[str] = Counter()
        acks: list[str] = []
        ok = retries = 0
        with _instrumented(phases) if instrument else contextlib.nullcontext(Counter[str]()) as counts:
            barrier.wait(timeout=RESULT_TIMEOUT)
            counts.clear()
            phases.clear()
            cpu0 = time.process_time()  # this process, all threads (kazoo's included)
            start = time.perf_counter()  # CLOCK_MONOTONIC on Linux: comparable across processes
            for b in batches:
                try:
                    retries += append(b)
                    ok += 1
                except Exception as exc:
                    errors[type(exc).__name__] += 1
            end = time.perf_counter()
            cpu = time.process_time() - cpu0
            extra = {"cpu": cpu, "requests": dict(counts), "phases": dict(phases.seconds), "acks": acks}
        results.put((writer, start, end, ok, dict(errors), retries, extra))
    except BaseException as exc:  # set-up failed: report it rather than hang the barrier
        barrier.abort()
        results.put((writer, 0.0, 0.0, 0, {f"setup:{type(exc).__name__}: {exc}": n}, 0, {}))
    finally:
        if table is not None and spec is not None:
            _close_slots(table)


def _zk_spec(hosts: str, label: str) -> str:
    return f"zk://{hosts}/bench-{label}-{uuid.uuid4().hex[:12]}?timeout={ZK_TIMEOUT:g}"


def _create(config: str, path: str, spec: str | None) -> None:
    if config == "deltalake":
        from deltalake import DeltaTable

        DeltaTable.create(path, schema=SCHEMA)
        return
    from eventlog.table import Table

    table = Table.create(path, SCHEMA, slots=spec)
    if spec is not None:
        _close_slots(table)


def _inspect(config: str, path: str, spec: str | None) -> tuple[int, int, list[str]]:
    """(version, row count, transactions committed after CREATE) of the table after the run."""
    if config == "deltalake":
        from deltalake import DeltaTable

        dt = DeltaTable(path)
        return dt.version(), dt.to_pyarrow_table().num_rows, []
    from eventlog.table import Table
    from eventlog.txn.groupcommit import member_txn_ids

    table = Table.open(path, slots=spec)
    try:
        txns = [t for h in table.history() if h["version"] > 0 for t in member_txn_ids(h)]
        return table.version, table.to_arrow().num_rows, txns
    finally:
        if spec is not None:
            _close_slots(table)


def run_appends(
    config: str,
    writers: int,
    per_writer: int,
    hosts: dict[str, str],
    *,
    instrument: bool = False,
    server_pids: Sequence[int] = (),
) -> RunResult:
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix=f"bench-zk-{config}-")
    try:
        path = str(Path(tmp) / "table")
        spec = _zk_spec(hosts[config], f"{config}-{writers}") if config in ZK_CONFIGS else None
        _create(config, path, spec)
        barrier = ctx.Barrier(writers)
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=_append_worker,
                args=(config, path, spec, per_writer, w, barrier, results, instrument),
            )
            for w in range(writers)
        ]
        server_cpu0 = _cpu_seconds(server_pids)
        rows = _run_processes(procs, results)
        server_cpu = _cpu_seconds(server_pids) - server_cpu0
        errors: Counter[str] = Counter()
        requests: Counter[str] = Counter()
        phases: Counter[str] = Counter()
        for r in rows:
            errors.update(r[4])
            requests.update(r[6].get("requests", {}))
            phases.update(r[6].get("phases", {}))
        ok = sum(r[3] for r in rows)
        seconds = max(r[2] for r in rows) - min(r[1] for r in rows)
        version, nrows, committed = _inspect(config, path, spec)
        result = RunResult(
            config,
            writers,
            ok,
            writers * per_writer - ok,
            seconds,
            errors,
            version,
            nrows,
            sum(r[5] for r in rows),
            cpu=sum(r[6].get("cpu", 0.0) for r in rows),
            server_cpu=server_cpu,
            writer_seconds=sum(r[2] - r[1] for r in rows),
            requests=requests,
            phases=phases,
        )
        if config != "deltalake":
            expected = writers * per_writer
            context = f"{config}, {writers} writer(s), errors {dict(errors) or 'none'}"
            # With group commit several appends may share a version.
            bad_version = result.version > expected if config in GROUP_CONFIGS else result.version != expected
            assert not bad_version, f"{context}: version {result.version} for {expected} appends"
            assert result.rows == expected, f"{context}: {result.rows} rows != {expected} appends"
            # Exactly once: every acknowledged transaction is in the log once, nothing else is.
            acked = sorted(txn for r in rows for txn in r[6].get("acks", []))
            assert acked == sorted(committed), f"{context}: acknowledged txns != committed txns"
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def part_appends(
    hosts: dict[str, str], pids: dict[str, list[int]], sizes: dict[int, int], repeat: int
) -> bool:
    print(f"\n## Part 1: small appends ({sizes[1]} appends x 1 writer, {sizes[4]} x 4 processes)\n")
    results: dict[tuple[str, int], list[RunResult]] = {}
    for rep in range(repeat):
        for writers in (1, 4):
            for config in CONFIGS:
                r = run_appends(config, writers, sizes[writers], hosts, server_pids=pids.get(config, []))
                results.setdefault((config, writers), []).append(r)
                print(
                    f"  run {rep + 1}: {config:13s} {writers} writer(s): {r.commits_per_s:7.1f} commits/s, "
                    f"{r.ok} ok, {r.failed} failed {dict(r.errors) or ''}, {r.retries} lost claims "
                    f"-> version {r.version}, {r.rows} rows; loadavg {_load()}",
                    flush=True,
                )

    rows = []
    for writers in (1, 4):
        for config in CONFIGS:
            runs = results[(config, writers)]
            cps = Stat.of([r.commits_per_s for r in runs])
            ms = Stat.of([1000 * r.seconds / max(1, r.ok) * writers for r in runs])
            errs: Counter[str] = Counter()
            for r in runs:
                errs.update(r.errors)
            rows.append(
                [
                    config,
                    writers,
                    writers * sizes[writers],
                    cps.fmt(".0f"),
                    ms.fmt(".2f"),
                    f"{sum(r.failed for r in runs)} / {len(runs) * writers * sizes[writers]}",
                    ", ".join(f"{k} x{v}" for k, v in errs.items()) or "-",
                    str(sum(r.retries for r in runs)) if config != "deltalake" else "n/a",
                    Stat.of([1000 * r.cpu / max(1, r.ok) for r in runs]).fmt(".1f"),
                    Stat.of([1000 * r.server_cpu / max(1, r.ok) for r in runs]).fmt(".1f")
                    if config in ZK_CONFIGS
                    else "-",
                ]
            )
    print_table(
        "Small appends: commits/s (median [min-max] over runs)",
        [
            "config",
            "writers",
            "appends/run",
            "commits/s",
            "ms/commit per writer",
            "failed (all runs)",
            "errors",
            "lost slot claims (all runs)",
            "writers' CPU ms/commit",
            "ZooKeeper JVMs' CPU ms/commit",
        ],
        rows,
    )

    def median(config: str, writers: int) -> float:
        return Stat.of([r.commits_per_s for r in results[(config, writers)]]).median

    ratio_rows = []
    for writers in (1, 4):
        for config in ZK_CONFIGS:
            vs_dl = ratio(median(config, writers), median("deltalake", writers))
            vs_emb = ratio(median(config, writers), median("embedded", writers))
            ratio_rows.append([config, writers, f"{vs_dl:.1f}x", f"{vs_emb:.2f}x"])
    print_table(
        "Ratios of medians (commits/s; > 1 means the ZooKeeper config is faster)",
        ["config", "writers", "ours-ZK / deltalake", "ours-ZK / embedded"],
        ratio_rows,
    )

    target_rows = []
    for config in ("zk-ensemble", "zk-ensemble-group"):
        vs_dl = ratio(median(config, 4), median("deltalake", 4))
        vs_emb = ratio(median(config, 4), median("embedded", 4))
        failed = sum(r.failed for r in results[(config, 4)])
        met_dl, met_emb = verdict(vs_dl >= TARGET_VS_DELTALAKE), verdict(vs_emb >= TARGET_VS_EMBEDDED)
        target_rows += [
            [config, f">= {TARGET_VS_DELTALAKE:.0f}x deltalake", f"{vs_dl:.1f}x", met_dl],
            [config, f">= {TARGET_VS_EMBEDDED}x embedded", f"{vs_emb:.2f}x", met_emb],
            [config, "no failed append", f"{failed} failed", verdict(failed == 0)],
        ]
    print_table(
        "Targets (4 processes through the 3-node ensemble; commits/s = acknowledged appends/s)",
        ["config", "target", "measured", "verdict"],
        target_rows,
    )
    for r in results[("zk-ensemble-group", 4)]:
        per_version = r.ok / max(1, r.version)
        print(f"group commit: {r.ok} appends in {r.version} versions ({per_version:.1f} per version)")
    ours_failed = sum(r.failed for (c, _w), runs in results.items() if c != "deltalake" for r in runs)
    print(
        "verification: rows == appends, acknowledged txns == committed txns (exactly once), and version =="
        f" appends (<= with group commit) asserted after every run of ours; {ours_failed} failed"
    )
    for writers in (1, 4):
        for r in results[("deltalake", writers)]:
            if r.version != r.ok or r.rows != r.ok:
                print(f"note: deltalake {writers} writer(s): version {r.version}, rows {r.rows}, ok {r.ok}")
    return ours_failed == 0


# ---------------------------------------------------------------------------------------------
# Part 2: claim strategies with plain kazoo


@dataclass
class ClaimResult:
    mode: str
    slots: int
    seconds: float
    retries: int
    requests: int
    p50_ms: float
    p99_ms: float

    @property
    def per_s(self) -> float:
        return self.slots / self.seconds if self.seconds > 0 else 0.0


def _count_requests() -> Counter[str]:
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


def _claim_worker(mode: str, hosts: str, base: str, n: int, writer: int, barrier: Any, results: Any) -> None:
    """One claimer process: take ``n`` consecutive slots the ``mode`` way."""
    client: Any = None
    store: Any = None
    try:
        from kazoo.client import KazooClient

        from lockstore.base import SlotClaim, default_owner

        counts = _count_requests()
        counter, slots = f"{base}/counter", f"{base}/slots"
        if mode == "store":
            from lockstore.zookeeper import ZooKeeperSlotStore

            store = ZooKeeperSlotStore(hosts, chroot=base, timeout=ZK_TIMEOUT)
            owner = default_owner("bench")
        else:
            client = KazooClient(hosts=hosts, timeout=ZK_TIMEOUT)
            client.start(timeout=ZK_TIMEOUT)
        latencies: list[float] = []
        retries = 0
        barrier.wait(timeout=RESULT_TIMEOUT)
        counts.clear()
        start = time.perf_counter()
        for i in range(n):
            t0 = time.perf_counter()
            if mode == "cas":
                while True:
                    data, stat = client.get(counter)
                    v = int(data)
                    txn = client.transaction()
                    txn.set_data(counter, str(v + 1).encode(), version=stat.version)
                    txn.create(f"{slots}/{v + 1:020d}", CLAIM_PAYLOAD)
                    if not any(isinstance(r, Exception) for r in txn.commit()):
                        break
                    retries += 1
            elif mode == "seq":
                client.create(f"{slots}/s-", CLAIM_PAYLOAD, sequence=True)
            else:
                claim = SlotClaim(f"w{writer}-{i}", f"w{writer}-{i}.json", owner)
                while not store.claim("raw", store.latest("raw") + 1, claim):
                    retries += 1
            latencies.append(time.perf_counter() - t0)
        end = time.perf_counter()
        results.put((writer, start, end, retries, sum(counts.values()), latencies, ""))
    except BaseException as exc:
        barrier.abort()
        results.put((writer, 0.0, 0.0, 0, 0, [], f"{type(exc).__name__}: {exc}"))
    finally:
        if store is not None:
            store.close()
        if client is not None:
            with contextlib.suppress(Exception):
                client.stop()
            client.close()


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run_claims(mode: str, hosts: str, writers: int, per_writer: int) -> ClaimResult:
    from kazoo.client import KazooClient

    from lockstore.zookeeper import ZooKeeperSlotStore, table_node_name

    base = f"/bench-claims-{mode}-{uuid.uuid4().hex[:12]}"
    total = writers * per_writer
    admin = KazooClient(hosts=hosts, timeout=ZK_TIMEOUT)
    admin.start(timeout=ZK_TIMEOUT)
    try:
        if mode == "store":
            setup = ZooKeeperSlotStore(hosts, chroot=base, timeout=ZK_TIMEOUT)
            try:
                setup.latest("raw")  # creates the table's znodes outside the timed loop
            finally:
                setup.close()
            slots_path = f"{base}/tables/{table_node_name('raw')}/slots"
        else:
            admin.create(f"{base}/counter", b"-1", makepath=True)
            admin.create(f"{base}/slots", b"")
            slots_path = f"{base}/slots"
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(writers)
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_claim_worker, args=(mode, hosts, base, per_writer, w, barrier, results))
            for w in range(writers)
        ]
        rows = _run_processes(procs, results)
        failures = [r[6] for r in rows if r[6]]
        if failures:
            raise RuntimeError(f"claim workers ({mode}) failed: {failures}")
        children = admin.get_children(slots_path)
        assert len(children) == total == len(set(children)), f"{mode}: {len(children)} slots != {total}"
        if mode != "seq":  # the counter makes CAS claims gapless: exactly versions 0..total-1
            assert sorted(int(c) for c in children) == list(range(total)), f"{mode}: slots not gapless"
        latencies = [x for r in rows for x in r[5]]
        with contextlib.suppress(Exception):
            admin.delete(base, recursive=True)
        return ClaimResult(
            mode,
            total,
            max(r[2] for r in rows) - min(r[1] for r in rows),
            sum(r[3] for r in rows),
            sum(r[4] for r in rows),
            1000 * _percentile(latencies, 0.5),
            1000 * _percentile(latencies, 0.99),
        )
    finally:
        with contextlib.suppress(Exception):
            admin.stop()
        admin.close()


def part_claims(hosts: str, writers: int, per_writer: int, repeat: int) -> None:
    print(f"\n## Part 2: claim strategies, plain kazoo on the ensemble ({writers} x {per_writer} slots)\n")
    results: dict[str, list[ClaimResult]] = {}
    for rep in range(repeat):
        for mode in CLAIM_MODES:
            r = run_claims(mode, hosts, writers, per_writer)
            results.setdefault(mode, []).append(r)
            print(
                f"  run {rep + 1}: {mode:5s} {r.per_s:7.1f} slots/s, {r.retries / r.slots:.2f} retries/slot, "
                f"{r.requests / r.slots:.2f} requests/slot, p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms; "
                f"loadavg {_load()}",
                flush=True,
            )
    labels = {
        "cas": "cas: get + txn(set_data(version) + create)",
        "seq": "seq: create(sequence=True)",
        "store": "store: ZooKeeperSlotStore latest() + claim()",
    }
    rows = []
    for mode in CLAIM_MODES:
        runs = results[mode]
        rows.append(
            [
                labels[mode],
                Stat.of([r.per_s for r in runs]).fmt(".0f"),
                Stat.of([r.retries / r.slots for r in runs]).fmt(".2f"),
                Stat.of([r.requests / r.slots for r in runs]).fmt(".2f"),
                Stat.of([r.p50_ms for r in runs]).fmt(".1f"),
                Stat.of([r.p99_ms for r in runs]).fmt(".1f"),
            ]
        )
    print_table(
        f"Claiming consecutive slots, {writers} processes (median [min-max] of runs; retries are immediate)",
        ["strategy", "slots/s", "retries/slot", "requests/slot", "p50 ms/slot", "p99 ms/slot"],
        rows,
    )
    print("verification: every run left exactly one znode per slot; cas and store slots gapless")


# ---------------------------------------------------------------------------------------------
# Part 3: one commit through the ensemble


class _Phases:
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
def _instrumented(phases: _Phases) -> Iterator[Counter[str]]:
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
        counts = _count_requests()
        for owner, name, wrapped in patches:
            setattr(owner, name, wrapped)
        yield counts
    finally:
        KazooClient._call = original_call
        for owner, name, original in originals:
            setattr(owner, name, original)


def _cpu_seconds(pids: Sequence[int]) -> float:
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


def _profile_table(hosts: str) -> tuple[Any, Any, str]:
    """A fresh table on its own ZooKeeperSlotStore (own chroot), warmed up by 5 appends."""
    from eventlog.table import Table
    from lockstore.zookeeper import ZooKeeperSlotStore

    store = ZooKeeperSlotStore(hosts, chroot=f"/bench-profile-{uuid.uuid4().hex[:12]}", timeout=ZK_TIMEOUT)
    tmp = tempfile.mkdtemp(prefix="bench-zk-profile-")
    try:
        path = str(Path(tmp) / "table")
        Table.create(path, SCHEMA, slots=store)
        table = Table.open(path, slots=store)
        for i in range(5):  # warm-up: imports, first data file, kazoo's connection
            table.append(small_batch(9, i))
    except BaseException:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return table, store, tmp


def _warm_up(hosts: str, n: int) -> None:
    """``n`` appends through a fresh table, so that the servers' JIT has compiled the hot paths."""
    table, store, tmp = _profile_table(hosts)
    try:
        for i in range(n):
            table.append(small_batch(8, i))
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _label(key: tuple[str, int, str]) -> str:
    filename, line, func = key
    if filename.startswith(REPO_ROOT):
        filename = os.path.relpath(filename, REPO_ROOT)
    elif filename == "~":
        return func
    else:
        filename = "/".join(Path(filename).parts[-2:])
    return f"{filename}:{line}({func})"


def _request_table(title: str, runs: Sequence[tuple[Counter[str], int]]) -> None:
    """ZooKeeper requests per commit by type; ``runs``: (request counts, commits) per run."""
    kinds = sorted({k for c, _ in runs for k in c}, key=lambda k: -sum(c[k] for c, _ in runs))
    rows = [[k, Stat.of([c[k] / n for c, n in runs]).fmt(".2f")] for k in kinds]
    rows.append(["total", Stat.of([sum(c.values()) / n for c, n in runs]).fmt(".2f")])
    print_table(title, ["request (one round trip each)", "per commit"], rows)


def _phase_table(
    title: str, runs: Sequence[tuple[dict[str, float], float]], extra: Sequence[list[str]]
) -> None:
    """Phases in ms per commit; ``runs``: (ms per commit by phase, total ms per commit) per run."""
    with_rest = [({**p, REST: total - sum(p.values())}, total) for p, total in runs]
    names = sorted(
        {k for p, _ in with_rest for k in p},
        key=lambda k: -statistics.median(p.get(k, 0.0) for p, _ in with_rest),
    )
    total = statistics.median(t for _, t in with_rest)
    rows = [
        [
            name,
            Stat.of([p.get(name, 0.0) for p, _ in with_rest]).fmt(".2f"),
            f"{100 * statistics.median(p.get(name, 0.0) for p, _ in with_rest) / total:.0f}%",
        ]
        for name in names
    ]
    rows.append(["total", Stat.of([t for _, t in with_rest]).fmt(".2f"), "100%"])
    print_table(title, ["phase", "ms per commit", "share"], [*rows, *extra])


def part_profile(
    hosts: str, n: int, contended: int, repeat: int, top: int, server_pids: Sequence[int]
) -> None:
    print(f"\n## Part 3: where the time goes (ensemble; 1 writer x {n}, 4 processes x {contended})\n")
    idle0 = _cpu_seconds(server_pids)
    time.sleep(IDLE_SECONDS)
    idle = (_cpu_seconds(server_pids) - idle0) / IDLE_SECONDS
    print(f"  ZooKeeper JVMs idle (before the runs): {1000 * idle:.0f} ms CPU per second, all 3 together")
    single: list[tuple[Counter[str], dict[str, float], float, float, float]] = []
    for rep in range(repeat):
        table, store, tmp = _profile_table(hosts)
        try:
            start_version = table.version
            phases = _Phases()
            with _instrumented(phases) as counts:
                counts.clear()
                cpu0, server0 = time.process_time(), _cpu_seconds(server_pids)
                t0 = time.perf_counter()
                for i in range(n):
                    table.append(small_batch(0, i))
                wall = time.perf_counter() - t0
                cpu, server = time.process_time() - cpu0, _cpu_seconds(server_pids) - server0
                got = (Counter(counts), {k: 1000 * v / n for k, v in phases.seconds.items()})
            assert table.version == start_version + n
            single.append((*got, 1000 * wall / n, 1000 * cpu / n, 1000 * server / n))
            print(
                f"  1 writer, run {rep + 1}: {1000 * wall / n:.2f} ms/commit ({n / wall:.0f} commits/s), "
                f"{sum(got[0].values()) / n:.2f} ZooKeeper requests/commit, CPU/commit: client "
                f"{1000 * cpu / n:.2f} ms, ZooKeeper JVMs {1000 * server / n:.2f} ms; loadavg {_load()}",
                flush=True,
            )
        finally:
            store.close()
            shutil.rmtree(tmp, ignore_errors=True)

    multi: list[RunResult] = []
    for rep in range(repeat):
        r = run_appends(
            "zk-ensemble", 4, contended, {"zk-ensemble": hosts}, instrument=True, server_pids=server_pids
        )
        multi.append(r)
        print(
            f"  4 processes, run {rep + 1}: {r.commits_per_s:.0f} commits/s (instrumented), "
            f"{r.retries / r.ok:.2f} lost claims/commit, {sum(r.requests.values()) / r.ok:.2f} "
            f"ZooKeeper requests/commit, CPU/commit: clients {1000 * r.cpu / r.ok:.2f} ms, "
            f"ZooKeeper JVMs {1000 * r.server_cpu / r.ok:.2f} ms; loadavg {_load()}",
            flush=True,
        )

    _request_table(
        "1 writer: ZooKeeper requests per commit (median [min-max] over runs)", [(c, n) for c, *_ in single]
    )
    _request_table(
        "4 processes: ZooKeeper requests per successful commit (median [min-max] over runs)",
        [(r.requests, r.ok) for r in multi],
    )

    def cpu_rows(client: Sequence[float], server: Sequence[float]) -> list[list[str]]:
        both = [c + s for c, s in zip(client, server, strict=True)]
        bound = [2 * 1000 / b for b in both if b > 0]
        return [
            ["(CPU) writer process(es), all threads", Stat.of(client).fmt(".2f"), ""],
            ["(CPU) ZooKeeper JVMs", Stat.of(server).fmt(".2f"), ""],
            ["(CPU) 2 cores / CPU per commit = commits/s bound", Stat.of(bound).fmt(".0f"), ""],
        ]

    _phase_table(
        "1 writer: wall time of one commit (instrumented, no profiler)",
        [(p, total) for _, p, total, _, _ in single],
        cpu_rows([s[3] for s in single], [s[4] for s in single]),
    )
    _phase_table(
        "4 processes: writer wall time per successful commit (sum over writers / commits)",
        [({k: 1000 * v / r.ok for k, v in r.phases.items()}, 1000 * r.writer_seconds / r.ok) for r in multi],
        [
            ["lost claims per commit", Stat.of([r.retries / r.ok for r in multi]).fmt(".2f"), ""],
            *cpu_rows([1000 * r.cpu / r.ok for r in multi], [1000 * r.server_cpu / r.ok for r in multi]),
        ],
    )

    table, store, tmp = _profile_table(hosts)
    try:
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for i in range(n):
            table.append(small_batch(0, i))
        prof.disable()
        wall = time.perf_counter() - t0
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    stats = pstats.Stats(prof, stream=io.StringIO())
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    ours = sorted(
        ((k, v) for k, v in raw.items() if k[0].startswith(OUR_PACKAGES)),
        key=lambda kv: kv[1][3],
        reverse=True,
    )
    print(
        f"cProfile, 1 writer: {n} appends in {wall:.3f} s under the profiler "
        f"({1000 * wall / n:.2f} ms/commit)"
    )
    print_table(
        "Our code by cumulative time (cProfile, main thread)",
        ["function", "calls", "cumulative s", "ms/commit", "own s"],
        [
            [_label(k), nc, f"{ct:.3f}", f"{1000 * ct / n:.2f}", f"{tt:.3f}"]
            for k, (_c, nc, tt, ct, _) in ours[:top]
        ],
    )
    by_own = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    print_table(
        "All functions by own time (cProfile, main thread)",
        ["function", "calls", "own s", "cumulative s"],
        [[_label(k), nc, f"{tt:.3f}", f"{ct:.3f}"] for k, (_c, nc, tt, ct, _) in by_own],
    )


# ---------------------------------------------------------------------------------------------
# Driver


def _load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (median and range)")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)} (default: all)"
    )
    parser.add_argument("--top", type=int, default=15, help="rows of the cProfile tables")
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the servers


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from tests.support.zkserver import ZooKeeperEnsemble, ZooKeeperServer

    os.environ.pop("EVENTLOG_SLOTS", None)  # "embedded" must mean the default store
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    sizes = {1: 30, 4: 15} if args.quick else {1: 300, 4: 150}
    claims_per_writer = 30 if args.quick else 300
    profile_appends = 50 if args.quick else 200
    warm_up = 100 if args.quick else 500
    print(f"# bench_zookeeper ({'quick' if args.quick else 'full'}): {machine_note()}")
    print(f"parts: {', '.join(args.parts)}; {args.repeat} runs each")
    standalone = ZooKeeperServer(force_sync=True)
    ensemble = ZooKeeperEnsemble(3, force_sync=True)
    ok = True
    try:
        t0 = time.perf_counter()
        standalone.start()
        ensemble.start()
        print(
            f"ZooKeeper: standalone {standalone.hosts} ({standalone.mode()}); ensemble {ensemble.hosts} "
            f"({', '.join(str(m) for m in ensemble.modes())}); forceSync=yes, tickTime 2000 ms; "
            f"started in {time.perf_counter() - t0:.1f} s"
        )
        hosts = {
            "zk-standalone": standalone.hosts,
            "zk-ensemble": ensemble.hosts,
            "zk-ensemble-group": ensemble.hosts,
        }
        ensemble_pids = [node.pid for node in ensemble.nodes if node.pid is not None]
        pids = {
            "zk-standalone": [p for p in [standalone.pid] if p is not None],
            "zk-ensemble": ensemble_pids,
            "zk-ensemble-group": ensemble_pids,
        }
        for config in ("zk-standalone", "zk-ensemble"):  # the JVMs start cold (C1 JIT)
            t0 = time.perf_counter()
            _warm_up(hosts[config], warm_up)
            print(f"warm-up: {warm_up} appends through {config} in {time.perf_counter() - t0:.1f} s")
        if "appends" in args.parts:
            ok = part_appends(hosts, pids, sizes, args.repeat) and ok
        if "claims" in args.parts:
            part_claims(ensemble.hosts, 4, claims_per_writer, args.repeat)
        if "profile" in args.parts:
            part_profile(
                ensemble.hosts, profile_appends, sizes[4], args.repeat, args.top, pids["zk-ensemble"]
            )
    finally:
        try:
            ensemble.close()
        finally:
            standalone.close()
            signal.signal(signal.SIGTERM, previous)
        print(f"servers stopped; loadavg {_load()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
