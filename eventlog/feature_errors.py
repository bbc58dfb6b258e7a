"""Typed errors of the table features: change data feed reads and DROP FEATURE.

Re-exported from :mod:`eventlog.errors` and :mod:`eventlog`, where users import them.
"""

from __future__ import annotations

from eventlog.error_base import EventlogError, InvalidInputError

__all__ = [
    "ChangeDataNotRecordedError",
    "ChangeDataSchemaChangeError",
    "FeatureDropError",
    "InvalidChangeRangeError",
    "RowTrackingNotEnabledError",
]


class ChangeDataNotRecordedError(InvalidInputError):
    """A change data feed read over versions without change data: the feed
    (``delta.enableChangeDataFeed``) was off at the start version or turned off within the
    range (Delta's ``DELTA_MISSING_CHANGE_DATA``). Fields: ``version`` (the first version
    without change data), ``start`` and ``end`` (the range asked for)."""

    error_class = "DELTA_MISSING_CHANGE_DATA"

    def __init__(self, *, version: int, start: int, end: int) -> None:
        EventlogError.__init__(
            self,
            f"[{self.error_class}] Error getting change data for range [{start} , {end}] as change "
            f"data was not recorded for version [{version}]. If you've enabled change data feed on "
            "this table, use `DESCRIBE HISTORY` to see when it was first enabled. Otherwise, to "
            "start recording change data, set the table property delta.enableChangeDataFeed=true "
            "(Table.set_properties).",
            version=version,
            start=start,
            end=end,
        )


class InvalidChangeRangeError(InvalidInputError):
    """A change data feed range that cannot be read: its end is before its start (Delta's
    ``DELTA_INVALID_CDC_RANGE``) or its start is after the latest version
    (``DELTA_CDC_START_VERSION_AFTER_LATEST``). Fields: ``start``, ``end`` (None when not
    given), ``latest`` (the table's latest version) and ``reason`` (``"end before start"``,
    ``"start after latest"``)."""

    def __init__(self, *, start: int, end: int | None, latest: int, reason: str) -> None:
        message = (
            f"[DELTA_INVALID_CDC_RANGE] CDC range from start {start} to end {end} was invalid. "
            "End cannot be before start."
            if reason == "end before start"
            else f"[DELTA_CDC_START_VERSION_AFTER_LATEST] Start version {start} for change data feed "
            f"exceeds the latest table version {latest}."
        )
        EventlogError.__init__(self, message, start=start, end=end, latest=latest, reason=reason)


class FeatureDropError(InvalidInputError):
    """``Table.drop_feature`` refused; nothing of the downgrade was committed (the
    pre-downgrade step may have been). Fields: ``feature``, ``reason`` (one of
    :attr:`REASONS`, whose values are Delta's error classes) and ``detail`` (what to do).

    * ``"not present"``: the table's protocol does not list the feature
      (``DELTA_FEATURE_DROP_FEATURE_NOT_PRESENT``);
    * ``"unsupported"``: a feature this library cannot drop, unknown or not droppable here
      (``DELTA_FEATURE_DROP_UNSUPPORTED_CLIENT_FEATURE``);
    * ``"not removable"``: Delta does not allow dropping it (``DELTA_FEATURE_DROP_NONREMOVABLE_FEATURE``);
    * ``"in use"``: the table still uses it, e.g. a CHECK constraint remains;
    * ``"dependent features"``: another listed feature requires it;
    * ``"truncate history not allowed"``: ``truncate_history`` on a writer-only feature;
    * ``"wait for retention"``: traces were just removed; retry after the log retention
      (``DELTA_FEATURE_DROP_WAIT_FOR_RETENTION_PERIOD``);
    * ``"historical versions exist"``: the kept log history still uses the feature
      (``DELTA_FEATURE_DROP_HISTORICAL_VERSIONS_EXIST``).
    """

    REASONS = {
        "not present": "DELTA_FEATURE_DROP_FEATURE_NOT_PRESENT",
        "unsupported": "DELTA_FEATURE_DROP_UNSUPPORTED_CLIENT_FEATURE",
        "not removable": "DELTA_FEATURE_DROP_NONREMOVABLE_FEATURE",
        "in use": "DELTA_FEATURE_DROP_CONFLICT_REVALIDATION_FAIL",
        "dependent features": "DELTA_FEATURE_DROP_DEPENDENT_FEATURE",
        "truncate history not allowed": "DELTA_FEATURE_DROP_HISTORY_TRUNCATION_NOT_ALLOWED",
        "wait for retention": "DELTA_FEATURE_DROP_WAIT_FOR_RETENTION_PERIOD",
        "historical versions exist": "DELTA_FEATURE_DROP_HISTORICAL_VERSIONS_EXIST",
    }

    feature: str
    detail: str

    def __init__(self, *, feature: str, reason: str, detail: str = "") -> None:
        code = self.REASONS.get(reason, "DELTA_FEATURE_DROP")
        message = f"[{code}] cannot drop table feature {feature!r}: {reason}"
        EventlogError.__init__(
            self, f"{message}. {detail}" if detail else message, feature=feature, reason=reason, detail=detail
        )

    @property
    def delta_error_class(self) -> str:
        """Delta's error class for this refusal."""
        return self.REASONS.get(self.reason, "DELTA_FEATURE_DROP")


