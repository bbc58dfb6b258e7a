"""The conflict checker: a pure function of (this transaction, one winning commit).

``check_conflicts(txn, winner)`` runs once per commit that won since ``txn``'s read
version, in ascending version order, and either returns the transaction *rebased* on the
winner (adopted protocol and metadata) or raises one of Delta's conflict exceptions. No
I/O happens here: the caller reads the winning commit and passes its actions in.

The checks run in Delta Spark's order (``ConflictChecker.checkConflicts``). The order
decides which exception a user sees, so it is part of the contract:

0. RESTORE only   -> ConcurrentWriteException   (any winner at all)
1. protocol        -> ProtocolChangedException   (two creators of one table land here)
2. metadata        -> MetadataChangedException   (schema, properties, partitioning; a winner
                      that only moved identity high-water marks conflicts only when its values
                      may overlap this transaction's: :mod:`eventlog.txn.identity`)
3. domain metadata -> ConcurrentTransactionException ("A conflicting metadata domain ...")
4. app txn ids     -> ConcurrentTransactionException (a txn appId this transaction read)
5. added files that should have been read  -> ConcurrentAppendException
6. removed files that this transaction read -> ConcurrentDeleteReadException
7. removed files this transaction also removes -> ConcurrentDeleteDeleteException

Among the file checks, append beats delete-read, which beats delete-delete: two
``replaceWhere`` writes on one partition fail the second with ConcurrentAppend.

Tables with deletion vectors enabled use row-level concurrency instead of steps 5-7: the
Databricks contract for unpartitioned tables, and beyond it for partitioned ones, with the
same rules and fallbacks (on a partitioned table a winner's new file must also lie in a
partition this transaction's predicates select, as in step 5):

5'. resolve changes to different rows of shared files (:mod:`eventlog.txn.rowlevel`): merge
    the two deletion vectors, or carry deletes across a concurrent compaction;
6'. new rows the winner wrote that this transaction's predicates may match (partition
    values, then file statistics) -> ConcurrentAppendException; DV re-adds and compaction
    outputs carry no new rows and are skipped;
7'. files this transaction removes that the winner removed and resolution could not
    reconcile (the same row changed twice, or a Z-order rewrite) -> ConcurrentDeleteRead
    (a file it read) or ConcurrentDeleteDelete.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import AbstractBitMap64

from eventlog.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from eventlog.expr import Expr, Literal, evaluate_mask
from eventlog.files import row_tracking
from eventlog.files.column_mapping import physical_name, strip
from eventlog.files.pruning import partition_strings, prune_table, typed_partition_values
from eventlog.log import in_commit_timestamps as ict
from eventlog.log.actions import (
    AddFile,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
)
from eventlog.log.commit import Commit
from eventlog.log.filetable import AddFiles, RemoveFiles, add_files, adds_table
from eventlog.snapshot.isolation import IsolationLevel
from eventlog.snapshot.protocol import check_supported, removed_features
from eventlog.txn import rowlevel
from eventlog.txn.identity import IdentityRange, foreign_overlap, only_marks_changed
from eventlog.txn.rowlevel import CompactionSource, DvUpdate, RowLevelState

# Configuration changes a concurrent commit may make without failing writers in flight:
# enabling features whose writers stay compatible (Delta's allow-list, reduced to the
# features this library implements). Every other property change is a metadata conflict.
_ALLOWED_CONCURRENT_PROPERTY_CHANGES: Mapping[str, str] = {
    "delta.enableDeletionVectors": "true",
    ict.ENABLE_KEY: "true",
}
# Properties a winner may add with any value: where in-commit timestamps begin (the loser is
# dated after the winner when it is staged again: eventlog.txn.attempt).
_ALLOWED_NEW_PROPERTIES = frozenset({ict.ENABLEMENT_VERSION_KEY, ict.ENABLEMENT_TIMESTAMP_KEY})


@dataclass(frozen=True, slots=True)
class ReadSet:
    """What a transaction read, recorded as it ran.

    ``partition_predicates`` holds one entry per scan: the partition-only part of its
    filter, or TRUE when it had none (a data-only filter reads every partition).
    ``files`` maps each file path the scans returned to its partition values.
    """

    partition_predicates: tuple[Expr, ...] = ()
    files: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)
    whole_table: bool = False
    app_ids: frozenset[str] = frozenset()
    # The full predicate of each scan (TRUE when it had none): row-level concurrency
    # checks a winner's new files against it with their statistics.
    predicates: tuple[Expr, ...] = ()

    @property
    def depends_on_files(self) -> bool:
        return bool(self.partition_predicates) or bool(self.files) or self.whole_table


@dataclass(frozen=True, slots=True)
class TransactionSummary:
    """The current transaction as the checker sees it."""

    table: str
    read_version: int
    read_protocol: Protocol | None
    read_metadata: Metadata | None
    partition_schema: pa.Schema
    read_set: ReadSet
    isolation_level: IsolationLevel  # effective level (after the snapshot downgrade)
    is_blind_append: bool
    metadata: Metadata | None = None  # metadata this transaction writes, if any
    protocol: Protocol | None = None
    removes: tuple[RemoveFile, ...] = ()
    domains: tuple[DomainMetadata, ...] = ()
    adds: tuple[AddFile, ...] = ()
    # Row-level concurrency (DVs enabled, partitioned or not): this transaction's
    # changes to existing files, and the files it compacts (OPTIMIZE without Z-order).
    row_level: bool = False
    data_schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    dv_updates: Mapping[str, DvUpdate] = field(default_factory=dict)
    compaction: tuple[CompactionSource, ...] = ()
    # RESTORE-like commits that rewrite the table from a version ("commitLarge" in
    # Delta Spark) tolerate no concurrent commit at all.
    fail_on_any_winner: bool = False
    # Identity values this transaction generated (eventlog.txn.identity). Its staged
    # high-water-mark move is not in ``metadata``: the rules treat it as no metadata change.
    identity: tuple[IdentityRange, ...] = ()


@dataclass(frozen=True)
class WinningCommit:
    """What the checker needs of a commit that won."""

    version: int
    commit_info: CommitInfo | None
    metadata: Metadata | None
    protocol: Protocol | None
    adds: Sequence[AddFile]  # lazily made values over the commit's columns
    removes: Sequence[RemoveFile]
    app_ids: frozenset[str]
    domains: tuple[DomainMetadata, ...]
    # DV bitmaps of this commit's adds that row-level resolution needs, loaded by the caller.
    dv_bitmaps: Mapping[str, AbstractBitMap64] = field(default_factory=dict)
    # The commit these come from: its file actions as Arrow tables (``add_table``).
    source: Commit | None = field(default=None, repr=False, compare=False)

    @staticmethod
    def of(commit: Commit, dv_bitmaps: Mapping[str, AbstractBitMap64] | None = None) -> WinningCommit:
        # The file actions stay columns (a compaction or rewrite winner carries thousands):
        # values are made only for the few files a rule looks at.
        info: CommitInfo | None = None
        metadata: Metadata | None = None
        protocol: Protocol | None = None
        app_ids: set[str] = set()
        domains: list[DomainMetadata] = []
        for action in commit.others:
            if isinstance(action, CommitInfo):
                info = info or action
            elif isinstance(action, Metadata):
                metadata = metadata or action
            elif isinstance(action, Protocol):
                protocol = protocol or action
            elif isinstance(action, SetTransaction):
                app_ids.add(action.app_id)
            elif isinstance(action, DomainMetadata):
                domains.append(action)
        files = commit.file_actions
        return WinningCommit(
            version=commit.version,
            commit_info=info,
            metadata=metadata,
            protocol=protocol,
            adds=AddFiles(table=files.adds),
            removes=RemoveFiles(table=files.removes),
            app_ids=frozenset(app_ids),
            domains=tuple(domains),
            dv_bitmaps=dv_bitmaps or {},
            source=commit,
        )

    @functools.cached_property
    def add_table(self) -> pa.Table:
        """The adds as Arrow columns (:data:`~eventlog.log.filetable.ADD_SCHEMA`), in commit
        order: the commit's file actions (built once per commit, and shared with the snapshot
        fold that takes the commit in), or built from :attr:`adds`. What the file checks
        evaluate predicates on, so a 10,000-file winner costs no Python value per file."""
        if self.source is not None:
            return self.source.file_actions.adds
        return adds_table(self.adds)

    @functools.cached_property
    def removed_paths(self) -> frozenset[str]:
        if isinstance(self.removes, RemoveFiles):
            return frozenset(self.removes.table.column("path").to_pylist())
        return frozenset(r.path for r in self.removes)

    @property
    def is_blind_append(self) -> bool:
        # Taken from the winner's commitInfo only; missing means false (Delta Spark).
        return bool(self.commit_info is not None and self.commit_info.is_blind_append)

    @property
    def operation(self) -> str:
        return self.commit_info.operation if self.commit_info is not None else "TRANSACTION"


def check_conflicts(txn: TransactionSummary, winner: WinningCommit) -> TransactionSummary:
    """Check ``txn`` against one winning commit; return it rebased, or raise a conflict."""
    _check_large_commit(txn, winner)
    txn = _check_protocol(txn, winner)
    txn = _check_metadata(txn, winner)
    _check_domain_metadata(txn, winner)
    _check_app_ids(txn, winner)
    excluded: frozenset[str] = frozenset()
    if txn.row_level:
        txn, excluded = _resolve_row_level(txn, winner)
        _check_added_rows(txn, winner, excluded)
        _check_changed_files_row_level(txn, winner, excluded)
        return txn
    _check_added_files(txn, winner)
    _check_deleted_files_read(txn, winner)
    _check_delete_delete(txn, winner)
    return txn


def check_all(txn: TransactionSummary, winners: Sequence[WinningCommit]) -> TransactionSummary:
    """Run :func:`check_conflicts` over winners in ascending version order."""
    for winner in sorted(winners, key=lambda w: w.version):
        txn = check_conflicts(txn, winner)
    return txn


# --------------------------------------------------------------------------- helpers


def _conflict(
    cls: type[DeltaConcurrentModificationException],
    txn: TransactionSummary,
    winner: WinningCommit,
    *,
    partition: str | None = None,
    detail: str = "",
) -> DeltaConcurrentModificationException:
    info: dict[str, Any] = winner.commit_info.to_json() if winner.commit_info is not None else {}
    return cls(
        winning_version=winner.version,
        operation=winner.operation,
        winning_commit_info=info,
        partition=partition,
        isolation_level=txn.isolation_level.value,
        table=txn.table,
        detail=detail,
    )


def partition_hint(
    partition_values: Mapping[str, str | None] | None, partition_schema: pa.Schema
) -> str | None:
    """Delta's ``[c1=v1, c2=v2]`` hint (schema order, ``null`` for missing), or None."""
    if not partition_values or len(partition_schema) == 0:
        return None
    parts = []
    for name in partition_schema.names:
        value = partition_values.get(name)
        parts.append(f"{name}={'null' if value is None else value}")
    return "[" + ", ".join(parts) + "]"


