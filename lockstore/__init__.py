"""Version-slot stores: which writer may publish version N of a table.

See :mod:`lockstore.base` for the port and its guarantees.
"""

from lockstore.base import (
    Lease,
    LeaseHeldError,
    LeaseOwner,
    LockstoreError,
    SlotClaim,
    SlotNotClaimedError,
    SlotRecord,
    SlotStore,
    SlotStoreUnavailableError,
    SlotStoreWriteRefusedError,
    TableBindingError,
    default_owner,
    lease_owner_here,
)
from lockstore.embedded import EmbeddedSlotStore
from lockstore.localfs import LocalFileSlotStore
from lockstore.memory import InMemorySlotStore
from lockstore.objectstore import ObjectStoreSlotStore

__all__ = [
    "SlotStore",
    "SlotClaim",
    "SlotRecord",
    "LockstoreError",
    "SlotStoreUnavailableError",
    "SlotStoreWriteRefusedError",
    "SlotNotClaimedError",
    "TableBindingError",
    "default_owner",
    "Lease",
    "LeaseOwner",
    "LeaseHeldError",
    "lease_owner_here",
    "InMemorySlotStore",
    "LocalFileSlotStore",
    "EmbeddedSlotStore",
    "ObjectStoreSlotStore",
]
