"""Tables on S3 (a local moto server): small appends and bulk write/scan, ours versus delta-rs.

Starts moto's standalone S3 server on a loopback port (``tests.support.s3server.MotoS3Server``:
a Python emulator in its own process, every PUT/POST/DELETE serialized under one lock so that
conditional writes are atomic) and stops it at the end. Only fake credentials are used: every
``AWS_*`` variable is removed from this process's environment and ``testing`` keys are set.
moto is not AWS: its latency and throughput are those of a Python web app sharing this
machine's cores with the client. What matters is the ratio ours / deltalake on the same
server, and S3 / local for each engine.

Four configurations (``deltalake-local`` is a reference for deltalake's own S3 / local ratio):

* ``ours-local``      -- a local path, the default embedded (local-file) slot store
* ``ours-s3``         -- ``s3://<bucket>/...`` with ``storage_options={"endpoint_url", "key",
  "secret"}`` and ``slots=lockstore.InMemorySlotStore()``: one process only (an object-store
  table has no default slot store; several machines would need ZooKeeper slots)
* ``deltalake-s3``    -- the same server, ``storage_options`` ``AWS_ENDPOINT_URL``, keys, region,
  ``AWS_ALLOW_HTTP`` (deltalake >= 1.0 commits with ``If-None-Match: *``, which moto honours)
* ``deltalake-local`` -- a local path

Measurements, each ``--repeat`` times on fresh tables, configurations interleaved with the
first one rotating from run to run, ``gc.collect()`` (and ``os.sync()``) before each timed call:

1. small appends: N one-row appends (200; ``--quick`` 30). Ours through one handle
   (``Table.open(...).append(batch)``), deltalake ``write_deltalake(uri, batch, mode="append")``
   (each call loads the table's log, as a user of that API pays). commits/s, ms/commit, CPU
   ms/commit of this process (all threads) and of the S3 server. Afterwards the version must be
   N and the table must hold N rows.
2. bulk write: one append of 2,000,000 rows (``--quick`` 200,000; columns ``id int64, value
   float64, name string, ts timestamp[us, UTC], count int32``, built by ``bench_bulk.make_data``)
   into a new table (ours: ``Table.create`` untimed, then the timed ``append``; deltalake:
   ``write_deltalake`` creating the table). MB/s = Arrow ``nbytes`` / seconds.
3. full scan of the tables just written: ``Table.open(...).to_arrow()`` versus
   ``DeltaTable(...).to_pyarrow_table()`` (handle / DeltaTable made beforehand); row count and
   ``sum(id)`` are checked.
4. open: a table of C one-row commits (``--open-commits``, default 100; ``--quick`` 20; versions
   0..C-1; ``delta.checkpointInterval`` 1,000,000, so no automatic checkpoint), then the same
   table with a checkpoint at its version C-1 (``Table.checkpoint()`` / ``create_checkpoint()``,
   nothing after it). Each is opened ``--opens`` times per run (default 3), configurations
   interleaved: ``Table.open(uri)`` versus ``DeltaTable(uri)`` (both read the whole snapshot,
   file list included); the per-run median is kept. The opened version is checked. The tables
   are built untimed (deltalake through one ``DeltaTable``). (The automatic checkpoints differ:
   ours at versions that are multiples of the interval, delta-rs at version+1 multiples.)

Then, on a second server that logs every request, S3 requests are counted for ``ours-s3``,
``deltalake-s3`` and ``deltalake-s3-handle`` (by HTTP method; GET split into object reads and
listings): per small append (mean of N, after a first untimed one), per open of the table those
appends made (``Table.open`` / ``DeltaTable(uri)``), create + bulk write, and open + full scan
of the bulk table, and the two opens of measurement 4. ``--profile`` adds a cProfile of ours-s3
small appends (top functions).

Client and server cost. moto is a Python web app: each request costs it about as much CPU as
the client spends making it. Every timing therefore also reports the S3 server process's CPU
time (``/proc/<pid>/stat``, all its threads) and its share of the wall time: requests are
sequential, so that share is (roughly) wall time a faster server would not cost. The load
average is printed before every run: the machine is shared, and other jobs' CPU use shows up
as wall time above client + server CPU.

Run: ``.venv/bin/python bench/bench_s3.py [--quick] [--repeat N] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import fsspec
import pyarrow as pa
import pyarrow.compute as pc

from bench._common import (
    SMALL_SCHEMA,
    Stat,
    cpu_seconds,
    machine_note,
    print_table,
    ratio,
    rotated,
    small_batch,
)
from bench.bench_bulk import make_data
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, MotoS3Server

CONFIGS = ("ours-local", "ours-s3", "deltalake-s3", "deltalake-local")  # bulk write and scan
# Small appends also through one DeltaTable handle (``write_deltalake(dt, ...)``), as ours uses one.
SMALL_CONFIGS = ("ours-local", "ours-s3", "deltalake-s3", "deltalake-s3-handle", "deltalake-local")
S3_CONFIGS = ("ours-s3", "deltalake-s3", "deltalake-s3-handle")


def parse_args() -> argparse.Namespace:
    """``--quick``, ``--repeat N`` (default 3, quick 1) and ``--profile``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run (< 60 s)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per measurement (default 3, quick 1)")
    parser.add_argument("--profile", action="store_true", help="cProfile ours-s3 small appends")
    parser.add_argument(
        "--open-commits", type=int, default=None,
        help="commits of the table whose open is timed (default 100, quick 20); one more: a checkpoint",
    )  # fmt: skip
    parser.add_argument("--opens", type=int, default=3, help="timed opens per table and run (default 3)")
    args = parser.parse_args()
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.open_commits is None:
        args.open_commits = 20 if args.quick else 100
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.open_commits < 2 or args.opens < 1:
        parser.error("--open-commits must be at least 2 and --opens at least 1")
    return args


