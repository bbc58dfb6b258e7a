"""Operations as functions: (a builder over a snapshot, arguments) -> Plan.

An operation decides and returns; it never commits. These tests run operations on a
:class:`PlanBuilder` over a table's snapshot, outside any transaction, and check what the
plan says it read and staged, and that the table itself did not move.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from eventlog import Table
from eventlog import expr as ex
from eventlog.errors import AppendOnlyViolationError, InvalidTablePropertyError, TransactionStateError
from eventlog.ops import alter, dml, optimize, restore, write
from eventlog.txn.plan import Plan, PlanBuilder
from tests.conftest import SCHEMA, rows


def _table(tmp_path: Path, **props: str) -> Table:
    t = Table.create(str(tmp_path / "t"), SCHEMA, partition_by=["date"], properties=props)
    t.append(rows([1, 2, 3], "2024-01-01"))
    t.append(rows([4, 5], "2024-01-02"))
    return t


def _builder(t: Table) -> PlanBuilder:
    return PlanBuilder(t, t.refresh())


def test_append_reads_nothing_and_stages_new_files(tmp_path: Path) -> None:
    t = _table(tmp_path)
    plan = write.append(_builder(t), rows([9], "2024-01-03"))
    assert isinstance(plan, Plan) and plan.operation == "WRITE"
    assert (plan.partition_predicates, plan.read_files, plan.whole_table) == ((), {}, False)
    assert len(plan.adds) == 1 and plan.adds[0].partition_values == {"date": "2024-01-03"}
    assert plan.created == (plan.adds[0].path,)
    assert plan.metrics["numOutputRows"] == "1"
    assert t.version == 2 and Table.open(t.uri).version == 2  # nothing committed


def test_delete_reads_its_predicate_and_removes_the_matching_partition(tmp_path: Path) -> None:
    t = _table(tmp_path)
    day2 = [f for f in t.snapshot().add_files if f.partition_values["date"] == "2024-01-02"]
    plan = dml.delete(_builder(t), "date = '2024-01-02'")
    assert plan.operation == "DELETE" and plan.parameters["predicate"] == "[\"date = '2024-01-02'\"]"
    assert [ex.to_sql(p) for p in plan.partition_predicates] == ["date = '2024-01-02'"]
    assert set(plan.read_files) == {f.path for f in day2}
    assert {r.path for r in plan.removes} == {f.path for f in day2}
    assert plan.adds == () and plan.created == ()
    assert plan.metrics["numDeletedRows"] == "2"


def test_dv_delete_plans_a_deletion_vector_it_wrote(tmp_path: Path) -> None:
    t = _table(tmp_path, **{"delta.enableDeletionVectors": "true"})
    plan = dml.delete(_builder(t), "id = 2")
    (add,) = plan.adds
    assert add.deletion_vector is not None and add.deletion_vector.cardinality == 1
    assert len(plan.created) == 1 and plan.created[0].startswith("deletion_vector_")
    assert (tmp_path / "t" / plan.created[0]).exists()
    assert set(plan.dv_updates) == {add.path}


def test_update_restore_optimize_and_alter_are_plans_too(tmp_path: Path) -> None:
    t = _table(tmp_path)
    upd = dml.update(_builder(t), "id = 4", {"x": "x + 100"})
    assert upd.operation == "UPDATE" and len(upd.removes) == 1 and len(upd.adds) == 1
    res = restore.restore(_builder(t), 1)
    assert res.operation == "RESTORE" and res.whole_table and res.fail_on_any_winner
    assert {r.path for r in res.removes} == {f.path for f in t.snapshot().add_files} - set(t.files(1))
    t.append(rows([6], "2024-01-02"))
    opt = optimize.optimize(_builder(t), partition_filter="date = '2024-01-02'")
    assert opt.operation == "OPTIMIZE" and not opt.changes_data
    assert len(opt.removes) == 2 and all(not a.data_change for a in opt.adds)
    props = alter.set_properties(_builder(t), {"owner": "audit"})
    assert props.metadata is not None and props.metadata.configuration["owner"] == "audit"
    assert props.adds == props.removes == ()


def test_an_operation_refuses_before_writing_anything(tmp_path: Path) -> None:
    t = _table(tmp_path, **{"delta.appendOnly": "true"})
    builder = _builder(t)
    with pytest.raises(AppendOnlyViolationError):
        dml.delete(builder, "id = 1")
    assert builder.build().created == ()


def test_a_transaction_records_the_plan_it_is_given(tmp_path: Path) -> None:
    t = _table(tmp_path)
    txn = t.transaction()
    plan = dml.delete(PlanBuilder(t, txn.snapshot), "id = 5")
    txn.record(plan)
    with pytest.raises(TransactionStateError):
        txn.record(plan)  # one operation per transaction
    fresh = t.transaction()
    fresh.record(plan)
    result = fresh.commit()
    assert result.version == 3 and sorted(t.to_arrow().column("id").to_pylist()) == [1, 2, 3, 4]


def test_auto_compaction_property_is_validated_and_stored(tmp_path: Path) -> None:
    t = _table(tmp_path)
    plan = alter.set_properties(_builder(t), {"delta.autoOptimize.autoCompact": "auto"})
    assert (
        plan.metadata is not None and plan.metadata.configuration["delta.autoOptimize.autoCompact"] == "auto"
    )
    with pytest.raises(InvalidTablePropertyError) as info:
        alter.set_properties(_builder(t), {"delta.autoOptimize.autoCompact": "sometimes"})
    assert info.value.allowed == ["true", "false", "auto", "legacy"]
