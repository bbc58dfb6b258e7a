"""Row tracking (the ``rowTracking`` writer feature): stable row ids and row commit versions.

What the protocol asks, and where this library does it:

* **Fresh ids at commit.** While the feature is supported (and not suspended by
  ``delta.rowTrackingSuspended``), every ``add`` gets a ``baseRowId`` above the table's
  high-water mark and a ``defaultRowCommitVersion`` equal to its commit's version; the
  ``delta.rowTracking`` domain moves the mark (``{"rowIdHighWaterMark": n}``). A file added
  again (a new deletion vector, a backfill) keeps the values it had.
  :func:`assign_fresh_row_ids` runs when the commit's bytes are made for a version
  (:meth:`eventlog.txn.attempt.CommitAttempt.bytes`), so a commit rebased over a winner takes
  ids above the winner's mark and the version it finally lands at.
* **Stable ids through rewrites.** While the feature is enabled (``delta.enableRowTracking``
  true), a row copied or updated into a new file keeps its id, and a copied row keeps its
  commit version: both are written into two hidden columns of the new file, named in the
  table configuration (``delta.rowTracking.materializedRowIdColumnName`` and
  ``...RowCommitVersionColumnName``). :func:`stable_ids` reads them from a source file.
* **Reading.** The stable id of a row is its materialized id when present, else the file's
  ``baseRowId`` plus the row's physical position; its commit version likewise
  (:func:`stable_ids`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from eventlog.errors import CorruptLogError
from eventlog.files import column_mapping as cm
from eventlog.log.actions import Action, AddFile, DomainMetadata, Metadata, Protocol

FEATURE = "rowTracking"
DOMAIN = "delta.rowTracking"
ENABLE_KEY = "delta.enableRowTracking"
SUSPENDED_KEY = "delta.rowTrackingSuspended"
ROW_ID_COLUMN_KEY = "delta.rowTracking.materializedRowIdColumnName"
COMMIT_VERSION_COLUMN_KEY = "delta.rowTracking.materializedRowCommitVersionColumnName"
NO_HIGH_WATER_MARK = -1
"""The mark of a table that never assigned a row id: the first file's ``baseRowId`` is 0."""

ROW_ID = "_row_id"
ROW_COMMIT_VERSION = "_row_commit_version"
"""The names of the two columns :meth:`eventlog.table.Table.to_arrow` adds on request
(Spark calls them ``_metadata.row_id`` and ``_metadata.row_commit_version``)."""


def supported(protocol: Protocol | None) -> bool:
    """Whether ``protocol`` lists the ``rowTracking`` writer feature."""
    return protocol is not None and FEATURE in (protocol.writer_features or ())


def assigns(protocol: Protocol | None, metadata: Metadata | None) -> bool:
    """Whether writers must assign fresh row ids: the feature supported and not suspended."""
    if not supported(protocol):
        return False
    config = metadata.configuration if metadata is not None else {}
    return config.get(SUSPENDED_KEY, "false").lower() != "true"


def enabled(protocol: Protocol | None, metadata: Metadata | None) -> bool:
    """Whether row ids are stable: the feature supported and ``delta.enableRowTracking`` true."""
    return (
        supported(protocol)
        and metadata is not None
        and metadata.configuration.get(ENABLE_KEY, "false").lower() == "true"
    )


def materialized_columns(configuration: Mapping[str, str]) -> tuple[str, str] | None:
    """(row id column, row commit version column) of the data files, or None when unnamed."""
    row_id = configuration.get(ROW_ID_COLUMN_KEY)
    version = configuration.get(COMMIT_VERSION_COLUMN_KEY)
    return (row_id, version) if row_id and version else None


def with_column_names(configuration: Mapping[str, str], schema_names: Iterable[str]) -> dict[str, str]:
    """``configuration`` with the hidden columns named (``_row-id-col-<uuid>`` and
    ``_row-commit-version-col-<uuid>``, as Delta Spark names them) when row tracking is
    turned on and they are not named yet; unchanged otherwise."""
    config = dict(configuration)
    if config.get(ENABLE_KEY, "false").lower() != "true" or materialized_columns(config) is not None:
        return config
    taken = {n.lower() for n in schema_names}
    while True:
        names = (f"_row-id-col-{uuid.uuid4()}", f"_row-commit-version-col-{uuid.uuid4()}")
        if not {n.lower() for n in names} & taken:
            break
    config[ROW_ID_COLUMN_KEY], config[COMMIT_VERSION_COLUMN_KEY] = names
    return config


def high_water_mark(domains: Mapping[str, DomainMetadata] | Iterable[DomainMetadata]) -> int:
    """The ``rowIdHighWaterMark`` of the ``delta.rowTracking`` domain among ``domains``
    (:data:`NO_HIGH_WATER_MARK` when absent)."""
    found = domains.get(DOMAIN) if isinstance(domains, Mapping) else None
    if not isinstance(domains, Mapping):
        for d in domains:
            if d.domain == DOMAIN:
                found = d
    if found is None or found.removed:
        return NO_HIGH_WATER_MARK
    try:
        value = orjson.loads(found.configuration or "{}").get("rowIdHighWaterMark")
    except (orjson.JSONDecodeError, AttributeError):
        value = None
    if not isinstance(value, int) or isinstance(value, bool):
        raise CorruptLogError(
            f"the {DOMAIN} domain holds no integer rowIdHighWaterMark: {found.configuration[:200]!r}",
            uri="",
            version=None,
        )
    return value


