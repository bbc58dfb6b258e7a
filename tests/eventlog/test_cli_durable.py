"""``--durable`` on the ``eventlog`` subcommands that commit (optimize, reorg, restore,
drop-feature, slots repair): the table is opened in durable mode, so each new commit's
entry in ``_delta_log`` and every data file it adds (content and entry) are fsynced before
the command returns; without the option nothing is.

``os.fsync`` is wrapped to record, for every call, the path synced and, for a directory,
its entries at that moment (a directory sync makes exactly those entries durable). The
commands run in this process through :func:`eventlog.cli.main`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventlog import Table
from eventlog.cli import main
from eventlog.log.storage import commit_file_name
from tests.conftest import SCHEMA, rows
from tests.support.fsyncs import Synced, record_fsyncs

DV = {"delta.enableDeletionVectors": "true"}


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Synced:
    record = record_fsyncs(monkeypatch)
    for name in ("EVENTLOG_SLOTS", "EVENTLOG_AUDIT_KEY"):
        monkeypatch.delenv(name, raising=False)
    return record


def _table(root: Path) -> str:
    """Versions 0-4: create, three appends (three small files), a delete marking one row in
    a deletion vector."""
    with Table.create(root, SCHEMA, properties=DV) as t:
        for ids in ([1, 2], [3], [4, 5]):
            t.append(rows(ids))
        t.delete("id = 4")
        return t.uri


def _lose_commit(uri: str, version: int) -> None:
    """An acknowledged commit removed from outside (what ``--accept-lost`` is for)."""
    os.remove(Path(uri) / "_delta_log" / commit_file_name(version))


@dataclass(frozen=True)
class Command:
    argv: Callable[[str], list[str]]  # the arguments, given the table's URI
    prepare: Callable[[str], None] = lambda uri: None  # the table's state it needs
    fsyncs: int | None = None  # what it costs in durable mode (None: not fixed here)

    def run(self, uri: str, durable: bool, capsys: pytest.CaptureFixture[str]) -> None:
        code = main(["--json", *self.argv(uri), *(["--durable"] if durable else [])])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert json.loads(out)["table"]


COMMANDS = {
    # One new data file (content, entry), then the commit: staged file, its directory, the
    # claim's directory, _delta_log, the slot's completion mark.
    "optimize": Command(lambda uri: ["optimize", uri], fsyncs=2 + 5),
    "reorg": Command(lambda uri: ["reorg", uri, "--purge"], fsyncs=2 + 5),
    "restore": Command(lambda uri: ["restore", uri, "2"], fsyncs=5),
    # Several commits, each followed by a checkpoint (four fsyncs each: written whole, then
    # renamed in; _last_checkpoint likewise).
    "drop-feature": Command(lambda uri: ["drop-feature", uri, "deletionVectors"]),
    # The REPAIR commit written in place (file, _delta_log), the slot's completion mark.
    "slots-repair": Command(
        lambda uri: ["slots", "repair", uri, "--accept-lost", "3"],
        prepare=lambda uri: _lose_commit(uri, 3),
        fsyncs=3,
    ),
}


def _on_disk(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _ids(table: Table) -> list[int]:
    return sorted(table.to_arrow().column("id").to_pylist())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_durable_commits_are_synced_before_the_command_returns(
    name: str, tmp_path: Path, synced: Synced, capsys: pytest.CaptureFixture[str]
) -> None:
    command, root = COMMANDS[name], tmp_path / "t"
    uri = _table(root)
    command.prepare(uri)
    existing = _on_disk(root)
    synced.calls.clear()
    command.run(uri, True, capsys)
    with Table.open(uri) as t:
        # slots repair writes the REPAIR commit at the lost version; the others append.
        new = [3] if name == "slots-repair" else list(range(5, t.version + 1))
        commits = [t.commits_between(v, v)[0] for v in new]
        assert _ids(t) == ([1, 2, 3] if name == "restore" else [1, 2, 3, 5])
    assert commits, f"{name} committed nothing"
    if command.fsyncs is not None:
        assert len(synced.calls) == command.fsyncs
    for commit in commits:
        assert synced.entry_durable(root / "_delta_log" / commit_file_name(commit.version)) >= 0
        written = [a.path for a in commit.adds if a.path not in existing]  # RESTORE re-adds old ones
        for path in written:
            assert synced.file_synced(root / path) >= 0 and synced.entry_durable(root / path) >= 0, path
    # Each new slot is marked complete durably too (the embedded slot store with fsync=True).
    slots = root / "_eventlog" / "slots" / "table"
    assert any(p == str(slots) for p, entries in synced.calls if entries is not None)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_without_durable_nothing_is_synced(
    name: str, tmp_path: Path, synced: Synced, capsys: pytest.CaptureFixture[str]
) -> None:
    command = COMMANDS[name]
    uri = _table(tmp_path / "t")
    command.prepare(uri)
    synced.calls.clear()
    command.run(uri, False, capsys)
    assert synced.calls == []


def test_durable_is_refused_where_nothing_commits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = _table(tmp_path / "t")
    for argv in (["vacuum", uri, "--durable"], ["show", uri, "--durable"], ["--durable", "history", uri]):
        assert main(argv) == 2, argv
        _, err = capsys.readouterr()
        assert err.startswith("eventlog: error: No such option: --durable"), err