# --------------------------------------------------------------------------- the checks


def _check_large_commit(txn: TransactionSummary, winner: WinningCommit) -> None:
    """0. A RESTORE computed its adds and removes from the read version: any winner
    invalidates them (Delta Spark's ``commitLarge`` raises ConcurrentWriteException)."""
    if txn.fail_on_any_winner:
        raise _conflict(ConcurrentWriteException, txn, winner)


def _check_protocol(txn: TransactionSummary, winner: WinningCommit) -> TransactionSummary:
    """1. A winning protocol: the client must support it; two protocol changes conflict.

    Table creation always writes a protocol, so two concurrent creators of one table (or
    two writers to an empty path) fail here with ProtocolChangedException, whose message
    carries the empty-directory hint when the winner is version 0.
    """
    new = winner.protocol
    if new is None:
        return txn
    # The table as the winner leaves it (raises UnsupportedProtocolError, not a conflict).
    check_supported(new, winner.metadata or txn.metadata or txn.read_metadata)
    if txn.protocol is not None:
        raise _conflict(ProtocolChangedException, txn, winner)
    if txn.read_protocol is not None and removed_features(txn.read_protocol, new):
        raise _conflict(
            ProtocolChangedException,
            txn,
            winner,
            detail=f"Features removed: {sorted(removed_features(txn.read_protocol, new))}. ",
        )
    return dataclasses.replace(txn, read_protocol=new)


