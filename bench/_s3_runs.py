"""bench_s3's timed runs: warm-up, small appends, bulk write and scan, opens with and without
a checkpoint, and the cProfile of ours-s3 small appends (``--profile``).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from bench._common import cpu_seconds, rotated, small_batch
from bench._s3common import (
    CONFIGS,
    NO_AUTO_CHECKPOINT,
    SMALL_CONFIGS,
    Engine,
    Place,
    Timing,
    checkpoint_written,
    measure,
)
from tests.support.s3server import MotoS3Server


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
            checkpoint_written(place, config, uris[config], commits - 1)
        checkpointed = timed_opens(commits - 1)
    finally:
        for config in CONFIGS:
            engines[config].close()
            place.remove(config, uris[config])
    return plain, checkpointed


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
