"""Native scans of ``s3://`` tables through S3A (``hadoop-aws`` on the suite's session, see
``tests/support/spark.py``), the table's fsspec ``storage_options`` translated to S3A
settings for each read only (:mod:`spark_adapter.s3a`).

The S3 API is moto's server on loopback; a second server, started by this module, is
another "endpoint" holding a bucket of the same name with other rows: a read that used the
wrong endpoint's settings would return the other table's rows. moto accepts any
credentials, so credentials are told apart by the secret this module greps for.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest
from py4j.protocol import Py4JJavaError

from eventlog import Table
from eventlog.log.location import TableLocation
from spark_adapter import EventlogTable, read_table, s3a
from spark_adapter.jvm_reader import DV_READER_CONF
from spark_adapter.native import NATIVE_CONF
from spark_adapter.s3a import HadoopTarget, Untranslatable, read_scheme, s3a_target, translate
from tests.support.fixtures import delete_bucket, s3_admin_client
from tests.support.s3server import ACCESS_KEY, start_s3_server_for_tests

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]
pytest.importorskip("s3fs")

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.string()), ("x", pa.float64())])
DV = {"delta.enableDeletionVectors": "true"}


def batch(ids: range, part: str) -> pa.Table:
    return pa.table({"id": list(ids), "p": [part] * len(ids), "x": [i / 4 for i in ids]}, schema=SCHEMA)


def rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["p"], r["x"]) for r in df.collect())


def engine_rows(uri: str, options: dict[str, Any], version: int | None = None) -> list[tuple[Any, ...]]:
    with Table.open(uri, storage_options=options) as t:
        got = t.to_arrow() if version is None else t.to_arrow(version=version)
    return sorted(zip(*(got.column(c).to_pylist() for c in ("id", "p", "x")), strict=True))


def plan(df: Any) -> str:
    return str(df._jdf.queryExecution().executedPlan().toString())


def assert_native(df: Any) -> None:
    """Spark's own Parquet scan of S3A files, and no Python data source or Python UDF."""
    text = plan(df)
    assert "FileScan parquet" in text
    assert "BatchScan" not in text and "BatchEvalPython" not in text and "PythonDataSource" not in text
    assert df.inputFiles() and all(f.startswith("s3a-") for f in df.inputFiles())


def assert_python_source(df: Any) -> None:
    text = plan(df)
    assert "BatchScan" in text and "FileScan parquet" not in text


@pytest.fixture
def secret() -> str:
    """A secret nothing else contains (moto takes any), to grep for."""
    return f"s3cr3t-{uuid.uuid4().hex}"


@pytest.fixture
def options(s3_storage_options: dict[str, str], secret: str) -> dict[str, Any]:
    return {**s3_storage_options, "secret": secret, "client_kwargs": {"region_name": "us-east-1"}}


def make_table(
    uri: str, options: dict[str, Any], parts: dict[str, range], properties: dict[str, str] | None = None
) -> Table:
    slots = uri.rsplit("/", 1)[0] + "/_slots"
    t = Table.create(
        uri, SCHEMA, partition_by=["p"], properties=properties, slots=slots, storage_options=options
    )
    for part, ids in parts.items():
        t.append(batch(ids, part))
    return t


@pytest.fixture
def table(s3_uri: str, options: dict[str, Any]) -> Iterator[str]:
    """A partitioned table, versions 0 (create), 1..3 (one append per partition)."""
    make_table(s3_uri, options, {"a": range(0, 40), "b": range(100, 130), "c": range(200, 210)}).close()
    yield s3_uri


# --------------------------------------------------------------------------- reads


