"""Nothing of ours under ``_delta_log/``: only the names the Delta protocol defines, after
every kind of operation (Delta's ``_staged_commits/`` is for catalog-managed commits, and
Delta Spark's log cleanup deletes and parses what it finds there)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pytest

from eventlog import DeltaConcurrentModificationException, Table
from eventlog.log.storage import LEGACY_STAGED_DIR
from eventlog.txn.attempt import CommitAttempt
from lockstore import EmbeddedSlotStore, SlotClaim
from tests.conftest import SCHEMA, rows, sorted_ids

# PROTOCOL.md "Delta Log Entries", "Checkpoints", "Log Compaction Files", "Version
# Checksum File", "Last Checkpoint File", sidecars and (reserved) catalog-managed commits.
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
DELTA_NAMES = re.compile(
    r"^(?:"
    r"\d{20}\.json"
    r"|\d{20}\.crc"
    r"|\d{20}\.checkpoint\.parquet"
    r"|\d{20}\.checkpoint\.\d{10}\.\d{10}\.parquet"
    rf"|\d{{20}}\.checkpoint\.{_UUID}\.(?:json|parquet)"
    r"|\d{20}\.\d{20}\.compacted\.json"
    r"|_last_checkpoint"
    rf"|_sidecars/{_UUID}\.parquet"
    rf"|_staged_commits/\d{{20}}\.{_UUID}\.json"
    r")$"
)


def _log_names(t: Table) -> list[str]:
    fs, log_dir = t.log.fs, t.log.log_dir
    return sorted(p[len(fs._strip_protocol(log_dir)) + 1 :] for p in fs.find(log_dir))


def _staged_names(t: Table) -> list[str]:
    return t.log.list_staged()


def _assert_only_delta_names(t: Table, after: str) -> None:
    foreign = [name for name in _log_names(t) if not DELTA_NAMES.match(name)]
    assert foreign == [], f"after {after}: not Delta protocol names under _delta_log/: {foreign}"


def test_the_name_patterns_tell_delta_files_from_others() -> None:
    for name in ("00000000000000000003.json", "00000000000000000010.checkpoint.parquet", "_last_checkpoint"):
        assert DELTA_NAMES.match(name)
    for name in ("_staged_commits/0f8c2b1e-2b7c-4c55-9a4e-3f1e2d3c4b5a.json", "_staged_commits/q-1-2-x.json"):
        assert not DELTA_NAMES.match(name)
    assert DELTA_NAMES.match("_staged_commits/00000000000000000003.0f8c2b1e-2b7c-4c55-9a4e-3f1e2d3c4b5a.json")


def _conflict(t: Table) -> None:
    loser = Table.open(t.uri).transaction()
    loser.delete("id = 4")
    t.delete("id = 4")  # the same row, deleted by the winner
    with pytest.raises(DeltaConcurrentModificationException):
        loser.commit()


def _aborted(t: Table) -> None:
    txn = t.transaction()
    txn.append(rows([60]))
    txn.abort()


def _group_commit(t: Table) -> None:
    handles = [Table.open(t.uri, group_commit=True) for _ in range(4)]
    threads = [threading.Thread(target=h.append, args=(rows([70 + i]),)) for i, h in enumerate(handles)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)


def _merge(t: Table) -> None:
    source = rows([3, 80])
    t.merge(source, "target.id = source.id").when_matched_update_all().when_not_matched_insert_all().execute()


CLEANUP = {
    "delta.logRetentionDuration": "interval 0 seconds",
    "eventlog.auditRetentionDuration": "interval 0 seconds",
}
STEPS: list[tuple[str, Callable[[Table], object]]] = [
    ("appends", lambda t: [t.append(rows([i])) for i in range(1, 5)]),
    ("an overwrite with replaceWhere", lambda t: t.overwrite(rows([4]), replace_where="id = 4")),
    ("a deletion-vector DELETE", lambda t: t.delete("id = 2")),
    ("an UPDATE", lambda t: t.update("id = 3", {"x": "7"})),
    ("a MERGE", _merge),
    ("a conflict", _conflict),
    ("an aborted transaction", _aborted),
    ("group commit", _group_commit),
    ("OPTIMIZE ZORDER", lambda t: t.optimize(zorder_by=["id"])),
    ("a checkpoint", lambda t: t.checkpoint()),
    ("RESTORE", lambda t: t.restore(3)),
    ("properties", lambda t: t.set_properties({"delta.appendOnly": "false"})),
    ("VACUUM", lambda t: t.vacuum(retention_hours=0, enforce_retention=False)),
    ("log cleanup", lambda t: [t.set_properties(CLEANUP), t.append(rows([90])), t.checkpoint()]),
]


def test_only_delta_names_under_the_log_after_every_kind_of_operation(any_uri: str) -> None:
    properties = {"delta.enableDeletionVectors": "true", "delta.checkpointInterval": "5"}
    t = Table.create(any_uri, SCHEMA, properties=properties)
    _assert_only_delta_names(t, "create")
    for what, step in STEPS:
        step(t)
        _assert_only_delta_names(t, what)
        assert _staged_names(t) == [], f"after {what}: staged commits left behind"
    names = _log_names(t)
    assert min(n for n in names if n.endswith(".json")) != "00000000000000000000.json"  # cleaned up
    assert Table.open(any_uri).version == t.version


def test_staged_commits_live_in_the_tables_own_area(any_uri: str) -> None:
    t = Table.create(any_uri, SCHEMA)
    t.append(rows([1]))
    loop = CommitAttempt(t, _pending(t, [2]))
    t.log.stage(loop.staged_name, loop.bytes(2))
    fs = t.log.fs
    assert fs.exists(f"{t.log.root}/_eventlog/staged/{loop.staged_name}")
    assert not fs.exists(f"{t.log.root}/{LEGACY_STAGED_DIR}")


def _pending(t: Table, ids: list[int]) -> Any:
    txn = Table.open(t.uri).transaction()
    txn.append(rows(ids))
    return txn.pending()


def test_a_claim_staged_the_old_way_is_still_recovered(local_uri: str) -> None:
    """A table laid out by an earlier release: a writer claimed version 2 and died, its
    staged commit in ``_delta_log/_staged_commits/``. Readers publish it from there."""
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    dead = Table.open(local_uri).transaction()
    dead.append(rows([2]))
    loop = CommitAttempt(dead.table, dead.pending())
    data = loop.bytes(2)
    legacy = Path(local_uri) / LEGACY_STAGED_DIR
    legacy.mkdir(parents=True)
    (legacy / loop.staged_name).write_bytes(data)
    slots = EmbeddedSlotStore(Path(local_uri) / "_eventlog" / "slots")
    assert slots.claim(t.key, 2, SlotClaim(dead.txn_id, loop.staged_name))
    reader = Table.open(local_uri)
    assert reader.version == 2 and sorted_ids(reader) == [1, 2]
    assert (Path(local_uri) / "_delta_log" / f"{2:020d}.json").read_bytes() == data
    assert slots.get(t.key, 2).complete  # type: ignore[union-attr]
    assert t.append(rows([3])).version == 3
    assert reader.vacuum(retention_hours=0, enforce_retention=False) == [
        f"{t.uri}/{LEGACY_STAGED_DIR}/{loop.staged_name}"
    ]
    assert list(legacy.iterdir()) == [] and sorted_ids(Table.open(local_uri)) == [1, 2, 3]


def test_a_claim_staged_the_old_way_on_an_object_store_is_still_recovered(memory_uri: str) -> None:
    t = Table.create(memory_uri, SCHEMA)
    t.append(rows([1]))
    dead = Table.open(memory_uri).transaction()
    dead.append(rows([2]))
    loop = CommitAttempt(dead.table, dead.pending())
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{t.log.root}/{LEGACY_STAGED_DIR}/{loop.staged_name}", loop.bytes(2))
    assert t.slots.claim(t.key, 2, SlotClaim(dead.txn_id, loop.staged_name))
    assert sorted_ids(Table.open(memory_uri)) == [1, 2]
    assert pa.table(Table.open(memory_uri).to_arrow()).num_rows == 2