# --------------------------------------------------------------------------- environment


def is_s3(config: str) -> bool:
    return "-s3" in config


def fake_aws_env() -> None:
    """Remove every ``AWS_*`` variable and set fake credentials (as the test fixtures do)."""
    for name in list(os.environ):
        if name.upper().startswith("AWS_"):
            del os.environ[name]
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    for name in ("NO_PROXY", "no_proxy"):
        current = os.environ.get(name, "")
        os.environ[name] = ",".join(filter(None, [current, "127.0.0.1", "localhost"]))


@dataclass
class Place:
    """Where a configuration's tables go: a local directory or a bucket on the S3 server."""

    endpoint: str
    bucket: str
    local_root: str

    @property
    def ours_options(self) -> dict[str, str]:
        return {"endpoint_url": self.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}

    @property
    def deltalake_options(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def uri(self, config: str, name: str) -> str:
        if is_s3(config):
            return f"s3://{self.bucket}/{config}-{name}"
        return str(Path(self.local_root) / f"{config}-{name}")

    def fs(self, config: str) -> Any:
        if is_s3(config):
            return fsspec.filesystem("s3", skip_instance_cache=True, **self.ours_options)
        return fsspec.filesystem("file")

    def remove(self, config: str, uri: str) -> None:
        fs = self.fs(config)
        path = uri.removeprefix("s3://")
        if fs.exists(path):
            fs.rm(path, recursive=True)

    def parquet_files(self, config: str, uri: str) -> tuple[int, int]:
        """(data files, bytes) of a table, the log excluded."""
        fs = self.fs(config)
        found = fs.find(uri.removeprefix("s3://"), detail=True)
        data = [info for p, info in found.items() if p.endswith(".parquet") and "_delta_log" not in p]
        return len(data), sum(int(info["size"]) for info in data)


def make_bucket(endpoint: str) -> str:
    fs = fsspec.filesystem(
        "s3", skip_instance_cache=True, endpoint_url=endpoint, key=ACCESS_KEY, secret=SECRET_KEY
    )
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    return bucket


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages."""
    with open("/proc/loadavg") as f:
        return " / ".join(f.read().split()[:3])


def server_cpu(server: MotoS3Server) -> float:
    """CPU seconds (user + system, all threads) of the server process so far."""
    with open(f"/proc/{server.pid}/stat") as f:
        raw = f.read()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- engines


class Engine:
    """One configuration's table operations; set-up (creating, opening) is never timed."""

    def __init__(self, config: str, place: Place) -> None:
        self.config = config
        self.place = place
        self.ours = config.startswith("ours")
        self.s3 = is_s3(config)
        self._closers: list[Callable[[], None]] = []

    def _ours_kwargs(self) -> dict[str, Any]:
        if not self.s3:
            return {}  # the default embedded (local-file) slot store
        from lockstore.memory import InMemorySlotStore

        store = InMemorySlotStore()  # ours to close, after the tables using it
        self._closers.append(store.close)
        return {"slots": store, "storage_options": self.place.ours_options}

    def _dl_options(self) -> dict[str, str] | None:
        return self.place.deltalake_options if self.s3 else None

    def small_appender(
        self, uri: str, properties: dict[str, str] | None = None, handle: bool = False
    ) -> Callable[[pa.RecordBatch], object]:
        """Create an empty table at ``uri`` (with ``properties``); return a 1-row append through
        one handle (deltalake: ``write_deltalake(uri)`` unless ``-handle`` or ``handle``)."""
        if self.ours:
            from eventlog.table import Table

            kwargs = self._ours_kwargs()
            Table.create(uri, SMALL_SCHEMA, properties=properties, **kwargs).close()
            table = Table.open(uri, **kwargs)
            self._closers.insert(0, table.close)
            return table.append
        from deltalake import DeltaTable, write_deltalake

        options = self._dl_options()
        DeltaTable.create(uri, schema=SMALL_SCHEMA, storage_options=options, configuration=properties)
        if handle or self.config.endswith("-handle"):
            dt = DeltaTable(uri, storage_options=options)  # kept up to date by each write
            return lambda b: write_deltalake(dt, b, mode="append")
        return lambda b: write_deltalake(uri, b, mode="append", storage_options=options)

    def bulk_writer(self, uri: str, data: pa.Table) -> Callable[[], object]:
        if self.ours:
            from eventlog.table import Table

            table = Table.create(uri, data.schema, **self._ours_kwargs())
            self._closers.insert(0, table.close)
            return lambda: table.append(data)
        from deltalake import write_deltalake

        options = self._dl_options()
        return lambda: write_deltalake(uri, data, storage_options=options)

    def reader(self, uri: str) -> Callable[[], pa.Table]:
        if self.ours:
            from eventlog.table import Table

            table = Table.open(uri, **self._ours_kwargs())
            self._closers.insert(0, table.close)
            return table.to_arrow
        from deltalake import DeltaTable

        return DeltaTable(uri, storage_options=self._dl_options()).to_pyarrow_table

    def open_table(self, uri: str) -> object:
        """Open the table at ``uri`` (what a new reader pays before its first query)."""
        if self.ours:
            from eventlog.table import Table

            table = Table.open(uri, **self._ours_kwargs())
            self._closers.insert(0, table.close)
            return table
        from deltalake import DeltaTable

        return DeltaTable(uri, storage_options=self._dl_options())

    def opener(self, uri: str) -> tuple[Callable[[], object], Callable[[object], int]]:
        """(open, version_of_then_close): the open alone is timed; the slot store (ours) is
        made beforehand, the handle closed after."""
        if self.ours:
            from eventlog.table import Table

            kwargs = self._ours_kwargs()

            def version_ours(table: Any) -> int:
                try:
                    return int(table._snapshot.version)  # as loaded (``version`` would refresh)
                finally:
                    table.close()

            return (lambda: Table.open(uri, **kwargs)), version_ours
        from deltalake import DeltaTable

        options = self._dl_options()
        return (lambda: DeltaTable(uri, storage_options=options)), (lambda dt: int(dt.version()))  # type: ignore[attr-defined]

    def checkpoint(self, uri: str) -> None:
        """Write a checkpoint of the table's latest version (untimed)."""
        if self.ours:
            from eventlog.table import Table

            table = Table.open(uri, **self._ours_kwargs())
            try:
                table.checkpoint()
            finally:
                table.close()
            return
        from deltalake import DeltaTable

        DeltaTable(uri, storage_options=self._dl_options()).create_checkpoint()

    def inspect(self, uri: str) -> tuple[int, int]:
        """(version, rows) as a fresh reader sees them."""
        if self.ours:
            from eventlog.table import Table

            table = Table.open(uri, **self._ours_kwargs())
            self._closers.insert(0, table.close)
            return table.version, table.to_arrow().num_rows
        from deltalake import DeltaTable

        dt = DeltaTable(uri, storage_options=self._dl_options())
        return dt.version(), dt.to_pyarrow_table().num_rows

    def close(self) -> None:
        closers, self._closers = self._closers, []
        for close in closers:
            close()


# --------------------------------------------------------------------------- measurements


@dataclass
class Timing:
    seconds: float
    cpu: float  # this process, all threads
    server_cpu: float  # the S3 server process


def measure(fn: Callable[[], object], server: MotoS3Server) -> tuple[Timing, object]:
    gc.collect()
    os.sync()
    start, cpu, scpu = time.perf_counter(), cpu_seconds(), server_cpu(server)
    out = fn()
    timing = Timing(time.perf_counter() - start, cpu_seconds() - cpu, server_cpu(server) - scpu)
    return timing, out


def warm_up(place: Place, server: MotoS3Server, data: pa.Table) -> None:
    """Untimed: every configuration's first small appends, bulk write and scan of the process
    (imports, thread pools, S3 clients and connections)."""
    for config in SMALL_CONFIGS:
        run_small(config, place, server, 3, -1)
    run_bulk(place, server, data, -1, {})


def run_small(config: str, place: Place, server: MotoS3Server, n: int, rep: int) -> Timing:
    engine = Engine(config, place)
    uri = place.uri(config, f"small-{rep}")
    batches = [small_batch(0, i) for i in range(n)]
    try:
        append = engine.small_appender(uri)

        def loop() -> None:
            for b in batches:
                append(b)

        timing, _ = measure(loop, server)
        version, rows = engine.inspect(uri)
        if version != n or rows != n:
            raise AssertionError(f"{config}: after {n} appends: version {version}, {rows} rows")
        return timing
    finally:
        engine.close()
        place.remove(config, uri)


def run_bulk(
    place: Place, server: MotoS3Server, data: pa.Table, rep: int, files: dict[str, tuple[int, int]]
) -> tuple[dict[str, Timing], dict[str, Timing]]:
    """Write with every configuration (rotated), then scan every table (rotated)."""
    expected_sum = pc.sum(data["id"]).as_py()
    uris = {c: place.uri(c, f"bulk-{rep}") for c in CONFIGS}
    writes: dict[str, Timing] = {}
    scans: dict[str, Timing] = {}
    try:
        for config in rotated(CONFIGS, rep):
            engine = Engine(config, place)
            try:
                writes[config], _ = measure(engine.bulk_writer(uris[config], data), server)
            finally:
                engine.close()
            files[config] = place.parquet_files(config, uris[config])
        for config in rotated(CONFIGS, rep):
            engine = Engine(config, place)
            try:
                scans[config], got = measure(engine.reader(uris[config]), server)
            finally:
                engine.close()
            assert isinstance(got, pa.Table)
            if got.num_rows != data.num_rows or pc.sum(got["id"]).as_py() != expected_sum:
                raise AssertionError(f"{config}: read back {got.num_rows} rows, expected {data.num_rows}")
            del got
    finally:
        for config in CONFIGS:
            place.remove(config, uris[config])
    return writes, scans


def _checkpoint_written(place: Place, config: str, uri: str, version: int) -> None:
    """Wait (up to 10 s) for ``<version>.checkpoint.parquet`` in the table's log."""
    fs = place.fs(config)
    path = f"{uri.removeprefix('s3://')}/_delta_log/{version:020d}.checkpoint.parquet"
    deadline = time.monotonic() + 10
    while not fs.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"{config}: no checkpoint at version {version}")
        time.sleep(0.05)
        fs.invalidate_cache()


