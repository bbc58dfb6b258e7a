"""Log replay on columns: fold add and remove actions into the live files and tombstones.

The Delta rule (PROTOCOL.md "Action Reconciliation"): a file is identified by its path and
deletion-vector id, and for each such key the newest action wins; an ``add`` makes the file
live, a ``remove`` makes it a tombstone. :func:`fold_files` applies that rule to Arrow
tables with vectorised kernels: no Python value per file, and for the usual fold (a few new
commits on a large state) only the rows whose *path* a new action names are looked at
individually.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from eventlog.log.filetable import ADD_SCHEMA, REMOVE_SCHEMA, FileActions, conform, file_keys

__all__ = ["compact", "fold_files"]

_MAX_CHUNKS = 64  # past this many chunks a folded table is made contiguous again


def fold_files(live: pa.Table, tombstones: pa.Table, actions: FileActions) -> tuple[pa.Table, pa.Table]:
    """``(live, tombstones)`` after ``actions`` (newer than both) are applied."""
    if actions.is_empty:
        return live, tombstones
    adds, removes = actions.adds, actions.removes
    if removes.num_rows == 0 and live.num_rows == 0 and tombstones.num_rows == 0:
        # The first fold of a log without checkpoint: only duplicate adds can interact, and
        # one version never adds a file twice (PROTOCOL.md), so one commit needs no check.
        versions = actions.add_versions
        if len(versions) == 0 or versions.min() == versions.max():
            return compact(adds), tombstones
        if _first_of_runs(file_keys(adds)) is None:
            return compact(adds), tombstones
    add_keys, remove_keys = _keys(adds), _keys(removes)
    keys = pa.concat_arrays([add_keys, remove_keys])
    # Newest wins; within one version an add outranks a remove (a valid commit has neither).
    rank = np.concatenate([actions.add_versions * 2 + 1, actions.remove_versions * 2])
    winners = _newest_per_key(keys, rank)
    if winners is not None:
        n_add = adds.num_rows
        adds = adds.take(pa.array(winners[winners < n_add]))
        removes = removes.take(pa.array(winners[winners >= n_add] - n_add))
        add_keys = _keys(adds)
        remove_keys = _keys(removes)
        keys = pa.concat_arrays([add_keys, remove_keys])
    paths = pc.unique(pa.concat_arrays([_path(adds), _path(removes)]))
    live = _drop(live, paths, keys)
    tombstones = _drop(tombstones, paths, keys)
    return compact(_concat(live, adds, ADD_SCHEMA)), compact(_concat(tombstones, removes, REMOVE_SCHEMA))


def compact(table: pa.Table) -> pa.Table:
    """``table``, made contiguous once folds have split it into many chunks."""
    if table.num_columns and table.column(0).num_chunks > _MAX_CHUNKS:
        return table.combine_chunks()
    return table


def _concat(base: pa.Table, more: pa.Table, schema: pa.Schema) -> pa.Table:
    """``base`` then ``more``, as ``schema`` (a commit's removes keep stats; tombstones not)."""
    if more.num_rows == 0:
        return base
    if not more.schema.equals(schema):
        more = conform(more, schema)
    if base.num_rows == 0:
        return more
    return pa.concat_tables([base, more])


def _path(table: pa.Table) -> pa.Array:
    return table.column("path").combine_chunks()


def _keys(table: pa.Table) -> pa.Array:
    keys = file_keys(table)
    return keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys


def _newest_per_key(keys: pa.Array, rank: np.ndarray) -> np.ndarray | None:
    """Row numbers of the newest action per key, or None when every key is distinct."""
    if _first_of_runs(keys) is None:
        return None
    order = pc.sort_indices(
        pa.table({"k": keys, "r": pa.array(rank)}), sort_keys=[("k", "ascending"), ("r", "descending")]
    )
    first = _first_of_runs(keys, order)
    assert first is not None
    winners: np.ndarray = order.to_numpy()[first]
    return np.sort(winners)


def _first_of_runs(keys: pa.Array | pa.ChunkedArray, order: pa.Array | None = None) -> np.ndarray | None:
    """For ``keys`` taken in ``order`` (default: sorted), a mask of each key's first row;
    None when no key repeats. Sorting, not hashing: Arrow's hash kernels hold a copy of
    every distinct string, several times the size of the keys."""
    n = len(keys)
    if n < 2:
        return None
    if order is None:
        order = pc.sort_indices(keys)
    ordered = keys.take(order)
    ordered = ordered.combine_chunks() if isinstance(ordered, pa.ChunkedArray) else ordered
    same = pc.equal(ordered.slice(1), ordered.slice(0, n - 1))
    if not pc.any(same).as_py():
        return None
    first = np.ones(n, dtype=bool)
    first[1:] = ~same.to_numpy(zero_copy_only=False)
    return first


def _drop(table: pa.Table, paths: pa.Array, keys: pa.Array) -> pa.Table:
    """``table`` without the rows whose key is in ``keys`` (``paths``: their paths, which
    narrows the key comparison to the few rows that share a path)."""
    if table.num_rows == 0 or len(keys) == 0:
        return table
    candidate = pc.is_in(table.column("path"), value_set=paths)
    if not pc.any(candidate).as_py():
        return table
    index = pc.indices_nonzero(candidate)
    near = table.select(["path", "deletionVector"]).take(index)
    hit = pc.is_in(file_keys(near), value_set=keys)
    drop = index.filter(hit).to_numpy()
    if len(drop) == 0:
        return table
    keep = np.ones(table.num_rows, dtype=bool)
    keep[drop] = False
    return table.filter(pa.array(keep))
