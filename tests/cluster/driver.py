"""A Spark driver for the cluster tests, run as a child process (one SparkContext per JVM).

Usage: ``python driver.py '<config json>'`` where the config is::

    {"master": "spark://127.0.0.1:<port>", "pyfiles": "/path/project.zip", "app": "name",
     "cores_max": 2, "executors": 2, "scenarios": [["batch", {"uri": ...}], ...]}

It builds a SparkSession against ``master`` with the project zip in
``spark.submit.pyFiles``, waits (bounded) until ``executors`` executors registered, runs the
scenarios in order and prints one line ``CLUSTER-RESULT <json>`` on stdout: a mapping of
scenario name to its result, or to ``{"error": <traceback>}`` if it raised (later scenarios
still run). Nothing here imports from ``tests``: the driver sees the project only as its
parent process gave it (the tests run it with the project zip on ``PYTHONPATH`` and the
repository hidden).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULT_MARKER = "CLUSTER-RESULT "
EXECUTOR_WAIT = 90.0  # seconds for the executors to register
QUERY_WAIT = 120.0  # seconds for a streaming query to finish
BARRIER_WAIT = 120.0  # seconds for the other drivers of a concurrent scenario

Scenario = Callable[[Any, dict[str, Any]], dict[str, Any]]


def build_session(config: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if config.get("jars"):  # S3A for native s3:// scans; executors fetch them from the driver
        builder = builder.config("spark.jars", ",".join(config["jars"]))
    return (
        builder.master(config["master"])
        .appName(config.get("app", "eventlog-cluster-test"))
        .config("spark.submit.pyFiles", config["pyfiles"])
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", str(config.get("cores_max", 2)))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


def wait_for_executors(spark: Any, count: int, timeout: float = EXECUTOR_WAIT) -> int:
    """Block until ``count`` executors registered with the driver; return how many did."""
    deadline = time.monotonic() + timeout
    while True:
        # getExecutorMemoryStatus lists the block managers: the driver's and one per executor.
        registered = int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1
        if registered >= count:
            return registered
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{registered} of {count} executors registered after {timeout:.0f} s")
        time.sleep(0.2)


def rows_of(df: Any) -> list[dict[str, Any]]:
    """The DataFrame's rows as dicts, sorted by ``id``."""
    return sorted((r.asDict() for r in df.collect()), key=lambda r: r["id"])


# ---------------------------------------------------------------------------------- scenarios