def _check_metadata(txn: TransactionSummary, winner: WinningCommit) -> TransactionSummary:
    """2. A winning metadata change fails every concurrent write.

    The only tolerated difference is enabling an allow-listed feature property (Delta's
    ``attemptToResolveMetadataConflicts``); the transaction then adopts the new metadata.
    """
    new = winner.metadata
    if new is None:
        return txn
    if txn.metadata is not None or txn.read_metadata is None:
        raise _conflict(MetadataChangedException, txn, winner)
    old = txn.read_metadata
    if only_marks_changed(old, new):
        # Beyond Delta: a winner that only moved identity high-water marks (an insert)
        # conflicts only when it may have generated values in a range this transaction
        # reserved: a foreign writer's mark that reached our range. Our own writers'
        # ranges are disjoint (one counter). The staged marks are rebased by the caller.
        overlap = foreign_overlap(old, new, winner.commit_info, txn.identity)
        if overlap is not None:
            raise _conflict(
                MetadataChangedException,
                txn,
                winner,
                detail=f"identity column {overlap.column}: a concurrent writer's high-water mark "
                f"reached this transaction's values (from {overlap.first}). ",
            )
        return dataclasses.replace(txn, read_metadata=new)
    same_identity = (
        old.id == new.id
        and old.schema_string == new.schema_string
        and old.partition_columns == new.partition_columns
        and old.name == new.name
        and old.description == new.description
        and old.format == new.format
    )
    if not same_identity:
        raise _conflict(MetadataChangedException, txn, winner)
    if any(k not in new.configuration for k in old.configuration):
        raise _conflict(MetadataChangedException, txn, winner)
    for key, value in new.configuration.items():
        if old.configuration.get(key) == value:
            continue
        if key in _ALLOWED_NEW_PROPERTIES and key not in old.configuration:
            continue
        if _ALLOWED_CONCURRENT_PROPERTY_CHANGES.get(key) != value:
            raise _conflict(MetadataChangedException, txn, winner)
    return dataclasses.replace(txn, read_metadata=new)


