"""Tamper evidence: an intact log verifies; every kind of tampering is named at its version."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from eventlog import Table, VerifyReport
from eventlog import cli as eventlog_cli
from eventlog.log.actions import decode_commit, encode_commit
from eventlog.log.audit import AUDIT_FIELD, chain_commit, digest, read_audit, recompute
from lockstore import LocalFileSlotStore
from lockstore.localfs import table_dir_name
from tests.conftest import SCHEMA, rows

KEY = b"audit-secret"


def _table(tmp_path: Path, n: int = 6, **kw: object) -> Table:
    t = Table.create(str(tmp_path / "t"), SCHEMA, properties={"delta.checkpointInterval": "4"}, **kw)  # type: ignore[arg-type]
    for i in range(1, n):
        t.append(rows([i]))
    t.delete("id = 2")
    return t


def _path(t: Table, v: int) -> Path:
    return Path(t.uri) / "_delta_log" / f"{v:020d}.json"


def _rechain(t: Table, first: int, key: bytes | None = None) -> None:
    """What someone who can rewrite storage does: recompute every hash from ``first`` on."""
    last = t.latest_version()
    for v in range(first, last + 1):
        prev = digest(_path(t, v - 1).read_bytes()) if v > 0 else None
        actions = decode_commit(_path(t, v).read_bytes())
        _path(t, v).write_bytes(chain_commit(actions, prev, key))


def _tamper(data: bytes) -> bytes:
    """One file's row count changed in its statistics (an edit a reader would trust)."""
    out = data.replace(b'\\"numRecords\\":1', b'\\"numRecords\\":7', 1)
    assert out != data
    return out


def _verify(t: Table, key: bytes | None = None) -> VerifyReport:
    """Verify through a fresh handle that has not read the log (reading would try to finish
    or repair what the tampering left behind)."""
    return Table.handle(t.uri).verify(key)


def test_an_intact_log_verifies_with_its_anchors(tmp_path: Path) -> None:
    t = _table(tmp_path)
    report = _verify(t)
    assert report.ok and report.problem is None and report.first_bad_version is None
    assert (report.checked_from, report.chained_from) == (0, 0)
    assert report.versions_checked == report.anchors_checked == t.version + 1
    fields = read_audit(_path(t, 3).read_bytes())
    assert fields is not None and fields.prev == digest(_path(t, 2).read_bytes())
    info = t.history(1)[0]
    assert set(info[AUDIT_FIELD]) == {"prev", "hash"}  # Delta readers see an ignorable field


def test_deltalake_still_reads_the_chained_table(tmp_path: Path) -> None:
    t = _table(tmp_path)
    got = deltalake.DeltaTable(t.uri).to_pyarrow_table().column("id").to_pylist()
    assert sorted(got) == [1, 3, 4, 5]


def test_an_edited_commit_is_named(tmp_path: Path) -> None:
    t = _table(tmp_path)
    data = _path(t, 3).read_bytes()
    _path(t, 3).write_bytes(_tamper(data))
    report = _verify(t)
    assert (report.ok, report.problem, report.first_bad_version) == (False, "edited", 3)


def test_a_recomputed_chain_is_caught_by_the_slot_anchors(tmp_path: Path) -> None:
    t = _table(tmp_path)
    data = _path(t, 2).read_bytes()
    _path(t, 2).write_bytes(_tamper(data))
    _rechain(t, 2)
    fields = read_audit(_path(t, 2).read_bytes())
    assert fields is not None and recompute(_path(t, 2).read_bytes(), fields, None)[0] == fields.hash
    report = _verify(t)
    assert (report.problem, report.first_bad_version) == ("edited", 2)
    assert "slot recorded" in (report.detail or "")


def test_a_deleted_commit_is_named(tmp_path: Path) -> None:
    t = _table(tmp_path)
    os.remove(_path(t, 3))
    report = _verify(t)
    assert (report.problem, report.first_bad_version) == ("removed", 3)


