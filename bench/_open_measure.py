"""bench_open: opening a table with each engine, and measuring it.

Timed opens in this process (:func:`time_calls`), cold opens in fresh processes for peak
memory (:func:`measure_children`, :func:`child_main`), the check that both engines see the
same table, and the snapshot of our code every process of the run imports.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bench._common import Stat, cpu_seconds, rotated

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("ours", "deltalake")


class CheckFailed(Exception):
    """Both engines must see the same table (and ours must plan the right files): ERROR, exit 1."""


class Opened(NamedTuple):
    handle: object
    version: int
    files: int


def open_ours(path: str) -> Opened:
    from eventlog.table import Table

    t = Table.open(path)
    return Opened(t, t.version, len(t.files()))


def open_deltalake(path: str) -> Opened:
    from deltalake import DeltaTable

    dt = DeltaTable(path)
    return Opened(dt, dt.version(), len(dt.file_uris()))


OPENERS: dict[str, Callable[[str], Opened]] = {"ours": open_ours, "deltalake": open_deltalake}


# --------------------------------------------------------------------------- measuring


def time_calls(calls: dict[str, Callable[[], object]], repeat: int) -> dict[str, Stat]:
    """ms per call: 1 warm-up each, then ``repeat`` interleaved rounds, the first call rotating."""
    for fn in calls.values():  # warm-up: imports, page cache
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(repeat):
        for name in rotated(list(calls), rep):
            gc.collect()  # no call pays for collecting the previous one's garbage
            start = time.perf_counter()
            result = calls[name]()
            times[name].append(time.perf_counter() - start)
            del result  # its teardown is not timed
    return {name: Stat.of([1000 * t for t in v]) for name, v in times.items()}


def time_opens(path: str, repeat: int) -> dict[str, Stat]:
    return time_calls({e: functools.partial(OPENERS[e], path) for e in ENGINES}, repeat)


def _status_kib(key: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmRSS: resident now, VmHWM: its peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def _reset_peak() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux >= 4.0); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def child_main(argv: Sequence[str]) -> int:
    """In a fresh process: warm up both engines on ``warm``, open ``path`` with ``engine`` once.

    The peak is ``ru_maxrss`` after the open, with the high-water mark reset to the baseline
    first (``/proc/self/clear_refs``): a child started by fork+exec otherwise inherits the
    parent's RSS at the fork as its ``ru_maxrss`` floor (the benchmark process holds
    hundreds of MiB), and the imports' own transient peak would hide a small open."""
    engine, path, warm = argv
    for opener in OPENERS.values():  # imports both libraries, and one tiny open each
        opener(warm)
    gc.collect()
    reset = _reset_peak()
    base = _status_kib("VmRSS")
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    opened = OPENERS[engine](path)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    held = _status_kib("VmRSS") - base
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base  # KiB on Linux
    if reset:  # VmHWM is the same high-water mark, without the inherited floor
        peak = min(peak, _status_kib("VmHWM") - base)
    out = {
        "version": opened.version,
        "files": opened.files,
        "wall": wall,
        "cpu": cpu,
        "peak_mib": peak / 1024,
        "held_mib": held / 1024,
        "peak_reset": reset,
        "code": sys.modules["eventlog"].__file__,
    }
    print(json.dumps(out))
    return 0


# Run in the code snapshot's directory with PYTHONPATH = snapshot, repository root (where
# bench is found); the snapshot is put first again before child_main imports our code.
_CHILD = (
    "import sys; from bench._open_measure import child_main; sys.path.insert(0, sys.argv[1]); "
    "sys.exit(child_main(sys.argv[2:]))"
)
CODE_PACKAGES = ("eventlog", "lockstore")


def code_dir() -> str:
    """The code snapshot (first on PYTHONPATH once :func:`snapshot_code` ran)."""
    return os.environ["PYTHONPATH"].split(os.pathsep)[0]


def snapshot_code(dest: str) -> None:
    """Copy our packages as they are now into ``dest`` and import them from there, in this
    process and in every child (PYTHONPATH, working directory): other engineers edit
    ``eventlog/`` while this runs, and a child must not import a half-edited tree or a
    different version than this process times."""
    for pkg in CODE_PACKAGES:
        shutil.copytree(ROOT / pkg, Path(dest) / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, dest)
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([dest, str(ROOT), *rest])
    import eventlog.table

    if not eventlog.table.__file__ or not eventlog.table.__file__.startswith(dest):
        raise CheckFailed(f"eventlog imported from {eventlog.table.__file__}, not from the snapshot {dest}")


@dataclass(frozen=True)
class ChildStats:
    peak: Stat  # MiB over the baseline
    held: Stat  # MiB
    wall: Stat  # ms
    cpu: Stat  # ms


def measure_children(path: str, warm: str, repeat: int, expect: tuple[int, int]) -> dict[str, ChildStats]:
    """``repeat`` fresh-process opens per engine, alternating (the first engine rotating)."""
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in ENGINES}
    for rep in range(repeat):
        for engine in rotated(list(ENGINES), rep):
            proc = subprocess.run(
                [sys.executable, "-c", _CHILD, code_dir(), engine, path, warm],
                cwd=code_dir(),
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise CheckFailed(f"{engine} child failed on {path}: {proc.stderr[-2000:]}")
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            if (out["version"], out["files"]) != expect:
                raise CheckFailed(
                    f"{engine} child saw version/files {out['version']}/{out['files']}, "
                    f"expected {expect[0]}/{expect[1]}"
                )
            if not str(out["code"]).startswith(code_dir()):
                raise CheckFailed(f"{engine} child imported {out['code']}, not the snapshot {code_dir()}")
            if not out["peak_reset"]:
                print("  warning: /proc/self/clear_refs refused: peaks include the inherited floor")
            runs[engine].append(out)
    return {
        e: ChildStats(
            Stat.of([r["peak_mib"] for r in rs]),
            Stat.of([r["held_mib"] for r in rs]),
            Stat.of([1000 * r["wall"] for r in rs]),
            Stat.of([1000 * r["cpu"] for r in rs]),
        )
        for e, rs in runs.items()
    }


def check_same(path: str, version: int, files: int) -> str | None:
    """An error message unless both engines see ``version`` and ``files`` live files."""
    seen = {e: OPENERS[e](path)[1:] for e in ENGINES}
    bad = {e: v for e, v in seen.items() if v != (version, files)}
    if bad:
        return f"{path}: expected version {version} with {files} files, saw " + ", ".join(
            f"{e}: version {v[0]} with {v[1]} files" for e, v in seen.items()
        )
    return None


def require_same(path: str, version: int, files: int) -> None:
    err = check_same(path, version, files)
    if err is not None:
        raise CheckFailed(err)
