"""A list-append history from several processes, checked for the cycles serializability
forbids (tests/support/history.py, after Elle).

Keys are partitions of one table (``k``); a list is the elements (``v``) of its rows in the
order of the versions that appended them. Each transaction picks one or two keys, reads
their lists at its snapshot, and appends one element to each with one MERGE (``ON t.k IN
(...) AND t.k = s.k AND t.v = s.v ... WHEN NOT MATCHED THEN INSERT *``), so its reads are
the MERGE's: the partitions of its keys. Three processes run such transactions at once,
under Serializable and WriteSerializable; some lose to conflicts (Delta's exceptions), the
rest commit. The final lists are read back from the log itself (each version's added
files), not from what the clients say. Then: no G0, G1c or G2 cycle, no read that is not a
prefix of its list, no aborted element anywhere, nothing lost or duplicated, versions
gapless and ``verify`` passing.
"""

from __future__ import annotations

import multiprocessing as mp
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventlog import DeltaConcurrentModificationException, Table
from eventlog.log.storage import LogStore
from tests.support.history import Anomaly, Txn, check

KEYS = ["a", "b", "c", "d"]
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def _client(uri: str, client: int, count: int, seed: int, start: Any, out: Any) -> None:
    table = Table.open(uri)
    rng = random.Random(seed)
    done = []
    start.wait(timeout=60)
    for i in range(count):
        keys = sorted(rng.sample(KEYS, rng.choice([1, 2])))
        element = client * 1_000 + i
        txn = table.transaction()
        record: dict[str, Any] = {"name": f"c{client}-{i}", "keys": keys, "element": element}
        record["read_version"] = txn.read_version
        # What the transaction reads: its keys' elements at its snapshot.
        seen = table.to_arrow(
            version=txn.read_version, filter="k IN ({})".format(", ".join(f"'{k}'" for k in keys))
        )
        record["seen"] = {
            k: [v for kk, v in zip(seen["k"].to_pylist(), seen["v"].to_pylist(), strict=True) if kk == k]
            for k in keys
        }
        source = pa.table({"k": keys, "v": [element] * len(keys)}, schema=SCHEMA)
        within = ", ".join(f"'{k}'" for k in keys)
        try:
            txn.merge(
                source,
                on=f"t.k IN ({within}) AND t.k = s.k AND t.v = s.v",
                source_alias="s",
                target_alias="t",
            ).when_not_matched_insert_all().execute()
            record["version"] = txn.commit().version
        except DeltaConcurrentModificationException as exc:
            record["aborted"] = type(exc).__name__
        done.append(record)
    table.close()
    out.put(done)


def _final_lists(uri: str) -> tuple[dict[str, list[int]], dict[int, int]]:
    """Each key's list, from the log: the rows of the files each version added, in version
    order; and the version each element was appended in."""
    table = Table.open(uri)
    lists: dict[str, list[int]] = {k: [] for k in KEYS}
    version_of: dict[int, int] = {}
    for commit in table.commits_between(1, table.version):
        for add in commit.adds:
            rows = pq.read_table(Path(uri) / add.path)
            for v in rows["v"].to_pylist():
                lists[add.partition_values["k"] or ""].append(v)
                version_of[v] = commit.version
    return lists, version_of


@pytest.mark.parametrize("level", ["Serializable", "WriteSerializable"])
def test_concurrent_read_then_append_transactions_form_no_forbidden_cycle(tmp_path: Path, level: str) -> None:
    uri = str(tmp_path / "t")
    Table.create(uri, SCHEMA, partition_by=["k"], properties={"delta.isolationLevel": level}).close()
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(3)
    procs = [
        ctx.Process(target=_client, args=(uri, c, 12, 100 * c + len(level), start, out)) for c in (1, 2, 3)
    ]
    for p in procs:
        p.start()
    records = [r for _ in procs for r in out.get(timeout=300)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    committed = [r for r in records if "version" in r]
    aborted = [r for r in records if "aborted" in r]
    assert committed and len(committed) + len(aborted) == 36
    lists, version_of = _final_lists(uri)
    txns = []
    for r in committed:
        reads = {k: tuple(sorted(r["seen"][k], key=lambda e: version_of.get(e, -1))) for k in r["keys"]}
        txns.append(Txn(r["name"], reads, {k: r["element"] for k in r["keys"]}))
    anomalies: list[Anomaly] = check(txns, lists, aborted=[r["element"] for r in aborted])
    assert anomalies == []
    # The acknowledged versions are each committed txn's, once, gapless after the create.
    assert sorted(r["version"] for r in committed) == list(range(1, len(committed) + 1))
    assert LogStore.commit_versions(LogStore(uri).list_log()) == list(range(len(committed) + 1))
    assert all(version_of[r["element"]] == r["version"] for r in committed)
    report = Table.open(uri).verify()
    assert (report.ok, report.problem) == (True, None)
