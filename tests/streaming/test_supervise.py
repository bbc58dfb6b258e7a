"""streaming.supervise on stand-in queries: restarts on metadata changes only, bounded, logged."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from streaming import ChangeCommitError, SourceMetadataChangedError, supervise


def metadata_change(version: int = 4) -> SourceMetadataChangedError:
    return SourceMetadataChangedError(
        uri="/t", version=version, operation="ADD COLUMNS", changed=["schema"],
        old_schema='{"type":"struct","fields":[]}', new_schema='{"type":"struct","fields":[{"name":"z"}]}',
        old_properties={}, new_properties={}, old_protocol={}, new_protocol={}, read_version=version - 1,
    )  # fmt: skip


class WrappedError(Exception):
    """Like pyspark's StreamingQueryException: only the text of the worker's error survives."""


@dataclass
class FakeQuery:
    id: str
    error: BaseException | None = None
    stopped: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        if self.error is None and not self.done.wait(timeout):
            return False
        if self.error is not None:
            raise self.error
        return True if timeout is not None else None

    def exception(self) -> BaseException | None:
        return self.error

    def stop(self) -> None:
        self.stopped += 1
        self.done.set()


def starter(*errors: BaseException | None) -> tuple[list[FakeQuery], Callable[[], FakeQuery]]:
    started: list[FakeQuery] = []

    def start() -> FakeQuery:
        q = FakeQuery("q-1", errors[len(started)] if len(started) < len(errors) else None)
        if q.error is None:
            q.done.set()
        started.append(q)
        return q

    return started, start


def test_restarts_on_a_wrapped_metadata_change_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    started, start = starter(WrappedError(f"[STREAM_FAILED] ... Traceback:\n{metadata_change(7)}\n..."), None)
    with caplog.at_level(logging.WARNING, logger="streaming.supervise"):
        last: FakeQuery = supervise(start, max_restarts=2)
    assert len(started) == 2 and last is started[1]
    assert started[0].stopped == 1
    (record,) = [r for r in caplog.records if r.name == "streaming.supervise"]
    fields = record.__dict__
    assert (fields["event"], fields["query_id"], fields["restart"]) == ("stream_restart", "q-1", 1)
    assert fields["version"] == 7
    assert '"name":"z"' in fields["new_schema"] and fields["changed"] == ["schema"]


def test_restarts_are_bounded() -> None:
    started, start = starter(metadata_change(), metadata_change(5), metadata_change(6))
    with pytest.raises(SourceMetadataChangedError) as info:
        supervise(start, max_restarts=2)
    assert info.value.version == 6 and len(started) == 3


def test_other_errors_propagate_without_restart() -> None:
    change = ChangeCommitError(uri="/t", version=3, operation="DELETE", removed_files=1, added_files=0)
    for error in (RuntimeError("boom"), WrappedError(str(change))):
        started, start = starter(error)
        with pytest.raises(type(error)):
            supervise(start, max_restarts=5)
        assert len(started) == 1


def test_timeout_returns_the_running_query() -> None:
    query = FakeQuery("q-2")
    assert supervise(lambda: query, timeout=0.3) is query
    assert not query.done.is_set()


def test_negative_max_restarts_is_refused() -> None:
    with pytest.raises(ValueError):
        supervise(lambda: FakeQuery("q"), max_restarts=-1)