def _check_domain_metadata(txn: TransactionSummary, winner: WinningCommit) -> None:
    """3. Both commits write the same metadata domain."""
    # The row-id high-water mark is excepted (Delta): fresh ids are re-assigned above the
    # winner's mark when the commit is rebased (eventlog.txn.attempt).
    mine = {d.domain for d in txn.domains} - {row_tracking.DOMAIN}
    for d in winner.domains:
        if d.domain in mine:
            raise _conflict(
                ConcurrentTransactionException,
                txn,
                winner,
                detail=f"A conflicting metadata domain {d.domain} is added.",
            )


def _check_app_ids(txn: TransactionSummary, winner: WinningCommit) -> None:
    """4. The winner wrote a txn action for an app id this transaction read.

    Versions are not compared (Delta Spark): two instances of one streaming query (same
    checkpoint, same app id) always fail the loser, even when they wrote the same batch.
    """
    if txn.read_set.app_ids & winner.app_ids:
        raise _conflict(ConcurrentTransactionException, txn, winner)


def _check_added_files(txn: TransactionSummary, winner: WinningCommit) -> None:
    """5. Files the winner added that this transaction's reads would have returned.

    Candidates depend on the isolation level: Serializable counts every add;
    WriteSerializable ignores a blind-append winner's adds unless this transaction
    changes metadata; snapshot isolation (no data change) counts none. A blind append
    never conflicts here. On an unpartitioned table, or after ``read_whole_table``, any
    candidate conflicts; otherwise a candidate conflicts when its partition values satisfy
    one of the recorded partition predicates.
    """
    level = txn.isolation_level
    if level is IsolationLevel.SNAPSHOT_ISOLATION or txn.is_blind_append:
        return
    if level is IsolationLevel.SERIALIZABLE or txn.metadata is not None:
        checked = True
    else:
        checked = not winner.is_blind_append
    if not checked or not winner.adds:
        return
    unpartitioned = txn.read_metadata is None or not txn.read_metadata.partition_columns
    if txn.read_set.whole_table or unpartitioned:
        match: AddFile | None = winner.adds[0]
    else:
        match = _first_matching(txn.read_set.partition_predicates, winner.add_table, txn.partition_schema)
    if match is not None:
        raise _conflict(
            ConcurrentAppendException,
            txn,
            winner,
            partition=partition_hint(match.partition_values, txn.partition_schema),
        )


