"""The streaming sink on the engine alone (no Spark): exactly-once batch commits, replays,
file names, provenance, complete mode, metadata changes, the commit-time backstop against
two runs of one query, auto-compaction and VACUUM of an interrupted batch's orphans."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from eventlog import ConcurrentTransactionException, MetadataChangedException, Table
from eventlog.errors import InvalidInputError, SchemaMismatchError
from eventlog.log.actions import Protocol
from lockstore import LocalFileSlotStore
from streaming import compaction
from streaming.batchfiles import abort_batch, batch_file_prefix, parse_batch_file_name, write_batch_files
from streaming.compaction import AUTO_COMPACT_KEY, CompactionOutcome
from streaming.ownership import (
    StoreLocator,
    acquire_checkpoint,
    claim_checkpoint,
    lease_name,
    process_start_token,
    verify_checkpoint,
)
from streaming.plan import SinkOptions, plan_batch
from streaming.sink import STREAMING_FIELD, STREAMING_OPERATION, BatchCommit, MicroBatchSink, commit_batch

QUERY = "0c5a3c9e-1111-4222-8333-944455556666"


def batch(ids: list[int], part: str = "a") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "p": pa.array([part] * len(ids), pa.string())})


def ids(uri: str) -> list[int]:
    with Table.open(uri) as t:
        return sorted(t.to_arrow().column("id").to_pylist())


def data_files_on_disk(uri: str) -> list[str]:
    out = []
    for directory, dirs, names in os.walk(uri):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        rel = os.path.relpath(directory, uri)
        out += [n if rel == "." else f"{rel}/{n}" for n in names if n.endswith(".parquet")]
    return sorted(out)


def sink(uri: str, run: str = "run-1", **options: object) -> MicroBatchSink:
    return MicroBatchSink(uri, query_id=QUERY, run_id=run, options=SinkOptions(**options))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- exactly once


def test_each_batch_commits_once_with_its_txn_version(local_uri: str) -> None:
    s = sink(local_uri)
    results = [s.process(b, batch([b * 10, b * 10 + 1])) for b in range(3)]
    assert [r.version for r in results] == [0, 1, 2]
    assert ids(local_uri) == [0, 1, 10, 11, 20, 21]
    with Table.open(local_uri) as t:
        assert t.refresh().txn_version(QUERY) == 2


def test_a_replayed_batch_commits_nothing_and_deletes_its_files(local_uri: str) -> None:
    s = sink(local_uri)
    for b in range(3):
        s.process(b, batch([b]))
    before = data_files_on_disk(local_uri)
    # The engine replays its last batch (its commit was not recorded in the engine's
    # checkpoint), in this run and in a restarted one: nothing is written twice.
    assert s.process(2, batch([2])).skipped
    restarted = sink(local_uri, run="run-2")
    assert restarted.process(2, batch([2])).skipped
    assert ids(local_uri) == [0, 1, 2]
    with Table.open(local_uri) as t:
        assert t.version == 2
    assert data_files_on_disk(local_uri) == before  # the replays' files are gone
    assert restarted.process(3, batch([3])).version == 3
    assert ids(local_uri) == [0, 1, 2, 3]


def test_files_are_named_by_query_batch_and_task(local_uri: str) -> None:
    s = sink(local_uri, partition_by=("p",))
    plan = s.plan(batch([0]).schema)
    files = [s.write(plan, 7, batch([1, 2], part), task=task) for task, part in enumerate(["a", "b"])]
    commit_batch(plan, files, query_id=QUERY, run_id="r", batch_id=7)
    names = data_files_on_disk(local_uri)
    assert len(names) == 2
    for name in names:
        assert name.split("/")[-1].startswith(f"part-{batch_file_prefix(QUERY, 7)}-t")
        assert parse_batch_file_name(name)[:2] == (QUERY, 7)  # type: ignore[index]
    assert sorted(parse_batch_file_name(n)[2] for n in names) == [0, 1]  # type: ignore[index]
    assert parse_batch_file_name("part-00000-0d2c.c000.snappy.parquet") is None  # batch writes
    assert batch_file_prefix("a/b c", 1, 2) == "a_b_c-b1-t2"  # never a path


def test_commit_info_records_query_run_and_batch(local_uri: str) -> None:
    s = sink(local_uri, user_metadata="nightly")
    s.process(0, batch([1]))
    sink(local_uri, run="run-2", app_id="my-app").process(1, batch([2]))
    with Table.open(local_uri) as t:
        newest, oldest = t.history()
        assert t.refresh().txn_version("my-app") == 1
    assert oldest["operation"] == STREAMING_OPERATION
    assert oldest["operationParameters"] == {
        "outputMode": "Append",
        "queryId": QUERY,
        "epochId": "0",
        "runId": "run-1",
    }
    assert oldest[STREAMING_FIELD] == {"queryId": QUERY, "runId": "run-1", "batchId": 0, "appId": QUERY}
    assert oldest["userMetadata"] == "nightly"
    assert oldest["isBlindAppend"] is True
    assert oldest["operationMetrics"]["numOutputRows"] == "1"
    assert newest[STREAMING_FIELD] == {"queryId": QUERY, "runId": "run-2", "batchId": 1, "appId": "my-app"}


def test_complete_mode_replaces_the_table_every_batch(local_uri: str) -> None:
    s = MicroBatchSink(local_uri, query_id=QUERY, run_id="r", complete=True)
    s.process(0, batch([1, 2]))
    s.process(1, batch([1, 2, 3]))
    assert ids(local_uri) == [1, 2, 3]
    assert s.process(1, batch([9])).skipped  # replay: still exactly once
    s.process(2, batch([]))  # an empty result empties the table
    assert ids(local_uri) == []
    with Table.open(local_uri) as t:
        ops = [(h["operation"], h["operationParameters"]["outputMode"]) for h in t.history()]
        assert ops == [(STREAMING_OPERATION, "Complete")] * 3


def test_complete_mode_on_an_append_only_table_fails_at_planning(local_uri: str) -> None:
    Table.create(local_uri, batch([]).schema, properties={"delta.appendOnly": "true"}).close()
    with pytest.raises(InvalidInputError, match="appendOnly"):
        MicroBatchSink(local_uri, query_id=QUERY, complete=True).process(0, batch([1]))
    assert data_files_on_disk(local_uri) == []


def test_schema_is_enforced_at_planning_and_merge_schema_lets_columns_in(local_uri: str) -> None:
    sink(local_uri).process(0, batch([1]))
    wider = batch([2]).append_column("extra", pa.array(["x"]))
    with pytest.raises(SchemaMismatchError, match="extra"):
        sink(local_uri).process(1, wider)
    sink(local_uri, merge_schema=True).process(1, wider)
    with Table.open(local_uri) as t:
        assert t.schema.names == ["id", "p", "extra"]
    with pytest.raises(InvalidInputError, match="partitionBy"):
        sink(local_uri, partition_by=("p",)).process(2, batch([3]))


def test_partition_by_creates_a_partitioned_table(local_uri: str) -> None:
    sink(local_uri, partition_by=("P",)).process(0, pa.concat_tables([batch([1], "a"), batch([2], "b")]))
    with Table.open(local_uri) as t:
        assert t.partition_columns == ("p",)  # resolved case-insensitively, as Spark does
    assert {n.split("/")[0] for n in data_files_on_disk(local_uri)} == {"p=a", "p=b"}


# --------------------------------------------------------------------------- metadata changes


def _upgrade_protocol(t: Table) -> None:
    txn = t.transaction()
    txn.set_operation("UPGRADE PROTOCOL", {})
    txn.update_protocol(Protocol(3, 7, ("deletionVectors",), ("deletionVectors",)))
    txn.commit()


ALTERS: dict[str, Callable[[Table], object]] = {
    "property": lambda t: t.set_properties({"delta.appendOnly": "false"}),
    "column": lambda t: t.add_columns([pa.field("extra", pa.string())]),
    "protocol": _upgrade_protocol,
}


@pytest.mark.parametrize("alter", sorted(ALTERS))
def test_a_metadata_change_fails_the_next_batch_and_a_restart_writes_it_once(
    local_uri: str, alter: str
) -> None:
    s = sink(local_uri)
    s.process(0, batch([0]))
    s.process(1, batch([1]))
    with Table.open(local_uri) as t:
        ALTERS[alter](t)
        altered = t.version
    before = data_files_on_disk(local_uri)
    with pytest.raises(MetadataChangedException) as err:
        s.process(2, batch([2]))
    assert err.value.winning_version == altered
    assert "Batch 2 was not committed" in str(err.value)
    with Table.open(local_uri) as t:
        assert t.version == altered  # nothing committed
    assert data_files_on_disk(local_uri) == before  # and the batch's files are gone
    # A change committed between planning and commit fails the batch as well.
    plan = s.plan(batch([0]).schema)
    files = s.write(plan, 2, batch([2]))
    with Table.open(local_uri) as t:
        t.set_properties({"delta.appendOnly": "false", "some.key": alter})
    with pytest.raises(MetadataChangedException):
        commit_batch(plan, [files], query_id=QUERY, run_id="run-1", batch_id=2)
    # The restarted query (a new run) replays batch 2 with the new metadata, then goes on.
    restarted = sink(local_uri, run="run-2")
    assert restarted.process(2, batch([2])).version is not None
    assert restarted.process(2, batch([2])).skipped
    restarted.process(3, batch([3]))
    assert ids(local_uri) == [0, 1, 2, 3]


def test_concurrent_blind_appends_do_not_disturb_the_sink(local_uri: str) -> None:
    s = sink(local_uri)
    s.process(0, batch([0]))
    with Table.open(local_uri) as t:
        t.append(batch([100]))
    plan = s.plan(batch([0]).schema)
    files = s.write(plan, 1, batch([1]))
    with Table.open(local_uri) as t:
        t.append(batch([101]))
    result = commit_batch(plan, [files], query_id=QUERY, run_id="run-1", batch_id=1)
    assert result.read_version == 0  # the run's previous commit: every change since was checked
    assert ids(local_uri) == [0, 1, 100, 101]


# --------------------------------------------------------------------------- two runs, one query


def test_another_run_writing_the_query_fails_the_batch(local_uri: str) -> None:
    first, second = sink(local_uri, run="run-1"), sink(local_uri, run="run-2")
    first.process(0, batch([0]))
    first.process(1, batch([1]))
    second.process(2, batch([2]))  # a second instance of the query, same checkpoint
    with pytest.raises(
        ConcurrentTransactionException, match="several streaming queries are using the same checkpoint"
    ) as err:
        first.process(3, batch([3]))
    assert "runId run-2" in str(err.value)
    assert err.value.winning_version == 2
    with pytest.raises(ConcurrentTransactionException, match="has already committed batch 2"):
        sink(local_uri, run="run-3").process(1, batch([1]))  # the txn version is above the batch
    assert ids(local_uri) == [0, 1, 2]


def test_two_runs_racing_for_one_batch_fail_the_loser(local_uri: str) -> None:
    first, second = sink(local_uri, run="run-1"), sink(local_uri, run="run-2")
    first.process(0, batch([0]))
    plan = first.plan(batch([0]).schema)
    files = first.write(plan, 1, batch([1]))
    second.process(1, batch([1]))
    with pytest.raises(ConcurrentTransactionException, match="same checkpoint"):
        commit_batch(plan, [files], query_id=QUERY, run_id="run-1", batch_id=1)
    assert ids(local_uri) == [0, 1]


# --------------------------------------------------------------------------- checkpoint leases

SAME_CHECKPOINT = "several streaming queries are using the same checkpoint"


def test_a_second_query_on_a_held_checkpoint_fails_naming_the_owner(tmp_path: Path) -> None:
    checkpoint = str(tmp_path / "checkpoint")
    first = acquire_checkpoint(
        LocalFileSlotStore(tmp_path / "slots"), checkpoint, query_id=QUERY, run_id="run-1", table="t"
    )
    with pytest.raises(ConcurrentTransactionException, match=SAME_CHECKPOINT) as err:
        acquire_checkpoint(
            LocalFileSlotStore(tmp_path / "slots"),
            checkpoint + "/",
            query_id=QUERY,
            run_id="run-2",
            table="t",
        )
    text = str(err.value)
    for part in (QUERY, "run run-1", f"host {socket.gethostname()}", f"pid {os.getpid()}", checkpoint):
        assert part in text
    assert err.value.winning_commit_info["checkpointLease"]["info"]["runId"] == "run-1"
    first.release()
    acquire_checkpoint(
        LocalFileSlotStore(tmp_path / "slots"), checkpoint, query_id=QUERY, run_id="run-2", table="t"
    ).release()


def test_lease_names_normalise_the_checkpoint_location(tmp_path: Path) -> None:
    assert (
        lease_name(str(tmp_path / "c"))
        == lease_name(f"file://{tmp_path}/c/")
        == lease_name(f"file:{tmp_path}/x/../c")
    )
    assert lease_name("s3://bucket/c/") == lease_name("s3://bucket/c") != lease_name("s3://bucket/d")


def _wait_until(condition: Callable[[], bool], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_an_applications_lease_lives_as_long_as_its_driver(tmp_path: Path) -> None:
    """The holder process (how Spark queries hold the lease): same application goes on,
    another is refused naming the owner, the driver's SIGKILL frees the checkpoint."""
    store = LocalFileSlotStore(tmp_path / "slots")
    locator = StoreLocator.of(store, None)
    assert locator is not None
    checkpoint = str(tmp_path / "checkpoint")
    name = lease_name(checkpoint)
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        token = process_start_token(driver.pid)
        owner = claim_checkpoint(
            store, locator, checkpoint, app="app-A", table="t", watch_pid=driver.pid, watch_token=token,
            info={"queryId": QUERY, "driverPid": str(driver.pid)},
        )  # fmt: skip
        assert owner.pid not in (os.getpid(), driver.pid)  # a holder process of its own
        assert store.lease_owner(name) == owner
        again = claim_checkpoint(
            store, locator, checkpoint, app="app-A", table="t", watch_pid=driver.pid, watch_token=token
        )
        assert again == owner  # a restarted query of the same application goes on
        assert verify_checkpoint(store, checkpoint, app="app-A", table="t") == owner
        with pytest.raises(ConcurrentTransactionException, match=SAME_CHECKPOINT) as err:
            claim_checkpoint(
                store, locator, checkpoint, app="app-B", table="t", watch_pid=os.getpid(), watch_token=None,
                run_hint=lambda o: "run-7 (of its latest committed batch)",
            )  # fmt: skip
        assert f"query {QUERY}, run run-7" in str(err.value)
        assert f"pid {owner.pid} (driver pid {driver.pid})" in str(err.value)
        with pytest.raises(ConcurrentTransactionException, match=SAME_CHECKPOINT):
            verify_checkpoint(store, checkpoint, app="app-B", table="t")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
    _wait_until(lambda: store.lease_owner(name) is None)
    taken = claim_checkpoint(
        store, locator, checkpoint, app="app-B", table="t", watch_pid=os.getpid(),
        watch_token=process_start_token(os.getpid()),
    )  # fmt: skip
    assert taken.info["app"] == "app-B"
    os.kill(taken.pid, signal.SIGTERM)  # the holder releases on SIGTERM
    _wait_until(lambda: store.lease_owner(name) is None)