def test_read_table_scans_natively_with_the_tables_options(
    spark: Any, table: str, options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="spark_adapter.native"):
        df = read_table(spark, table, storage_options=options)
        assert_native(df)
        assert rows(df) == engine_rows(table, options)
    assert "native scan of" in caplog.text and "Python data source" not in caplog.text
    assert len(rows(df)) == 80
    # The options reached the read only: the session's Hadoop configuration has none of them.
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    assert conf.get("fs.s3a.endpoint") is None and conf.get("fs.s3a.secret.key") is None
    scheme = df.inputFiles()[0].split("://", 1)[0]
    assert conf.get(f"fs.{scheme}.impl") is None


def test_to_df_and_where_prune_partitions_natively(spark: Any, table: str, options: dict[str, Any]) -> None:
    slots = table.rsplit("/", 1)[0] + "/_slots"
    et = EventlogTable.forPath(spark, table, slots, storage_options=options)
    try:
        full = et.toDF()
        assert_native(full)
        assert rows(full) == engine_rows(table, options)
    finally:
        et.table.close()
    day = read_table(spark, table, storage_options=options, where="p = 'b' AND id >= 120")
    assert_native(day)
    assert len(day.inputFiles()) == 1 and "/p=b/" in day.inputFiles()[0]
    assert rows(day) == [(i, "b", i / 4) for i in range(120, 130)]


def test_time_travel_natively(spark: Any, table: str, options: dict[str, Any]) -> None:
    old = read_table(spark, table, storage_options=options, version=2)
    assert_native(old)
    assert rows(old) == engine_rows(table, options, version=2)
    assert sorted({r[1] for r in rows(old)}) == ["a", "b"]


def test_many_partitions_join_their_values_on_the_read_schemes_paths(
    spark: Any, table: str, options: dict[str, Any], monkeypatch: Any
) -> None:
    """Past MAX_PARTITION_SCANS partitions, one scan joined on ``_metadata.file_path``: the
    driver qualifies the paths with the read's options, as the scan names them."""
    from spark_adapter import native

    monkeypatch.setattr(native, "MAX_PARTITION_SCANS", 1)
    df = read_table(spark, table, storage_options=options)
    assert_native(df)
    assert "BroadcastHashJoin" in plan(df) or "BroadcastNestedLoopJoin" in plan(df)
    assert rows(df) == engine_rows(table, options)


@pytest.mark.parametrize("reader", ["jvm", "sql"])
def test_deletion_vectors_on_s3_natively(
    spark: Any, s3_uri: str, options: dict[str, Any], reader: str
) -> None:
    with make_table(s3_uri, options, {"a": range(0, 300), "b": range(1000, 1100)}, DV) as t:
        t.delete("id % 7 = 3 OR id = 1000")
        dvs = [f for f in t.snapshot().add_files if f.deletion_vector is not None]
    assert len(dvs) == 2
    want = engine_rows(s3_uri, options)
    assert len(want) == 400 - len([i for i in range(0, 300) if i % 7 == 3]) - 15
    spark.conf.set(DV_READER_CONF, reader)
    try:
        df = read_table(spark, s3_uri, storage_options=options)
        assert_native(df)
        text = plan(df)
        # The JVM reader drops deleted rows inside the scan; the SQL one filters on row_index.
        assert ("Format: DvParquet" in text, "row_index" in text) == (reader == "jvm", reader == "sql")
        assert rows(df) == want
    finally:
        spark.conf.unset(DV_READER_CONF)


# --------------------------------------------------------------------------- two endpoints


@pytest.fixture(scope="module")
def second_server() -> Iterator[str]:
    """Another S3 endpoint (a second moto server) for the whole module."""
    endpoint, stop = start_s3_server_for_tests()
    try:
        yield endpoint
    finally:
        stop()


