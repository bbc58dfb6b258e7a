"""A full disk: the table on a small real file system (a tmpfs mounted by the test, as root)
that fills up in the middle of data files, staged commits, commits and checkpoints.

Each step's failure reaches the user as ``StorageError`` naming the step, the table is left
as it was, and once space is freed the table verifies and accepts writes. The last test
fills the disk under several writer processes, so it runs out wherever it happens to be, and
ends with the invariant check: every acknowledged commit present exactly once, gapless
versions, contents equal to the replay, ``verify``, a new write.
"""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from eventlog import DeltaConcurrentModificationException, EventlogError, StorageError, Table
from tests.support.invariants import check_invariants

SCHEMA = pa.schema([("id", pa.int64()), ("pad", pa.float64())])
WRITERS = 3
#: The errors a writer may meet when the disk is full: the engine's typed ones only.
FULL_DISK_ERRORS = (StorageError,)


def _mount(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the fault tests run as root): {done.stderr.decode().strip()}")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    _mount(mount, "2m")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last page with a ballast file; return the ballast's path."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return ballast


def batch(ids: list[int], seed: int = 0) -> pa.Table:
    pad = np.random.default_rng(seed).random(len(ids))  # incompressible
    return pa.table({"id": ids, "pad": pad}, schema=SCHEMA)


def ids(table: Table) -> list[int]:
    table.refresh()
    return sorted(table.to_arrow().column("id").to_pylist())


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_each_step_of_a_commit_on_a_full_disk(small_disk: Path) -> None:
    uri = str(small_disk / "t")
    t = Table.create(uri, SCHEMA, properties={"delta.checkpointInterval": "100"})
    for i in range(3):
        t.append(batch([i]))
    before = files(small_disk / "t")
    ballast = fill(small_disk)

    with pytest.raises(StorageError) as data:  # an append's data file
        t.append(batch(list(range(10, 20))))
    with pytest.raises(StorageError) as staged:  # a delete of a whole file writes only its commit
        t.delete("id = 0")
    with pytest.raises(StorageError) as ckpt:
        t.checkpoint()
    for err, step in ((data, "data file"), (staged, "staged commit"), (ckpt, "checkpoint")):
        e = err.value
        assert isinstance(e, OSError) and isinstance(e, EventlogError)
        assert (e.step, e.errno, e.uri) == (step, errno.ENOSPC, t.uri)
    assert ckpt.value.path == "_delta_log/00000000000000000003.checkpoint.parquet"
    # Nothing half-written: the files are the ones before, the log is unchanged.
    assert files(small_disk / "t") == before
    assert (t.refresh().version, ids(t)) == (3, [0, 1, 2])

    ballast.unlink()
    assert t.verify().ok
    assert t.delete("id = 0").version == 4
    assert t.append(batch([7])).version == 5
    assert ids(Table.open(uri)) == [1, 2, 7]


def test_a_checkpoint_after_a_commit_fails_on_a_full_disk_and_the_commit_stands(small_disk: Path) -> None:
    """The post-commit checkpoint is refused by the full disk: the commit is acknowledged
    and kept, as Delta's postCommit hook fails without failing the commit."""
    uri = str(small_disk / "t")
    t = Table.create(uri, SCHEMA, properties={"delta.checkpointInterval": "2"})
    t.append(batch([1]))
    ballast = fill(small_disk)
    # A whole-file delete needs one small staged commit; free just enough for it.
    ballast.write_bytes(b"\0" * (ballast.stat().st_size - 2 * 4096))
    result = t.delete("id = 1")
    assert result.version == 2
    assert not (small_disk / "t" / "_delta_log" / "00000000000000000002.checkpoint.parquet").exists()
    fresh = Table.open(uri)
    assert (fresh.version, ids(fresh)) == (2, [])
    ballast.unlink()
    assert fresh.verify().ok
    assert fresh.append(batch([2])).version == 3


def _filler(uri: str, worker: int, out: Any, start: Any) -> None:
    """Appends of 1 to 5,000 rows and deletes of whole earlier batches (a commit with no data
    file) until the disk has refused four of them; report acknowledgements and errors."""
    rng = random.Random(worker)
    table = Table.open(uri)
    acks: list[dict[str, Any]] = []
    errors: list[str] = []
    mine: list[list[int]] = []
    start.wait()
    for n in range(10_000):
        try:
            if mine and rng.random() < 0.3:
                target = mine[rng.randrange(len(mine))]
                try:
                    res = table.delete(f"id >= {target[0]} AND id <= {target[-1]}")
                except DeltaConcurrentModificationException:
                    continue
                mine.remove(target)
                acks.append({"kind": "delete", "version": res.version, "txn": res.txn_id, "ids": target})
            else:
                ids_ = [worker * 100_000_000 + n * 10_000 + k for k in range(rng.choice((1, 50, 5_000)))]
                res = table.append(batch(ids_, seed=n))
                mine.append(ids_)
                acks.append({"kind": "append", "version": res.version, "txn": res.txn_id, "ids": ids_})
        except FULL_DISK_ERRORS as exc:
            errors.append(f"{type(exc).__name__}:{getattr(exc, 'step', '')}")
            if len(errors) >= 4:
                break
        except BaseException as exc:  # reported: any other type is a bug
            errors.append(f"UNTYPED {type(exc).__name__}: {exc}")
            break
    out.put((worker, acks, errors))


@pytest.mark.timeout(240)
def test_writer_processes_fill_the_disk(small_disk: Path) -> None:
    uri = str(small_disk / "t")
    Table.create(uri, SCHEMA, properties={"delta.checkpointInterval": "4"})
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * 256 * 1024)  # freed afterwards, so the table can go on
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = ctx.Event()
    procs = [ctx.Process(target=_filler, args=(uri, w, out, start)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    acks = [a for _, worker_acks, _ in results for a in worker_acks]
    errors = [e for _, _, worker_errors in results for e in worker_errors]
    assert acks, "no append landed before the disk filled"
    assert len(errors) == 4 * WRITERS, errors  # every writer met the full disk, typed
    steps = {e.partition(":")[2] for e in errors}
    assert all(e.startswith("StorageError:") for e in errors), errors
    assert steps <= {"data file", "staged commit", "slot claim"}, errors

    ballast.unlink()
    table = check_invariants(uri, acks)
    assert table.verify().ok
    last = table.version
    assert table.append(batch([-1])).version == last + 1
