"""Synthetic Delta tables for the open/plan benchmarks: the ``_delta_log`` written directly.

Building 1,000,000 files through our append API would take hours (about 700 commits/s), so
these helpers write the commit files themselves, the way a real writer lays them out: one
JSON line per action (orjson), ``_delta_log/%020d.json``. Version 0 holds ``protocol``
(minReaderVersion 1, minWriterVersion 2), ``metaData`` (Spark JSON ``schemaString``,
``partitionColumns``, ``configuration``) and a ``commitInfo``; later versions hold ``add``
actions (and, for :func:`write_replace_chain`, ``remove`` actions) plus a ``commitInfo``.

Every ``add`` looks like one from Spark or delta-rs: ``part=NN/part-00000-<uuid>-c000.snappy.parquet``,
``partitionValues``, ``size``, ``modificationTime``, ``dataChange`` and a ``stats`` JSON string
(numRecords, minValues/maxValues/nullCount of ``id``, ``value`` and ``name``: about 200 bytes).
File ``i`` holds ids ``[i * ROWS_PER_FILE, (i + 1) * ROWS_PER_FILE)`` and sits in partition
``part = i % partitions`` (two digits), so a range on ``id`` selects a known run of files.

The data files themselves are never written: opening a table or planning a scan reads only
the log, in both libraries.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

ROWS_PER_FILE = 1000
PARTITIONS = 100
DAY_MS = 86_400_000
# Commit timestamps start 60 days ago (one second apart): every remove is past the default
# 7-day deleted-file retention, so a checkpoint carries no tombstones.
START_MS = int(time.time() * 1000) - 60 * DAY_MS

SCHEMA_STRING = orjson.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "value", "type": "double", "nullable": True, "metadata": {}},
            {"name": "name", "type": "string", "nullable": True, "metadata": {}},
            {"name": "part", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
).decode()


def part_value(i: int, partitions: int = PARTITIONS) -> str:
    return f"{i % partitions:02d}"


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def add_action(i: int, ts_ms: int, rng: random.Random, partitions: int = PARTITIONS) -> dict[str, Any]:
    """The ``add`` of file number ``i`` (see the module docstring for its contents)."""
    part = part_value(i, partitions)
    low = i * ROWS_PER_FILE
    stats = {
        "numRecords": ROWS_PER_FILE,
        "minValues": {"id": low, "value": round((i % 997) * 0.37, 3), "name": f"name-{i:08d}-a"},
        "maxValues": {
            "id": low + ROWS_PER_FILE - 1,
            "value": round(1000 + (i % 991) * 0.53, 3),
            "name": f"name-{i:08d}-z",
        },
        "nullCount": {"id": 0, "value": i % 3, "name": i % 7},
    }
    return {
        "add": {
            "path": f"part={part}/part-00000-{_uuid(rng)}-c000.snappy.parquet",
            "partitionValues": {"part": part},
            "size": 40_000 + (i * 7919) % 20_000,
            "modificationTime": ts_ms,
            "dataChange": True,
            "stats": orjson.dumps(stats).decode(),
        }
    }


def remove_action(add: dict[str, Any], ts_ms: int) -> dict[str, Any]:
    a = add["add"]
    return {
        "remove": {
            "path": a["path"],
            "deletionTimestamp": ts_ms,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": a["partitionValues"],
            "size": a["size"],
        }
    }


def _commit_info(ts_ms: int, operation: str, blind: bool, rng: random.Random) -> dict[str, Any]:
    mode = "Append" if blind else "Overwrite"
    return {
        "commitInfo": {
            "timestamp": ts_ms,
            "operation": operation,
            "operationParameters": {"mode": mode, "partitionBy": '["part"]'},
            "isBlindAppend": blind,
            "engineInfo": "bench-synthetic",
            "txnId": _uuid(rng),
        }
    }


def write_commit(path: str, version: int, actions: Iterable[dict[str, Any]]) -> None:
    data = b"\n".join(orjson.dumps(a) for a in actions) + b"\n"
    with open(Path(path) / "_delta_log" / f"{version:020d}.json", "wb") as f:
        f.write(data)


def write_header(
    path: str, rng: random.Random, configuration: dict[str, str] | None = None, partitions: bool = True
) -> None:
    """Version 0: protocol, metaData, commitInfo (an empty table)."""
    os.makedirs(Path(path) / "_delta_log", exist_ok=True)
    write_commit(
        path,
        0,
        [
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
            {
                "metaData": {
                    "id": _uuid(rng),
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": SCHEMA_STRING,
                    "partitionColumns": ["part"] if partitions else [],
                    "configuration": dict(configuration or {}),
                    "createdTime": START_MS,
                }
            },
            _commit_info(START_MS, "CREATE TABLE", False, rng),
        ],
    )


def write_adds_table(path: str, commit_sizes: Sequence[int], *, seed: int = 14) -> int:
    """Version 0 (empty table), then one commit per entry of ``commit_sizes`` holding that many
    new files (blind appends). Returns the last version."""
    rng = random.Random(seed)
    write_header(path, rng)
    i = 0
    for version, n in enumerate(commit_sizes, start=1):
        ts = START_MS + version * 1000
        actions = [add_action(j, ts, rng) for j in range(i, i + n)]
        actions.append(_commit_info(ts, "WRITE", True, rng))
        write_commit(path, version, actions)
        i += n
    return len(commit_sizes)


def write_replace_chain(path: str, commits: int, base_files: int, *, seed: int = 14) -> int:
    """A table of ``commits`` versions whose live state does not grow with its log.

    Version 0 creates the table, version 1 adds ``base_files`` files, and every later version
    adds one new file and removes the one the previous version added (a small overwrite):
    ``base_files + 1`` live files at the end however long the log is. Removes are dated more
    than 7 days ago, so a checkpoint holds no tombstones. Returns the last version."""
    if commits < 3:
        raise ValueError("a replace chain needs at least 3 commits")
    rng = random.Random(seed)
    write_header(path, rng)
    ts = START_MS + 1000
    write_commit(
        path, 1, [*(add_action(j, ts, rng) for j in range(base_files)), _commit_info(ts, "WRITE", True, rng)]
    )
    previous: dict[str, Any] | None = None
    for version in range(2, commits):
        ts = START_MS + version * 1000
        add = add_action(base_files + version, ts, rng)
        actions = [add] if previous is None else [remove_action(previous, ts), add]
        actions.append(_commit_info(ts, "WRITE", previous is None, rng))
        write_commit(path, version, actions)
        previous = add
    return commits - 1


def log_files(path: str, pattern: str) -> list[Path]:
    return sorted((Path(path) / "_delta_log").glob(pattern))