def _first_matching(
    predicates: Sequence[Expr], candidates: pa.Table, partition_schema: pa.Schema
) -> AddFile | None:
    """The first add (a row of ``candidates``, ``ADD_SCHEMA``) whose partition values
    satisfy the first predicate any of them satisfies, as a value; None when none does."""
    if not predicates:
        return None
    if any(isinstance(p, Literal) and p.value is True for p in predicates):
        return add_files(candidates.slice(0, 1))[0]
    # Evaluate each distinct partition once (a 10,000-file winner usually spans few), in
    # order of first appearance, so the first hit is also the first matching file.
    names = [physical_name(f) for f in partition_schema]  # keys are physical (column mapping)
    raw = partition_strings(candidates.column("partitionValues"), names)
    if len(raw) == 1:
        distinct = [pc.unique(raw[0])]
        first_rows = None  # looked up for the hit only
    else:
        keys = {f"k{i}": col for i, col in enumerate(raw)}
        table = pa.table({**keys, "row": pa.array(np.arange(candidates.num_rows, dtype=np.int64))})
        groups = table.group_by(list(keys), use_threads=False).aggregate([("row", "min")])
        groups = groups.sort_by("row_min")
        distinct = [groups.column(k).combine_chunks() for k in keys]
        first_rows = groups.column("row_min").to_numpy()
    partitions = typed_partition_values(distinct, strip(partition_schema))
    for pred in dict.fromkeys(predicates):  # de-duplicated, order kept
        hit = pc.index(evaluate_mask(pred, partitions), True).as_py()
        if hit < 0:
            continue
        if first_rows is not None:
            row = int(first_rows[hit])
        else:
            value = distinct[0][hit]
            row = (
                pc.index(raw[0], value).as_py()
                if value.is_valid
                else pc.index(raw[0].is_null(), True).as_py()
            )
        return add_files(candidates.slice(row, 1))[0]
    return None


def _check_deleted_files_read(txn: TransactionSummary, winner: WinningCommit) -> None:
    """6. The winner removed a file this transaction read (its remove dataChange is ignored,
    so a compaction's removes conflict too)."""
    if not winner.removes:
        return
    read = txn.read_set.files
    hit = winner.removed_paths.intersection(read)
    if hit:
        # The first such remove in commit order, for a stable partition hint.
        path = next(r.path for r in winner.removes if r.path in hit)
        raise _conflict(
            ConcurrentDeleteReadException,
            txn,
            winner,
            partition=partition_hint(read[path], txn.partition_schema),
        )
    if txn.read_set.whole_table:
        raise _conflict(ConcurrentDeleteReadException, txn, winner)


def _resolve_row_level(
    txn: TransactionSummary, winner: WinningCommit
) -> tuple[TransactionSummary, frozenset[str]]:
    """5'. (row-level concurrency) Reconcile changes to different rows of shared files."""
    state = RowLevelState(txn.adds, txn.removes, txn.dv_updates, txn.compaction)
    now = winner.commit_info.timestamp if winner.commit_info is not None else 0
    new, excluded = rowlevel.resolve(state, winner.adds, winner.removes, winner.dv_bitmaps, now)
    if new == state:
        return txn, excluded
    rebased = dataclasses.replace(
        txn, adds=new.adds, removes=new.removes, dv_updates=new.dv_updates, compaction=new.compaction
    )
    return rebased, excluded


