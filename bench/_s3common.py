"""What bench_s3's measurements share: the configurations, fake AWS credentials, where each
configuration's tables go (:class:`Place`), each configuration's table operations
(:class:`Engine`), and timing a call with this process's and the S3 server's CPU time.
"""

from __future__ import annotations

import gc
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa

from bench._common import SMALL_SCHEMA, Stat, cpu_seconds
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, MotoS3Server

CONFIGS = ("ours-local", "ours-s3", "deltalake-s3", "deltalake-local")  # bulk write and scan
# Small appends also through one DeltaTable handle (``write_deltalake(dt, ...)``), as ours uses one.
SMALL_CONFIGS = ("ours-local", "ours-s3", "deltalake-s3", "deltalake-s3-handle", "deltalake-local")
S3_CONFIGS = ("ours-s3", "deltalake-s3", "deltalake-s3-handle")


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


def checkpoint_written(place: Place, config: str, uri: str, version: int) -> None:
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


def share(timings: list[Timing], field: str) -> str:
    """Median share of the wall time spent as CPU time (``cpu`` or ``server_cpu``), in %."""
    return f"{100 * Stat.of([getattr(t, field) / t.seconds for t in timings]).median:.0f}%"
