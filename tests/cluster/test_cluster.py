"""The same code on a real Spark standalone cluster: a master and two workers on loopback.

Drivers run in child processes (``driver.py``; the test process keeps its own local
SparkContext) with the project shipped as a zip in ``spark.submit.pyFiles`` and a Python
that cannot import the repository, so executors run the shipped code. One driver runs the
batch, read, MERGE, streaming and ``s3://`` scenarios in one Spark application (a session
costs ~15 s on two cores, and the first use of each code path in an application ~20 s
more); the concurrent-writer test starts two more drivers at once. Every result is checked
against the table as the engine reads it in this process.

No ``AWS_*`` variable reaches the cluster's daemons, executors or drivers: the ``s3://``
table (moto's S3 API on loopback, slots in the bucket) is reached only through options.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eventlog import Table
from eventlog.log.commit import member_txn_ids
from eventlog.log.storage import LogStore
from spark_adapter import s3a_jars
from streaming.sink import STREAMING_FIELD, STREAMING_OPERATION
from tests.cluster.conftest import Driver, Measurements, Shipping, scenario_ok
from tests.support.fixtures import delete_bucket, s3_admin_client
from tests.support.invariants import check_invariants
from tests.support.s3server import ACCESS_KEY, REGION
from tests.support.sparkcluster import REPO_ROOT, SparkStandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.timeout(420)]

DRIVER_TIMEOUT = 300.0  # seconds for one driver process, session start to stop
TABLE_SCHEMA = pa.schema([("id", pa.int64()), ("part", pa.int64()), ("name", pa.string())])
BATCHES = 4  # appends per concurrent writer


def _aws_names() -> list[str]:
    return sorted(name for name in os.environ if name.upper().startswith("AWS_"))


@pytest.fixture(scope="module", autouse=True)
def no_aws_environment() -> Iterator[None]:
    """The cluster's daemons start without any ``AWS_*`` variable of this machine (an
    executor inherits its worker's environment), so S3 endpoints and credentials reach the
    executors only through the options a test passes; drivers inherit this process's
    environment. Set up before ``cluster`` and ``main_run``: an autouse fixture comes first
    among those of its scope, and module fixtures before any test's ``s3_fake_aws_env``."""
    with pytest.MonkeyPatch.context() as mp:
        for name in _aws_names():
            mp.delenv(name)
        yield


def _rows(ids: range, prefix: str) -> pa.Table:
    return pa.table(
        {"id": list(ids), "part": [i % 2 for i in ids], "name": [f"{prefix}{i}" for i in ids]},
        schema=TABLE_SCHEMA,
    )


def _engine_rows(uri: str, **kwargs: Any) -> list[dict[str, Any]]:
    with Table.open(uri) as table:
        return sorted(table.to_arrow(**kwargs).to_pylist(), key=lambda r: r["id"])


