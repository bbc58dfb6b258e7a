"""The columnar file state: bulk decoding of commits and the vectorised fold.

The reference is the plain protocol rule, written out with dicts: per (path, DV id) the
newest action wins. Every way of building a snapshot (bulk-decoded bytes, commit values,
step-by-step advances, a checkpoint plus the rest) must give exactly that.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import eventlog.log.bulk as bulk
from eventlog import Table
from eventlog.errors import CorruptLogError
from eventlog.log.actions import (
    Action,
    AddFile,
    CommitInfo,
    DeletionVectorDescriptor,
    Metadata,
    Protocol,
    RemoveFile,
    decode_commit,
    encode_commit,
)
from eventlog.log.bulk import decode_file_actions, decode_per_line
from eventlog.log.commit import COLUMNAR_BYTES, Commit
from eventlog.log.filetable import add_files, remove_files
from eventlog.snapshot import Snapshot
from tests.conftest import SCHEMA, rows

SCHEMA_STRING = orjson.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "day", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
).decode()
META = Metadata(id="t", schema_string=SCHEMA_STRING, partition_columns=("day",))
PROTOCOL = Protocol(1, 2)
DAYS = ("2024-01-01", "2024-01-02", None)  # date-like strings: Arrow's inference would make timestamps
DVS = (
    None,
    DeletionVectorDescriptor("u", "ab!cd", 40, 2),
    DeletionVectorDescriptor("i", "xyz", 10, 1, offset=3),
)


def _add(path: int, dv: int, version: int, tags: bool = False) -> AddFile:
    return AddFile(
        path=f"day={DAYS[path % 3]}/f{path}.parquet",
        partition_values={"day": DAYS[path % 3]},
        size=100 + version,
        modification_time=1_000 + version,
        data_change=version % 2 == 0,
        stats=orjson.dumps(
            {"numRecords": 3, "minValues": {"id": path}, "maxValues": {"id": path + 2}}
        ).decode(),
        tags={"origin": f"v{version}"} if tags else None,
        deletion_vector=DVS[dv],
    )


def _info(version: int) -> CommitInfo:
    return CommitInfo(timestamp=10_000 + version, operation="WRITE")


def _commit_bytes(actions: list[Action], foreign: bool) -> bytes:
    data = encode_commit(actions)
    if foreign:  # another writer's spacing: not the canonical prefix, so the per-line path
        data = data.replace(b'{"add":', b'{ "add" :').replace(b'{"remove":', b'{ "remove" :')
    return data


# One commit: (is_add, path, dv) actions with distinct (path, dv) keys.
_ACTION = st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 2))
_COMMITS = st.lists(
    st.tuples(st.lists(_ACTION, max_size=6, unique_by=lambda a: (a[1], a[2])), st.booleans(), st.booleans()),
    min_size=1,
    max_size=8,
)


def _history(
    spec: list[tuple[list[tuple[bool, int, int]], bool, bool]],
) -> list[tuple[int, list[Action], bool]]:
    out: list[tuple[int, list[Action], bool]] = [(0, [_info(0), PROTOCOL, META], False)]
    for version, (actions, foreign, tags) in enumerate(spec, start=1):
        body: list[Action] = [_info(version)]
        for is_add, path, dv in actions:
            add = _add(path, dv, version, tags)
            body.append(add if is_add else add.remove(20_000 + version))
        out.append((version, body, foreign))
    return out


def _reference(
    history: list[tuple[int, list[Action], bool]],
) -> tuple[dict[tuple[str, str | None], AddFile], set[tuple[str, str | None]]]:
    live: dict[tuple[str, str | None], AddFile] = {}
    tombstones: set[tuple[str, str | None]] = set()
    for _, actions, _ in history:
        for a in actions:
            if isinstance(a, AddFile):
                live[a.key] = a
                tombstones.discard(a.key)
            elif isinstance(a, RemoveFile):
                live.pop(a.key, None)
                tombstones.add(a.key)
    return live, tombstones


def _state(snap: Snapshot) -> tuple[dict[tuple[str, str | None], AddFile], set[tuple[str, str | None]]]:
    live = {a.key: a for a in add_files(snap.live_files)}
    assert len(live) == snap.num_files  # no key twice
    return live, {r.key for r in remove_files(snap.tombstone_files)}


@settings(max_examples=60, deadline=None)
@given(_COMMITS, st.integers(0, 8))
def test_every_way_of_folding_equals_the_protocol_rule(
    spec: list[tuple[list[tuple[bool, int, int]], bool, bool]], split: int
) -> None:
    history = _history(spec)
    want_live, want_tombstones = _reference(history)
    items = [(v, _commit_bytes(actions, foreign)) for v, actions, foreign in history]

    headers, files = decode_file_actions(items)
    bulk_snap = Snapshot.from_events("mem://t", headers, files)
    commits = [Commit(v, tuple(decode_commit(data))) for v, data in items]
    from_values = Snapshot.from_commits("mem://t", commits)
    split = min(split, len(commits) - 1)
    stepped = Snapshot.from_commits("mem://t", commits[: split + 1])
    for commit in commits[split + 1 :]:
        stepped = stepped.advance([commit])
    checkpointed = Snapshot.from_state(
        "mem://t", stepped.version, PROTOCOL, META, from_values.live_files, from_values.tombstone_files
    )

    for snap in (bulk_snap, from_values, stepped, checkpointed):
        live, tombstones = _state(snap)
        assert live == want_live
        assert tombstones == want_tombstones
    assert bulk_snap.commit_timestamps == tuple((v, 10_000 + v) for v, _, _ in history)


def test_date_like_partition_values_stay_strings() -> None:
    adds = [_add(i, 0, 2) for i in range(3)]
    items = [(0, encode_commit([_info(0), PROTOCOL, META])), (1, encode_commit([_info(1), *adds]))]
    _, files = decode_file_actions(items)
    assert sorted(add_files(files.adds), key=lambda a: a.path) == sorted(adds, key=lambda a: a.path)


def test_a_big_commit_is_read_in_pieces_with_the_same_result(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    """Chunks cut lines in two; runs of add lines are parsed in place, the head by lines."""
    adds = [_add(i, i % 3, 4, tags=i % 7 == 0) for i in range(3_000)]
    data = encode_commit([_info(0), PROTOCOL, META, *adds, adds[5].remove(9)])
    monkeypatch.setattr(bulk, "_BATCH_BYTES", 4_096)
    decoder = bulk.BulkDecoder()
    decoder.commit(0, (data[i : i + 10_001] for i in range(0, len(data), 10_001)))
    headers, files = decoder.finish()
    want_headers, want = decode_per_line([(0, data)])
    assert headers == want_headers
    assert add_files(files.adds) == add_files(want.adds)
    assert remove_files(files.removes) == remove_files(want.removes)
    assert set(files.add_versions.tolist()) == {0}


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"add":{"path":"x","partitionValues":{"day":"1"},"size":1,"modificationTime":1,'
         b'"dataChange":true,"stats":{"numRecords":1}}}', "stats as an object"),
        (b'{"add":{"path":"x","partitionValues":{"day":"1"},"size":1,"modificationTime":1,'
         b'"dataChange":true,"tags":{"when":"2024-01-01"}}}', "a date-like tag value"),
        (b'{"add":{"path":"x","partitionValues":{"day":1},"size":1,"modificationTime":1,"dataChange":true}}',
         "a number as partition value"),
    ],
)  # fmt: skip
def test_input_the_bulk_path_refuses_goes_through_the_exact_codec(line: bytes, why: str) -> None:
    items = [(0, encode_commit([_info(0), PROTOCOL, META])), (1, line + b"\n")]
    headers, files = decode_file_actions(items)
    want_headers, want = decode_per_line(items)
    assert headers == want_headers, why
    assert add_files(files.adds) == add_files(want.adds), why


def test_a_change_of_partition_columns_is_folded_exactly() -> None:
    other = Metadata(id="t", schema_string=SCHEMA_STRING, partition_columns=())
    before = _add(1, 0, 1)
    after = AddFile("g.parquet", {}, 5, 5)
    items = [
        (0, encode_commit([_info(0), PROTOCOL, META, before])),
        (1, encode_commit([_info(1), other, before.remove(7), after])),
    ]
    headers, files = decode_file_actions(items)
    snap = Snapshot.from_events("mem://t", headers, files)
    assert add_files(snap.live_files) == [after]
    assert snap.partition_columns == ()
    assert [r.partition_values for r in remove_files(snap.tombstone_files)] == [{"day": DAYS[1]}]


def test_a_malformed_line_names_its_version_and_line(local_uri: str) -> None:
    t = Table.create(local_uri, SCHEMA)
    t.append(rows([1]))
    path = t.log.commit_path(1)
    with open(path, "ab") as f:
        f.write(b'{"add": not json\n')
    with pytest.raises(CorruptLogError) as info:
        Table.open(local_uri).snapshot()
    assert info.value.version == 1
    with open(path, "rb") as f:
        assert info.value.line == len(f.read().splitlines())


def test_an_open_table_folds_only_new_commits(local_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Incremental refresh: an open handle applies the new commits to its state; it never
    reloads the table from its checkpoint."""
    t = Table.create(local_uri, SCHEMA, properties={"delta.checkpointInterval": "3"})
    for i in range(5):
        t.append(rows([i]))
    reader = Table.open(local_uri)
    first = reader.snapshot()
    first_paths = first.paths()

    def no_reload(*args: object) -> Snapshot:
        raise AssertionError("the open table reloaded its snapshot")

    monkeypatch.setattr("eventlog.table.handle.load_snapshot", no_reload)
    t.delete("id = 2")
    t.append(rows([9]))
    second = reader.snapshot()
    monkeypatch.undo()
    assert second.version == first.version + 2
    assert first.paths() == first_paths  # the older value is untouched
    assert second.paths() == Table.open(local_uri).files()
    assert second.num_files == 5


