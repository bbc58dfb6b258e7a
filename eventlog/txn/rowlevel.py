"""Row-level concurrency: resolving two commits that changed different rows of one file.

Used by the conflict checker for tables with deletion vectors enabled: unpartitioned ones
(the Databricks contract) and partitioned ones (beyond it: a file lies in one partition, so
the same per-file rules apply). Like the checker, every function here is pure: DV
bitmaps of the winning commit are loaded by the caller and passed in.

A transaction records, for each existing file it changes, a :class:`DvUpdate`: the DV
state it read (``base``) and the rows deleted once it lands (``deleted``; every row when
it removes the file). Against one winning commit that also changed file ``P``:

* the winner updated ``P``'s DV (``dv_win``): if ``(dv_win & deleted) - base`` is empty the
  two touched different rows, so this transaction re-points its remove at the winner's
  ``(P, dv_win)`` and adds ``(P, dv_win | deleted)`` (an inline DV); otherwise the same row
  was changed twice and ``P`` is left to the file-level checks, which fail the commit
  (the algorithm of the OSS proposal delta-io/delta#7357);
* the winner compacted ``P`` into ``Q`` (an OPTIMIZE without Z-order, which records in
  ``Q``'s ``tags`` where ``P``'s live rows went): the newly deleted rows of ``P`` are mapped
  to their positions in ``Q`` and deleted there instead.

And when this transaction is a compaction (OPTIMIZE without Z-order) of ``P`` into ``Q``:

* the winner deleted rows of ``P`` (DV update or full removal): those rows are mapped into
  ``Q`` and deleted there (the compaction keeps the winner's deletes);
* the winner compacted ``P`` too: this compaction is dropped (it commits no file change).

Anything else is left to the file-level rules, i.e. it conflicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import orjson
from pyroaring import AbstractBitMap64, BitMap64, FrozenBitMap64

from eventlog.files.deletion_vectors import inline_descriptor
from eventlog.log.actions import AddFile, RemoveFile

COMPACTED_FROM_TAG = "eventlog.compactedFrom"


@dataclass(frozen=True, slots=True)
class DvUpdate:
    """This transaction's row-level change to one existing file."""

    path: str
    num_rows: int  # physical rows in the file
    base_dv_id: str | None  # DV unique id of the state read (None: no DV)
    base: FrozenBitMap64  # rows already deleted in that state
    deleted: FrozenBitMap64  # rows deleted once this commit lands

    @property
    def removes_file(self) -> bool:
        return len(self.deleted) >= self.num_rows


@dataclass(frozen=True, slots=True)
class CompactionSource:
    """A file this transaction compacts: its live rows are ``target`` rows from ``offset``."""

    path: str
    base_dv_id: str | None
    base: FrozenBitMap64
    num_rows: int  # physical rows of the source
    target: str
    offset: int


@dataclass(frozen=True, slots=True)
class RowLevelState:
    """The parts of a transaction that row-level resolution may rewrite."""

    adds: tuple[AddFile, ...]
    removes: tuple[RemoveFile, ...]
    dv_updates: Mapping[str, DvUpdate]
    compaction: tuple[CompactionSource, ...]


def compaction_tag(sources: Sequence[CompactionSource]) -> dict[str, str]:
    """The ``tags`` entry an OPTIMIZE output file carries: where each source's rows went."""
    return {COMPACTED_FROM_TAG: orjson.dumps([[s.path, s.base_dv_id, s.offset] for s in sources]).decode()}


def _compacted_sources(add: AddFile) -> list[tuple[str, str | None, int]]:
    raw = (add.tags or {}).get(COMPACTED_FROM_TAG)
    if not raw:
        return []
    return [(str(p), d, int(o)) for p, d, o in orjson.loads(raw)]


def live_rank_positions(rows: Iterable[int], base: AbstractBitMap64, offset: int) -> BitMap64:
    """Positions in a compacted file of the given (live) source rows.

    A source's live rows are copied in physical order, so row ``p`` lands at
    ``offset + p - (number of rows deleted before p)``.
    """
    return BitMap64(offset + p - base.rank(p) for p in rows)


def resolve(
    state: RowLevelState,
    winner_adds: Sequence[AddFile],
    winner_removes: Sequence[RemoveFile],
    winner_bitmaps: Mapping[str, AbstractBitMap64],
    now: int,
) -> tuple[RowLevelState, frozenset[str]]:
    """Resolve this transaction against one winner; return it rebased and the resolved paths.

    Resolved paths are excluded from the file-level checks; unresolvable ones are left in
    place so those checks raise the usual conflict.
    """
    removed = {r.path: r for r in winner_removes}
    mine = set(state.dv_updates) | {c.path for c in state.compaction}
    if removed.keys().isdisjoint(mine):
        return state, frozenset()  # the winner changed none of the files this one changes
    work = _Work(state, now)
    # Only the winner's adds of files this transaction changes are looked up by path (a
    # compaction winner's outputs are found by their tags, in _find_compaction).
    added = {a.path: a for a in winner_adds if a.path in mine}
    touches_compaction = any(c.path in removed for c in state.compaction)
    if touches_compaction and not _resolve_compaction(work, added, removed, winner_bitmaps):
        return state, frozenset()
    for path, upd in list(work.updates.items()):
        if path not in removed:
            continue
        win_add = added.get(path)
        if win_add is not None and win_add.deletion_vector is not None:
            _merge_dv_update(work, upd, win_add, winner_bitmaps[path])
        elif win_add is None:
            _move_to_compacted(work, upd, winner_adds, winner_bitmaps)
    return work.freeze(), frozenset(work.excluded)