NO_AUTO_CHECKPOINT = {"delta.checkpointInterval": "1000000"}


def run_open(
    place: Place, server: MotoS3Server, commits: int, opens: int, rep: int
) -> tuple[dict[str, Timing], dict[str, Timing]]:
    """Per configuration, the median (by wall time) of ``opens`` timed opens of a table of
    ``commits`` commits (no checkpoint), then of that table with a checkpoint at its version.
    Configurations interleaved, first one rotated."""
    uris = {c: place.uri(c, f"open-{rep}") for c in CONFIGS}
    engines = {c: Engine(c, place) for c in CONFIGS}
    plain: dict[str, Timing] = {}
    checkpointed: dict[str, Timing] = {}

    def timed_opens(expected: int) -> dict[str, Timing]:
        got: dict[str, list[Timing]] = {c: [] for c in CONFIGS}
        for _ in range(opens):
            for config in rotated(CONFIGS, rep):
                open_, version_of = engines[config].opener(uris[config])
                timing, handle = measure(open_, server)
                version = version_of(handle)
                del handle
                if version != expected:
                    raise AssertionError(f"{config}: opened version {version}, expected {expected}")
                got[config].append(timing)
        return {c: sorted(ts, key=lambda t: t.seconds)[len(ts) // 2] for c, ts in got.items()}

    try:
        for config in CONFIGS:
            append = engines[config].small_appender(uris[config], NO_AUTO_CHECKPOINT, handle=True)
            for i in range(1, commits):  # versions 1 .. commits-1 (0 is the create)
                append(small_batch(0, i))
        plain = timed_opens(commits - 1)
        for config in CONFIGS:
            engines[config].checkpoint(uris[config])
            _checkpoint_written(place, config, uris[config], commits - 1)
        checkpointed = timed_opens(commits - 1)
    finally:
        for config in CONFIGS:
            engines[config].close()
            place.remove(config, uris[config])
    return plain, checkpointed


# --------------------------------------------------------------------------- request counts

_REQUEST = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/[\d.]+" (\d{3})')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # werkzeug colours some lines (4xx, DELETE)


def _classify(method: str, target: str) -> str:
    path, _, query = target.partition("?")
    if method == "GET" and ("list-type=" in query or "prefix=" in query or "delimiter=" in query):
        return "LIST"
    if method == "HEAD" and "/" not in path.strip("/"):
        return "HEAD bucket"
    return method


def count_requests(log: Path, start: int) -> Counter[str]:
    """Requests in the server log after byte ``start``, by kind (and failures as ``status``)."""
    time.sleep(0.3)  # the server writes its line as it answers
    with log.open("rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", errors="replace")
    counts: Counter[str] = Counter()
    for m in _REQUEST.finditer(_ANSI.sub("", text)):
        kind = _classify(m.group(1), m.group(2))
        counts[kind] += 1
        if not m.group(3).startswith("2"):
            counts[f"({kind} {m.group(3)})"] += 1
    return counts


REQUEST_OPERATIONS = {
    "append": "per small append (mean of N)",
    "open": "open after the N+1 appends",
    "bulk": "create + bulk write",
    "scan": "open + full scan of the bulk table",
    "open-log": "open of C commits (no checkpoint)",
    "open-ckpt": "open of C commits, checkpoint at the last",
}


def _count_config(
    engine: Engine,
    n: int,
    data: pa.Table,
    commits: int,
    counted: Callable[[str, str, Callable[[], object]], None],
) -> None:
    config, place = engine.config, engine.place
    uri = place.uri(config, "small")
    append = engine.small_appender(uri)
    append(small_batch(0, 0))  # the handle's first append may warm caches

    def appends() -> None:
        for i in range(1, n + 1):
            append(small_batch(0, i))

    counted("append", config, appends)
    if config in CONFIGS:  # (the -handle variant opens like deltalake-s3)
        counted("open", config, lambda: engine.open_table(uri))
        bulk_uri = place.uri(config, "bulk")
        counted("bulk", config, lambda: engine.bulk_writer(bulk_uri, data)())
        counted("scan", config, lambda: engine.reader(bulk_uri)())
        open_uri = place.uri(config, "open")
        append_open = engine.small_appender(open_uri, NO_AUTO_CHECKPOINT, handle=True)
        for i in range(1, commits):
            append_open(small_batch(0, i))
        opened: list[object] = []
        open_, version_of = engine.opener(open_uri)
        counted("open-log", config, lambda: opened.append(open_()))
        if version_of(opened.pop()) != commits - 1:
            raise AssertionError(f"{config}: open of {commits} commits saw another version")
        engine.checkpoint(open_uri)
        _checkpoint_written(place, config, open_uri, commits - 1)
        open_, version_of = engine.opener(open_uri)
        counted("open-ckpt", config, lambda: opened.append(open_()))
        if version_of(opened.pop()) != commits - 1:
            raise AssertionError(f"{config}: checkpointed open saw another version")


def request_counts(n: int, data: pa.Table, commits: int) -> dict[tuple[str, str], Counter[str]]:
    """S3 requests of ``n`` small appends, of an open of that table, of one bulk write (with
    the create) and of an open + full scan of that table, per configuration."""
    out: dict[tuple[str, str], Counter[str]] = {}
    with MotoS3Server(log_requests=True) as server:
        assert server.log_path is not None
        log = server.log_path

        def counted(what: str, config: str, fn: Callable[[], object]) -> None:
            time.sleep(0.3)  # earlier requests' log lines are written
            start = log.stat().st_size
            fn()
            out[(config, what)] = count_requests(log, start)

        place = Place(server.endpoint_url, make_bucket(server.endpoint_url), "")
        for config in S3_CONFIGS:
            engine = Engine(config, place)
            try:
                _count_config(engine, n, data, commits, counted)
            finally:
                engine.close()
    return out


def _in_io_thread(fn: Callable[[], object]) -> None:
    """Run ``fn`` on fsspec's event-loop thread (where s3fs's requests run) and wait for it."""
    import asyncio

    from fsspec.asyn import get_loop

    async def call() -> None:
        fn()

    asyncio.run_coroutine_threadsafe(call(), get_loop()).result(timeout=10)


def profile_small(place: Place, n: int) -> str:
    """cProfile of ``n`` ours-s3 small appends, in the calling thread and in fsspec's I/O
    thread (request signing, HTTP, parsing; coroutine resumptions count as calls there)."""
    engine = Engine("ours-s3", place)
    uri = place.uri("ours-s3", "profile")
    main_prof, io_prof = cProfile.Profile(), cProfile.Profile()
    try:
        append = engine.small_appender(uri)
        append(small_batch(0, 0))
        _in_io_thread(io_prof.enable)
        main_prof.enable()
        start, cpu = time.perf_counter(), cpu_seconds()
        for i in range(1, n + 1):
            append(small_batch(0, i))
        wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        main_prof.disable()
        _in_io_thread(io_prof.disable)
    finally:
        engine.close()
        place.remove("ours-s3", uri)
    buf = io.StringIO()
    buf.write(
        f"{n} appends (profiled: {1000 * wall / n:.1f} ms/commit wall, {1000 * cpu / n:.1f} ms CPU)\n\n"
        "-- calling thread, by cumulative time --\n"
    )
    main = pstats.Stats(main_prof, stream=buf).strip_dirs()
    main.sort_stats("cumulative").print_stats(30)
    buf.write("-- fsspec I/O thread (s3fs, aiobotocore, aiohttp), by own time --\n")
    pstats.Stats(io_prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(20)
    buf.write("-- fsspec I/O thread, by cumulative time --\n")
    pstats.Stats(io_prof, stream=buf).strip_dirs().sort_stats("cumulative").print_stats(25)
    return buf.getvalue()


def share(timings: list[Timing], field: str) -> str:
    """Median share of the wall time spent as CPU time (``cpu`` or ``server_cpu``), in %."""
    return f"{100 * Stat.of([getattr(t, field) / t.seconds for t in timings]).median:.0f}%"


# --------------------------------------------------------------------------- main


def main() -> int:
    args = parse_args()
    n_small = 30 if args.quick else 200
    rows = 200_000 if args.quick else 2_000_000
    fake_aws_env()
    print(f"# bench_s3 ({'quick' if args.quick else 'full'}): {machine_note()}")
    print(
        "note: the S3 server is moto, a Python emulator in a separate local process on the same cores "
        "(writes serialized under one lock); its latency and throughput are not AWS's. Compare the "
        "ratios ours / deltalake on the same server and S3 / local."
    )
    print("note: ours-s3 uses slots=InMemorySlotStore(): valid for writers in one process only.")
    data = make_data(rows)
    mb = data.nbytes / 1e6
    print(
        f"sizes: {n_small} one-row appends per run; bulk {rows:,} rows = {mb:.1f} MB in Arrow; "
        f"opens of {args.open_commits} commits and at a checkpoint, {args.opens} per run; "
        f"{args.repeat} runs each"
    )

    small: dict[str, list[Timing]] = {c: [] for c in SMALL_CONFIGS}
    writes: dict[str, list[Timing]] = {c: [] for c in CONFIGS}
    scans: dict[str, list[Timing]] = {c: [] for c in CONFIGS}
    files: dict[str, tuple[int, int]] = {}
    opens_log: dict[str, list[Timing]] = {c: [] for c in CONFIGS}
    opens_ckpt: dict[str, list[Timing]] = {c: [] for c in CONFIGS}
    commits = args.open_commits
    loads: list[str] = []
    local_root = tempfile.mkdtemp(prefix="bench-s3-")
    try:
        with MotoS3Server() as server:
            print(
                f"S3 server: {server.endpoint_url} (pid {server.pid}, up in {server.startup_seconds:.1f} s)"
            )
            place = Place(server.endpoint_url, make_bucket(server.endpoint_url), local_root)
            warm_up(place, server, data.slice(0, 1000))
            for rep in range(args.repeat):
                loads.append(loadavg())
                for config in rotated(SMALL_CONFIGS, rep):
                    small[config].append(run_small(config, place, server, n_small, rep))
                wrote, scanned = run_bulk(place, server, data, rep, files)
                for config in CONFIGS:
                    writes[config].append(wrote[config])
                    scans[config].append(scanned[config])
                plain, ckpt = run_open(place, server, commits, args.opens, rep)
                for config in CONFIGS:
                    opens_log[config].append(plain[config])
                    opens_ckpt[config].append(ckpt[config])
                print(
                    f"  run {rep + 1} (load {loads[-1]}): appends/s "
                    + ", ".join(f"{c} {n_small / small[c][-1].seconds:.0f}" for c in SMALL_CONFIGS)
                    + "; write MB/s "
                    + ", ".join(f"{c} {mb / wrote[c].seconds:.0f}" for c in CONFIGS)
                    + "; scan MB/s "
                    + ", ".join(f"{c} {mb / scanned[c].seconds:.0f}" for c in CONFIGS)
                    + f"; open ms ({commits} commits / checkpoint) "
                    + ", ".join(
                        f"{c} {1000 * plain[c].seconds:.0f} / {1000 * ckpt[c].seconds:.0f}" for c in CONFIGS
                    ),
                    flush=True,
                )
            profile = profile_small(place, n_small) if args.profile else ""
        requests = request_counts(n_small, data, args.open_commits)
    finally:
        shutil.rmtree(local_root, ignore_errors=True)

    # ---- small appends
    cps = {c: Stat.of([n_small / t.seconds for t in small[c]]) for c in SMALL_CONFIGS}
    rows_small = []
    for c in SMALL_CONFIGS:
        rows_small.append(
            [
                c,
                cps[c].fmt(".0f"),
                Stat.of([1000 * t.seconds / n_small for t in small[c]]).fmt(".2f"),
                Stat.of([1000 * t.cpu / n_small for t in small[c]]).fmt(".2f"),
                Stat.of([1000 * t.server_cpu / n_small for t in small[c]]).fmt(".2f") if is_s3(c) else "-",
                share(small[c], "cpu"),
                share(small[c], "server_cpu") if is_s3(c) else "-",
                f"{ratio(cps['ours-s3'].median, cps[c].median):.2f}x",
            ]
        )
    print_table(
        f"Small appends: {n_small} one-row appends, median [min-max] of {args.repeat}",
        ["config", "commits/s", "ms/commit", "client CPU ms/commit", "S3 server CPU ms/commit",
         "client CPU / wall", "server CPU / wall", "ours-s3 / config (commits/s)"],
        rows_small,
    )  # fmt: skip

    # ---- bulk
    w = {c: Stat.of([t.seconds for t in writes[c]]) for c in CONFIGS}
    s = {c: Stat.of([t.seconds for t in scans[c]]) for c in CONFIGS}
    rows_bulk = []
    for phase, st, runs in (("write", w, writes), ("full scan", s, scans)):
        for c in CONFIGS:
            rows_bulk.append(
                [
                    phase,
                    c,
                    st[c].fmt(".2f"),
                    f"{mb / st[c].median:.0f} [{mb / st[c].high:.0f}-{mb / st[c].low:.0f}]",
                    Stat.of([t.cpu for t in runs[c]]).fmt(".2f"),
                    Stat.of([t.server_cpu for t in runs[c]]).fmt(".2f") if is_s3(c) else "-",
                    share(runs[c], "server_cpu") if is_s3(c) else "-",
                    f"{files[c][0]} / {files[c][1] / 1e6:.0f} MB" if phase == "write" else "",
                ]
            )
    print_table(
        f"Bulk write and full scan of {rows:,} rows ({mb:.0f} MB in Arrow), "
        f"median [min-max] of {args.repeat}",
        ["phase", "config", "seconds", "MB/s", "client CPU s", "S3 server CPU s", "server CPU / wall",
         "data files / bytes"],
        rows_bulk,
    )  # fmt: skip

    # ---- opens
    o_log = {c: Stat.of([t.seconds for t in opens_log[c]]) for c in CONFIGS}
    o_ckpt = {c: Stat.of([t.seconds for t in opens_ckpt[c]]) for c in CONFIGS}
    rows_open = []
    for label, st, runs in (
        (f"{commits} commits, no checkpoint (v{commits - 1})", o_log, opens_log),
        (f"{commits} commits, checkpoint at v{commits - 1}", o_ckpt, opens_ckpt),
    ):
        for c in CONFIGS:
            rows_open.append(
                [
                    label,
                    c,
                    Stat.of([1000 * t.seconds for t in runs[c]]).fmt(".1f"),
                    Stat.of([1000 * t.cpu for t in runs[c]]).fmt(".1f"),
                    Stat.of([1000 * t.server_cpu for t in runs[c]]).fmt(".1f") if is_s3(c) else "-",
                    share(runs[c], "server_cpu") if is_s3(c) else "-",
                    f"{ratio(st[c].median, st['ours-s3'].median):.2f}x",
                ]
            )
    print_table(
        f"Open (Table.open / DeltaTable(uri)), median [min-max] over {args.repeat} runs of the "
        f"per-run median of {args.opens} opens",
        ["table", "config", "ms/open", "client CPU ms", "S3 server CPU ms", "server CPU / wall",
         "ours-s3 speed / config"],
        rows_open,
    )  # fmt: skip

    # ---- ratios
    # Throughputs (higher is faster) per measurement and configuration.
    throughput: dict[str, dict[str, float]] = {
        "small appends (commits/s)": {c: cps[c].median for c in SMALL_CONFIGS},
        "small appends, deltalake through one DeltaTable": {
            **{c: cps[c].median for c in SMALL_CONFIGS},
            "deltalake-s3": cps["deltalake-s3-handle"].median,
        },
        "bulk write (MB/s)": {c: mb / w[c].median for c in CONFIGS},
        "full scan (MB/s)": {c: mb / s[c].median for c in CONFIGS},
        f"open, {commits} commits (opens/s)": {c: 1 / o_log[c].median for c in CONFIGS},
        "open at a checkpoint (opens/s)": {c: 1 / o_ckpt[c].median for c in CONFIGS},
    }
    ratio_rows = []
    for label, t in throughput.items():
        ratio_rows.append(
            [
                label,
                f"{ratio(t['ours-s3'], t['deltalake-s3']):.2f}x",
                f"{ratio(t['ours-local'], t['deltalake-local']):.2f}x",
                f"{ratio(t['ours-s3'], t['ours-local']):.2f}x",
                f"{ratio(t['deltalake-s3'], t['deltalake-local']):.2f}x",
            ]
        )
    print_table(
        "Throughput ratios (medians; > 1 means the first is faster)",
        ["measurement", "ours-s3 / deltalake-s3", "ours-local / deltalake-local", "ours: S3 / local",
         "deltalake: S3 / local"],
        ratio_rows,
    )  # fmt: skip

    # ---- requests
    kinds = sorted({k for counts in requests.values() for k in counts}, key=lambda k: (k[0] == "(", k))
    req_rows = []
    order = list(REQUEST_OPERATIONS)
    for (config, what), counts in sorted(requests.items(), key=lambda kv: (order.index(kv[0][1]), kv[0][0])):
        per = n_small if what == "append" else 1
        req_rows.append(
            [
                config,
                REQUEST_OPERATIONS[what]
                .replace("N+1", str(n_small + 1))
                .replace("N", str(n_small))
                .replace("C commits", f"{commits} commits"),
            ]
            + [f"{counts[k] / per:.2f}".rstrip("0").rstrip(".") if counts[k] else "0" for k in kinds]
            + [f"{sum(v for k, v in counts.items() if not k.startswith('(')) / per:.2f}"]
        )
    print_table(
        "S3 requests (server log; LIST = GET with a list query; '(X 404)' etc. are included in X)",
        ["config", "operation", *kinds, "total"],
        req_rows,
    )
    if profile:
        print("### cProfile: ours-s3 small appends\n\n```\n" + profile.rstrip() + "\n```")
    print(f"verification: every small-append run reached version {n_small} with {n_small} rows; every scan "
          f"returned {rows:,} rows with the written sum(id); every open saw version {commits - 1} "
          f"(checkpoint file present for the second) -> OK")  # fmt: skip
    print(f"load average at the end: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
