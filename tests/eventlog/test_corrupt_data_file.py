"""A data file that is not Parquet (left empty or torn by a power loss on a table not in
durable mode, or by a partial copy) is CorruptDataFileError, naming the file, on every read
path: to_arrow, scan, DML; never pyarrow's untyped ArrowInvalid. The log is untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlog import CorruptDataFileError, EventlogError, Table
from tests.conftest import SCHEMA, rows


def _table_with_a_bad_file(tmp_path: Path, content: bytes) -> tuple[Table, str]:
    t = Table.create(str(tmp_path / "t"), SCHEMA)
    t.append(rows([1, 2]))
    t.append(rows([3]))
    bad = sorted(add.path for add in t.snapshot().add_files)[0]
    (tmp_path / "t" / bad).write_bytes(content)
    return Table.open(t.uri), bad


@pytest.mark.parametrize(
    "content", [b"", b"PAR1 torn in the middle", b"x" * 100], ids=["empty", "torn", "garbage"]
)
def test_every_read_path_names_the_corrupt_file(tmp_path: Path, content: bytes) -> None:
    t, bad = _table_with_a_bad_file(tmp_path, content)
    reads = {
        "to_arrow": lambda: t.to_arrow(),
        "to_arrow filtered": lambda: t.to_arrow(filter="id > 0"),
        "scan": lambda: t.scan().read_all(),
        "delete": lambda: t.delete("id >= 1"),
        "update": lambda: t.update("id >= 1", {"x": "1"}),
    }
    for name, read in reads.items():
        with pytest.raises(CorruptDataFileError) as err:
            read()
        e = err.value
        assert isinstance(e, EventlogError), name
        assert e.uri == t.uri and e.path.endswith(bad), (name, e.path)
        assert e.reason, name
    assert Table.open(t.uri).version == 2  # nothing was committed
    assert t.verify().ok  # the log is intact
