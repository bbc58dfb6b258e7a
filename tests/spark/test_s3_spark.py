"""Spark and streaming on an ``s3://`` table (moto's S3 API on loopback), storage options
given as reader/writer options.

The session's Python workers were started by a JVM that never saw the test's AWS
variables (the session fixture is set up before ``s3_fake_aws_env``), and the endpoint
is in no environment at all: every task, planning worker and commit worker reaches the
bucket only through the options, which is what these tests prove. Version slots come
from the run's ZooKeeper (a chroot per test), as an object store needs.
"""

from __future__ import annotations

import json
import os
import pickle
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from eventlog import Table
from eventlog.errors import InvalidInputError, InvalidTextError
from eventlog.log.location import TableLocation
from lockstore import ObjectStoreSlotStore
from spark_adapter import EventlogTable, read_table
from spark_adapter.types import storage_options, storage_spark_options
from streaming.ownership import lease_name
from streaming.sink import STREAMING_FIELD

pytestmark = [pytest.mark.spark, pytest.mark.zookeeper, pytest.mark.timeout(300)]

deltalake = pytest.importorskip("deltalake")
pytest.importorskip("s3fs")

SPARK_ERRORS = (PySparkException, Py4JJavaError)
WAIT = 120
REGION_JSON = json.dumps({"client_kwargs": {"region_name": "us-east-1"}})


@pytest.fixture
def secret() -> str:
    """A secret nothing else contains (moto takes any credentials), to grep for."""
    return f"s3cr3t-{uuid.uuid4().hex}"


@pytest.fixture
def options(s3_storage_options: dict[str, str], secret: str) -> dict[str, str]:
    """fsspec storage options with the test's secret."""
    return {**s3_storage_options, "secret": secret}


@pytest.fixture
def spark_options(spark: Any, options: dict[str, str], zk_chroot: str) -> dict[str, str]:
    """Reader/writer options: ``storage.<name>`` per option, the region as ``storageOptions``
    JSON (a nested value), and ZooKeeper slots."""
    return {
        **{f"storage.{k}": v for k, v in options.items()},
        "storageOptions": REGION_JSON,
        "slots": f"zk://{zk_chroot}",
    }


@pytest.fixture
def table(
    s3_uri: str, options: dict[str, str], spark_options: dict[str, str]
) -> Iterator[Callable[[], Table]]:
    """Opens the test's own handle on the s3:// table (the latest one is closed after the test)."""
    handle: list[Table] = []

    def open_it() -> Table:
        for t in handle:
            t.close()
        handle[:] = [Table.open(s3_uri, slots=spark_options["slots"], storage_options=options)]
        return handle[0]

    yield open_it
    for t in handle:
        t.close()


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def _theirs(uri: str, options: dict[str, str]) -> tuple[int, list[tuple[Any, ...]]]:
    dt = deltalake.DeltaTable(uri, storage_options=options)
    rows = pa.table(dt.to_pyarrow_dataset().to_table()).select(["id", "s"]).to_pylist()
    return dt.version(), sorted((r["id"], r["s"]) for r in rows)


def _log_texts(uri: str, options: dict[str, str]) -> dict[str, bytes]:
    fs, root = TableLocation.of(uri, options).files()
    fs.invalidate_cache()
    return {p: fs.cat_file(p) for p in fs.find(f"{root}/_delta_log")}


