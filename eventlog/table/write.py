"""``write_table``: write data to a table, creating it when the path holds none."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import fsspec

from eventlog.errors import InvalidInputError, TableAlreadyExistsError
from eventlog.log.commitlog import SlotsSpec
from eventlog.log.storage import LogStore, open_log_store
from eventlog.table.handle import Table
from eventlog.txn.transaction import CommitResult


def write_table(
    uri: str | os.PathLike[str],
    data: Any,
    *,
    mode: str = "append",
    partition_by: Sequence[str] | None = None,
    properties: Mapping[str, str] | None = None,
    replace_where: str | None = None,
    schema_mode: str | None = None,
    slots: SlotsSpec = None,
    storage_options: Mapping[str, Any] | None = None,
    filesystem: fsspec.AbstractFileSystem | None = None,
    durable: bool = False,
) -> CommitResult:
    """Write ``data`` to the table at ``uri``, creating it when the path holds none.

    ``mode`` is ``"append"``, ``"overwrite"``, ``"error"`` (fail if the table exists) or
    ``"ignore"`` (do nothing if it exists), as in Spark and delta-rs. Writers racing to
    create one table: the losers get ProtocolChangedException (retry to append).
    ``durable``: fsync before the commit is acknowledged (see :meth:`Table.create`).
    """
    if mode not in ("append", "overwrite", "error", "ignore"):
        raise InvalidInputError(f"mode must be append, overwrite, error or ignore; got {mode!r}")
    log = open_log_store(uri, storage_options, filesystem)
    where: dict[str, Any] = {"storage_options": storage_options, "filesystem": filesystem, "durable": durable}
    if not LogStore.commit_versions(log.list_log()):
        try:
            table = Table.create(uri, None, partition_by, properties, slots, data=data, **where)
        except TableAlreadyExistsError:
            pass  # created meanwhile: fall through to the existing-table path
        else:
            info = table.history(1)[0]
            return CommitResult(0, 1, info["operation"], info.get("operationMetrics", {}), info["txnId"])
    table = Table.open(uri, slots, **where)
    if mode == "error":
        raise TableAlreadyExistsError(table.uri, table.version)
    if mode == "ignore":
        return CommitResult(table.version, 0, "", {}, "", skipped=True)
    if partition_by is not None and tuple(partition_by) != table.partition_columns:
        raise InvalidInputError(
            f"partition_by {list(partition_by)} differs from the table's {list(table.partition_columns)}"
        )
    if mode == "append":
        return table.append(data, schema_mode=schema_mode)
    return table.overwrite(data, replace_where=replace_where, schema_mode=schema_mode)