def scenario_ship(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Where each executor imported the project from (tasks on every executor)."""

    def origins(_: Any) -> Any:
        import importlib
        import sys as task_sys

        modules = ["eventlog", "lockstore", "streaming", "spark_adapter", "pyspark_eventlog"]
        time.sleep(0.5)  # keep the task slot busy so the other executor takes the next task
        yield {
            "cwd": os.getcwd(),
            "executable": task_sys.executable,
            "sys_path": list(task_sys.path),
            "files": {m: os.path.abspath(str(importlib.import_module(m).__file__)) for m in modules},
        }

    import eventlog

    tasks = spark.sparkContext.parallelize(range(8), 8).mapPartitions(origins).collect()
    return {"driver_eventlog": os.path.abspath(str(eventlog.__file__)), "tasks": tasks}


def scenario_batch(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Append twice (creating a partitioned table), then overwrite."""
    uri = args["uri"]

    def frame(ids: range) -> Any:
        data = [(i, i % 2, f"n{i}") for i in ids]
        return spark.createDataFrame(data, "id long, part long, name string").repartition(2)

    frame(range(0, 10)).write.format("eventlog").mode("append").option("partitionBy", "part").save(uri)
    frame(range(10, 20)).write.format("eventlog").mode("append").save(uri)
    counts = [spark.read.format("eventlog").load(uri).count()]
    frame(range(100, 105)).write.format("eventlog").mode("overwrite").save(uri)
    counts.append(spark.read.format("eventlog").load(uri).count())
    return {"counts": counts}


def scenario_read(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    """``spark.read.format("eventlog")``: latest, time travel, and a filter."""
    uri = args["uri"]
    reader = spark.read.format("eventlog")
    return {
        "latest": rows_of(reader.load(uri)),
        "version1": rows_of(spark.read.format("eventlog").option("versionAsOf", 1).load(uri)),
        "filtered": rows_of(spark.read.format("eventlog").load(uri).where("id >= 5")),
        "partitions": spark.read.format("eventlog")
        .option("maxPartitionBytes", 1)
        .load(uri)
        .rdd.getNumPartitions(),
    }


def scenario_native(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    """``spark_adapter.read_table``: latest, time travel, and a pushed ``where``."""
    from spark_adapter import read_table

    uri = args["uri"]
    return {
        "latest": rows_of(read_table(spark, uri)),
        "version1": rows_of(read_table(spark, uri, version=1)),
        "filtered": rows_of(read_table(spark, uri, where="id >= 5")),
    }


def scenario_merge(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Upsert ids 5..14 into a table holding ids 0..9."""
    from spark_adapter import EventlogTable

    source = spark.createDataFrame(
        [(i, i % 2, f"new{i}") for i in range(5, 15)], "id long, part long, name string"
    ).repartition(2)
    result = (
        EventlogTable.forPath(spark, args["uri"])
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    return {"version": result.version, "operation": result.operation, "metrics": dict(result.metrics)}


def scenario_stream(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    """One ``availableNow`` run of Parquet files into ``writeStream.format("eventlog")``
    (``options``: more sink options)."""
    stream = (
        spark.readStream.schema("id long, part long").option("maxFilesPerTrigger", 1).parquet(args["input"])
    )
    query = (
        stream.writeStream.format("eventlog")
        .option("checkpointLocation", args["checkpoint"])
        .option("partitionBy", "part")
        .options(**args.get("options", {}))
        .trigger(availableNow=True)
        .start(args["uri"])
    )
    try:
        finished = bool(query.awaitTermination(QUERY_WAIT))
    finally:
        query.stop()
    progress = query.recentProgress
    return {
        "finished": finished,
        "query_id": str(query.id),
        "input_rows": sum(int(p["numInputRows"]) for p in progress),
    }


def scenario_append_batches(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Writer ``writer`` appends ``batches`` DataFrames of 5 rows, each tagged in userMetadata.

    With ``ready_dir`` and ``parties``: wait (bounded) until that many drivers are ready,
    so concurrent writers really overlap. Returns the acknowledged appends in order and the
    wall-clock span of the appends (``started``, ``ended``).
    """
    uri, writer, batches = args["uri"], int(args["writer"]), int(args["batches"])
    frames = [
        spark.createDataFrame(
            [(writer * 1000 + b * 10 + k, writer, b) for k in range(5)], "id long, worker long, batch long"
        ).repartition(2)
        for b in range(batches)
    ]
    if args.get("ready_dir"):
        ready = Path(args["ready_dir"])
        (ready / f"writer-{writer}").touch()
        deadline = time.monotonic() + BARRIER_WAIT
        while len(list(ready.iterdir())) < int(args["parties"]):
            if time.monotonic() >= deadline:
                raise TimeoutError("the other writers did not get ready in time")
            time.sleep(0.05)
    acks = []
    started = time.time()
    for b, df in enumerate(frames):
        tag = f"w{writer}-b{b}"
        df.write.format("eventlog").mode("append").option("userMetadata", tag).save(uri)
        acks.append({"tag": tag, "ids": [writer * 1000 + b * 10 + k for k in range(5)]})
    return {"acks": acks, "started": started, "ended": time.time()}


def scenario_s3_table(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    """An ``s3://`` table from the cluster, its endpoint and credentials in options only.

    ``storage_options``: fsspec options (``storage.<name>`` reader/writer options, and
    ``storage_options=`` of ``EventlogTable.forPath``); ``storage_json``: more of them, given
    as the ``storageOptions`` JSON option (and merged into ``forPath``'s); ``slots``: the slot
    store URI. First, what ``AWS_*`` variables the driver and every executor's Python workers
    see; then two appends (executors write the Parquet files, the driver commits), a read
    through ``format("eventlog")``, a MERGE through ``EventlogTable`` (its ``toDF()`` reads
    through the same data source), and a time-travel read.
    """
    from spark_adapter import EventlogTable

    uri, slots = args["uri"], args["slots"]
    storage = {**args["storage_options"], **args.get("storage_json", {})}
    options = {f"storage.{k}": v for k, v in args["storage_options"].items()}
    options.update(slots=slots, storageOptions=json.dumps(args.get("storage_json", {})))

    def environment(_: Any) -> Any:
        time.sleep(0.5)  # keep the task slot busy so the other executor takes the next task
        yield {"cwd": os.getcwd(), "aws": sorted(k for k in os.environ if k.upper().startswith("AWS_"))}

    def frame(ids: range, prefix: str) -> Any:
        data = [(i, i % 2, f"{prefix}{i}") for i in ids]
        return spark.createDataFrame(data, "id long, part long, name string").repartition(2)

    def read(**extra: str) -> list[dict[str, Any]]:
        return rows_of(spark.read.format("eventlog").options(**options, **extra).load(uri))

    steps: dict[str, float] = {}
    mark = time.monotonic()

    def step(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        steps[name], mark = now - mark, now

    probes = spark.sparkContext.parallelize(range(4), 4).mapPartitions(environment).collect()
    step("probe")
    writer = frame(range(0, 10), "a").write.format("eventlog").mode("append").options(**options)
    writer.option("partitionBy", "part").save(uri)
    step("create")
    frame(range(10, 20), "b").write.format("eventlog").mode("append").options(**options).save(uri)
    step("append")
    result: dict[str, Any] = {
        "driver_aws": sorted(k for k in os.environ if k.upper().startswith("AWS_")),
        "executors": probes,
        "appended": read(),
        "steps": steps,
    }
    step("read")
    table = EventlogTable.forPath(spark, uri, slots, storage_options=storage)
    try:
        merged = (
            table.alias("t")
            .merge(frame(range(15, 25), "m").alias("s"), "t.id = s.id")
            .whenMatchedDelete("s.id % 3 = 0")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )
        step("merge")
        result["merge"] = {
            "version": merged.version,
            "operation": merged.operation,
            "metrics": dict(merged.metrics),
        }
        result["to_df"] = rows_of(table.toDF())
        step("to_df")
    finally:
        table.table.close()
    result["version0"] = read(versionAsOf="0")
    step("version0")
    return result


def scenario_s3_native(spark: Any, args: dict[str, Any]) -> dict[str, Any]:
    """``read_table`` of the ``s3_table`` scenario's table through S3A (native: Spark's Parquet
    scan on the executors), its storage options given to the read only: latest, time travel
    and a partition ``where``. Also the plan's scan, its files' scheme, what of the options
    the session's Hadoop configuration holds afterwards (nothing), and whether the secret
    appears in the explained plans."""
    import contextlib
    import io

    from spark_adapter import read_table

    uri, storage = args["uri"], {**args["storage_options"], **args.get("storage_json", {})}
    latest = read_table(spark, uri, storage_options=storage)
    old = read_table(spark, uri, storage_options=storage, version=1)
    odd = read_table(spark, uri, storage_options=storage, where="part = 1")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        latest.explain(extended=True)
    plan = str(latest._jdf.queryExecution().executedPlan().toString())
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    secret = args["storage_options"]["secret"]
    return {
        "latest": rows_of(latest),
        "version1": rows_of(old),
        "odd": rows_of(odd),
        "odd_files": len(odd.inputFiles()),
        "schemes": sorted({f.split("://", 1)[0][:4] for f in latest.inputFiles()}),
        "file_scan": "FileScan parquet" in plan and "BatchScan" not in plan,
        "session_conf": [k for k in ("fs.s3a.endpoint", "fs.s3a.secret.key") if conf.get(k) is not None],
        "secret_in_plans": secret in out.getvalue() or secret in plan,
    }


SCENARIOS: dict[str, Scenario] = {
    "ship": scenario_ship,
    "batch": scenario_batch,
    "read": scenario_read,
    "native": scenario_native,
    "merge": scenario_merge,
    "stream": scenario_stream,
    "stream_lease": scenario_stream,
    "append_batches": scenario_append_batches,
    "s3_table": scenario_s3_table,
    "s3_native": scenario_s3_native,
}


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    began = time.monotonic()
    spark = build_session(config)
    spark.sparkContext.setLogLevel("WARN")
    results: dict[str, Any] = {}
    timings: dict[str, float] = {"session": time.monotonic() - began}
    try:
        mark = time.monotonic()
        results["executors"] = wait_for_executors(spark, int(config.get("executors", 2)))
        timings["executors"] = time.monotonic() - mark
        for name, args in config["scenarios"]:
            mark = time.monotonic()
            try:
                results[name] = SCENARIOS[name](spark, args)
            except Exception:
                results[name] = {"error": traceback.format_exc()}
            timings[name] = time.monotonic() - mark
    finally:
        mark = time.monotonic()
        spark.stop()
        timings["stop"] = time.monotonic() - mark
    results["timings"] = timings
    print(RESULT_MARKER + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