def _local_texts(directory: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_batch_write_append_and_read_through_the_options(
    spark: Any,
    s3_uri: str,
    options: dict[str, str],
    spark_options: dict[str, str],
    deltalake_s3_options: dict[str, str],
    secret: str,
    table: Callable[[], Table],
) -> None:
    # The premise: Spark's Python workers know no S3 endpoint but the options'.
    env = spark.sparkContext.parallelize([0], 1).map(lambda _: sorted(os.environ)).collect()[0]
    assert not [name for name in env if name.startswith("AWS_ENDPOINT_URL")]
    first = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id bigint, s string")
    # Spark lower-cases option names (the data source sees "storage.endpoint_url").
    mixed_case = {
        ("STORAGE.Endpoint_URL" if k == "storage.endpoint_url" else k): v for k, v in spark_options.items()
    }
    first.write.format("eventlog").mode("append").options(**mixed_case).save(s3_uri)
    second = spark.createDataFrame([(4, "d"), (5, "e")], "id bigint, s string")
    second.write.format("eventlog").mode("append").options(**spark_options).save(s3_uri)
    want = [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]

    read = spark.read.format("eventlog").options(**spark_options).load(s3_uri)
    assert _rows(read) == want
    first_version = spark.read.format("eventlog").options(**spark_options).option("versionAsOf", 0)
    assert _rows(first_version.load(s3_uri)) == want[:3]
    t = table()
    assert t.version == 1
    assert [h["operation"] for h in sorted(t.history(), key=lambda h: h["version"])] == ["WRITE", "WRITE"]
    assert _theirs(s3_uri, deltalake_s3_options) == (1, want)
    # read_table scans natively through S3A (hadoop-aws is on the suite's session), the
    # options translated for that read (tests/spark/test_native_s3.py has the details).
    native = read_table(spark, s3_uri, storage_options=options, slots=spark_options["slots"])
    assert _rows(native) == want
    assert native.inputFiles() and all(f.startswith("s3a-") for f in native.inputFiles())
    # The log holds no secret: not in commitInfo, not anywhere.
    texts = _log_texts(s3_uri, options)
    assert len([p for p in texts if p.endswith(".json")]) >= 2
    assert not [p for p, data in texts.items() if secret.encode() in data]


@pytest.mark.parametrize("slots", ["zookeeper", "s3"])
def test_streaming_sink_and_source_on_s3_with_a_local_checkpoint(
    spark: Any,
    s3_uri: str,
    s3_bucket: str,
    options: dict[str, str],
    spark_options: dict[str, str],
    secret: str,
    tmp_path: Path,
    table: Callable[[], Table],
    slots: str,
) -> None:
    """With S3 slots, the checkpoint lease is taken too: its holder process reaches the bucket
    with the table's options. (With ZooKeeper it is not: the holder lives as long as the
    test run's Spark application and would outlive the test's chroot.)"""
    if slots == "s3":
        # A short TTL: once the test deletes the bucket, the holder's heartbeat fails and it
        # exits within seconds, though the application (the Spark session) lives on.
        spark_options = {**spark_options, "slots": f"s3://{s3_bucket}/_slots?lease_ttl=3"}
    source_dir = tmp_path / "input"
    source_dir.mkdir()
    for n in range(2):
        pq.write_table(
            pa.table({"id": pa.array([n * 10, n * 10 + 1], pa.int64())}), source_dir / f"{n}.parquet"
        )
    checkpoint = tmp_path / "sink-checkpoint"
    query = (
        spark.readStream.schema("id long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source_dir))
        .writeStream.format("eventlog")
        .option("checkpointLocation", str(checkpoint))
        .option("checkpointLease", str(slots == "s3").lower())
        .options(**spark_options)
        .trigger(availableNow=True)
        .start(s3_uri)
    )
    try:
        assert query.awaitTermination(WAIT), "the sink query did not finish in time"
    finally:
        query.stop()
    t = table()
    if slots == "s3":
        t.close()
        t = Table.open(s3_uri, slots=spark_options["slots"], storage_options=options)
    assert sorted(t.to_arrow().column("id").to_pylist()) == [0, 1, 10, 11]
    assert t.version == 1  # one commit per micro-batch: batch 0 created the table
    if slots == "s3":
        assert isinstance(t.slots, ObjectStoreSlotStore)
        owner = t.slots.lease_owner(lease_name(str(checkpoint)))
        assert owner is not None and owner.info["queryId"] == str(query.id)
        assert owner.pid != os.getpid()  # the holder process, which reached S3 with the options
        t.close()
    assert t.refresh().txn_version(str(query.id)) == 1
    last = max(t.history(), key=lambda h: h["version"])
    assert last[STREAMING_FIELD] == {
        "queryId": str(query.id), "runId": str(query.runId), "batchId": 1, "appId": str(query.id),
    }  # fmt: skip

    # The s3:// table as a streaming source, into local Parquet.
    out, source_checkpoint = tmp_path / "out", tmp_path / "source-checkpoint"
    reader = (
        spark.readStream.format("eventlog")
        .options(**spark_options)
        .load(s3_uri)
        .writeStream.format("parquet")
        .option("checkpointLocation", str(source_checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    try:
        assert reader.awaitTermination(WAIT), "the source query did not finish in time"
    finally:
        reader.stop()
    assert sorted(pq.read_table(out).column("id").to_pylist()) == [0, 1, 10, 11]

    # Neither checkpoint nor the table's log holds the secret.
    local = {**_local_texts(checkpoint), **_local_texts(source_checkpoint)}
    assert any("offsets" in p for p in local)
    assert not [p for p, data in local.items() if secret.encode() in data]
    assert not [p for p, data in _log_texts(s3_uri, options).items() if secret.encode() in data]


def test_forpath_with_storage_options_runs_dml_on_s3(
    spark: Any,
    s3_uri: str,
    options: dict[str, str],
    spark_options: dict[str, str],
    table: Callable[[], Table],
) -> None:
    slots = spark_options["slots"]
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    data = pa.table({"id": [1, 2, 3, 4], "s": ["a", "b", "c", "d"]}, schema=schema)
    Table.create(s3_uri, schema, slots=slots, storage_options=options, data=data).close()
    et = EventlogTable.forPath(spark, s3_uri, slots, storage_options=options)
    try:
        assert options["secret"] not in repr(et.location)
        assert et.delete("id = 2").version == 1
        assert et.update("id = 3", set={"s": "'z'"}).version == 2
        src = spark.createDataFrame([(4, "D"), (5, "e")], "id bigint, s string")
        merged = (
            et.alias("t")
            .merge(src.alias("m"), "t.id = m.id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
        ).execute()
        assert merged.version == 3
        want = [(1, "a"), (3, "z"), (4, "D"), (5, "e")]
        assert _rows(et.toDF()) == want
        assert et.optimize().executeCompaction().version == 4  # compaction tasks write on S3
        assert et.vacuum(dryRun=True) == []  # listing tasks on S3; every file is within retention
        assert _rows(et.toDF()) == want
    finally:
        et.table.close()
    t = table()
    assert sorted((r["id"], r["s"]) for r in t.to_arrow().to_pylist()) == want
    assert [h["operation"] for h in sorted(t.history(), key=lambda h: h["version"])] == [
        "CREATE TABLE AS SELECT", "DELETE", "UPDATE", "MERGE", "OPTIMIZE",
    ]  # fmt: skip


def test_bad_storage_options_fail_naming_the_option_and_touch_nothing(
    spark: Any, s3_uri: str, options: dict[str, str], spark_options: dict[str, str], secret: str
) -> None:
    df = spark.createDataFrame([(1, "a")], "id bigint, s string")
    bad_json = {**spark_options, "storageOptions": "{not json"}
    with pytest.raises(SPARK_ERRORS, match="option storageOptions must be a JSON object"):
        df.write.format("eventlog").mode("append").options(**bad_json).save(s3_uri)
    typo = {k: v for k, v in spark_options.items() if k != "storage.endpoint_url"}
    typo["storage.endpointurl"] = options["endpoint_url"]
    with pytest.raises(SPARK_ERRORS, match="endpointurl") as info:
        df.write.format("eventlog").mode("append").options(**typo).save(s3_uri)
    assert secret not in str(info.value)
    twice = {**spark_options, "storageOptions": json.dumps({"key": "other"})}
    with pytest.raises(SPARK_ERRORS, match="storage option 'key' is given twice"):
        spark.read.format("eventlog").options(**twice).load(s3_uri)
    with pytest.raises(InvalidInputError, match="no_such_option") as direct:
        EventlogTable.forPath(
            spark, s3_uri, spark_options["slots"], storage_options={**options, "no_such_option": 1}
        )
    assert secret not in str(direct.value)
    assert not Table.exists(s3_uri, storage_options=options)  # nothing was written


def test_spark_option_parsing_and_the_location_value() -> None:
    parsed = storage_options(
        {
            "path": "s3://b/t",
            "storage.endpoint_url": "http://h:1",
            "storage.anon": "False",
            "storageOptions": REGION_JSON,
        }
    )
    assert parsed == {
        "endpoint_url": "http://h:1",
        "anon": False,
        "client_kwargs": {"region_name": "us-east-1"},
    }
    with pytest.raises(InvalidTextError) as twice:
        storage_options({"storage.key": "a", "storageOptions": '{"key": "b"}'})
    assert (twice.value.argument, twice.value.reason) == ("storage.key", "given twice")
    with pytest.raises(InvalidTextError) as not_object:
        storage_options({"storageOptions": "[1, 2]"})
    assert (not_object.value.argument, not_object.value.reason) == ("storageOptions", "not a JSON object")
    with pytest.raises(InvalidTextError) as empty:
        storage_options({"storage.": "x"})
    assert empty.value.argument == "storage."

    loc = TableLocation.of("s3://b/t", {"secret": "hush", "key": "k", "client_kwargs": {"region_name": "r"}})
    assert repr(loc) == "TableLocation('s3://b/t', storage_options=[client_kwargs, key, secret])"
    assert "hush" not in repr(loc) and str(loc) == "s3://b/t"
    copy = pickle.loads(pickle.dumps(loc))
    assert copy == loc and hash(copy) == hash(loc)
    loc.storage_options["client_kwargs"]["region_name"] = "changed"  # a copy: the value stays
    assert loc.storage_options["client_kwargs"] == {"region_name": "r"}
    assert json.loads(storage_spark_options(loc)["storageOptions"]) == loc.storage_options
    assert storage_spark_options(TableLocation.of("/tmp/t")) == {}
    with pytest.raises(InvalidTextError):
        TableLocation.of("", {})


_NAMES = st.text(
    alphabet=st.characters(codec="ascii", categories=["Ll", "Nd"], include_characters="_"), min_size=1
)
_TEXT = st.text(max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    flat=st.dictionaries(_NAMES, _TEXT, max_size=5),
    document=st.one_of(st.none(), _TEXT, st.dictionaries(_NAMES, _TEXT, max_size=3).map(json.dumps)),
)
def test_any_storage_option_text_parses_or_names_the_option(
    flat: dict[str, str], document: str | None
) -> None:
    """User text: every storage.<name> value arrives as its string (or a boolean for
    true/false), and any storageOptions text is a JSON object of options or an
    InvalidTextError naming the option, never another exception."""
    options: dict[str, str] = {f"storage.{k}": v for k, v in flat.items()}
    if document is not None:
        options["storageOptions"] = document
    try:
        parsed = storage_options(options)
    except InvalidTextError as exc:
        assert exc.argument in {"storageOptions", *options}
        assert document is not None or exc.argument.startswith("storage.")
        return
    for name, value in flat.items():
        if value.strip().lower() in ("true", "false"):
            assert parsed[name] is (value.strip().lower() == "true")
        else:
            assert parsed[name] == value
    if document is not None and document.strip():
        nested = json.loads(document)
        assert isinstance(nested, dict) and {k: parsed[k] for k in nested} == nested
        assert not set(nested) & set(flat)
