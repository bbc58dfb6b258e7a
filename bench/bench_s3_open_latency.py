"""Opening a table of many small commits on S3: commit files read ahead concurrently
(``eventlog.log.commitlog.PREFETCH_COMMITS``, 16) against one after the other (1), on the
local moto server, with and without an injected client-side round-trip latency.

moto on loopback answers in about a millisecond and serves one request at a time on this
2-core machine, so it cannot show what a real S3 region's round trip (tens of ms) costs a
reader that waits for each GET in turn. ``--latency-ms`` adds an ``asyncio.sleep`` before
every S3 request of our client (aiobotocore), which overlaps between concurrent requests as
network time does. deltalake (Rust, its own client) is timed without injected latency,
for reference.

    .venv/bin/python bench/bench_s3_open_latency.py [--commits 100] [--rounds 5] [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa

from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, start_s3_server_for_tests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    for name in list(os.environ):
        if name.startswith("AWS_"):
            del os.environ[name]
    os.environ.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION=REGION
    )
    endpoint, stop = start_s3_server_for_tests()
    try:
        run(endpoint, args.commits, args.rounds, args.latency_ms / 1000)
    finally:
        stop()


def run(endpoint: str, commits: int, rounds: int, latency: float) -> None:
    import aiobotocore.client as aioclient
    import boto3
    import deltalake

    from eventlog import Table
    from eventlog.log import commitlog
    from lockstore import InMemorySlotStore

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench-open-latency")
    uri = "s3://bench-open-latency/t"
    options = {"endpoint_url": endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}
    theirs = {
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true",
    }  # fmt: skip
    schema = pa.schema([("id", pa.int64())])
    table = Table.create(
        uri, schema, slots=InMemorySlotStore(), storage_options=options,
        properties={"delta.checkpointInterval": str(commits * 10)},
    )  # fmt: skip
    for i in range(commits):
        table.append(pa.table({"id": [i]}, schema=schema))
    original = aioclient.AioBaseClient._make_api_call
    delay = {"s": 0.0}

    async def delayed(self: Any, operation: str, params: dict[str, Any]) -> Any:
        if delay["s"]:
            await asyncio.sleep(delay["s"])
        return await original(self, operation, params)

    aioclient.AioBaseClient._make_api_call = delayed  # type: ignore[method-assign]
    cases = [
        (f"ours prefetch={p} latency={ms:g}ms", p, ms / 1000) for ms in (0, latency * 1000) for p in (16, 1)
    ]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in cases}
    times["deltalake latency=0ms"] = []
    for _ in range(rounds):  # alternating
        for name, prefetch, seconds in cases:
            commitlog.PREFETCH_COMMITS, delay["s"] = prefetch, seconds
            wall, cpu = time.perf_counter(), time.process_time()
            version = Table.open(uri, slots=InMemorySlotStore(), storage_options=options).version
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
            assert version == commits, version
        delay["s"] = 0.0
        wall, cpu = time.perf_counter(), time.process_time()
        assert deltalake.DeltaTable(uri, storage_options=theirs).version() == commits
        times["deltalake latency=0ms"].append((time.perf_counter() - wall, time.process_time() - cpu))
    load = os.getloadavg()
    print(f"open of {commits} commits, no checkpoint; medians of {rounds} alternating rounds; load {load}")
    medians = {name: statistics.median(w for w, _ in v) for name, v in times.items()}
    for name, values in times.items():
        cpu_ms = statistics.median(c for _, c in values) * 1000
        print(f"  {name:34s} wall {medians[name] * 1000:8.1f} ms   client CPU {cpu_ms:7.1f} ms")
    for ms in (0, latency * 1000):
        ahead, serial = (
            medians[f"ours prefetch=16 latency={ms:g}ms"],
            medians[f"ours prefetch=1 latency={ms:g}ms"],
        )
        print(f"  latency {ms:g} ms: read ahead / one by one = {ahead / serial:.2f}x")
    ratio = medians["ours prefetch=16 latency=0ms"] / medians["deltalake latency=0ms"]
    print(f"  ours prefetch=16 / deltalake, no latency = {ratio:.2f}x")


if __name__ == "__main__":
    main()
