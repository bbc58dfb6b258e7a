"""Checkpoints of every kind written by hand for the checkpoint tests (test_checkpoint_multipart,
test_checkpoint_v2, test_checkpoint_locating, test_checkpoint_deltalake, test_checkpoint_columnar):
sample states, multi-part sets, V2 headers and sidecars, and a file system that refuses to list.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eventlog.log.actions import AddFile, DeletionVectorDescriptor, Protocol
from eventlog.log.checkpoint import CheckpointState, checkpoint_path, write_checkpoint
from tests.eventlog.log.test_checkpoint import full_state

V = 7
UUID_A = "80a083e8-7026-4e79-81be-64bd76c43a11"
V2_PROTOCOL = Protocol(3, 7, ("deletionVectors", "v2Checkpoint"), ("deletionVectors", "v2Checkpoint"))


def checkpoint_name(version: int, suffix: str) -> str:
    return f"{version:020d}.checkpoint.{suffix}"


def many_adds(n: int, *, offset: int = 0) -> list[AddFile]:
    return [
        AddFile(
            f"d={i % 3}/f-{offset + i:06d}.parquet",
            {"d": str(i % 3)},
            100 + i,
            1_700_000_000_000 + i,
            i % 2 == 0,
            f'{{"numRecords":{i}}}',
            tags={"k": str(i)} if i % 5 == 0 else None,
            deletion_vector=DeletionVectorDescriptor("u", f"dv{i:018d}xx", 30, i, offset=i)
            if i % 7 == 0
            else None,
        )
        for i in range(n)
    ]


def rich_state(version: int = V) -> CheckpointState:
    """full_state plus enough files that they spread over several parts/sidecars."""
    base = full_state(version)
    return dataclasses.replace(base, adds=[*base.adds, *many_adds(40)])


def our_rows(tmp: Path, state: CheckpointState) -> pa.Table:
    """Our checkpoint of ``state`` as a raw table (one row per action)."""
    write_checkpoint(fsspec.filesystem("file"), str(tmp), state)
    return pq.read_table(checkpoint_path(str(tmp), state.version))


def kind_rows(rows: pa.Table, kinds: tuple[str, ...]) -> pa.Table:
    mask = None
    for kind in kinds:
        valid = rows.column(kind).is_valid()
        mask = valid if mask is None else pc.or_(mask, valid)
    return rows.filter(mask)


def write_json_lines(path: Path, actions: list[Any]) -> None:
    path.write_bytes(b"\n".join(orjson.dumps(a) for a in actions) + b"\n")


def py_actions(rows: pa.Table) -> list[dict[str, Any]]:
    """Rows of a checkpoint table as JSON actions (maps become objects)."""
    out = []
    for row in rows.to_pylist():
        ((kind, body),) = [(k, v) for k, v in row.items() if v is not None]
        body = {k: v for k, v in body.items() if v is not None}
        for key in ("partitionValues", "tags", "configuration"):
            if isinstance(body.get(key), list):
                body[key] = dict(body[key])
        if kind == "metaData":
            body["format"]["options"] = dict(body["format"]["options"])
        out.append({kind: body})
    return out


def sidecar_action(path: Path) -> dict[str, Any]:
    return {
        "sidecar": {
            "path": path.name,
            "sizeInBytes": path.stat().st_size,
            "modificationTime": int(path.stat().st_mtime * 1000),
            "tags": {},
        }
    }


def write_sidecars(log: Path, rows: pa.Table, n: int) -> list[Path]:
    """The add/remove rows of ``rows`` split over ``n`` sidecar files (add/remove columns only)."""
    files = kind_rows(rows, ("add", "remove")).select(["add", "remove"])
    (log / "_sidecars").mkdir(exist_ok=True)
    paths = []
    for i in range(n):
        part = files.take(pa.array(np.arange(i, files.num_rows, n)))
        path = log / "_sidecars" / f"{uuid.uuid4()}.parquet"
        pq.write_table(part, path)
        paths.append(path)
    return paths


class NoListing(fsspec.implementations.local.LocalFileSystem):  # type: ignore[misc]
    """A local file system that refuses to list: proves a read opens files by name."""

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        raise AssertionError(f"listed {path}")


def write_multipart(
    tmp: Path, log: Path, state: CheckpointState, parts: int, skip: int | None = None
) -> None:
    rows = our_rows(tmp, state)
    for i in range(parts):
        if skip == i + 1:
            continue
        # Every part holds rows of several kinds; protocol/metaData land in some part.
        part = rows.take(pa.array(np.arange(i, rows.num_rows, parts)))
        pq.write_table(part, log / checkpoint_name(state.version, f"{i + 1:010d}.{parts:010d}.parquet"))


def v2_header(rows: pa.Table, version: int) -> list[dict[str, Any]]:
    non_file = py_actions(kind_rows(rows, ("protocol", "metaData", "txn", "domainMetadata")))
    return [{"checkpointMetadata": {"version": version, "tags": {}}}, *non_file]


def v2_state(version: int = V) -> CheckpointState:
    return dataclasses.replace(rich_state(version), protocol=V2_PROTOCOL)


def assert_same_state(got: CheckpointState, want: CheckpointState) -> None:
    assert (got.version, got.protocol, got.metadata) == (want.version, want.protocol, want.metadata)
    assert got.add_table.sort_by("path").equals(want.add_table.sort_by("path"))
    assert sorted(got.removes, key=lambda r: r.path) == sorted(want.removes, key=lambda r: r.path)
    assert sorted(got.txns, key=lambda t: t.app_id) == sorted(want.txns, key=lambda t: t.app_id)
    assert sorted(got.domains, key=lambda d: d.domain) == sorted(want.domains, key=lambda d: d.domain)