def high_water_mark_domain(mark: int) -> DomainMetadata:
    return DomainMetadata(DOMAIN, orjson.dumps({"rowIdHighWaterMark": mark}).decode())


def assign_fresh_row_ids(
    actions: Sequence[Action], version: int, mark: int, count_rows: Callable[[AddFile], int]
) -> tuple[list[Action], int]:
    """``actions`` with fresh row ids on the adds that have none: each such file's
    ``baseRowId`` is one above the mark, which then moves past its rows (``count_rows``);
    ``defaultRowCommitVersion`` is ``version`` where missing. Any ``delta.rowTracking``
    domain among ``actions`` is replaced by the new mark's when it moved. Returns the
    actions and the new mark."""
    out: list[Action] = []
    start = mark
    for action in actions:
        if isinstance(action, DomainMetadata) and action.domain == DOMAIN:
            mark = max(mark, high_water_mark([action]))
            continue
        if isinstance(action, AddFile) and (
            action.base_row_id is None or action.default_row_commit_version is None
        ):
            base = action.base_row_id
            if base is None:
                base = mark + 1
                mark += count_rows(action)
            cv = action.default_row_commit_version
            action = dataclasses.replace(
                action, base_row_id=base, default_row_commit_version=version if cv is None else cv
            )
        out.append(action)
    if mark != start:
        out.append(high_water_mark_domain(mark))
    return out, mark


def stable_ids(
    add: AddFile,
    positions: np.ndarray,
    materialized: pa.Table | None,
    columns: tuple[str, str] | None,
) -> tuple[pa.Array, pa.Array]:
    """(row ids, row commit versions) of the rows at physical ``positions`` of ``add``.

    ``materialized`` holds the file's hidden columns (named ``columns``) for those rows, or
    is None when the file has none; a null there falls back to ``baseRowId`` + position and
    the file's ``defaultRowCommitVersion``. A file without a ``baseRowId`` (written before
    the feature) gives null ids, as it would to Delta Spark.
    """
    n = len(positions)
    if add.base_row_id is None:
        fresh: pa.Array = pa.nulls(n, pa.int64())
    else:
        fresh = pa.array(positions.astype(np.int64, copy=False) + add.base_row_id, pa.int64())
    cv = add.default_row_commit_version
    default_cv = pa.nulls(n, pa.int64()) if cv is None else pa.array(np.full(n, cv, np.int64), pa.int64())
    if materialized is None or columns is None:
        return fresh, default_cv
    row_id_col, cv_col = columns
    ids, versions = fresh, default_cv
    if row_id_col in materialized.column_names:
        ids = pc.coalesce(materialized.column(row_id_col).combine_chunks().cast(pa.int64()), fresh)
    if cv_col in materialized.column_names:
        versions = pc.coalesce(materialized.column(cv_col).combine_chunks().cast(pa.int64()), default_cv)
    return ids, versions


def attach(
    rows: pa.Table,
    columns: tuple[str, str],
    ids: pa.Array | pa.ChunkedArray,
    versions: pa.Array | pa.ChunkedArray,
) -> pa.Table:
    """``rows`` with the two hidden columns appended (replaced when present)."""
    out = rows
    for name, values in zip(columns, (ids, versions), strict=True):
        if name in out.column_names:
            out = out.drop_columns([name])
        out = out.append_column(pa.field(name, pa.int64()), values)
    return out


def hidden_columns(configuration: Mapping[str, str]) -> tuple[str, ...]:
    """The hidden column names a data file of this table may hold (none without row tracking)."""
    names = materialized_columns(configuration)
    return names if names is not None else ()


def split(rows: pa.Table, hidden: Sequence[str]) -> tuple[pa.Table, pa.Table | None]:
    """(``rows`` without the hidden columns, the hidden columns or None when it has none)."""
    present = [c for c in hidden if c in rows.column_names]
    if not present:
        return rows, None
    return rows.drop_columns(present), rows.select(present)


def rejoin(rows: pa.Table, hidden: pa.Table | None) -> pa.Table:
    """``rows`` with the hidden columns :func:`split` took off (the same rows, in order)."""
    if hidden is None:
        return rows
    for name, column in zip(hidden.column_names, hidden.columns, strict=True):
        rows = rows.append_column(pa.field(name, pa.int64()), column)
    return rows


def mark_updated(
    rows: pa.Table, hidden: tuple[str, str] | None, where: pa.Array | pa.ChunkedArray | None = None
) -> pa.Table:
    """``rows`` whose commit version column is null where ``where`` is true (every row when
    None): updated rows keep their ids but take the version of the commit writing them."""
    if hidden is None or hidden[1] not in rows.column_names:
        return rows
    index = rows.column_names.index(hidden[1])
    column = rows.column(index)
    nulls = pa.nulls(rows.num_rows, pa.int64())
    value = nulls if where is None else pc.if_else(where, nulls, column)
    return rows.set_column(index, pa.field(hidden[1], pa.int64()), value)


def file_layout(data: pa.Table, schema: pa.Schema, hidden: Sequence[str]) -> tuple[pa.Table, list[str]]:
    """Conformed rows as :func:`eventlog.files.datafiles.write_data_files` takes them for a
    table of ``schema``: under column mapping's physical names, with the hidden columns
    (``hidden``: rows a rewrite copied carry their stable ids there) kept as they are; and
    the hidden columns present."""
    body, kept = split(data, hidden)
    if cm.is_mapped(schema) and not cm.is_mapped(body.schema):
        body = cm.adopt(body, schema)  # column mapping: written under physical names
    return rejoin(body, kept), kept.column_names if kept is not None else []