class RowTrackingNotEnabledError(InvalidInputError):
    """Row ids asked of a table (or a version of it) without row tracking enabled, where
    they are not stable or not assigned (Delta's ``DELTA_ROW_TRACKING_NOT_ENABLED``-style
    refusal of ``_metadata.row_id``). Fields: ``version`` (the version read) and
    ``supported`` (whether the feature is listed in the protocol, only not turned on)."""

    supported: bool

    def __init__(self, *, version: int, supported: bool) -> None:
        hint = (
            "the table supports the rowTracking feature, but delta.enableRowTracking is not true"
            if supported
            else "the table does not support the rowTracking feature"
        )
        EventlogError.__init__(
            self,
            f"row ids were asked for at version {version}, but row tracking is not enabled there: "
            f"{hint}; enable it with Table.set_properties({{'delta.enableRowTracking': 'true'}})",
            version=version,
            supported=supported,
        )


class ChangeDataSchemaChangeError(InvalidInputError):
    """A change data feed read over a schema change it cannot read across: the rows are
    returned in the end version's schema, and data of the range was written in a schema not
    read compatible with it: a column renamed or dropped (column mapping), the partition
    columns changed, a column's type changed or a nullable column made NOT NULL. Read the two
    sides separately: ``start..version - 1`` and ``version..end``.

    Fields: ``start`` and ``end`` (the range asked for), ``version`` (the version of the
    schema change), ``read_version`` (the version whose schema the read returns: ``end``)
    and ``reason``:

    * ``"schema change"``: a version after the start committed a schema the end version's
      cannot read (Delta's ``DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE``);
    * ``"data schema"``: the start version's schema cannot be read as the end version's,
      which is the only schema change in the range, at ``version`` (Delta's
      ``DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA``, which names the start version).
    """

    REASONS = {
        "schema change": "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE",
        "data schema": "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA",
    }

    read_version: int

    def __init__(self, *, start: int, end: int, version: int, read_version: int, reason: str) -> None:
        found = (
            f"an incompatible schema change at version {version}"
            if reason == "schema change"
            else f"an incompatible data schema at version {start} (the schema changed at version {version})"
        )
        EventlogError.__init__(
            self,
            f"[{self.REASONS.get(reason, self.REASONS['schema change'])}] Retrieving table changes "
            f"between version {start} and {end} failed because of an incompatible schema change. "
            f"Your read schema is the schema at version {read_version}, but we found {found}. "
            f"If possible, please query table changes separately from version {start} to "
            f"{version - 1}, and from version {version} to {end}.",
            start=start,
            end=end,
            version=version,
            read_version=read_version,
            reason=reason,
        )

    @property
    def delta_error_class(self) -> str:
        """Delta's error class for this refusal."""
        return self.REASONS.get(self.reason, self.REASONS["schema change"])
