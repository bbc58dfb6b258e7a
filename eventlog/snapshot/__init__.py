"""Projections: the table state at a version, folded from the log's events
(:mod:`~eventlog.snapshot.projection`), and what that state means for readers and writers
(the isolation level a table asks for, the protocol features it needs).
"""

from eventlog.log.commit import Commit
from eventlog.snapshot.projection import Snapshot

__all__ = ["Commit", "Snapshot"]
