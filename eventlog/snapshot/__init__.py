"""Projections: the table state at a version, folded from the log's events
(:mod:`~eventlog.snapshot.projection`), and what that state means for readers and writers
(the isolation level a table asks for, the protocol features it needs). Around it: loading
a snapshot from commits and checkpoints and writing checkpoints (``loader``), versions by
timestamp and the commit history (``timeline``), reading a snapshot's rows (``read``) and
the metadata of a new table (``new_table``).
"""

from eventlog.log.commit import Commit
from eventlog.snapshot.projection import Snapshot

__all__ = ["Commit", "Snapshot"]