def test_two_endpoints_with_one_bucket_name_read_in_one_session(
    spark: Any, s3_server: str, second_server: str, s3_fake_aws_env: None
) -> None:
    """Same bucket name, other endpoint, other credentials: each read gets its own table's
    rows, in any order, again and again (Hadoop caches file systems by scheme and bucket)."""
    bucket = f"eventlog-{uuid.uuid4().hex}"
    uri = f"s3://{bucket}/table"
    clients = [s3_admin_client(e) for e in (s3_server, second_server)]
    one = {"endpoint_url": s3_server, "key": ACCESS_KEY, "secret": f"one-{uuid.uuid4().hex}"}
    two = {"endpoint_url": second_server, "key": "other", "secret": f"two-{uuid.uuid4().hex}"}
    for c in clients:
        c.create_bucket(Bucket=bucket)
    try:
        make_table(uri, one, {"a": range(0, 5)}).close()
        make_table(uri, two, {"z": range(50, 53)}).close()
        for _ in range(2):
            first = read_table(spark, uri, storage_options=one)
            second = read_table(spark, uri, storage_options=two)
            assert_native(first)
            assert_native(second)
            assert rows(first) == [(i, "a", i / 4) for i in range(5)]
            assert rows(second) == [(i, "z", i / 4) for i in range(50, 53)]
        scheme_one = first.inputFiles()[0].split("://")[0]
        scheme_two = second.inputFiles()[0].split("://")[0]
        assert scheme_one != scheme_two
    finally:
        for c in clients:
            delete_bucket(c, bucket)


def test_a_wrong_endpoint_fails_only_that_tables_read(
    spark: Any, table: str, options: dict[str, Any], second_server: str
) -> None:
    """The table's log is read with its options, the data files with a read-level override
    that points S3A at the second server (which has no such bucket): only that read fails,
    with S3A's error, and the next read with the right options succeeds."""
    location = TableLocation.of(table, options)
    target = s3a_target(spark, location)
    assert isinstance(target, HadoopTarget)
    wrong = {**target.options, "fs.s3a.endpoint": second_server}
    files = [f.split("://", 1)[1] for f in read_table(spark, table, storage_options=options).inputFiles()]
    other = read_scheme({"endpoint": second_server})
    wrong[f"fs.{other}.impl"] = s3a.S3A_FILESYSTEM
    with pytest.raises(Py4JJavaError) as failed:
        spark.read.options(**wrong).parquet(*[f"{other}://{f}" for f in files]).collect()
    text = str(failed.value)
    assert "org.apache.hadoop.fs.s3a.UnknownStoreException" in text and "NoSuchBucket" in text
    assert options["secret"] not in text
    assert rows(read_table(spark, table, storage_options=options)) == engine_rows(table, options)


# --------------------------------------------------------------------------- secrets