class Inputs:
    """The tables and files the scenarios of the main driver start from."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.batch = str(root / "batch")
        self.read = str(root / "read")
        self.merge = str(root / "merge")
        self.stream = str(root / "stream")
        self.stream_input = root / "stream-input"
        self.checkpoint = str(root / "checkpoint")
        self.stream_lease = str(root / "stream-lease")
        self.checkpoint_lease = str(root / "checkpoint-lease")
        # read: versions 0 (empty) .. 3, two partitions, a delete in the last one.
        table = Table.create(self.read, TABLE_SCHEMA, partition_by=["part"])
        table.append(_rows(range(0, 10), "a"))
        table.append(_rows(range(10, 15), "b"))
        table.delete("id = 3")
        # merge: ids 0..9 at version 1.
        Table.create(self.merge, TABLE_SCHEMA).append(_rows(range(0, 10), "old"))
        # stream: three Parquet files of four ids, one per micro-batch.
        self.stream_input.mkdir()
        for f in range(3):
            ids = [f * 10 + i for i in range(4)]
            pq.write_table(
                pa.table(
                    {"id": pa.array(ids, pa.int64()), "part": pa.array([i % 2 for i in ids], pa.int64())}
                ),
                self.stream_input / f"in-{f}.parquet",
            )

    def scenarios(self) -> list[tuple[str, dict[str, Any]]]:
        return [
            ("ship", {}),
            ("batch", {"uri": self.batch}),
            ("read", {"uri": self.read}),
            ("native", {"uri": self.read}),
            ("merge", {"uri": self.merge}),
            (
                "stream",
                {
                    "input": str(self.stream_input),
                    "uri": self.stream,
                    "checkpoint": self.checkpoint,
                    "options": {"checkpointLease": "false"},
                },
            ),
            (
                "stream_lease",
                {
                    "input": str(self.stream_input),
                    "uri": self.stream_lease,
                    "checkpoint": self.checkpoint_lease,
                },
            ),
        ]


@dataclass(frozen=True)
class S3Table:
    """The ``s3://`` table of the main driver's ``s3_table`` scenario."""

    bucket: str
    uri: str
    slots: str  # slots in the bucket, reached through the table's file system and options
    storage: dict[str, str]  # fsspec options, with a secret nothing else holds (to grep for)
    region: dict[str, Any]  # more options, passed as the storageOptions JSON option

    def scenario_args(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "slots": self.slots,
            "storage_options": self.storage,
            "storage_json": self.region,
        }


@pytest.fixture(scope="module")
def s3_table(s3_server: str) -> Iterator[S3Table]:
    """A fresh bucket on the run's S3 server (module-scoped, as ``main_run`` is: the
    function-scoped ``s3_bucket`` cannot serve it); emptied and deleted afterwards."""
    client = s3_admin_client(s3_server)
    bucket = f"eventlog-{uuid.uuid4().hex}"
    client.create_bucket(Bucket=bucket)
    try:
        yield S3Table(
            bucket=bucket,
            uri=f"s3://{bucket}/table",
            slots=f"s3://{bucket}/_slots",
            storage={"endpoint_url": s3_server, "key": ACCESS_KEY, "secret": f"s3cr3t-{uuid.uuid4().hex}"},
            region={"client_kwargs": {"region_name": REGION}},
        )
    finally:
        delete_bucket(client, bucket)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    return Inputs(tmp_path_factory.mktemp("tables"))


@pytest.fixture(scope="module")
def main_run(
    cluster: SparkStandaloneCluster,
    shipping: Shipping,
    inputs: Inputs,
    s3_table: S3Table,
    measurements: Measurements,
) -> dict[str, Any]:
    """One driver (two executors) running every single-driver scenario, in order; S3A's jars
    on ``spark.jars``, so ``s3://`` tables are scanned natively (``s3_native``, and the reads
    of ``s3_table``'s MERGE and ``toDF``)."""
    scenarios = [
        *inputs.scenarios(),
        ("s3_table", s3_table.scenario_args()),
        ("s3_native", s3_table.scenario_args()),
    ]
    driver = Driver(cluster, shipping, scenarios, inputs.root / "driver", app="scenarios", jars=s3a_jars())
    try:
        return driver.finish(DRIVER_TIMEOUT, cluster, measurements)
    finally:
        driver.kill()


def test_the_cluster_has_two_alive_workers_and_ran_the_application_on_both(
    cluster: SparkStandaloneCluster, main_run: dict[str, Any]
) -> None:
    status = cluster.status()
    assert [w["state"] for w in status["workers"]] == ["ALIVE", "ALIVE"]
    assert main_run["executors"] == 2
    apps = [a for a in status["completedapps"] if a["name"] == "scenarios"]
    assert len(apps) == 1 and apps[0]["state"] == "FINISHED"