@pytest.mark.zookeeper
def test_a_zookeeper_lease_is_held_by_the_holder_session_until_the_driver_dies(
    zk_chroot: str, tmp_path: Path
) -> None:
    from lockstore.registry import open_slot_store

    spec = f"zk://{zk_chroot}"
    store = open_slot_store(spec, shared=False)
    try:
        locator = StoreLocator.of(store, spec)
        assert locator == StoreLocator("spec", spec)
        checkpoint = "s3://bucket/checkpoints/q1"
        driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        try:
            owner = claim_checkpoint(
                store, locator, checkpoint, app="app-A", table="t", watch_pid=driver.pid,
                watch_token=process_start_token(driver.pid), info={"queryId": QUERY},
            )  # fmt: skip
            assert store.lease_owner(lease_name(checkpoint)) == owner  # an ephemeral znode
            with pytest.raises(ConcurrentTransactionException, match=SAME_CHECKPOINT):
                claim_checkpoint(
                    store,
                    locator,
                    checkpoint,
                    app="app-B",
                    table="t",
                    watch_pid=os.getpid(),
                    watch_token=None,
                )
        finally:
            driver.send_signal(signal.SIGKILL)
            driver.wait(timeout=10)
        # The holder sees the driver gone, closes its session: the znode goes at once.
        _wait_until(lambda: store.lease_owner(lease_name(checkpoint)) is None)
    finally:
        store.close()


