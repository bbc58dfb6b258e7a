"""bench_zookeeper part 3: where one commit's time goes through the ensemble (requests per
commit, phases, CPU of writers and JVMs), then the same appends under cProfile.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import Stat, print_table, small_batch
from bench._zk_appends import RunResult, run_appends
from bench._zkcommon import (
    IDLE_SECONDS,
    OUR_PACKAGES,
    REPO_ROOT,
    REST,
    SCHEMA,
    ZK_TIMEOUT,
    Phases,
    instrumented,
    loadavg,
    process_cpu_seconds,
)


def _profile_table(hosts: str) -> tuple[Any, Any, str]:
    """A fresh table on its own ZooKeeperSlotStore (own chroot), warmed up by 5 appends."""
    from eventlog.table import Table
    from lockstore.zookeeper import ZooKeeperSlotStore

    store = ZooKeeperSlotStore(hosts, chroot=f"/bench-profile-{uuid.uuid4().hex[:12]}", timeout=ZK_TIMEOUT)
    tmp = tempfile.mkdtemp(prefix="bench-zk-profile-")
    try:
        path = str(Path(tmp) / "table")
        Table.create(path, SCHEMA, slots=store)
        table = Table.open(path, slots=store)
        for i in range(5):  # warm-up: imports, first data file, kazoo's connection
            table.append(small_batch(9, i))
    except BaseException:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return table, store, tmp


def warm_up_appends(hosts: str, n: int) -> None:
    """``n`` appends through a fresh table, so that the servers' JIT has compiled the hot paths."""
    table, store, tmp = _profile_table(hosts)
    try:
        for i in range(n):
            table.append(small_batch(8, i))
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _label(key: tuple[str, int, str]) -> str:
    filename, line, func = key
    if filename.startswith(REPO_ROOT):
        filename = os.path.relpath(filename, REPO_ROOT)
    elif filename == "~":
        return func
    else:
        filename = "/".join(Path(filename).parts[-2:])
    return f"{filename}:{line}({func})"


def _request_table(title: str, runs: Sequence[tuple[Counter[str], int]]) -> None:
    """ZooKeeper requests per commit by type; ``runs``: (request counts, commits) per run."""
    kinds = sorted({k for c, _ in runs for k in c}, key=lambda k: -sum(c[k] for c, _ in runs))
    rows = [[k, Stat.of([c[k] / n for c, n in runs]).fmt(".2f")] for k in kinds]
    rows.append(["total", Stat.of([sum(c.values()) / n for c, n in runs]).fmt(".2f")])
    print_table(title, ["request (one round trip each)", "per commit"], rows)


def _phase_table(
    title: str, runs: Sequence[tuple[dict[str, float], float]], extra: Sequence[list[str]]
) -> None:
    """Phases in ms per commit; ``runs``: (ms per commit by phase, total ms per commit) per run."""
    with_rest = [({**p, REST: total - sum(p.values())}, total) for p, total in runs]
    names = sorted(
        {k for p, _ in with_rest for k in p},
        key=lambda k: -statistics.median(p.get(k, 0.0) for p, _ in with_rest),
    )
    total = statistics.median(t for _, t in with_rest)
    rows = [
        [
            name,
            Stat.of([p.get(name, 0.0) for p, _ in with_rest]).fmt(".2f"),
            f"{100 * statistics.median(p.get(name, 0.0) for p, _ in with_rest) / total:.0f}%",
        ]
        for name in names
    ]
    rows.append(["total", Stat.of([t for _, t in with_rest]).fmt(".2f"), "100%"])
    print_table(title, ["phase", "ms per commit", "share"], [*rows, *extra])


