"""The retry loop (stable txn id, backoff between attempts) and picklable typed errors."""

from __future__ import annotations

import pickle
import random

import pytest

from eventlog import RetryPolicy, Table
from eventlog import errors as e
from lockstore import InMemorySlotStore, SlotClaim
from tests.conftest import SCHEMA, rows


class FlakySlots(InMemorySlotStore):
    """Refuses the first ``refusals`` claims as if another writer had taken the slot."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals
        self.claims: list[tuple[int, str]] = []

    def claim(self, table: str, version: int, claim: SlotClaim) -> bool:
        self.claims.append((version, claim.txn_id))
        if self.refusals > 0 and version > 0:
            self.refusals -= 1
            return False
        return super().claim(table, version, claim)


def test_retries_keep_the_txn_id_and_sleep_with_growing_backoff(local_uri: str) -> None:
    slots = FlakySlots(refusals=4)
    sleeps: list[float] = []
    policy = RetryPolicy(
        base_delay=0.01, multiplier=2.0, jitter=0.0, sleep=sleeps.append, rng=random.Random(0)
    )
    t = Table.create(local_uri, SCHEMA, slots=slots, retry_policy=policy)
    result = t.append(rows([1]))
    assert result.attempts == 5 and result.version == 1
    txn_ids = {txn for version, txn in slots.claims if version == 1}
    assert txn_ids == {result.txn_id}  # one transaction id across every attempt
    assert sleeps == [0.01, 0.02, 0.04, 0.08]  # never retried without sleeping
    assert t.history(1)[0]["txnId"] == result.txn_id


def test_retry_policy_validates_and_caps_delays() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2.0)
    p = RetryPolicy(base_delay=0.1, max_delay=0.3, jitter=0.5, rng=random.Random(3))
    delays = [p.delay(n) for n in range(1, 12)]
    assert all(0.0001 <= d <= 0.45 for d in delays)
    assert max(delays) > 0.2
    clock = iter([0.0, 5.0]).__next__
    budget = RetryPolicy(max_duration=1.0, clock=clock)
    assert budget.exhausted(1, started=0.0) is False
    assert budget.exhausted(1, started=0.0) is True


ERRORS = [
    e.TableNotFoundError("/t"),
    e.TableAlreadyExistsError("/t", 3),
    e.CorruptLogError("bad", uri="/t", version=2, line=4),
    e.VersionNotFoundError("no", requested=9, earliest=0, latest=3),
    e.UnsupportedProtocolError("no", features=["x"]),
    e.SchemaMismatchError("cols", columns=["a", "b"]),
    e.UnknownColumnError("z", ["a"], "delete"),
    e.PredicateError("bad sql", expression="a = = 1"),
    e.InvalidTablePropertyError("delta.isolationLevel", "X", ["Serializable"]),
    e.MergeCardinalityError("dup", rows=2),
    e.CommitFailedError(
        "gave up", attempts=3, start_version=1, last_attempted_version=4, elapsed_ms=1.5, txn_id="t1"
    ),
    e.CommitStateUnknownError("unknown", txn_id="t1", version=5),
    e.ConcurrentAppendException(
        winning_version=3, operation="WRITE", partition="[d=1]", isolation_level="Serializable", table="/t"
    ),
    e.ConcurrentDeleteReadException(winning_version=3, operation="DELETE", table="/t"),
    e.ConcurrentDeleteDeleteException(winning_version=3, operation="OPTIMIZE", table="/t"),
    e.MetadataChangedException(winning_version=3, operation="SET TBLPROPERTIES", table="/t"),
    e.ProtocolChangedException(winning_version=0, operation="CREATE TABLE", table="/t"),
    e.ConcurrentTransactionException(winning_version=3, operation="STREAMING UPDATE", table="/t"),
    e.ConcurrentWriteException(winning_version=3, operation="WRITE", table="/t"),
]


@pytest.mark.parametrize("err", ERRORS, ids=lambda x: type(x).__name__)
def test_errors_pickle_with_their_fields(err: e.EventlogError) -> None:
    try:
        raise err from ValueError("root cause")
    except e.EventlogError as raised:
        clone = pickle.loads(pickle.dumps(raised))
    assert type(clone) is type(err)
    assert str(clone) == str(err)
    assert clone._fields == err._fields
    assert isinstance(clone.__cause__, ValueError)
    assert isinstance(clone, e.EventlogError)