def test_an_s3_slot_lease_is_held_by_the_holder_with_the_stores_options(
    s3_bucket: str, s3_storage_options: dict[str, str]
) -> None:
    """Slots in the bucket (ObjectStoreSlotStore): the holder process opens the same store with
    the file system's options (endpoint, credentials), which it reads on its stdin, so they
    never show on its command line; no AWS endpoint is in the environment it inherits."""
    s3fs = pytest.importorskip("s3fs")
    from lockstore import ObjectStoreSlotStore

    assert not any(k.startswith("AWS_ENDPOINT") for k in os.environ)
    secret = f"secret-{uuid.uuid4().hex}"  # moto takes any credentials; this one is findable
    options = {**s3_storage_options, "secret": secret}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    store = ObjectStoreSlotStore(fs, f"{s3_bucket}/slots", lease_ttl=5)
    locator = StoreLocator.of(store, None)
    assert locator is not None and locator.value == f"s3://{s3_bucket}/slots?lease_ttl=5&poll_interval=0.025"
    assert secret not in repr(locator)
    checkpoint = "/var/checkpoints/q1"
    name = lease_name(checkpoint)
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        owner = claim_checkpoint(
            store, locator, checkpoint, app="app-A", table="t", watch_pid=driver.pid,
            watch_token=process_start_token(driver.pid), info={"queryId": QUERY},
        )  # fmt: skip
        assert owner.pid not in (os.getpid(), driver.pid)
        assert store.lease_owner(name) == owner
        with open(f"/proc/{owner.pid}/cmdline", "rb") as f:
            assert secret.encode() not in f.read()
        with pytest.raises(ConcurrentTransactionException, match=SAME_CHECKPOINT):
            claim_checkpoint(
                store, locator, checkpoint, app="app-B", table="t", watch_pid=os.getpid(), watch_token=None
            )
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
    # The holder sees the driver gone and releases the lease (no TTL to wait out).
    _wait_until(lambda: store.lease_owner(name) is None, seconds=4)


