"""Opening a shared slot store does not hold the registry while it connects: a release on
another thread (a garbage-collected table's, run by whatever thread collected it, even the
connecting client's own) goes through meanwhile. Holding it deadlocked: the client thread
waited for the registry, and the opener, timing out, joined that thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lockstore import registry
from lockstore.localfs import LocalFileSlotStore


def test_the_registry_is_free_while_a_store_connects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = registry.open_slot_store(str(tmp_path / "other"))
    opened = registry._open
    released = threading.Event()

    def slow_open(spec: str, *args: object) -> object:
        # While this store "connects", another thread gives a different store back.
        worker = threading.Thread(target=lambda: (registry.release_slot_store(other), released.set()))
        worker.start()
        worker.join(timeout=10)
        return opened(spec, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(registry, "_open", slow_open)
    store = registry.open_slot_store(str(tmp_path / "slots"))
    assert released.is_set()
    assert isinstance(store, LocalFileSlotStore)
    assert registry.open_slot_store(str(tmp_path / "slots")) is store  # shared: one store, two uses
    registry.release_slot_store(store)
    registry.release_slot_store(store)
    assert registry.shared_slot_stores().count(store) == 0  # the last use gave it back