def _check_added_rows(txn: TransactionSummary, winner: WinningCommit, excluded: frozenset[str]) -> None:
    """6'. (row-level) New rows the winner wrote that this transaction's reads could match.

    A DV re-add of an existing path and a compaction output (``dataChange = false``)
    carry no new rows and are skipped; other candidates conflict when their statistics
    say they may hold a row satisfying one of this transaction's predicates.
    """
    level = txn.isolation_level
    if level is IsolationLevel.SNAPSHOT_ISOLATION or txn.is_blind_append:
        return
    if level is not IsolationLevel.SERIALIZABLE and txn.metadata is None and winner.is_blind_append:
        return
    if not winner.adds:
        return
    adds = winner.add_table
    paths = adds.column("path")
    keep = pc.fill_null(adds.column("dataChange"), True)
    if excluded:
        keep = pc.and_(keep, pc.invert(pc.is_in(paths, value_set=pa.array(list(excluded), pa.string()))))
    if winner.removes:
        removed = pa.array(list(winner.removed_paths), pa.string())
        re_added = pc.and_(pc.is_in(paths, value_set=removed), pc.is_valid(adds.column("deletionVector")))
        keep = pc.and_(keep, pc.invert(re_added))
    candidates = adds.filter(keep)
    if candidates.num_rows == 0:
        return
    preds = txn.read_set.predicates or txn.read_set.partition_predicates
    if txn.read_set.whole_table or any(isinstance(p, Literal) and p.value is True for p in preds):
        matched = candidates.slice(0, 1)
    else:
        matched = _first_may_match(dict.fromkeys(preds), candidates, txn)
    if matched is not None:
        values = matched.column("partitionValues")[0].as_py()
        hint = partition_hint(dict(values or ()), txn.partition_schema)
        raise _conflict(ConcurrentAppendException, txn, winner, partition=hint)


def _first_may_match(
    predicates: Iterable[Expr], candidates: pa.Table, txn: TransactionSummary
) -> pa.Table | None:
    """The first candidate (add rows) that may hold a row matching one of ``predicates``, as
    one add row: its partition values must satisfy the predicate's partition-only part
    (exactly, as the file-level append check evaluates it), then its statistics must allow
    a match (as data skipping); None when no candidate may match."""
    schema = pa.schema([*txn.data_schema, *txn.partition_schema])
    for pred in predicates:
        _, kept = prune_table(candidates, pred, schema, txn.partition_schema.names)
        if kept.num_rows:
            return kept.slice(0, 1)
    return None


def _check_changed_files_row_level(
    txn: TransactionSummary, winner: WinningCommit, excluded: frozenset[str]
) -> None:
    """7'. (row-level) The winner removed, in a way resolution could not reconcile, a file
    this transaction removes (rewrites, DV-updates or compacts). Files it only read may
    change underneath it: the rows its predicates matched there were not touched.
    Delta's order holds: a file this transaction read gives DeleteRead, else DeleteDelete."""
    mine = {r.path for r in txn.removes} | {c.path for c in txn.compaction}
    for remove in winner.removes:
        if remove.path in excluded or remove.path not in mine:
            continue
        if remove.path in txn.read_set.files:
            values = txn.read_set.files[remove.path]
            raise _conflict(
                ConcurrentDeleteReadException,
                txn,
                winner,
                partition=partition_hint(values, txn.partition_schema),
            )
        raise _conflict(ConcurrentDeleteDeleteException, txn, winner)


def _check_delete_delete(txn: TransactionSummary, winner: WinningCommit) -> None:
    """7. Both commits remove the same file path (DV ids and dataChange are not compared)."""
    if not winner.removes or not txn.removes:
        return
    mine = {r.path: r for r in txn.removes}
    if winner.removed_paths.isdisjoint(mine):
        return
    for remove in winner.removes:
        own = mine.get(remove.path)
        if own is not None:
            raise _conflict(
                ConcurrentDeleteDeleteException,
                txn,
                winner,
                partition=partition_hint(own.partition_values, txn.partition_schema),
            )
