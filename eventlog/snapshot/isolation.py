"""Isolation levels and the per-transaction downgrade rule.

The table property ``delta.isolationLevel`` selects ``WriteSerializable`` (the default,
as the Databricks documentation specifies) or ``Serializable``. ``SnapshotIsolation`` is
never a table setting: it is chosen for a transaction whose actions change no data
(OPTIMIZE, an empty commit), which skips only the "added files that should have been
read" check (Delta Spark, ``TransactionHelper.getIsolationLevelToUse``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from eventlog.errors import InvalidTablePropertyError
from eventlog.log.actions import Action, AddFile, RemoveFile

ISOLATION_LEVEL_KEY = "delta.isolationLevel"


class IsolationLevel(enum.StrEnum):
    SERIALIZABLE = "Serializable"
    WRITE_SERIALIZABLE = "WriteSerializable"
    SNAPSHOT_ISOLATION = "SnapshotIsolation"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def table_levels(cls) -> list[str]:
        """Values accepted for the table property."""
        return [cls.SERIALIZABLE.value, cls.WRITE_SERIALIZABLE.value]

    @classmethod
    def parse(cls, value: str) -> IsolationLevel:
        """Parse a table-property value; anything but the two table levels is rejected."""
        for level in (cls.SERIALIZABLE, cls.WRITE_SERIALIZABLE):
            if value == level.value:
                return level
        raise InvalidTablePropertyError(ISOLATION_LEVEL_KEY, value, cls.table_levels())

    @classmethod
    def of_table(cls, configuration: Mapping[str, str]) -> IsolationLevel:
        value = configuration.get(ISOLATION_LEVEL_KEY)
        return cls.WRITE_SERIALIZABLE if value is None else cls.parse(value)


def effective_isolation_level(
    table_level: IsolationLevel, actions: Sequence[Action], *, changes_data: bool
) -> IsolationLevel:
    """The level a transaction runs its conflict checks at.

    Downgrade to snapshot isolation when every action is a file action with
    ``dataChange = false`` (or there are none) and either the table is Serializable or
    the operation does not change data. Any metadata, protocol, txn or domain action
    prevents the downgrade.
    """
    for action in actions:
        if not isinstance(action, (AddFile, RemoveFile)):
            return table_level
        if action.data_change:
            return table_level
    if table_level is IsolationLevel.SERIALIZABLE or not changes_data:
        return IsolationLevel.SNAPSHOT_ISOLATION
    return table_level
