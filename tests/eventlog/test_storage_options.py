"""``storage_options=`` and ``filesystem=``: how a table reaches its file system.

The S3 end of this is in the object-store tests (a real S3 API on loopback); here, the
contract every scheme shares: the options reach fsspec, an explicit file system is used
as it is, and bad arguments are typed errors before anything is written.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from eventlog import Table, write_table
from eventlog.errors import InvalidInputError, InvalidTextError
from tests.conftest import SCHEMA, rows


def test_an_explicit_filesystem_is_the_one_every_file_goes_through() -> None:
    fs = MemoryFileSystem()
    uri = f"memory://explicit-{uuid.uuid4().hex}/t"
    t = Table.create(uri, SCHEMA, filesystem=fs)
    t.append(rows([1, 2]))
    assert t.log.fs is fs
    files = fs.find(uri.removeprefix("memory:/"))
    assert any(f.endswith(".parquet") for f in files)
    assert any(f.endswith("00000000000000000001.json") for f in files)
    reopened = Table.open(uri, filesystem=fs)
    assert reopened.to_arrow().column("id").to_pylist() == [1, 2]
    assert write_table(uri, rows([3]), filesystem=fs).version == 2


def test_storage_options_reach_fsspec(tmp_path: Path) -> None:
    """Local file systems take ``auto_mkdir``; the handle's file system carries it."""
    uri = str(tmp_path / "t")
    t = Table.create(uri, SCHEMA, storage_options={"auto_mkdir": True})
    assert t.log.fs.auto_mkdir is True
    t.append(rows([1]))
    assert Table.open(uri, storage_options={"auto_mkdir": True}).version == 1


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"storage_options": "key=value"}, InvalidTextError),
        ({"storage_options": {"": 1}}, InvalidTextError),
        ({"storage_options": {1: "x"}}, InvalidTextError),
        ({"filesystem": "memory"}, InvalidInputError),
        ({"filesystem": MemoryFileSystem(), "storage_options": {"a": 1}}, InvalidInputError),
    ],
)
def test_bad_storage_arguments_are_typed_errors_and_write_nothing(
    tmp_path: Path, kwargs: dict[str, object], error: type[Exception]
) -> None:
    uri = str(tmp_path / "t")
    with pytest.raises(error):
        Table.create(uri, SCHEMA, **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "t").exists()
    with pytest.raises(error):
        write_table(uri, pa.table({"id": [1]}), **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "t").exists()


def test_an_unknown_scheme_is_an_invalid_input_error() -> None:
    with pytest.raises(InvalidInputError):
        Table.create("nosuchscheme://bucket/t", SCHEMA)
    assert "nosuchscheme" not in fsspec.available_protocols()