def part_profile(
    hosts: str, n: int, contended: int, repeat: int, top: int, server_pids: Sequence[int]
) -> None:
    print(f"\n## Part 3: where the time goes (ensemble; 1 writer x {n}, 4 processes x {contended})\n")
    idle0 = process_cpu_seconds(server_pids)
    time.sleep(IDLE_SECONDS)
    idle = (process_cpu_seconds(server_pids) - idle0) / IDLE_SECONDS
    print(f"  ZooKeeper JVMs idle (before the runs): {1000 * idle:.0f} ms CPU per second, all 3 together")
    single: list[tuple[Counter[str], dict[str, float], float, float, float]] = []
    for rep in range(repeat):
        table, store, tmp = _profile_table(hosts)
        try:
            start_version = table.version
            phases = Phases()
            with instrumented(phases) as counts:
                counts.clear()
                cpu0, server0 = time.process_time(), process_cpu_seconds(server_pids)
                t0 = time.perf_counter()
                for i in range(n):
                    table.append(small_batch(0, i))
                wall = time.perf_counter() - t0
                cpu, server = time.process_time() - cpu0, process_cpu_seconds(server_pids) - server0
                got = (Counter(counts), {k: 1000 * v / n for k, v in phases.seconds.items()})
            assert table.version == start_version + n
            single.append((*got, 1000 * wall / n, 1000 * cpu / n, 1000 * server / n))
            print(
                f"  1 writer, run {rep + 1}: {1000 * wall / n:.2f} ms/commit ({n / wall:.0f} commits/s), "
                f"{sum(got[0].values()) / n:.2f} ZooKeeper requests/commit, CPU/commit: client "
                f"{1000 * cpu / n:.2f} ms, ZooKeeper JVMs {1000 * server / n:.2f} ms; loadavg {loadavg()}",
                flush=True,
            )
        finally:
            store.close()
            shutil.rmtree(tmp, ignore_errors=True)

    multi: list[RunResult] = []
    for rep in range(repeat):
        r = run_appends(
            "zk-ensemble", 4, contended, {"zk-ensemble": hosts}, instrument=True, server_pids=server_pids
        )
        multi.append(r)
        print(
            f"  4 processes, run {rep + 1}: {r.commits_per_s:.0f} commits/s (instrumented), "
            f"{r.retries / r.ok:.2f} lost claims/commit, {sum(r.requests.values()) / r.ok:.2f} "
            f"ZooKeeper requests/commit, CPU/commit: clients {1000 * r.cpu / r.ok:.2f} ms, "
            f"ZooKeeper JVMs {1000 * r.server_cpu / r.ok:.2f} ms; loadavg {loadavg()}",
            flush=True,
        )

    _request_table(
        "1 writer: ZooKeeper requests per commit (median [min-max] over runs)", [(c, n) for c, *_ in single]
    )
    _request_table(
        "4 processes: ZooKeeper requests per successful commit (median [min-max] over runs)",
        [(r.requests, r.ok) for r in multi],
    )

    def cpu_rows(client: Sequence[float], server: Sequence[float]) -> list[list[str]]:
        both = [c + s for c, s in zip(client, server, strict=True)]
        bound = [2 * 1000 / b for b in both if b > 0]
        return [
            ["(CPU) writer process(es), all threads", Stat.of(client).fmt(".2f"), ""],
            ["(CPU) ZooKeeper JVMs", Stat.of(server).fmt(".2f"), ""],
            ["(CPU) 2 cores / CPU per commit = commits/s bound", Stat.of(bound).fmt(".0f"), ""],
        ]

    _phase_table(
        "1 writer: wall time of one commit (instrumented, no profiler)",
        [(p, total) for _, p, total, _, _ in single],
        cpu_rows([s[3] for s in single], [s[4] for s in single]),
    )
    _phase_table(
        "4 processes: writer wall time per successful commit (sum over writers / commits)",
        [({k: 1000 * v / r.ok for k, v in r.phases.items()}, 1000 * r.writer_seconds / r.ok) for r in multi],
        [
            ["lost claims per commit", Stat.of([r.retries / r.ok for r in multi]).fmt(".2f"), ""],
            *cpu_rows([1000 * r.cpu / r.ok for r in multi], [1000 * r.server_cpu / r.ok for r in multi]),
        ],
    )

    table, store, tmp = _profile_table(hosts)
    try:
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for i in range(n):
            table.append(small_batch(0, i))
        prof.disable()
        wall = time.perf_counter() - t0
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    stats = pstats.Stats(prof, stream=io.StringIO())
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    ours = sorted(
        ((k, v) for k, v in raw.items() if k[0].startswith(OUR_PACKAGES)),
        key=lambda kv: kv[1][3],
        reverse=True,
    )
    print(
        f"cProfile, 1 writer: {n} appends in {wall:.3f} s under the profiler "
        f"({1000 * wall / n:.2f} ms/commit)"
    )
    print_table(
        "Our code by cumulative time (cProfile, main thread)",
        ["function", "calls", "cumulative s", "ms/commit", "own s"],
        [
            [_label(k), nc, f"{ct:.3f}", f"{1000 * ct / n:.2f}", f"{tt:.3f}"]
            for k, (_c, nc, tt, ct, _) in ours[:top]
        ],
    )
    by_own = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    print_table(
        "All functions by own time (cProfile, main thread)",
        ["function", "calls", "own s", "cumulative s"],
        [[_label(k), nc, f"{tt:.3f}", f"{ct:.3f}"] for k, (_c, nc, tt, ct, _) in by_own],
    )
