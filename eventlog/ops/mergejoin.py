"""The join of a pyarrow MERGE (:mod:`eventlog.ops.merge`): the source held whole, each
target file joined against it in turn.

The source side of the join (its key columns, non-null, cast to the target's key types, and
each row's index in the source) is prepared once (:class:`SourceKeys`). When the first key
has an ordered type (integers, dates, timestamps, strings) the prepared keys are sorted by
it, so that a target file is joined only with the source rows whose first key lies between
the file's smallest and largest: a file of clustered keys then costs a join with the source
rows it may match, not with the whole source.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventlog.errors import InvalidInputError

__all__ = ["FILE", "IDX", "ROW", "SRC", "SourceKeys", "gather"]

FILE = "__eventlog_file"
ROW = "__eventlog_row"
SRC = "__eventlog_src"
IDX = "__eventlog_idx"


def _ordered(t: pa.DataType) -> bool:
    """Whether values of ``t`` convert to numpy values that sort as Arrow compares them."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    )


class SourceKeys:
    """The source side of the MERGE join, prepared once (see the module docstring).

    ``source`` carries each row's index in column :data:`SRC`; ``keys`` are (target column,
    source column) pairs; ``target_schema`` gives the types the source keys are cast to.
    """

    def __init__(self, source: pa.Table, keys: Sequence[tuple[str, str]], target_schema: pa.Schema) -> None:
        self.target_keys = [k for k, _ in keys]
        self.names = [f"k{i}" for i in range(len(keys))]
        right = source.select([*(k for _, k in keys), SRC]).rename_columns([*self.names, SRC])
        for i, (tk, _) in enumerate(keys):
            name = self.names[i]
            right = right.filter(pc.is_valid(right[name]))
            lt, rt = target_schema.field(tk).type, right.schema.field(name).type
            if lt != rt:
                try:
                    right = right.set_column(i, name, pc.cast(right[name], lt))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise InvalidInputError(f"merge key types differ: target {lt} vs source {rt}") from exc
        self._sorted: np.ndarray | None = None
        if self.names and right.num_rows and _ordered(right.schema.field(self.names[0]).type):
            right = right.sort_by(self.names[0])
            self._sorted = right[self.names[0]].to_numpy()
        self.right = right

    def _candidates(self, left: pa.Table) -> pa.Table:
        """The prepared source rows whose first key lies within ``left``'s."""
        if self._sorted is None or not left.num_rows:
            return self.right
        first = left[self.names[0]].to_numpy()
        lo = np.searchsorted(self._sorted, first.min(), side="left")
        hi = np.searchsorted(self._sorted, first.max(), side="right")
        return self.right.slice(int(lo), int(hi - lo))

    def join(self, target: pa.Table) -> pa.Table:
        """(target row index, target file, target row, source row) where every key pair is
        equal and non-null; the index is the row's index in ``target``, which holds the key
        columns and :data:`FILE` and :data:`ROW`."""
        left = target.select([*self.target_keys, FILE, ROW]).rename_columns([*self.names, FILE, ROW])
        left = left.append_column(IDX, pa.array(np.arange(left.num_rows, dtype=np.int64)))
        for name in self.names:
            left = left.filter(pc.is_valid(left[name]))
        right = self._candidates(left)
        return left.join(right, keys=self.names, join_type="inner").select([IDX, FILE, ROW, SRC])


def gather(target: pa.Table, source: pa.Table, pairs: pa.Table, t: str, s: str) -> pa.Table:
    """The target and source rows of each matched pair, columns named ``alias.column``."""
    trows = target.take(pairs[IDX])
    srows = source.take(pairs[SRC])
    cols = {f"{t}.{n}": trows[n] for n in trows.schema.names}
    cols.update({f"{s}.{n}": srows[n] for n in srows.schema.names})
    return pa.table(cols)