def test_no_secret_in_plans_or_logs(
    spark: Any,
    table: str,
    options: dict[str, Any],
    secret: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with caplog.at_level(logging.DEBUG, logger="spark_adapter"):
        df = read_table(spark, table, storage_options=options, where="p = 'a'")
        assert len(df.collect()) == 40
        capsys.readouterr()
        df.explain(extended=True)
        df.explain(mode="formatted")
        explained = capsys.readouterr().out
    qe = df._jdf.queryExecution()
    texts = [explained, caplog.text, str(qe.toString()), str(qe.analyzed().toString()), plan(df)]
    assert "FileScan parquet" in explained
    assert all(secret not in t for t in texts)
    assert all(ACCESS_KEY + "," not in t for t in texts)
    target = s3a_target(spark, TableLocation.of(table, options))
    assert isinstance(target, HadoopTarget) and secret not in repr(target)
    assert target.options["fs.s3a.secret.key"] == secret  # the read does carry it


# --------------------------------------------------------------------------- fallbacks


def test_without_hadoop_aws_reads_fall_back_to_the_python_source(
    spark: Any, table: str, options: dict[str, Any], caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    monkeypatch.setattr(s3a, "s3a_available", lambda spark: False)
    with caplog.at_level(logging.INFO, logger="spark_adapter.native"):
        df = read_table(spark, table, storage_options=options)
    (line,) = [r.getMessage() for r in caplog.records if "native read of" in r.getMessage()]
    assert "hadoop-aws" in line and "Python data source" in line
    assert_python_source(df)
    assert rows(df) == engine_rows(table, options)


def test_an_option_s3a_cannot_express_falls_back_naming_its_key(
    spark: Any, table: str, options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    odd = {**options, "config_kwargs": {"retries": {"mode": "standard"}}}
    with caplog.at_level(logging.INFO, logger="spark_adapter.native"):
        df = read_table(spark, table, storage_options=odd)
    (line,) = [r.getMessage() for r in caplog.records if "native read of" in r.getMessage()]
    assert "'config_kwargs.retries.mode'" in line and "standard" not in line
    assert options["secret"] not in caplog.text
    assert_python_source(df)
    assert rows(df) == engine_rows(table, options)


def test_native_conf_off_still_falls_back(spark: Any, table: str, options: dict[str, Any]) -> None:
    spark.conf.set(NATIVE_CONF, "false")
    try:
        df = read_table(spark, table, storage_options=options)
        assert_python_source(df)
        assert rows(df) == engine_rows(table, options)
    finally:
        spark.conf.unset(NATIVE_CONF)


# --------------------------------------------------------------------------- DML


def test_dml_on_s3_with_native_scans(
    spark: Any, s3_uri: str, options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    slots = s3_uri.rsplit("/", 1)[0] + "/_slots"
    make_table(s3_uri, options, {"a": range(0, 20), "b": range(100, 110)}, DV).close()
    et = EventlogTable.forPath(spark, s3_uri, slots, storage_options=options)
    try:
        with caplog.at_level(logging.INFO, logger="spark_adapter.native"):
            et.delete("id % 5 = 0")
            et.update("p = 'b'", {"x": "x + 1000"})
            source = spark.createDataFrame([(1, "a", -1.0), (500, "c", 5.0)], "id bigint, p string, x double")
            et.alias("t").merge(
                source.alias("s"), "t.id = s.id AND t.p = s.p"
            ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
        scans = [r.getMessage() for r in caplog.records if r.getMessage().startswith("native scan of")]
        assert len(scans) >= 3 and not [r for r in caplog.records if "native read of" in r.getMessage()]
        want = sorted(
            [(i, "a", -1.0 if i == 1 else i / 4) for i in range(0, 20) if i % 5]
            + [(i, "b", i / 4 + 1000) for i in range(100, 110) if i % 5]
            + [(500, "c", 5.0)]
        )
        assert engine_rows(s3_uri, options) == want
        df = et.toDF()
        assert_native(df)
        assert rows(df) == want
    finally:
        et.table.close()


# --------------------------------------------------------------------------- translation


def test_translate_maps_fsspec_names_to_s3a_keys() -> None:
    got = translate(
        {
            "endpoint_url": "https://s3.example.test:9000",
            "key": "AK",
            "secret": "SK",
            "token": "TK",
            "client_kwargs": {"region_name": "eu-west-1"},
            "config_kwargs": {
                "s3": {"addressing_style": "virtual"},
                "retries": {"max_attempts": 4},
                "connect_timeout": 2.5,
                "read_timeout": "30",
                "max_pool_connections": 12,
            },
            "requester_pays": "true",
            "use_listings_cache": False,
        }
    )
    assert got == {
        "fs.s3a.endpoint": "https://s3.example.test:9000",
        "fs.s3a.connection.ssl.enabled": "true",
        "fs.s3a.endpoint.region": "eu-west-1",
        "fs.s3a.path.style.access": "false",
        "fs.s3a.access.key": "AK",
        "fs.s3a.secret.key": "SK",
        "fs.s3a.session.token": "TK",
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
        "fs.s3a.attempts.maximum": "3",
        "fs.s3a.connection.establish.timeout": "2500ms",
        "fs.s3a.connection.timeout": "30000ms",
        "fs.s3a.connection.maximum": "12",
        "fs.s3a.requester.pays.enabled": "true",
    }
    plain = translate({"endpoint_url": "http://127.0.0.1:9000", "key": "a", "secret": "b"})
    assert plain["fs.s3a.connection.ssl.enabled"] == "false"
    assert plain["fs.s3a.path.style.access"] == "true"  # an S3-compatible endpoint
    assert plain["fs.s3a.endpoint.region"] == "us-east-1"
    assert plain["fs.s3a.aws.credentials.provider"].endswith(".SimpleAWSCredentialsProvider")
    anon = translate({"anon": "true", "client_kwargs": {"region_name": "us-west-2"}})
    assert anon == {
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider",
        "fs.s3a.endpoint.region": "us-west-2",
    }
    assert translate({"anon": False, "use_ssl": False}) == {"fs.s3a.connection.ssl.enabled": "false"}


@pytest.mark.parametrize(
    ("storage_options", "key"),
    [
        ({"profile": "prod-secret-profile"}, "profile"),
        ({"key": "a", "secret": "b", "client_kwargs": {"verify": "/ca/secret.pem"}}, "client_kwargs.verify"),
        ({"config_kwargs": {"retries": {"mode": "adaptive"}}}, "config_kwargs.retries.mode"),
        ({"config_kwargs": {"signature_version": "s3v2"}}, "config_kwargs.signature_version"),
        (
            {"config_kwargs": {"s3": {"use_accelerate_endpoint": True}}},
            "config_kwargs.s3.use_accelerate_endpoint",
        ),
        ({"s3_additional_kwargs": {"ServerSideEncryption": "aws:kms"}}, "s3_additional_kwargs"),
        ({"key": "only-a-key-no-secret"}, "key"),
        ({"anon": True, "key": "a", "secret": "b"}, "anon"),
        ({"endpoint_url": "ftp://host"}, "endpoint_url"),
        ({"use_ssl": "maybe"}, "use_ssl"),
    ],
)
def test_translate_names_the_option_it_cannot_express(storage_options: dict[str, Any], key: str) -> None:
    with pytest.raises(Untranslatable) as failed:
        translate(storage_options)
    assert failed.value.key == key
    assert str(failed.value) == f"storage option {key!r} has no S3A equivalent"


def test_read_scheme_is_one_per_option_set() -> None:
    a = {"fs.s3a.endpoint": "http://127.0.0.1:1", "fs.s3a.secret.key": "s"}
    assert read_scheme(a) == read_scheme(dict(reversed(list(a.items()))))
    assert read_scheme(a) != read_scheme({**a, "fs.s3a.secret.key": "t"})
    assert read_scheme(a).startswith("s3a-") and len(read_scheme(a)) == 24


def test_s3a_jars_lists_hadoop_aws_and_the_sdk_not_pyspark_jars() -> None:
    jars = s3a.s3a_jars()
    names = [j.rsplit("/", 1)[-1] for j in jars]
    assert any(n.startswith("hadoop-aws-") for n in names)
    assert any(n.startswith("s3-2.") for n in names)
    assert not any(n.startswith(("hadoop-client-", "bundle-")) for n in names)
    # No second copy of an artifact pyspark ships (netty, httpclient, slf4j...).
    shipped = {re.sub(r"-\d[^/]*\.jar$", "", j) for j in os.listdir(Path(pyspark.__file__).parent / "jars")}
    assert {re.sub(r"-\d[^/]*\.jar$", "", n) for n in names} & shipped == set()
    assert sum(os.path.getsize(j) for j in jars) < 40_000_000  # no 690 MB SDK bundle


def test_s3a_jars_says_what_to_run_when_they_are_missing(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv(s3a.JARS_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=re.escape("run scripts/bootstrap_s3a.sh")):
        s3a.s3a_jars()
    (tmp_path / "jars.txt").write_text(str(tmp_path / "gone.jar") + "\n")
    with pytest.raises(FileNotFoundError, match=re.escape("gone.jar")):
        s3a.s3a_jars()
