"""bench_s3's S3 request counts, read from the log of a server that logs every request."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from bench._common import small_batch
from bench._s3common import (
    CONFIGS,
    NO_AUTO_CHECKPOINT,
    S3_CONFIGS,
    Engine,
    Place,
    checkpoint_written,
    make_bucket,
)
from tests.support.s3server import MotoS3Server

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
        checkpoint_written(place, config, open_uri, commits - 1)
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