def test_a_removed_commit_with_the_rest_renumbered_is_named(tmp_path: Path) -> None:
    t = _table(tmp_path)
    last = t.version
    os.remove(_path(t, 3))
    for v in range(4, last + 1):
        os.rename(_path(t, v), _path(t, v - 1))
    report = _verify(t)
    assert (report.problem, report.first_bad_version) == ("removed", 3)


def test_an_inserted_commit_is_named(tmp_path: Path) -> None:
    t = _table(tmp_path)
    last = t.version
    for v in range(last, 2, -1):
        os.rename(_path(t, v), _path(t, v + 1))
    _path(t, 3).write_bytes(_path(t, 2).read_bytes())
    _rechain(t, 3)
    report = _verify(t)
    assert (report.problem, report.first_bad_version) == ("inserted", 3)


def test_reordered_commits_are_named(tmp_path: Path) -> None:
    t = _table(tmp_path)
    a, b = _path(t, 2).read_bytes(), _path(t, 3).read_bytes()
    _path(t, 2).write_bytes(b)
    _path(t, 3).write_bytes(a)
    report = _verify(t)
    assert (report.problem, report.first_bad_version) == ("reordered", 2)


def test_another_delta_writers_commit_is_unguarded_naming_its_engine(tmp_path: Path) -> None:
    t = _table(tmp_path)
    deltalake.write_deltalake(t.uri, rows([99]), mode="append")
    foreign = t.latest_version()
    report = _verify(t)
    assert (report.ok, report.problem, report.first_bad_version) == (False, "unguarded", foreign)
    assert report.unguarded[0][0] == foreign and report.unguarded[0][1].startswith("delta-rs")
    assert t.append(rows([100])).version == foreign + 1  # we chain on after it
    allowed = Table.handle(t.uri).verify(allow_unguarded=True)
    assert allowed.ok and allowed.unguarded == report.unguarded and allowed.versions_checked == foreign + 2
    assert any(f"version {foreign} was written outside the version slots" in n for n in allowed.notes)


def test_a_commit_of_ours_replaced_by_an_unchained_one_is_still_edited(tmp_path: Path) -> None:
    t = _table(tmp_path)
    info, *rest = decode_commit(_path(t, 3).read_bytes())
    stripped = dataclasses.replace(info, extra={k: v for k, v in info.extra.items() if k != AUDIT_FIELD})
    _path(t, 3).write_bytes(encode_commit([stripped, *rest]))  # the same actions, the chain stripped
    report = Table.handle(t.uri).verify(allow_unguarded=True)
    assert (report.ok, report.problem, report.first_bad_version) == (False, "edited", 3)


def test_a_truncated_tail_is_named(tmp_path: Path) -> None:
    t = _table(tmp_path)
    last = t.version
    os.remove(_path(t, last))
    report = _verify(t)
    assert (report.problem, report.first_bad_version) == ("truncated", last)


def test_hmac_verification(tmp_path: Path) -> None:
    t = _table(tmp_path, audit_key=KEY)
    assert (read_audit(_path(t, 1).read_bytes()) or pytest.fail()).hmac is not None
    assert _verify(t, KEY).ok and _verify(t, KEY).hmac_checked
    wrong = _verify(t, b"other key")
    assert (wrong.problem, wrong.first_bad_version) == ("edited", 0)
    # Without the key, an edit with a recomputed hash keeps a stale HMAC: caught even
    # where no slot anchor exists.
    data = _path(t, 4).read_bytes()
    edited = _tamper(data)
    fields = read_audit(edited)
    assert fields is not None
    content, _ = recompute(edited, fields, None)
    _path(t, 4).write_bytes(edited[: fields.hash_span[0]] + content.encode() + edited[fields.hash_span[1] :])
    report = _verify(t, KEY)
    assert (report.problem, report.first_bad_version) == ("edited", 4)


def test_a_table_written_before_chaining_verifies_from_the_first_chained_commit(tmp_path: Path) -> None:
    uri = str(tmp_path / "old")
    deltalake.write_deltalake(uri, rows([1]))
    deltalake.write_deltalake(uri, rows([2]), mode="append")
    t = Table.open(uri)
    t.append(rows([3]))
    report = t.verify()
    assert report.ok and report.chained_from == 2
    assert any("predate the hash chain" in n for n in report.notes)


