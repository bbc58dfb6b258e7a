"""V2 checkpoints written: on ``delta.checkpointPolicy=v2`` tables, UUID-named top-level files
with sidecars, read back as the replay of the commits; their sidecars kept by cleanup while
referenced; a missing sidecar handled as a damaged classic checkpoint is."""

from __future__ import annotations

import os
import time
from pathlib import Path

import fsspec
import orjson
import pyarrow.parquet as pq
import pytest

from eventlog import Table
from eventlog.errors import InvalidTablePropertyError, VersionNotFoundError
from eventlog.log.checkpoint import CheckpointState, list_checkpoints, read_checkpoint, write_checkpoint
from eventlog.log.checkpoint_v2 import SIDECAR_SCHEMA, write_v2_checkpoint
from tests.conftest import SCHEMA, rows

DAY = 86_400
V2 = {"delta.checkpointPolicy": "v2", "delta.checkpointInterval": "1000"}


def _age(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(path, (then, then))


def _log(uri: str) -> Path:
    return Path(uri) / "_delta_log"


def _ids(uri: str, version: int | None = None) -> list[int]:
    return sorted(Table.open(uri).to_arrow(version=version).column("id").to_pylist())


def _state(t: Table) -> CheckpointState:
    """The table's latest state folded from its commits (no checkpoint involved)."""
    snap = t.snapshot()
    return CheckpointState(
        snap.version, snap.protocol, snap.metadata, snap.live_files, snap.tombstone_files,
        tuple(snap.txns.values()), tuple(snap.domains.values()),
    )  # fmt: skip


def _same(got: CheckpointState, want: CheckpointState) -> None:
    assert (got.version, got.protocol, got.metadata) == (want.version, want.protocol, want.metadata)
    assert sorted((a.path, a.size, a.stats) for a in got.adds) == sorted(
        (a.path, a.size, a.stats) for a in want.adds
    )
    assert sorted(r.path for r in got.removes) == sorted(r.path for r in want.removes)
    assert sorted(got.txns, key=repr) == sorted(want.txns, key=repr)


def _v2_table(uri: str, **props: str) -> Table:
    t = Table.create(uri, SCHEMA, partition_by=["date"], properties={**V2, **props})
    t.append(rows([1, 2]), txn_app_id="app", txn_version=1)
    t.append(rows([3], date="2024-01-02"))
    t.delete("id = 1")
    return t


def test_a_v2_table_writes_uuid_named_checkpoints_with_sidecars(local_uri: str) -> None:
    t = _v2_table(local_uri)
    assert "v2Checkpoint" in (t.snapshot().protocol.reader_features or ())
    want = _state(t)
    assert t.checkpoint() == 3
    log = _log(local_uri)
    (cp,) = list_checkpoints(os.listdir(log))
    assert (cp.version, cp.kind) == (3, "v2") and cp.names[0].endswith(".parquet")
    assert not (log / f"{3:020d}.checkpoint.parquet").exists()  # no classic V1 checkpoint
    pointer = orjson.loads((log / "_last_checkpoint").read_bytes())
    assert pointer["version"] == 3 and "parts" not in pointer
    assert pointer["v2Checkpoint"]["path"] == cp.names[0]
    assert pointer["v2Checkpoint"]["sizeInBytes"] == (log / cp.names[0]).stat().st_size

    top = pq.read_table(log / cp.names[0]).to_pylist()
    kinds = [next(k for k, v in row.items() if v is not None) for row in top]
    assert kinds.count("checkpointMetadata") == 1 and kinds[0] == "checkpointMetadata"
    assert "add" not in kinds and "remove" not in kinds  # file actions live in the sidecars
    assert top[0]["checkpointMetadata"]["version"] == 3
    sidecars = [row["sidecar"] for row in top if row["sidecar"] is not None]
    assert sorted(s["path"] for s in sidecars) == sorted(os.listdir(log / "_sidecars"))
    for s in sidecars:
        side = pq.read_table(log / "_sidecars" / s["path"])
        assert side.schema.names == SIDECAR_SCHEMA.names and s["sizeInBytes"] > 0
    assert (
        sum(
            pq.read_table(log / "_sidecars" / s["path"]).column("add").drop_null().__len__() for s in sidecars
        )
        == 2
    )

    _same(read_checkpoint(fsspec.filesystem("file"), str(log), 3), want)
    assert _ids(local_uri) == [2, 3]
    assert Table.open(local_uri).verify().ok


def test_the_checkpoint_alone_rebuilds_the_table(local_uri: str) -> None:
    t = _v2_table(local_uri)
    t.checkpoint()
    t.append(rows([4]))
    for name in (f"{v:020d}.json" for v in range(3)):
        (_log(local_uri) / name).unlink()  # only the V2 checkpoint covers versions 0..3
    assert _ids(local_uri) == [2, 3, 4]
    assert _ids(local_uri, version=3) == [2, 3]
    with pytest.raises(VersionNotFoundError):
        Table.open(local_uri).to_arrow(version=2)


def test_json_top_level_and_several_sidecars_read_back(local_uri: str) -> None:
    t = _v2_table(local_uri)
    t.append(rows([10, 11, 12, 13]))
    want = _state(t)
    fs, log = fsspec.filesystem("file"), str(_log(local_uri))
    written = write_v2_checkpoint(fs, log, want, top_level="json", sidecar_rows=2)
    actions = len(want.adds) + len(want.removes)
    assert written.name.endswith(".json") and len(written.sidecars) == -(-actions // 2) >= 2
    lines = [orjson.loads(line) for line in (_log(local_uri) / written.name).read_bytes().splitlines()]
    assert next(iter(lines[0])) == "checkpointMetadata"
    assert [line["sidecar"]["path"] for line in lines if "sidecar" in line] == list(written.sidecars)
    _same(read_checkpoint(fs, log, want.version), want)
    assert _ids(local_uri) == [2, 3, 10, 11, 12, 13]


def test_setting_the_policy_upgrades_the_protocol_and_the_next_checkpoint_is_v2(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    t.checkpoint()  # classic, as the table asks
    assert list_checkpoints(os.listdir(_log(local_uri)))[0].kind == "classic"
    with pytest.raises(InvalidTablePropertyError):
        t.set_properties({"delta.checkpointPolicy": "v3"})
    t.set_properties({"delta.checkpointPolicy": "v2"})
    protocol = t.snapshot().protocol
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert "v2Checkpoint" in (protocol.reader_features or ()) and "v2Checkpoint" in (
        protocol.writer_features or ()
    )
    t.append(rows([2]))
    assert t.checkpoint() == 3
    assert [cp.kind for cp in list_checkpoints(os.listdir(_log(local_uri)))] == ["v2", "classic"]
    assert _ids(local_uri) == [1, 2]


def test_a_v2_protocol_with_the_classic_policy_writes_classic_checkpoints(tmp_path: Path) -> None:
    t = _v2_table(str(tmp_path / "t"))
    t.set_properties({"delta.checkpointPolicy": "classic"})  # the feature stays supported
    state = _state(t)
    assert "v2Checkpoint" in (state.protocol.reader_features or ())
    (tmp_path / "log").mkdir()
    write_checkpoint(fsspec.filesystem("file"), str(tmp_path / "log"), state)
    assert sorted(os.listdir(tmp_path / "log")) == [
        f"{state.version:020d}.checkpoint.parquet",
        "_last_checkpoint",
    ]


def _damage(log: Path, kind: str) -> None:
    """A classic checkpoint cut short, or a V2 checkpoint whose sidecar is gone."""
    (cp,) = list_checkpoints(os.listdir(log))
    if kind == "classic":
        path = log / cp.names[0]
        path.write_bytes(path.read_bytes()[:100])
    else:
        for sidecar in (log / "_sidecars").iterdir():
            sidecar.unlink()


@pytest.mark.parametrize("kind", ["classic", "v2"])
def test_a_missing_sidecar_is_handled_as_a_damaged_classic_checkpoint(tmp_path: Path, kind: str) -> None:
    uri = str(tmp_path / kind)
    t = _v2_table(uri, **({"delta.checkpointPolicy": "classic"} if kind == "classic" else {}))
    t.checkpoint()
    assert list_checkpoints(os.listdir(_log(uri)))[0].kind == kind
    _damage(_log(uri), kind)
    assert _ids(uri) == [2, 3]  # skipped: the commits are replayed
    (_log(uri) / f"{0:020d}.json").unlink()
    with pytest.raises(VersionNotFoundError) as info:  # and without them: a typed error
        Table.open(uri)
    assert info.value.earliest == 1


def _cleanup_table(uri: str) -> Table:
    props = {
        "delta.logRetentionDuration": "interval 1 days",
        "eventlog.auditRetentionDuration": "interval 1 days",
    }
    t = _v2_table(uri, **props)
    t.checkpoint()  # at 3
    t.append(rows([4]))
    t.checkpoint()  # at 4
    return t


def _sidecars_of(log: Path, version: int) -> set[str]:
    (cp,) = [cp for cp in list_checkpoints(os.listdir(log)) if cp.version == version and cp.kind == "v2"]
    return {r["sidecar"]["path"] for r in pq.read_table(log / cp.names[0]).to_pylist() if r["sidecar"]}


def test_cleanup_keeps_referenced_sidecars_and_deletes_unreferenced_old_ones(local_uri: str) -> None:
    t = _cleanup_table(local_uri)
    log, sidecars = _log(local_uri), _log(local_uri) / "_sidecars"
    old = _sidecars_of(log, 3) | _sidecars_of(log, 4)
    orphan_old, orphan_new = sidecars / "orphan-old.parquet", sidecars / "orphan-new.parquet"
    for orphan in (orphan_old, orphan_new):
        orphan.write_bytes(b"left by a checkpoint writer that died")
    for p in [*log.iterdir(), *sidecars.iterdir()]:
        if p.is_file() and p != orphan_new:
            _age(p, 10)
    t.append(rows([5]))
    assert t.checkpoint() == 5  # deletes versions 0..4: commits, checkpoints, their sidecars
    assert sorted(n for n in os.listdir(log) if n.endswith(".json")) == [f"{5:020d}.json"]
    assert set(os.listdir(sidecars)) == _sidecars_of(log, 5) | {orphan_new.name}
    assert not old & set(os.listdir(sidecars))

    for name in _sidecars_of(log, 5):
        _age(sidecars / name, 10)  # old, but checkpoint 5 still references them
    t.append(rows([6]))
    t.checkpoint()
    assert set(os.listdir(sidecars)) == _sidecars_of(log, 5) | _sidecars_of(log, 6) | {orphan_new.name}
    assert _ids(local_uri) == [2, 3, 4, 5, 6]
    report = Table.open(local_uri).verify()
    assert report.ok and report.checked_from == 5


def test_cleanup_writes_the_classic_compatibility_copy_of_a_v2_checkpoint(local_uri: str) -> None:
    t = _cleanup_table(local_uri)
    log = _log(local_uri)
    for p in log.iterdir():
        if p.is_file():
            _age(p, 10)
    t.append(rows([5]))
    t.checkpoint()  # at 5: deletes 0..4, after writing 5.checkpoint.parquet
    compat = log / f"{5:020d}.checkpoint.parquet"
    assert compat.exists()
    rows_ = pq.read_table(compat).to_pylist()
    assert [r["checkpointMetadata"]["version"] for r in rows_ if r["checkpointMetadata"]] == [5]  # V2 spec
    assert any(r["sidecar"] for r in rows_) and not any(r["add"] for r in rows_)
    (v2,) = [cp for cp in list_checkpoints(os.listdir(log)) if cp.kind == "v2"]
    fs = fsspec.filesystem("file")
    only_compat = [compat.name]
    _same(
        read_checkpoint(fs, str(log), 5, listing=only_compat),
        read_checkpoint(fs, str(log), 5, listing=[v2.names[0]]),
    )
