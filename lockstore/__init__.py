"""Version-slot stores: which writer may publish version N of a table.

See :mod:`lockstore.base` for the port and its guarantees.
"""

from lockstore.base import (
    LockstoreError,
    SlotClaim,
    SlotNotClaimedError,
    SlotRecord,
    SlotStore,
    SlotStoreUnavailableError,
    TableBindingError,
    default_owner,
)
from lockstore.localfs import LocalFileSlotStore
from lockstore.memory import InMemorySlotStore

__all__ = [
    "SlotStore",
    "SlotClaim",
    "SlotRecord",
    "LockstoreError",
    "SlotStoreUnavailableError",
    "SlotNotClaimedError",
    "TableBindingError",
    "default_owner",
    "InMemorySlotStore",
    "LocalFileSlotStore",
]
