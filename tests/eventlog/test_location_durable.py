"""Durable mode travels with a table's location (:class:`eventlog.log.location.TableLocation`):
the file system tasks write data files with fsyncs them, the log it opens is durable, and
the location of a table opened with ``durable=True`` says so."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa

from eventlog import Table
from eventlog.log.durable import is_durable
from eventlog.log.location import TableLocation


def test_location_of_a_durable_table_is_durable_and_survives_pickling(tmp_path: Path) -> None:
    Table.create(tmp_path / "t", data=pa.table({"x": [1]})).close()
    with Table.open(tmp_path / "t", durable=True) as durable, Table.open(tmp_path / "t") as plain:
        loc = pickle.loads(pickle.dumps(TableLocation.from_store(durable.log)))
        assert loc.durable and not TableLocation.from_store(plain.log).durable
    fs, root = loc.files()
    assert is_durable(fs) and root == str(tmp_path / "t")
    assert loc.log_store().durable
    assert repr(loc) == f"TableLocation({loc.uri!r}, durable=True)"


def test_of_adds_durable_mode_and_never_drops_it(tmp_path: Path) -> None:
    plain = TableLocation.of(tmp_path / "t")
    assert not plain.durable and not is_durable(plain.files()[0]) and not plain.log_store().durable
    durable = TableLocation.of(plain, durable=True)
    assert durable.durable and durable != plain and hash(durable) != hash(plain)
    assert TableLocation.of(durable) is durable
    assert TableLocation.of(str(tmp_path / "t"), durable=True) == durable


def test_handle_takes_durable(tmp_path: Path) -> None:
    Table.create(tmp_path / "t", data=pa.table({"x": [1]})).close()
    with Table.handle(tmp_path / "t", durable=True) as handle, Table.handle(tmp_path / "t") as plain:
        assert handle.log.durable and not plain.log.durable