def test_executors_import_the_project_from_the_shipped_zip(
    cluster: SparkStandaloneCluster, shipping: Shipping, main_run: dict[str, Any]
) -> None:
    ship = scenario_ok(main_run, "ship")
    # The driver imports the copy of the zip that pyspark put on its path.
    driver_file = Path(ship["driver_eventlog"])
    assert shipping.zip.name in driver_file.parts and not driver_file.is_relative_to(REPO_ROOT)
    executors = set()
    for task in ship["tasks"]:
        cwd = Path(task["cwd"])
        worker = next(w for w in cluster.work_dirs if cwd.is_relative_to(w))  # an executor's dir
        executors.add((worker, cwd))
        for module, file in task["files"].items():
            # Spark fetched the zip into the executor's directory; nothing comes from the repo.
            assert Path(file).is_relative_to(cwd / shipping.zip.name), (module, file)
        # Relative entries ("." and the zip) are relative to the task's directory.
        assert all((cwd / p).resolve() != REPO_ROOT for p in task["sys_path"]), task["sys_path"]
    assert len({worker for worker, _ in executors}) == 2, "the tasks did not run on both workers"


def test_the_executor_python_cannot_import_the_project_without_the_zip(
    shipping: Shipping, tmp_path: Path
) -> None:
    probe = (
        "import importlib.util as u; print(u.find_spec('eventlog') is None, u.find_spec('pyarrow') is None)"
    )
    isolated = subprocess.run(
        [str(shipping.python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert isolated.returncode == 0, isolated.stderr
    assert isolated.stdout.split() == ["True", "False"]  # no project, but pyarrow
    # The same interpreter without the launcher finds the editable install: the launcher matters.
    plain = subprocess.run(
        [str(shipping.base_python), "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert plain.stdout.split() == ["False", "False"], plain.stderr


def test_batch_append_and_overwrite(inputs: Inputs, main_run: dict[str, Any]) -> None:
    batch = scenario_ok(main_run, "batch")
    assert batch["counts"] == [20, 5]
    with Table.open(inputs.batch) as table:
        assert table.version == 2
        history = sorted(table.history(), key=lambda h: h["version"])
        assert [h["operationParameters"]["mode"] for h in history] == ["Append", "Append", "Overwrite"]
        assert list(table.snapshot().partition_columns) == ["part"]
    assert _engine_rows(inputs.batch) == [{"id": i, "part": i % 2, "name": f"n{i}"} for i in range(100, 105)]
    assert [r["id"] for r in _engine_rows(inputs.batch, version=1)] == list(range(20))


def test_python_data_source_reads_match_the_engine(inputs: Inputs, main_run: dict[str, Any]) -> None:
    read = scenario_ok(main_run, "read")
    assert read["latest"] == _engine_rows(inputs.read)
    assert [r["id"] for r in read["latest"]] == [i for i in range(15) if i != 3]
    assert read["version1"] == _engine_rows(inputs.read, version=1)
    assert read["filtered"] == _engine_rows(inputs.read, filter="id >= 5")
    with Table.open(inputs.read) as table:
        assert read["partitions"] == table.snapshot().num_files >= 2


def test_native_reads_match_the_engine(inputs: Inputs, main_run: dict[str, Any]) -> None:
    native = scenario_ok(main_run, "native")
    assert native["latest"] == _engine_rows(inputs.read)
    assert native["version1"] == _engine_rows(inputs.read, version=1)
    assert native["filtered"] == _engine_rows(inputs.read, filter="id >= 5")


def test_merge_upserts(inputs: Inputs, main_run: dict[str, Any]) -> None:
    merge = scenario_ok(main_run, "merge")
    assert merge["version"] == 2 and merge["operation"] == "MERGE"
    expected = [{"id": i, "part": i % 2, "name": f"old{i}" if i < 5 else f"new{i}"} for i in range(15)]
    assert _engine_rows(inputs.merge) == expected
    with Table.open(inputs.merge) as table:
        assert table.version == 2
        assert table.history(1)[0]["operation"] == "MERGE"


def _check_stream(result: dict[str, Any], uri: str) -> None:
    assert result["finished"] is True
    assert result["input_rows"] == 12
    assert [r["id"] for r in _engine_rows(uri)] == sorted(f * 10 + i for f in range(3) for i in range(4))
    with Table.open(uri) as table:
        history = sorted(table.history(), key=lambda h: h["version"])
    commits = [h[STREAMING_FIELD] for h in history if h["operation"] == STREAMING_OPERATION]
    assert [c["batchId"] for c in commits] == [0, 1, 2]
    assert {c["queryId"] for c in commits} == {result["query_id"]}


def test_streaming_sink_commits_each_batch_exactly_once(inputs: Inputs, main_run: dict[str, Any]) -> None:
    # Without the checkpoint lease (with it: the next test).
    _check_stream(scenario_ok(main_run, "stream"), inputs.stream)


def test_streaming_sink_with_the_checkpoint_lease_from_shipped_code(
    inputs: Inputs, main_run: dict[str, Any]
) -> None:
    _check_stream(scenario_ok(main_run, "stream_lease"), inputs.stream_lease)


def test_two_drivers_append_concurrently(
    cluster: SparkStandaloneCluster,
    shipping: Shipping,
    measurements: Measurements,
    main_run: dict[str, Any],
    tmp_path: Path,
) -> None:
    # main_run first: the scenarios' application holds both cores until it finishes.
    uri = str(tmp_path / "shared")
    Table.create(uri, pa.schema([("id", pa.int64()), ("worker", pa.int64()), ("batch", pa.int64())]))
    ready = tmp_path / "ready"
    ready.mkdir()
    drivers = [
        Driver(
            cluster,
            shipping,
            [
                (
                    "append_batches",
                    {"uri": uri, "writer": w, "batches": BATCHES, "ready_dir": str(ready), "parties": 2},
                )
            ],
            tmp_path / f"driver-{w}",
            app=f"writer-{w}",
            cores_max=1,
            executors=1,
        )
        for w in range(2)
    ]
    try:
        results = [d.finish(DRIVER_TIMEOUT, cluster, measurements) for d in drivers]
    finally:
        for d in drivers:
            d.kill()
    writers = [scenario_ok(r, "append_batches") for r in results]
    assert max(w["started"] for w in writers) < min(w["ended"] for w in writers), (
        "the writers did not overlap"
    )
    acked = [ack for w in writers for ack in w["acks"]]
    assert len(acked) == 2 * BATCHES

    versions = LogStore.commit_versions(LogStore(uri).list_log())
    assert versions == list(range(2 * BATCHES + 1)), "versions are not gapless 0..N"
    with Table.open(uri) as table:
        history = {h["version"]: h for h in table.history()}
    by_tag: dict[str, list[int]] = {}
    for version, h in history.items():
        if h.get("userMetadata"):
            by_tag.setdefault(h["userMetadata"], []).append(version)
    acks = []
    for ack in acked:
        assert len(by_tag.get(ack["tag"], [])) == 1, f"acknowledged append not in the log exactly once: {ack}"
        version = by_tag[ack["tag"]][0]
        acks.append(
            {
                "kind": "append",
                "version": version,
                "txn": member_txn_ids(history[version])[0],
                "ids": ack["ids"],
            }
        )
    # Gapless, each acknowledged commit once, nothing unacknowledged, contents = the union.
    check_invariants(uri, acks)
    assert sorted(Table.open(uri).to_arrow().column("id").to_pylist()) == sorted(
        i for a in acked for i in a["ids"]
    )


def test_s3_table_from_the_cluster_with_slots_in_the_bucket(
    cluster: SparkStandaloneCluster,
    s3_server: str,
    s3_table: S3Table,
    main_run: dict[str, Any],
    measurements: Measurements,
    deltalake_s3_options: dict[str, str],
) -> None:
    deltalake = pytest.importorskip("deltalake")
    pytest.importorskip("s3fs")  # the executors' Python is this one
    s3 = scenario_ok(main_run, "s3_table")
    measurements.drivers.setdefault("scenarios", {})["s3_table_steps"] = s3["steps"]

    # Nobody had an AWS_* variable: tasks on both executors, and the driver.
    assert s3["driver_aws"] == []
    assert [p["aws"] for p in s3["executors"]] == [[]] * len(s3["executors"])
    cwds = {Path(p["cwd"]) for p in s3["executors"]}
    assert len(cwds) == 2 and all(any(c.is_relative_to(w) for w in cluster.work_dirs) for c in cwds)

    appended = [{"id": i, "part": i % 2, "name": f"a{i}" if i < 10 else f"b{i}"} for i in range(20)]
    # MERGE of ids 15..24: matched 15 and 18 deleted, 16, 17 and 19 updated, 20..24 inserted.
    final = appended[:15] + [{"id": i, "part": i % 2, "name": f"m{i}"} for i in (16, 17, 19, *range(20, 25))]
    assert s3["appended"] == appended
    assert (s3["merge"]["version"], s3["merge"]["operation"]) == (2, "MERGE")
    metrics = s3["merge"]["metrics"]
    counts = [int(metrics[f"numTargetRows{k}"]) for k in ("Deleted", "Updated", "Inserted")]
    assert counts == [2, 3, 5], metrics
    assert s3["to_df"] == final
    assert s3["version0"] == appended[:10]

    # The engine, deltalake and the bucket agree.
    options = {**s3_table.storage, **s3_table.region}
    with Table.open(s3_table.uri, slots=s3_table.slots, storage_options=options) as table:
        assert table.version == 2
        history = sorted(table.history(), key=lambda h: h["version"])
        assert [h["operation"] for h in history] == ["WRITE", "WRITE", "MERGE"]
        assert list(table.snapshot().partition_columns) == ["part"]
        assert sorted(table.to_arrow().to_pylist(), key=lambda r: r["id"]) == final

    def theirs(**kwargs: Any) -> list[dict[str, Any]]:
        dt = deltalake.DeltaTable(s3_table.uri, storage_options=deltalake_s3_options, **kwargs)
        rows = dt.to_pyarrow_dataset().to_table().select(["id", "part", "name"]).to_pylist()
        return [{"version": dt.version()}, *sorted(rows, key=lambda r: r["id"])]

    assert theirs() == [{"version": 2}, *final]
    assert theirs(version=1) == [{"version": 1}, *appended]

    client = s3_admin_client(s3_server)
    keys = [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=s3_table.bucket)
        for item in page.get("Contents", [])
    ]
    assert [k for k in keys if k.startswith("_slots/")], f"no slot objects in the bucket: {keys}"
    data_files = [k for k in keys if k.startswith("table/") and k.endswith(".parquet")]
    assert len(data_files) >= 4  # two tasks per append, more for the MERGE's rewrites
    for key in keys:  # the options are in no object: not the log, the slots or the data
        body = client.get_object(Bucket=s3_table.bucket, Key=key)["Body"].read()
        assert s3_table.storage["secret"].encode() not in body, key


def test_s3_table_scanned_natively_on_the_executors(
    s3_table: S3Table, main_run: dict[str, Any], deltalake_s3_options: dict[str, str]
) -> None:
    """Spark's Parquet scan through S3A on both executors, which see no AWS variable: the
    endpoint and credentials reached them only as the read's options (merged into the scan's
    Hadoop configuration, shipped with the tasks)."""
    pytest.importorskip("s3fs")
    native = scenario_ok(main_run, "s3_native")
    options = {**s3_table.storage, **s3_table.region}
    with Table.open(s3_table.uri, slots=s3_table.slots, storage_options=options) as table:
        latest = sorted(table.to_arrow().to_pylist(), key=lambda r: r["id"])
        version1 = sorted(table.to_arrow(version=1).to_pylist(), key=lambda r: r["id"])
        odd_files = sum(1 for f in table.snapshot().add_files if f.partition_values.get("part") == "1")
    assert native["latest"] == latest and len(latest) == 23
    assert native["version1"] == version1 and len(version1) == 20
    assert native["odd"] == [r for r in latest if r["part"] == 1]
    assert native["odd_files"] == odd_files
    assert native["file_scan"] is True
    assert native["schemes"] == ["s3a-"]
    assert native["session_conf"] == []
    assert native["secret_in_plans"] is False
