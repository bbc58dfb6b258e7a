"""Every conflict exception type, raised by real concurrent transactions, with its fields."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import (
    CommitFailedError,
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    EventlogError,
    MetadataChangedException,
    ProtocolChangedException,
    RetryPolicy,
    Table,
    Transaction,
)
from eventlog.log.actions import Metadata, Protocol
from eventlog.log.storage import LogStore
from lockstore import InMemorySlotStore, SlotClaim
from tests.conftest import SCHEMA, rows, sorted_ids


def _table(uri: str, partitioned: bool = True) -> Table:
    t = Table.create(uri, SCHEMA, partition_by=["date"] if partitioned else None)
    t.append(rows([1, 2], "2024-01-01"))
    t.append(rows([3, 4], "2024-01-02"))
    return t


def test_hierarchy_matches_delta() -> None:
    for cls in (
        ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentDeleteDeleteException,
        MetadataChangedException, ProtocolChangedException, ConcurrentTransactionException,
        ConcurrentWriteException,
    ):  # fmt: skip
        assert issubclass(cls, DeltaConcurrentModificationException)
        assert issubclass(cls, EventlogError)
    assert issubclass(CommitFailedError, EventlogError)
    assert not issubclass(CommitFailedError, DeltaConcurrentModificationException)


def test_concurrent_append_fields_and_pickling(local_uri: str) -> None:
    t = _table(local_uri)
    loser = Table.open(local_uri).transaction()
    loser.delete("date = '2024-01-01' AND x = 1")
    t.append(rows([5], "2024-01-01"))  # blind append, ignored under WriteSerializable ...
    t.update("date = '2024-01-01'", set={"y": "0"})  # ... but this rewrite is not
    with pytest.raises(ConcurrentAppendException) as info:
        loser.commit()
    err = info.value
    assert (err.winning_version, err.operation, err.partition) == (4, "UPDATE", "[date=2024-01-01]")
    assert err.isolation_level == "WriteSerializable"
    assert err.conflict_type == "ConcurrentAppend"
    assert err.winning_commit_info["operation"] == "UPDATE"
    assert err.winning_commit_info["txnId"]
    assert "DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT" in str(err)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is ConcurrentAppendException
    assert (clone.winning_version, clone.partition, clone.operation) == (4, "[date=2024-01-01]", "UPDATE")
    assert str(clone) == str(err)


def test_concurrent_delete_read(local_uri: str) -> None:
    """The winner removed a whole file this transaction read and added nothing."""
    t = _table(local_uri)
    loser = Table.open(local_uri).transaction()
    loser.update("date = '2024-01-01'", set={"x": "x * 2"})
    t.delete("date = '2024-01-01'")  # partition-only: removes files, adds none
    with pytest.raises(ConcurrentDeleteReadException) as info:
        loser.commit()
    assert info.value.partition == "[date=2024-01-01]"
    assert info.value.operation == "DELETE"
    assert sorted_ids(t) == [3, 4]


def test_optimize_survives_appends_but_not_deletes(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    for i in range(3):
        t.append(rows([i]))
    compactor = Table.open(local_uri).transaction()
    compactor.optimize()
    t.append(rows([10]))
    result = compactor.commit()  # snapshot isolation: concurrent appends are fine
    assert result.version == 5
    assert len(t.files()) == 2
    assert sorted_ids(t) == [0, 1, 2, 10]
    info = t.history(1)[0]
    assert info["isolationLevel"] == "SnapshotIsolation"
    compactor2 = Table.open(local_uri).transaction()
    compactor2.optimize()
    t.delete("x = 10")
    with pytest.raises(ConcurrentDeleteReadException):
        compactor2.commit()


def test_concurrent_delete_delete(local_uri: str) -> None:
    """Two commits remove the same file without the loser having read it (e.g. a dynamic
    partition overwrite in an adapter); the loser gets DeleteDelete, naming the partition."""
    t = _table(local_uri)
    victim = next(f for f in t.snapshot().add_files if f.partition_values["date"] == "2024-01-02")
    loser = Table.open(local_uri).transaction()
    loser.set_operation("WRITE", {"mode": "Overwrite"})
    loser.remove_files([victim])
    t.delete("date = '2024-01-02'")
    with pytest.raises(ConcurrentDeleteDeleteException) as info:
        loser.commit()
    assert info.value.partition == "[date=2024-01-02]"


@pytest.mark.parametrize("change", ["set_properties", "add_columns", "merge_schema"])
def test_metadata_change_fails_concurrent_writes(local_uri: str, change: str) -> None:
    t = _table(local_uri)
    writer = Table.open(local_uri).transaction()
    writer.append(rows([9], "2024-01-03"))
    if change == "set_properties":
        t.set_properties({"delta.isolationLevel": "Serializable"})
    elif change == "add_columns":
        t.add_columns([pa.field("z", pa.string())])
    else:
        extra = rows([5], "2024-01-01").append_column("z", pa.array(["new"]))
        t.append(extra, schema_mode="merge")
    with pytest.raises(MetadataChangedException) as info:
        writer.commit()
    assert "Conflicting commit" in str(info.value)
    assert 9 not in sorted_ids(t)


def test_two_creators_get_protocol_changed_with_empty_dir_hint(local_uri: str) -> None:
    slots = InMemorySlotStore()
    Table.create(local_uri, SCHEMA, slots=slots)
    # A second creator that checked the path before the first committed: its creation
    # transaction read the empty state (no snapshot) and commits after the winner.
    loser_table = Table(LogStore(local_uri), slots, None)
    txn = Transaction(loser_table, None)
    txn.set_operation("CREATE TABLE", {})
    txn.update_protocol(Protocol(1, 2))
    schema_string = Table.open(local_uri, slots).snapshot().metadata.schema_string
    txn.update_metadata(Metadata(id=Metadata.new_id(), schema_string=schema_string))
    with pytest.raises(ProtocolChangedException) as info:
        txn.commit()
    assert info.value.winning_version == 0
    assert "writing to an empty directory" in str(info.value)


def test_same_app_id_concurrently_is_concurrent_transaction(local_uri: str) -> None:
    t = _table(local_uri)
    first = Table.open(local_uri).transaction()
    assert first.idempotent("stream-1", 0)
    first.append(rows([10], "2024-01-05"))
    second = Table.open(local_uri).transaction()
    assert second.idempotent("stream-1", 0)
    second.append(rows([10], "2024-01-05"))
    first.commit()
    with pytest.raises(ConcurrentTransactionException):
        second.commit()
    assert sorted_ids(t).count(10) == 1
    assert t.snapshot().txn_version("stream-1") == 0


def test_domain_metadata_conflict(local_uri: str) -> None:
    t = _table(local_uri)
    a = t.transaction()
    a.set_operation("Manual Update")
    a.set_domain_metadata("myapp.config", '{"k": 1}')
    b = Table.open(local_uri).transaction()
    b.set_operation("Manual Update")
    b.set_domain_metadata("myapp.config", '{"k": 2}')
    a.commit()
    with pytest.raises(ConcurrentTransactionException) as info:
        b.commit()
    assert "A conflicting metadata domain myapp.config is added." in str(info.value)
    assert t.snapshot().domains["myapp.config"].configuration == '{"k": 1}'


def test_restore_fails_on_any_concurrent_commit(local_uri: str) -> None:
    t = _table(local_uri)
    restorer = Table.open(local_uri).transaction()
    restorer.restore(1)
    t.append(rows([5], "2024-01-09"))
    with pytest.raises(ConcurrentWriteException):
        restorer.commit()
    t.restore(1)
    assert sorted_ids(t) == [1, 2]
    assert t.history(1)[0]["operation"] == "RESTORE"
    t.restore(0)
    assert sorted_ids(t) == []


def test_retry_exhaustion_is_commit_failed_with_cause(local_uri: str) -> None:
    """A slot store whose next slot is always taken: the commit fails after the budget,
    sleeping between attempts, and leaves no staged commit or data file behind."""
    slots = InMemorySlotStore()
    t = Table.create(local_uri, SCHEMA, slots=slots)
    sleeps: list[float] = []

    class Stubborn(InMemorySlotStore):
        def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
            return False

    policy = RetryPolicy(max_attempts=5, sleep=sleeps.append, rng=random.Random(1))
    stuck = Table.open(local_uri, slots=Stubborn(), retry_policy=policy)
    before = sorted(p.name for p in Path(local_uri).rglob("*.parquet"))
    with pytest.raises(CommitFailedError) as info:
        stuck.append(rows([1]))
    assert info.value.attempts == 5
    assert len(sleeps) == 4 and all(s > 0 for s in sleeps)
    assert sleeps == sorted(sleeps) or max(sleeps) <= policy.max_delay * 1.5
    after = sorted(p.name for p in Path(local_uri).rglob("*.parquet"))
    assert after == before  # the staged data file was deleted
    assert Path(local_uri, "_eventlog", "staged").is_dir()  # where the commit was staged ...
    assert not list(Path(local_uri, "_eventlog", "staged").glob("*.json"))  # ... and deleted from
    assert t.version == 0
