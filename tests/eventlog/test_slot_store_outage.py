"""A slot store that cannot be reached: every call of the table API that needs it raises the
engine's :class:`~eventlog.errors.SlotStoreError` (or, for a commit whose claim is in doubt,
``CommitStateUnknownError``), with lockstore's error chained, never lockstore's own error.
Found under a real network partition (tests/faults/test_partitions.py): ``verify`` and
``repair_slots`` let ``SlotStoreUnavailableError`` out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from eventlog import RetryPolicy, SlotStoreError, Table, identity_field
from lockstore import InMemorySlotStore, SlotClaim, SlotRecord, SlotStoreUnavailableError
from tests.conftest import SCHEMA, rows


class OutageSlots(InMemorySlotStore):
    """An in-memory store that raises ``SlotStoreUnavailableError`` while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise SlotStoreUnavailableError("the slot store is cut off")

    def latest(self, table: str) -> int:
        self._check()
        return super().latest(table)

    def get(self, table: str, version: int) -> SlotRecord | None:
        self._check()
        return super().get(table, version)

    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        self._check()
        return super().claim(table, version, claim)

    def mark_complete(self, table: str, version: int) -> None:
        self._check()
        super().mark_complete(table, version)

    def reserve_range(self, table: str, name: str, count: int, floor: int = 0) -> int:
        self._check()
        return super().reserve_range(table, name, count, floor)


CALLS: dict[str, Callable[[Table], Any]] = {
    "refresh": lambda t: t.refresh(),
    "verify": lambda t: t.verify(),
    "repair_slots": lambda t: t.repair_slots(dry_run=True),
    "repair_slots_for_real": lambda t: t.repair_slots(),
    "append": lambda t: t.append(rows([9])),
}


@pytest.mark.parametrize("call", CALLS, ids=list(CALLS))
def test_an_unreachable_slot_store_is_the_engines_error(local_uri: str, call: str) -> None:
    slots = OutageSlots()
    table = Table.create(local_uri, SCHEMA, slots=slots, retry_policy=RetryPolicy(max_duration=0.2))
    table.append(rows([1, 2]))
    slots.down = True
    with pytest.raises(SlotStoreError) as err:
        CALLS[call](table)
    assert isinstance(err.value.__cause__, SlotStoreUnavailableError)
    assert err.value.uri == table.uri
    slots.down = False
    assert CALLS["verify"](table).ok  # nothing was written meanwhile
    assert table.refresh().version == 1


def test_identity_values_from_an_unreachable_slot_store_are_the_engines_error(local_uri: str) -> None:
    """Identity values come in blocks reserved through the slot store; a block that cannot
    be reserved fails the write with SlotStoreError, and nothing is committed."""
    slots = OutageSlots()
    schema = pa.schema([identity_field("id"), pa.field("v", pa.string())])
    table = Table.create(local_uri, schema, slots=slots, retry_policy=RetryPolicy(max_duration=0.2))
    slots.down = True
    with pytest.raises(SlotStoreError) as err:
        table.append(pa.table({"v": ["a"]}))
    assert isinstance(err.value.__cause__, SlotStoreUnavailableError)
    slots.down = False
    assert table.refresh().version == 0
    table.append(pa.table({"v": ["b"]}))
    assert table.to_arrow().column("v").to_pylist() == ["b"]