# --------------------------------------------------------------------------- auto-compaction


def test_auto_compaction_compacts_the_partitions_a_batch_touched(local_uri: str) -> None:
    s = sink(local_uri, partition_by=("p",), auto_compact=True, auto_compact_min_files=4)
    outcomes: list[BatchCommit] = []
    for b in range(4):
        outcomes.append(
            s.process(b, pa.concat_tables([batch([b], "a"), batch([100 + b], "b" if b == 0 else "a")]))
        )
    assert [o.compaction for o in outcomes[:3]] == [None, None, None]
    done = outcomes[3].compaction
    assert isinstance(done, CompactionOutcome) and not done.failed
    assert done.partitions == ({"p": "a"},)  # p=b holds one small file: left alone
    assert done.removed_files == 4 and done.added_files == 1
    with Table.open(local_uri) as t:
        files = t.refresh().add_files
        assert sorted(str(f.partition_values["p"]) for f in files) == ["a", "b"]
        compact = t.history(1)[0]
        assert compact["operation"] == "OPTIMIZE"
        assert compact["operationParameters"]["predicate"] == "[\"(`p` = 'a')\"]"
    assert ids(local_uri) == [0, 1, 2, 3, 100, 101, 102, 103]


def test_auto_compaction_follows_the_table_property_unless_the_option_says_otherwise(
    tmp_path: Path,
) -> None:
    deltalake = pytest.importorskip("deltalake")
    uri = str(tmp_path / "t")
    deltalake.write_deltalake(uri, batch([-1]), configuration={AUTO_COMPACT_KEY: "true"})
    on = [sink(uri, auto_compact_min_files=3).process(b, batch([b])) for b in range(2)]
    assert on[-1].compaction is not None and on[-1].compaction.added_files == 1
    off = [
        sink(uri, auto_compact=False, auto_compact_min_files=2).process(b, batch([b])) for b in range(2, 4)
    ]
    assert [o.compaction for o in off] == [None, None]
    assert ids(uri) == [-1, 0, 1, 2, 3]


