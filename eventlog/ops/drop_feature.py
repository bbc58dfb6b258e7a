"""DROP FEATURE: the steps of Delta's ``AlterTableDropFeatureDeltaCommand``, each a plan.

Delta drops a table feature in three steps (PROTOCOL.md, "Removing a table feature"); the
table facade (:mod:`eventlog.table.drop_feature`) commits them in order:

1. **pre-downgrade** (:func:`remove_traces`): the feature's table properties off (the
   registry's ``disable``: ``delta.enableDeletionVectors=false``, ``delta.checkpointPolicy=
   classic``, the in-commit timestamp properties unset), then what rewrites its traces away
   (REORG PURGE of deletion vectors, a classic checkpoint);
2. **history**, for reader-writer features only: readers that do not know the feature must
   never replay a version that uses it. Without ``truncate_history`` (Delta Spark 4's
   default) three barrier checkpoints (:func:`empty_commit` + checkpoint) are written and
   the downgrade adds ``checkpointProtection`` with
   ``delta.requireCheckpointProtectionBeforeVersion``, so log cleanup may only drop the
   history before it all at once; with ``truncate_history`` the kept log must hold no trace
   any more (:func:`uses_feature`), else :class:`FeatureDropError` says to wait;
3. **downgrade** (:func:`downgrade_protocol`): one commit, ``DROP FEATURE`` with Delta's
   ``featureName`` and ``truncateHistory``, with the protocol at its lowest versions without
   the feature (:func:`eventlog.snapshot.protocol.downgrade`) and the metadata. Being a
   protocol change, it fails concurrent writers with ``ProtocolChangedException``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from eventlog.errors import FeatureDropError
from eventlog.files import row_tracking
from eventlog.log.actions import Action, AddFile, Metadata, Protocol, RemoveFile, UnknownAction
from eventlog.log.cleanup import PROTECTION_FEATURE, PROTECTION_KEY
from eventlog.snapshot.features import FEATURES, TableFeature
from eventlog.snapshot.protocol import downgrade, features_of
from eventlog.txn.plan import Plan, PlanBuilder

__all__ = [
    "BARRIER_CHECKPOINTS",
    "DROP_FEATURE",
    "check_drop",
    "downgrade_protocol",
    "drop_row_ids",
    "empty_commit",
    "property_changes",
    "remove_traces",
    "uses_feature",
]

DROP_FEATURE = "DROP FEATURE"  # Delta's DeltaOperations.OP_DROP_FEATURE
EMPTY_COMMIT = "Empty Commit"  # Delta's DeltaOperations.EmptyCommit
# Delta's NUMBER_OF_BARRIER_CHECKPOINTS: one more than its snapshot-loading retries, so a
# reader that falls back from an unreadable checkpoint gives up before reaching history.
BARRIER_CHECKPOINTS = 3
_V2_ACTIONS = ("checkpointMetadata", "sidecar")


def check_drop(protocol: Protocol, metadata: Metadata, name: str, *, truncate_history: bool) -> TableFeature:
    """The registry entry of the feature to drop, or :class:`FeatureDropError` (Delta's
    checks, in its order)."""
    if name not in features_of(protocol):
        raise FeatureDropError(
            feature=name, reason="not present", detail="the table's protocol does not list it"
        )
    feature = FEATURES.get(name)
    if feature is None:
        raise FeatureDropError(
            feature=name, reason="unsupported", detail="eventlog does not know this feature"
        )
    if not feature.removable:
        raise FeatureDropError(
            feature=name, reason="not removable", detail="Delta does not allow dropping it"
        )
    if not feature.droppable:
        raise FeatureDropError(feature=name, reason="unsupported", detail="eventlog cannot drop it (yet)")
    if truncate_history and not feature.reader_writer:
        raise FeatureDropError(
            feature=name,
            reason="truncate history not allowed",
            detail="only reader-writer features need their history truncated",
        )
    dependent = sorted(
        f.name for f in FEATURES.values() if name in f.requires and f.name in features_of(protocol)
    )
    if dependent:
        raise FeatureDropError(feature=name, reason="dependent features", detail=f"drop {dependent} first")
    return feature


def property_changes(metadata: Metadata, feature: TableFeature) -> dict[str, str | None]:
    """The pre-downgrade's property changes still to make (value None: unset). A property
    left out has its default: the value to set, unless :data:`_DEFAULTS` says otherwise."""
    config = metadata.configuration
    return {
        key: value
        for key, value in feature.disable
        if (value is None and key in config)
        or (value is not None and config.get(key, _DEFAULTS.get(key, value)) != value)
    }


_DEFAULTS = {row_tracking.SUSPENDED_KEY: "false"}  # properties whose absence is not their "off"
# Row tracking's properties and domain go with the protocol downgrade (Delta's
# tablePropertiesToRemoveAtDowngradeCommit and actionsToIncludeAtDowngradeCommit).
_ROW_TRACKING_KEYS = (
    row_tracking.ENABLE_KEY,
    row_tracking.SUSPENDED_KEY,
    row_tracking.ROW_ID_COLUMN_KEY,
    row_tracking.COMMIT_VERSION_COLUMN_KEY,
)


def drop_row_ids(plan: PlanBuilder) -> Plan:
    """Every live file added again without ``baseRowId`` and ``defaultRowCommitVersion``
    (``dataChange`` false), as Delta's RowTrackingUnBackfillCommand: row tracking is
    suspended by then, so the commit assigns none."""
    assert plan.snapshot is not None
    tracked = [
        f
        for f in plan.snapshot.add_files
        if f.base_row_id is not None or f.default_row_commit_version is not None
    ]
    plan.set_operation("ROW TRACKING UNBACKFILL", {}, changes_data=False)
    plan.add_files(
        [
            dataclasses.replace(f, base_row_id=None, default_row_commit_version=None, data_change=False)
            for f in tracked
        ],
        created=False,
    )
    plan.add_metrics(numUnbackfilledFiles=len(tracked))
    return plan.build()


def remove_traces(plan: PlanBuilder, changes: Mapping[str, str | None]) -> Plan:
    """Stage the pre-downgrade's property changes, as Delta commits them (SET TBLPROPERTIES,
    or UNSET TBLPROPERTIES when a property goes)."""
    config = {k: v for k, v in plan.metadata.configuration.items() if k not in changes}
    config.update({k: v for k, v in changes.items() if v is not None})
    if any(v is None for v in changes.values()):
        plan.set_operation(
            "UNSET TBLPROPERTIES", {"properties": list(changes), "ifExists": True}, changes_data=False
        )
    else:
        plan.set_operation("SET TBLPROPERTIES", {"properties": dict(changes)}, changes_data=False)
    plan.update_metadata(dataclasses.replace(plan.metadata, configuration=config))
    return plan.build()


def empty_commit(plan: PlanBuilder) -> Plan:
    """A commit with only its commitInfo, for a barrier checkpoint to sit on."""
    plan.set_operation(EMPTY_COMMIT, changes_data=False)
    return plan.build()


def downgrade_protocol(plan: PlanBuilder, name: str, *, truncate_history: bool, protect: bool) -> Plan:
    """The protocol downgrade commit; ``protect`` adds ``checkpointProtection`` and requires
    it before this version. Revalidates that the table no longer uses the feature (Delta's
    ``validateDropInvariants``): :class:`FeatureDropError` ``"in use"`` when it does."""
    assert plan.snapshot is not None
    feature = FEATURES[name]
    plan.set_operation(
        DROP_FEATURE, {"featureName": name, "truncateHistory": truncate_history}, changes_data=False
    )
    metadata = plan.metadata
    in_use = _in_use(plan, feature)
    if in_use:
        raise FeatureDropError(feature=name, reason="in use", detail=in_use)
    if name == row_tracking.FEATURE:
        config = {k: v for k, v in metadata.configuration.items() if k not in _ROW_TRACKING_KEYS}
        metadata = dataclasses.replace(metadata, configuration=config)
        domain = plan.snapshot.domains.get(row_tracking.DOMAIN)
        if domain is not None:
            plan.set_domain_metadata(domain.domain, domain.configuration, removed=True)
    if protect:
        config = {**metadata.configuration, PROTECTION_KEY: str(plan.snapshot.version + 1)}
        plan.update_metadata(dataclasses.replace(metadata, configuration=config))
    else:
        plan.update_metadata(metadata)  # Delta commits the metadata too
    plan.update_protocol(
        downgrade(plan.snapshot.protocol, name, add=(PROTECTION_FEATURE,) if protect else ())
    )
    return plan.build()


def _in_use(plan: PlanBuilder, feature: TableFeature) -> str:
    """Why the table still uses ``feature`` ("" when it does not)."""
    config = plan.metadata.configuration
    if feature.name == "checkConstraints":
        names = sorted(
            k.removeprefix("delta.constraints.") for k in config if k.startswith("delta.constraints.")
        )
        return f"CHECK constraints {names} remain; drop them first (Table.drop_constraint)" if names else ""
    changes = property_changes(plan.metadata, feature)
    if changes:
        return f"table properties {sorted(changes)} still turn it on"
    if feature.name == "deletionVectors" and any(a.deletion_vector is not None for a in plan.scan()):
        return "files with deletion vectors remain (Table.reorg_purge)"
    if feature.name == row_tracking.FEATURE and any(
        a.base_row_id is not None or a.default_row_commit_version is not None for a in plan.scan()
    ):
        return "files with row ids remain"
    return ""


def uses_feature(action: Action, name: str) -> bool:
    """Whether a log action is a trace of the reader-writer feature ``name`` (Delta's
    ``actionUsesFeature``)."""
    if name == "deletionVectors":
        return isinstance(action, AddFile | RemoveFile) and action.deletion_vector is not None
    if name == "v2Checkpoint":
        return isinstance(action, UnknownAction) and action.name in _V2_ACTIONS
    return False
