"""bench_open: the tables it opens, built once per run (our append API, synthetic logs from
:mod:`bench._tables`, checkpoints by ours or, as the fallback, by deltalake).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from bench import _tables
from bench._open_measure import code_dir

CHECKPOINT_TIMEOUT_S = 300.0
APPEND_BUDGET_S = 30.0
APPEND_SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])


@dataclass(frozen=True)
class Sizes:
    open_small: int
    open_large: int
    json_files: int
    json_commits: int
    cp_files: int
    cp_commits: int
    flat: tuple[int, ...]
    flat_base_files: int


FULL = Sizes(1000, 5000, 300_000, 30, 1_000_000, 10, (1000, 10_000, 100_000), 1000)
QUICK = Sizes(200, 500, 30_000, 30, 100_000, 10, (200, 2000, 10_000), 1000)


# --------------------------------------------------------------------------- building


def build_appended(path: str, commits: int) -> str:
    """Versions 0..commits-1 (one file per append) with our default checkpoints; how it was built."""
    from eventlog.table import Table

    start = time.perf_counter()
    projected = 0.0
    t = Table.create(path, APPEND_SCHEMA)
    try:
        for i in range(1, commits):
            t.append(pa.table({"id": pa.array([i], pa.int64()), "payload": [f"row-{i:06d}"]}, APPEND_SCHEMA))
            if i == 100:
                projected = (time.perf_counter() - start) * (commits - 1) / i
                if projected > APPEND_BUDGET_S:
                    break
        else:
            secs = time.perf_counter() - start
            rate = (commits - 1) / secs
            return f"our append API, one handle: {commits - 1} appends in {secs:.1f} s ({rate:.0f}/s)"
    finally:
        t.close()
    shutil.rmtree(path)
    start = time.perf_counter()
    _tables.write_adds_table(path, [1] * (commits - 1))
    cp = (commits - 1) // 100 * 100
    t = Table.open(path)
    try:
        t.checkpoint(t.snapshot(cp))
    finally:
        t.close()
    secs = time.perf_counter() - start
    return (
        f"synthetic log + Table.checkpoint() at v{cp} in {secs:.1f} s (the append API was "
        f"projected at {projected:.0f} s > {APPEND_BUDGET_S:.0f} s)"
    )


_CHECKPOINT = (
    "import sys; from eventlog.table import Table; t = Table.open(sys.argv[1]); print(t.checkpoint())"
)


def checkpoint_last(path: str, last: int) -> str:
    """A checkpoint at version ``last``: ours in a child process, deltalake's as the fallback."""
    start = time.perf_counter()
    why = ""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHECKPOINT, path],
            cwd=code_dir(),
            capture_output=True,
            text=True,
            timeout=CHECKPOINT_TIMEOUT_S,
            check=False,
        )
        if proc.returncode == 0 and proc.stdout.strip().splitlines()[-1:] == [str(last)]:
            secs = time.perf_counter() - start
            return f"checkpoint v{last} by ours (Table.open().checkpoint()) in {secs:.1f} s"
        why = f"ours failed (rc {proc.returncode}, {(proc.stdout + proc.stderr).strip()[-300:]!r})"
    except subprocess.TimeoutExpired:
        why = f"ours took over {CHECKPOINT_TIMEOUT_S:.0f} s"
    from deltalake import DeltaTable

    for p in _tables.log_files(path, "*.checkpoint*.parquet") + _tables.log_files(path, "_last_checkpoint"):
        p.unlink()
    start = time.perf_counter()
    DeltaTable(path).create_checkpoint()
    secs = time.perf_counter() - start
    return f"FALLBACK: {why}; checkpoint v{last} by DeltaTable.create_checkpoint() in {secs:.1f} s"


def commits_text(n: int) -> str:
    return "1 JSON commit" if n == 1 else f"{n} JSON commits"


class Tables:
    """Tables built on first use, kept for the run, deleted by :meth:`close`."""

    def __init__(self, sizes: Sizes) -> None:
        self.sizes = sizes
        self.root = tempfile.mkdtemp(prefix="bench-open-")
        self.paths: dict[str, str] = {}
        self.code = self._path("code")
        self.warm = self._path("warm")
        _tables.write_adds_table(self.warm, [10])

    def _path(self, name: str) -> str:
        return str(Path(self.root) / name)

    def get(self, name: str, build: Callable[[str], str]) -> str:
        if name not in self.paths:
            path = self._path(name)
            start = time.perf_counter()
            how = build(path)
            print(f"  built {name} in {time.perf_counter() - start:.1f} s: {how}", flush=True)
            self.paths[name] = path
        return self.paths[name]

    def json_table(self, commits: int) -> str:
        n = self.sizes.json_files
        sizes = [n // commits] * commits

        def build(path: str) -> str:
            _tables.write_adds_table(path, sizes)
            return f"{commits_text(commits)} of {sizes[0]:,} adds, no checkpoint"

        return self.get(f"json-{commits}x{sizes[0]}", build)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
