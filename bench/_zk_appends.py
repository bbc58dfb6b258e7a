"""bench_zookeeper part 1: commits/s of small appends, from 1 writer and 4 processes, in
each configuration (embedded, ZooKeeper standalone and ensemble, group commit, deltalake).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench._common import Stat, print_table, ratio, small_batch, verdict
from bench._loops import AppendRun, deltalake_append, deltalake_notes, setup_failed, timed_appends
from bench._zkcommon import (
    BACKOFF,
    CONFIGS,
    GROUP_CONFIGS,
    RESULT_TIMEOUT,
    SCHEMA,
    TARGET_VS_DELTALAKE,
    TARGET_VS_EMBEDDED,
    ZK_CONFIGS,
    ZK_TIMEOUT,
    Phases,
    instrumented,
    loadavg,
    process_cpu_seconds,
    run_processes,
)


@dataclass
class RunResult(AppendRun):
    server_cpu: float = 0.0  # CPU seconds of the ZooKeeper JVMs during the run (if pids given)
    writer_seconds: float = 0.0  # sum over writers of their loop's wall time
    requests: Counter[str] = field(default_factory=Counter)  # ZooKeeper requests (instrumented)
    phases: Counter[str] = field(default_factory=Counter)  # seconds per phase (instrumented)


def _close_slots(table: Any) -> None:
    with contextlib.suppress(Exception):
        table.slots.close()


def _append_worker(
    config: str,
    path: str,
    spec: str | None,
    n: int,
    writer: int,
    barrier: Any,
    results: Any,
    instrument: bool = False,
) -> None:
    """One writer process: set up, wait for the others, append ``n`` 1-row batches.

    ``instrument``: also count ZooKeeper requests and time the phases of each commit
    (see :func:`instrumented`), including the back-off sleeps after lost claims.
    """
    table: Any = None
    try:
        batches = [small_batch(writer, i) for i in range(n)]
        phases = Phases()
        if config == "deltalake":
            append = deltalake_append(path)
        else:
            from eventlog.table import Table
            from eventlog.txn.retry import RetryPolicy

            # The default policy, with its sleep timed when instrumenting.
            policy = RetryPolicy(sleep=phases.wrap(BACKOFF, time.sleep)) if instrument else None
            table = Table.open(path, slots=spec, retry_policy=policy, group_commit=config in GROUP_CONFIGS)

            def append(b: pa.RecordBatch) -> int:
                result = table.append(b)
                acks.append(result.txn_id)
                return int(result.attempts) - 1  # slot claims lost before this commit

        acks: list[str] = []
        with instrumented(phases) if instrument else contextlib.nullcontext(Counter[str]()) as counts:
            barrier.wait(timeout=RESULT_TIMEOUT)
            counts.clear()
            phases.clear()
            # CPU: this process, all threads (kazoo's included)
            loop = timed_appends(batches, append, cpu_clock=time.process_time)
            extra = {"cpu": loop.cpu, "requests": dict(counts), "phases": dict(phases.seconds), "acks": acks}
        results.put((writer, loop.start, loop.end, loop.ok, loop.errors, loop.retries, extra))
    except BaseException as exc:  # set-up failed: report it rather than hang the barrier
        results.put((writer, 0.0, 0.0, 0, setup_failed(barrier, exc, n), 0, {}))
    finally:
        if table is not None and spec is not None:
            _close_slots(table)


def _zk_spec(hosts: str, label: str) -> str:
    return f"zk://{hosts}/bench-{label}-{uuid.uuid4().hex[:12]}?timeout={ZK_TIMEOUT:g}"


def _create(config: str, path: str, spec: str | None) -> None:
    if config == "deltalake":
        from deltalake import DeltaTable

        DeltaTable.create(path, schema=SCHEMA)
        return
    from eventlog.table import Table

    table = Table.create(path, SCHEMA, slots=spec)
    if spec is not None:
        _close_slots(table)


def _inspect(config: str, path: str, spec: str | None) -> tuple[int, int, list[str]]:
    """(version, row count, transactions committed after CREATE) of the table after the run."""
    if config == "deltalake":
        from deltalake import DeltaTable

        dt = DeltaTable(path)
        return dt.version(), dt.to_pyarrow_table().num_rows, []
    from eventlog.table import Table
    from eventlog.txn.groupcommit import member_txn_ids

    table = Table.open(path, slots=spec)
    try:
        txns = [t for h in table.history() if h["version"] > 0 for t in member_txn_ids(h)]
        return table.version, table.to_arrow().num_rows, txns
    finally:
        if spec is not None:
            _close_slots(table)


def run_appends(
    config: str,
    writers: int,
    per_writer: int,
    hosts: dict[str, str],
    *,
    instrument: bool = False,
    server_pids: Sequence[int] = (),
) -> RunResult:
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix=f"bench-zk-{config}-")
    try:
        path = str(Path(tmp) / "table")
        spec = _zk_spec(hosts[config], f"{config}-{writers}") if config in ZK_CONFIGS else None
        _create(config, path, spec)
        barrier = ctx.Barrier(writers)
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=_append_worker,
                args=(config, path, spec, per_writer, w, barrier, results, instrument),
            )
            for w in range(writers)
        ]
        server_cpu0 = process_cpu_seconds(server_pids)
        rows = run_processes(procs, results)
        server_cpu = process_cpu_seconds(server_pids) - server_cpu0
        errors: Counter[str] = Counter()
        requests: Counter[str] = Counter()
        phases: Counter[str] = Counter()
        for r in rows:
            errors.update(r[4])
            requests.update(r[6].get("requests", {}))
            phases.update(r[6].get("phases", {}))
        ok = sum(r[3] for r in rows)
        seconds = max(r[2] for r in rows) - min(r[1] for r in rows)
        version, nrows, committed = _inspect(config, path, spec)
        result = RunResult(
            config,
            writers,
            ok,
            writers * per_writer - ok,
            seconds,
            errors,
            version,
            nrows,
            sum(r[5] for r in rows),
            cpu=sum(r[6].get("cpu", 0.0) for r in rows),
            server_cpu=server_cpu,
            writer_seconds=sum(r[2] - r[1] for r in rows),
            requests=requests,
            phases=phases,
        )
        if config != "deltalake":
            expected = writers * per_writer
            context = f"{config}, {writers} writer(s), errors {dict(errors) or 'none'}"
            # With group commit several appends may share a version.
            bad_version = result.version > expected if config in GROUP_CONFIGS else result.version != expected
            assert not bad_version, f"{context}: version {result.version} for {expected} appends"
            assert result.rows == expected, f"{context}: {result.rows} rows != {expected} appends"
            # Exactly once: every acknowledged transaction is in the log once, nothing else is.
            acked = sorted(txn for r in rows for txn in r[6].get("acks", []))
            assert acked == sorted(committed), f"{context}: acknowledged txns != committed txns"
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def part_appends(
    hosts: dict[str, str], pids: dict[str, list[int]], sizes: dict[int, int], repeat: int
) -> bool:
    print(f"\n## Part 1: small appends ({sizes[1]} appends x 1 writer, {sizes[4]} x 4 processes)\n")
    results: dict[tuple[str, int], list[RunResult]] = {}
    for rep in range(repeat):
        for writers in (1, 4):
            for config in CONFIGS:
                r = run_appends(config, writers, sizes[writers], hosts, server_pids=pids.get(config, []))
                results.setdefault((config, writers), []).append(r)
                print(
                    f"  run {rep + 1}: {config:13s} {writers} writer(s): {r.commits_per_s:7.1f} commits/s, "
                    f"{r.ok} ok, {r.failed} failed {dict(r.errors) or ''}, {r.retries} lost claims "
                    f"-> version {r.version}, {r.rows} rows; loadavg {loadavg()}",
                    flush=True,
                )

    rows = []
    for writers in (1, 4):
        for config in CONFIGS:
            runs = results[(config, writers)]
            cps = Stat.of([r.commits_per_s for r in runs])
            ms = Stat.of([1000 * r.seconds / max(1, r.ok) * writers for r in runs])
            errs: Counter[str] = Counter()
            for r in runs:
                errs.update(r.errors)
            rows.append(
                [
                    config,
                    writers,
                    writers * sizes[writers],
                    cps.fmt(".0f"),
                    ms.fmt(".2f"),
                    f"{sum(r.failed for r in runs)} / {len(runs) * writers * sizes[writers]}",
                    ", ".join(f"{k} x{v}" for k, v in errs.items()) or "-",
                    str(sum(r.retries for r in runs)) if config != "deltalake" else "n/a",
                    Stat.of([1000 * r.cpu / max(1, r.ok) for r in runs]).fmt(".1f"),
                    Stat.of([1000 * r.server_cpu / max(1, r.ok) for r in runs]).fmt(".1f")
                    if config in ZK_CONFIGS
                    else "-",
                ]
            )
    print_table(
        "Small appends: commits/s (median [min-max] over runs)",
        [
            "config",
            "writers",
            "appends/run",
            "commits/s",
            "ms/commit per writer",
            "failed (all runs)",
            "errors",
            "lost slot claims (all runs)",
            "writers' CPU ms/commit",
            "ZooKeeper JVMs' CPU ms/commit",
        ],
        rows,
    )

    def median(config: str, writers: int) -> float:
        return Stat.of([r.commits_per_s for r in results[(config, writers)]]).median

    ratio_rows = []
    for writers in (1, 4):
        for config in ZK_CONFIGS:
            vs_dl = ratio(median(config, writers), median("deltalake", writers))
            vs_emb = ratio(median(config, writers), median("embedded", writers))
            ratio_rows.append([config, writers, f"{vs_dl:.1f}x", f"{vs_emb:.2f}x"])
    print_table(
        "Ratios of medians (commits/s; > 1 means the ZooKeeper config is faster)",
        ["config", "writers", "ours-ZK / deltalake", "ours-ZK / embedded"],
        ratio_rows,
    )

    target_rows = []
    for config in ("zk-ensemble", "zk-ensemble-group"):
        vs_dl = ratio(median(config, 4), median("deltalake", 4))
        vs_emb = ratio(median(config, 4), median("embedded", 4))
        failed = sum(r.failed for r in results[(config, 4)])
        met_dl, met_emb = verdict(vs_dl >= TARGET_VS_DELTALAKE), verdict(vs_emb >= TARGET_VS_EMBEDDED)
        target_rows += [
            [config, f">= {TARGET_VS_DELTALAKE:.0f}x deltalake", f"{vs_dl:.1f}x", met_dl],
            [config, f">= {TARGET_VS_EMBEDDED}x embedded", f"{vs_emb:.2f}x", met_emb],
            [config, "no failed append", f"{failed} failed", verdict(failed == 0)],
        ]
    print_table(
        "Targets (4 processes through the 3-node ensemble; commits/s = acknowledged appends/s)",
        ["config", "target", "measured", "verdict"],
        target_rows,
    )
    for r in results[("zk-ensemble-group", 4)]:
        per_version = r.ok / max(1, r.version)
        print(f"group commit: {r.ok} appends in {r.version} versions ({per_version:.1f} per version)")
    ours_failed = sum(r.failed for (c, _w), runs in results.items() if c != "deltalake" for r in runs)
    print(
        "verification: rows == appends, acknowledged txns == committed txns (exactly once), and version =="
        f" appends (<= with group commit) asserted after every run of ours; {ours_failed} failed"
    )
    deltalake_notes(results)
    return ours_failed == 0
