"""The list-append checker (tests/support/history.py) finds each anomaly it names, on
histories built by hand, and passes a serializable one."""

from __future__ import annotations

from tests.support.history import Anomaly, Txn, check


def _kinds(anomalies: list[Anomaly]) -> list[tuple[str, tuple[str, ...]]]:
    return sorted((a.kind, a.txns) for a in anomalies)


def test_a_serial_history_has_no_anomaly() -> None:
    t1 = Txn("T1", {"x": ()}, {"x": 1})
    t2 = Txn("T2", {"x": (1,), "y": ()}, {"x": 2, "y": 3})
    t3 = Txn("T3", {"y": (3,)}, {"y": 4})
    assert check([t1, t2, t3], {"x": [1, 2], "y": [3, 4]}) == []


def test_write_skew_is_g2() -> None:
    # Each read the other's key empty, then appended to its own: rw edges both ways.
    t1 = Txn("T1", {"x": ()}, {"y": 1})
    t2 = Txn("T2", {"y": ()}, {"x": 2})
    assert _kinds(check([t1, t2], {"x": [2], "y": [1]})) == [("G2", ("T1", "T2"))]


def test_circular_information_flow_is_g1c() -> None:
    # T1 read T2's append to y, T2 read T1's append to x.
    t1 = Txn("T1", {"y": (2,)}, {"x": 1})
    t2 = Txn("T2", {"x": (1,)}, {"y": 2})
    assert _kinds(check([t1, t2], {"x": [1], "y": [2]})) == [("G1c", ("T1", "T2"))]


def test_dirty_write_orders_are_g0() -> None:
    # x ends T1 then T2, y ends T2 then T1: ww edges both ways.
    t1 = Txn("T1", {}, {"x": 1, "y": 4})
    t2 = Txn("T2", {}, {"x": 2, "y": 3})
    assert _kinds(check([t1, t2], {"x": [1, 2], "y": [3, 4]})) == [("G0", ("T1", "T2"))]


def test_reads_of_aborted_or_out_of_order_elements_and_lost_writes() -> None:
    t1 = Txn("T1", {"x": (9,)}, {"x": 1})  # 9 was appended by an aborted txn
    t2 = Txn("T2", {"x": (5,)}, {"y": 2})  # a read that is no prefix of x's list
    t3 = Txn("T3", {}, {"z": 7})  # committed, but missing from the end state
    found = _kinds(check([t1, t2, t3], {"x": [1], "y": [2, 2]}, aborted=[9]))
    assert found == [
        ("G1a", ("T1",)), ("duplicated", ("T2",)), ("incompatible-order", ("T2",)), ("lost", ("T3",)),
    ]  # fmt: skip