def test_a_big_commit_read_from_the_log_is_columns_with_the_same_actions(local_uri: str) -> None:
    """Past 64 KB a commit is decoded into columns; its values, made on demand, are the
    ones the per-line codec gives (file actions after the others)."""
    t = Table.create(local_uri, SCHEMA, partition_by=["date"], properties={"delta.targetFileSize": "1"})
    t.append(pa.table({"id": list(range(400)), "date": ["2024-01-01"] * 400, "x": list(range(400)),
                       "y": [1.0] * 400}, schema=SCHEMA))  # fmt: skip
    t.delete("id < 200")
    version = t.version
    data = t.log.read_commit(version)
    assert data is not None and len(data) > COLUMNAR_BYTES
    commit = Table.open(local_uri).commits_between(version, version)[0]
    assert "actions" not in commit.__dict__  # nothing made yet
    want = decode_commit(data)
    assert commit.others == tuple(a for a in want if not isinstance(a, AddFile | RemoveFile))
    assert commit.adds == [a for a in want if isinstance(a, AddFile)]
    assert commit.removes == [a for a in want if isinstance(a, RemoveFile)]
    assert len(commit.removes) == 200 and all(r.stats for r in commit.removes)
    assert sorted(map(repr, commit.actions)) == sorted(map(repr, want))