def test_a_failing_compaction_never_fails_the_batch(
    local_uri: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Table, *args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Table, "optimize", broken)
    s = sink(local_uri, auto_compact=True, auto_compact_min_files=2)
    s.process(0, batch([0]))
    with caplog.at_level(logging.WARNING, logger="streaming.compaction"):
        result = s.process(1, batch([1]))
    assert result.version == 1 and result.compaction is not None
    assert result.compaction.error == "OSError: disk full"
    assert "auto-compaction" in caplog.text and "disk full" in caplog.text
    assert ids(local_uri) == [0, 1]


def test_auto_compaction_values() -> None:
    assert compaction.parse_auto_compact("AUTO") is True
    assert compaction.parse_auto_compact("false") is False
    assert compaction.auto_compact_enabled({AUTO_COMPACT_KEY: "bogus"}, None) is False
    assert compaction.auto_compact_enabled({AUTO_COMPACT_KEY: "true"}, False) is False
    with pytest.raises(InvalidInputError):
        compaction.parse_auto_compact("sometimes")


# --------------------------------------------------------------------------- orphans


def test_vacuum_removes_an_interrupted_batchs_orphans(local_uri: str) -> None:
    s = sink(local_uri, partition_by=("p",))
    s.process(0, pa.concat_tables([batch([0], "a"), batch([1], "b")]))
    committed = data_files_on_disk(local_uri)
    # Batch 1 is interrupted: its tasks wrote files, the commit never ran (the driver died).
    plan = s.plan(batch([0]).schema)
    for task, part in enumerate(["a", "c"]):
        s.write(plan, 1, batch([10 + task], part), task=task)
    orphans = sorted(set(data_files_on_disk(local_uri)) - set(committed))
    assert len(orphans) == 2 and all(parse_batch_file_name(o)[:2] == (QUERY, 1) for o in orphans)  # type: ignore[index]
    old = time.time() - 3600
    for rel in orphans:
        os.utime(os.path.join(local_uri, rel), (old, old))
    with Table.open(local_uri) as t:
        deleted = t.vacuum(retention_hours=0.5, enforce_retention=False)
    assert sorted(os.path.relpath(p, local_uri) for p in deleted) == orphans
    assert data_files_on_disk(local_uri) == committed
    assert ids(local_uri) == [0, 1]


