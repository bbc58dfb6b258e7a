"""The "bank transfer" lost-update workload: processes move money between accounts.

Each transfer is one MERGE staged in an explicit transaction: the source holds two rows,
``(from, -amount)`` and ``(to, +amount)``, and ``WHEN MATCHED UPDATE SET balance =
t.balance + s.delta`` reads each balance at the transaction's snapshot. A short pause
between staging and ``commit()`` lets other processes commit in between. If a commit
ever published an update computed from a stale balance (a lost update), money would be
created or destroyed: the total balance changes, and the balances differ from replaying
the acknowledged transfers in version order. Conflicting transfers are retried with a
fresh transaction.

A partitioned bank (``partitioned=True``) keeps accounts in two branches (the partition
column), one data file each; a transfer's ON names the branches of its two accounts, so
transfers within one branch change different rows of one file (row-level concurrency on
deletion-vector tables) and transfers across branches touch two partitions.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from eventlog import DeltaConcurrentModificationException, Table
from eventlog.log.commitlog import SlotsSpec
from eventlog.log.storage import LogStore

SCHEMA = pa.schema([("id", pa.int64()), ("balance", pa.int64())])
PARTITIONED = pa.schema([("id", pa.int64()), ("branch", pa.string()), ("balance", pa.int64())])
SOURCE = pa.schema([("id", pa.int64()), ("delta", pa.int64())])
ACCOUNTS = 8
OPENING = 1000
MAX_ATTEMPTS = 300


@dataclass
class TransferResult:
    worker: int
    acks: list[dict[str, Any]] = field(default_factory=list)
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)


def create_bank(
    uri: str,
    properties: dict[str, str],
    slots: SlotsSpec = None,
    *,
    partitioned: bool = False,
    clustered: bool = False,
) -> Table:
    """Accounts 0..ACCOUNTS-1 with OPENING each, in two data files (two branches when
    ``partitioned``; clustered by ``id`` when ``clustered``)."""
    schema = PARTITIONED if partitioned else SCHEMA
    t = Table.create(
        uri,
        schema,
        properties=properties,
        slots=slots,
        partition_by=["branch"] if partitioned else None,
        cluster_by=["id"] if clustered else None,
    )
    half = ACCOUNTS // 2
    for ids in (range(half), range(half, ACCOUNTS)):
        columns: dict[str, list[Any]] = {"id": list(ids), "balance": [OPENING] * len(ids)}
        if partitioned:
            columns["branch"] = [branch(i) for i in ids]
        t.append(pa.table(columns, schema=schema))
    return t


def branch(account: int) -> str:
    """The branch (partition) of an account in a partitioned bank."""
    return f"b{account // (ACCOUNTS // 2)}"


def transfer_worker(
    uri: str,
    worker: int,
    transfers: int,
    seed: int,
    out: Any,
    slots: SlotsSpec,
    start: Any,
    partitioned: bool = False,
) -> None:
    rng = random.Random(seed)
    table = Table.open(uri, slots=slots)
    result = TransferResult(worker)
    start.wait()
    for _ in range(transfers):
        a, b = rng.sample(range(ACCOUNTS), 2)
        amount = rng.randint(1, 50)
        source = pa.table({"id": [a, b], "delta": [-amount, amount]}, schema=SOURCE)
        for _attempt in range(MAX_ATTEMPTS):
            txn = table.transaction()
            on = f"t.id = s.id AND t.id IN ({a}, {b})"
            if partitioned:  # name the partitions, as Delta's docs advise
                on += f" AND t.branch IN ('{branch(a)}', '{branch(b)}')"
            txn.merge(source, on, source_alias="s", target_alias="t").when_matched_update(
                set={"balance": "t.balance + s.delta"}
            ).execute()
            time.sleep(rng.uniform(0, 0.01))  # let others commit between read and commit
            try:
                res = txn.commit()
            except DeltaConcurrentModificationException:
                result.conflicts += 1
                continue
            result.acks.append(
                {"version": res.version, "txn": res.txn_id, "from": a, "to": b, "amount": amount}
            )
            break
        else:
            result.errors.append(f"transfer {a}->{b} gave up after {MAX_ATTEMPTS} conflicts")
    out.put(result)


def run_transfers(
    uri: str,
    workers: int,
    transfers: int,
    *,
    slots: str | None = None,
    timeout: float = 240.0,
    partitioned: bool = False,
) -> list[TransferResult]:
    """Run ``workers`` spawned processes, started together; return their results."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = ctx.Event()
    procs = [
        ctx.Process(
            target=transfer_worker, args=(uri, w, transfers, 7000 + w, queue, slots, start, partitioned)
        )
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    start.set()
    results = [queue.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"transfer process exited with {p.exitcode}"
    return results


def check_bank(uri: str, results: list[TransferResult], *, slots: SlotsSpec = None) -> dict[int, int]:
    """Assert the invariants; return the balances.

    Versions are gapless; every acknowledged transfer is in the log exactly once, at its
    version, and nothing else landed; the total balance is unchanged; every balance equals
    the replay of the acknowledged transfers in version order.
    """
    assert not [e for r in results for e in r.errors]
    acks = [a for r in results for a in r.acks]
    versions = LogStore.commit_versions(LogStore(uri).list_log())
    assert versions == list(range(len(versions))), "versions are not gapless"
    table = Table.open(uri, slots=slots)
    history = {h["version"]: h for h in table.history()}
    merges = {v: h["txnId"] for v, h in history.items() if h["operation"] == "MERGE"}
    assert sorted(merges.values()) == sorted(a["txn"] for a in acks), "a transfer is missing or landed twice"
    for ack in acks:
        assert merges[ack["version"]] == ack["txn"]
    assert len(history) == 3 + len(acks)  # CREATE TABLE, two seeding appends, the transfers
    balances = {r["id"]: r["balance"] for r in table.to_arrow().to_pylist()}
    assert len(balances) == ACCOUNTS and table.to_arrow().num_rows == ACCOUNTS
    assert sum(balances.values()) == ACCOUNTS * OPENING, "money was created or destroyed (a lost update)"
    replay = dict.fromkeys(range(ACCOUNTS), OPENING)
    for ack in sorted(acks, key=lambda a: a["version"]):
        replay[ack["from"]] -= ack["amount"]
        replay[ack["to"]] += ack["amount"]
    assert balances == replay
    report = table.verify()
    assert report.ok, report
    return balances
