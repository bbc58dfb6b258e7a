"""bench_zookeeper part 2: claiming consecutive slots with plain kazoo (cas, seq) and with
our ZooKeeperSlotStore, from 4 processes.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench._common import Stat, print_table
from bench._zkcommon import (
    CLAIM_MODES,
    CLAIM_PAYLOAD,
    RESULT_TIMEOUT,
    ZK_TIMEOUT,
    count_requests,
    loadavg,
    run_processes,
)


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


def _claim_worker(mode: str, hosts: str, base: str, n: int, writer: int, barrier: Any, results: Any) -> None:
    """One claimer process: take ``n`` consecutive slots the ``mode`` way."""
    client: Any = None
    store: Any = None
    try:
        from kazoo.client import KazooClient

        from lockstore.base import SlotClaim, default_owner

        counts = count_requests()
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
        rows = run_processes(procs, results)
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
                f"loadavg {loadavg()}",
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