def test_abort_deletes_the_batch_files_by_prefix_but_never_committed_ones(local_uri: str) -> None:
    s = sink(local_uri)
    s.process(0, batch([0]))
    plan = s.plan(batch([0]).schema)
    known = s.write(plan, 1, batch([1]), task=0)
    s.write(plan, 1, batch([2]), task=1)  # a task whose message never reached the driver
    deleted = abort_batch(local_uri, query_id=QUERY, batch_id=1, files=[known])
    assert len(deleted) == 2
    assert abort_batch(local_uri, query_id=QUERY, batch_id=0) == []  # batch 0 is committed
    assert len(data_files_on_disk(local_uri)) == 1
    assert ids(local_uri) == [0]


def test_a_failing_task_deletes_what_it_wrote(local_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("streaming.batchfiles._FLUSH_BYTES", 1)  # write each Arrow batch at once
    plan = plan_batch(local_uri, batch([0]).schema, complete=False, options=SinkOptions())

    def rows_then_failure() -> object:
        yield from batch([1]).to_batches()
        raise RuntimeError("task killed")

    with pytest.raises(RuntimeError):
        write_batch_files(plan, rows_then_failure(), query_id=QUERY, batch_id=0, task=0)  # type: ignore[arg-type]
    assert data_files_on_disk(local_uri) == []
    written = write_batch_files(plan, batch([1, 2]).to_batches(), query_id=QUERY, batch_id=0, task=0)
    assert len(written.adds) == 1 and len(data_files_on_disk(local_uri)) == 1