def test_verification_continues_from_a_checkpoint_after_cleanup(tmp_path: Path) -> None:
    t = _table(tmp_path, n=9)
    t.checkpoint()
    head = t.version
    t.append(rows([50]))
    for v in range(head + 1):
        os.remove(_path(t, v))
    report = _verify(t)
    assert report.ok and report.checked_from == head + 1
    assert any("cleaned up" in n for n in report.notes)
    # The first retained commit must still follow the chain head the checkpoint carries.
    data = json.loads(_path(t, head + 1).read_text().splitlines()[0])
    assert data["commitInfo"][AUDIT_FIELD]["prev"] is not None
    _path(t, head + 1).write_bytes(_path(t, head + 1).read_bytes())  # untouched: still ok
    assert _verify(t).ok


def test_group_commits_and_checkpoints_keep_the_chain(tmp_path: Path) -> None:
    t = Table.create(str(tmp_path / "g"), SCHEMA)
    g = Table.open(t.uri, group_commit=True)
    for i in range(5):
        g.append(rows([i]))
    g.checkpoint()
    g.append(pa.concat_tables([rows([10]), rows([11])]))
    assert Table.open(t.uri).verify().ok


# --------------------------------------------------------------------------- anchors


def test_a_copy_keeps_its_anchors_so_a_cut_off_tail_is_still_caught(tmp_path: Path) -> None:
    t = _table(tmp_path)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", t.uri, str(copy)], check=True, timeout=60)
    report = Table.handle(str(copy)).verify()
    assert report.ok and report.anchors_checked == t.version + 1 and report.unanchored == 0
    _path(Table.handle(str(copy)), t.version).unlink()
    report = Table.handle(str(copy)).verify()
    assert (report.ok, report.problem, report.first_bad_version) == (False, "truncated", t.version)
    assert _verify(t).ok  # the original is untouched


def test_a_table_whose_embedded_slots_were_keyed_by_its_path_keeps_them(tmp_path: Path) -> None:
    """Tables written before the embedded store served one table whatever the key."""
    uri = str(tmp_path / "t")
    legacy = LocalFileSlotStore(os.path.join(uri, "_eventlog", "slots"))  # keyed by the path
    t = Table.create(uri, SCHEMA, slots=legacy)
    t.append(rows([1]))
    assert os.listdir(os.path.join(uri, "_eventlog", "slots")) == [table_dir_name(t.key)]
    report = Table.handle(uri).verify()  # the embedded store finds the old directory
    assert report.ok and report.anchors_checked == 2
    assert Table.open(uri).append(rows([2])).version == 2
    assert legacy.get(t.key, 2) is not None  # claimed in the same directory


def test_commits_without_anchors_are_noted_and_can_be_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = _table(tmp_path)
    elsewhere = str(tmp_path / "other-slots")
    report = Table.handle(t.uri, slots=elsewhere).verify()
    assert report.ok and report.anchors_checked == 0 and report.unanchored == t.version + 1
    assert any(
        f"{t.version + 1} chained commit(s), the first at version 0, have no anchor" in n
        for n in report.notes
    )
    strict = Table.handle(t.uri, slots=elsewhere).verify(require_anchors=True)
    assert (strict.ok, strict.problem, strict.first_bad_version) == (False, "unanchored", 0)

    assert eventlog_cli.main(["verify", t.uri, "--slots", elsewhere, "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["unanchored"] == t.version + 1
    assert "eventlog: warning:" in err and "no anchor" in err
    assert eventlog_cli.main(["verify", t.uri, "--slots", elsewhere, "--require-anchors", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["problem"] == "unanchored" and "verify failed: version 0 unanchored" in err
    assert eventlog_cli.main(["verify", t.uri, "--require-anchors"]) == 0  # its own slots: anchored
    assert "warning" not in capsys.readouterr().err