class _Work:
    """Mutable scratch state for one resolution (never escapes :func:`resolve`)."""

    def __init__(self, state: RowLevelState, now: int) -> None:
        self.adds: dict[str, AddFile] = {a.path: a for a in state.adds}
        self.removes: dict[str, RemoveFile] = {r.path: r for r in state.removes}
        self.updates: dict[str, DvUpdate] = dict(state.dv_updates)
        self.compaction = list(state.compaction)
        self.now = now
        self.excluded: set[str] = set()

    def freeze(self) -> RowLevelState:
        return RowLevelState(
            tuple(self.adds.values()), tuple(self.removes.values()), self.updates, tuple(self.compaction)
        )

    def delete_rows_in(self, target: AddFile, rows: AbstractBitMap64, num_rows: int, *, own: bool) -> None:
        """Delete ``rows`` of ``target`` in this commit (merging with earlier such deletes)."""
        path = target.path
        if own:  # our own new file (a compaction output): just attach or extend its DV
            current = self.adds[path]
            prior = self.updates.get(path)
            deleted = FrozenBitMap64((prior.deleted if prior else FrozenBitMap64()) | rows)
            self.adds[path] = current.with_deletion_vector(
                inline_descriptor(deleted), data_change=current.data_change
            )
            self.updates[path] = DvUpdate(path, num_rows, None, FrozenBitMap64(), deleted)
            return
        prior = self.updates.get(path)
        base = prior.base if prior else FrozenBitMap64()
        deleted = FrozenBitMap64((prior.deleted if prior else base) | rows)
        upd = DvUpdate(path, num_rows, target.key[1], base, deleted)
        self.updates[path] = upd
        self.removes[path] = target.remove(self.now)
        if upd.removes_file:
            self.adds.pop(path, None)
        else:
            self.adds[path] = target.with_deletion_vector(
                inline_descriptor(deleted), modification_time=self.now
            )


def _merge_dv_update(work: _Work, upd: DvUpdate, win_add: AddFile, win_bits: AbstractBitMap64) -> None:
    if (win_bits & upd.deleted) - upd.base:
        return  # the same row changed by both: leave to the file-level checks
    merged = FrozenBitMap64(win_bits | upd.deleted)
    rebased = DvUpdate(upd.path, upd.num_rows, win_add.key[1], FrozenBitMap64(win_bits), merged)
    work.updates[upd.path] = rebased
    work.removes[upd.path] = win_add.remove(work.now)
    if rebased.removes_file:
        work.adds.pop(upd.path, None)
    else:
        work.adds[upd.path] = win_add.with_deletion_vector(
            inline_descriptor(merged), modification_time=work.now
        )
    work.excluded.add(upd.path)


def _find_compaction(
    winner_adds: Sequence[AddFile], path: str, base_dv_id: str | None
) -> tuple[AddFile, int] | None:
    for add in winner_adds:
        for src, dv_id, offset in _compacted_sources(add):
            if src == path and dv_id == base_dv_id:
                return add, offset
    return None


def _move_to_compacted(
    work: _Work, upd: DvUpdate, winner_adds: Sequence[AddFile], winner_bitmaps: Mapping[str, AbstractBitMap64]
) -> None:
    """The winner compacted a file we changed: delete our rows in its output instead."""
    found = _find_compaction(winner_adds, upd.path, upd.base_dv_id)
    if found is None:
        return  # removed for another reason: the file-level checks decide
    target, offset = found
    target_rows = target.num_records
    if target_rows is None:
        return
    newly = upd.deleted - upd.base
    mapped = live_rank_positions(newly, upd.base, offset)
    del work.updates[upd.path]
    work.removes.pop(upd.path, None)
    work.adds.pop(upd.path, None)
    target_base = winner_bitmaps.get(target.path, FrozenBitMap64())
    if target.path not in work.updates:
        work.updates[target.path] = DvUpdate(
            target.path, target_rows, target.key[1], FrozenBitMap64(target_base), FrozenBitMap64(target_base)
        )
    work.delete_rows_in(target, mapped, target_rows, own=False)
    work.excluded.update({upd.path, target.path})


def _resolve_compaction(
    work: _Work,
    added: Mapping[str, AddFile],
    removed: Mapping[str, RemoveFile],
    winner_bitmaps: Mapping[str, AbstractBitMap64],
) -> bool:
    """This transaction compacts files the winner changed. False: cannot resolve."""
    touched = [c for c in work.compaction if c.path in removed]
    if any(not removed[c.path].data_change and c.path not in added for c in touched):
        # Another compaction rewrote our inputs: same rows either way, so drop ours.
        for c in work.compaction:
            work.removes.pop(c.path, None)
            work.adds.pop(c.target, None)
            work.excluded.update({c.path, c.target})
        work.compaction = []
        return True
    for c in touched:
        win_add = added.get(c.path)
        if win_add is not None and win_add.deletion_vector is not None:
            win_bits = winner_bitmaps[c.path]
            newly = win_bits - c.base
            work.removes[c.path] = win_add.remove(work.now, data_change=False)
            new_base = FrozenBitMap64(win_bits)
            new_id = win_add.key[1]
        elif win_add is None:
            newly = BitMap64(range(c.num_rows)) - c.base
            work.removes.pop(c.path, None)  # already gone
            new_base = FrozenBitMap64(range(c.num_rows))
            new_id = None
        else:
            return False  # rewritten in place without a DV: not ours to reconcile
        target = work.adds[c.target]
        rows = target.num_records or 0
        work.delete_rows_in(target, live_rank_positions(newly, c.base, c.offset), rows, own=True)
        work.compaction = [
            dataclasses.replace(x, base=new_base, base_dv_id=new_id) if x.path == c.path else x
            for x in work.compaction
        ]
        work.excluded.add(c.path)
    return True
