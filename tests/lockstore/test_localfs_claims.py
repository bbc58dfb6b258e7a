"""The local-file store's claim files: anchors round-trip, and the slot directory stays
walkable by ordinary tools whatever the claim holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockstore import LocalFileSlotStore, SlotClaim

DIGEST = "ab" * 32


@pytest.mark.parametrize(
    "claim",
    [
        SlotClaim("t1", "t1.json", {"host": "h", "pid": "1"}, digest=DIGEST),
        SlotClaim("t2", "t2.json", {"host": "h" * 200, "pid": "1"}, digest=DIGEST),  # too long for a link
        SlotClaim("g", "group-g.json", {"host": "h", "pid": "1"}, tuple(f"m{i}" for i in range(20)), DIGEST),
    ],
    ids=["symlink", "long-owner", "group"],
)
def test_claims_round_trip_and_the_directory_stays_walkable(tmp_path: Path, claim: SlotClaim) -> None:
    store = LocalFileSlotStore(str(tmp_path / "slots"))
    assert store.claim("table", 0, claim)
    record = store.get("table", 0)
    assert record is not None and record.claim == claim
    # Every entry can be stat'ed through its links (no ENAMETOOLONG from a long target).
    files = [p for p in (tmp_path / "slots").rglob("*") if p.is_file() or p.is_dir()]
    assert files
