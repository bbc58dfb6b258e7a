"""ALTER TABLE ADD CONSTRAINT / DROP CONSTRAINT: CHECK constraints, stored as the table
properties ``delta.constraints.<name>`` (lower-cased, as Delta stores them).

Adding one reads the whole table and checks every live row first: a violation raises
:class:`ConstraintViolationError` and commits nothing. Both stage a metadata action, which
fails every concurrent writer with ``MetadataChangedException``: a write planned under the
old constraints can never commit rows the new one forbids. Adding the first constraint
upgrades the protocol with the ``checkConstraints`` feature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pyarrow as pa

from eventlog import expr as ex
from eventlog.errors import InvalidInputError
from eventlog.files.constraints import Rule, check_existing, constraint_key
from eventlog.files.scan import read_live_rows
from eventlog.log.actions import AddFile
from eventlog.ops.alter import read_protocol
from eventlog.snapshot.protocol import upgrade
from eventlog.txn.plan import Plan, PlanBuilder
from eventlog.userinput import check_text


def add_constraint(plan: PlanBuilder, name: str, sql: str) -> Plan:
    """Stage ``CHECK (sql)`` as constraint ``name`` once every existing row satisfies it."""
    name = check_text(name, "constraint name", allow_empty=False, allow_nul=False)
    ex.check_sql_text(sql, "CHECK constraint")
    key = constraint_key(name)
    existing = plan.metadata.configuration.get(key)
    if existing is not None:
        raise InvalidInputError(
            f"constraint {name!r} already exists on table {plan.table.uri}: {existing}; drop it first"
        )
    schema = plan.schema
    ex.parse_predicate(sql, schema, context=f"CHECK constraint {name}")
    plan.set_operation("ADD CONSTRAINT", {"name": name, "expr": sql}, changes_data=False)
    files = plan.scan(None)  # the whole table: a concurrent add or remove conflicts
    check_existing(Rule(name.lower(), sql), schema, _rows(plan, files))
    config = {**plan.metadata.configuration, key: sql}
    plan.update_metadata(dataclasses.replace(plan.metadata, configuration=config))
    current = read_protocol(plan)
    upgraded = upgrade(current, schema, config)
    if upgraded != current:
        plan.update_protocol(upgraded)
    return plan.build()


def _rows(plan: PlanBuilder, files: list[AddFile]) -> Iterator[pa.Table]:
    fs, root, parts = plan.table.log.fs, plan.table.log.root, plan.metadata.partition_columns
    for f in files:
        yield read_live_rows(fs, root, [f], plan.schema, parts)


def drop_constraint(plan: PlanBuilder, name: str, *, if_exists: bool = False) -> Plan:
    """Remove constraint ``name`` (InvalidInputError if absent, unless ``if_exists``)."""
    name = check_text(name, "constraint name", allow_empty=False, allow_nul=False)
    key = constraint_key(name)
    sql = plan.metadata.configuration.get(key)
    params = {"name": name} if sql is None else {"name": name, "expr": sql}
    plan.set_operation("DROP CONSTRAINT", params, changes_data=False)
    if sql is None:
        if not if_exists:
            raise InvalidInputError(
                f"cannot drop nonexistent constraint {name!r} from table {plan.table.uri} "
                "(use if_exists=True to ignore)"
            )
        return plan.build()
    config = {k: v for k, v in plan.metadata.configuration.items() if k != key}
    plan.update_metadata(dataclasses.replace(plan.metadata, configuration=config))
    return plan.build()
