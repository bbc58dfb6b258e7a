"""Delta Spark's streaming source on our tables: ``readStream.format("delta")`` next to ours,
``readStream.format("eventlog")``, on tables our writers make.

Every query drains into a ``foreachBatch`` collector, so each micro-batch's rows are compared,
not just the totals. Where both succeed they emit the same batches with the same rows: the
initial snapshot (ordered by modification time and path), later appends, ``maxFilesPerTrigger``
and ``startingVersion``. Where both fail, they fail at the same commit, each with its own
condition (Delta Spark's ``DELTA_*`` class, our typed error recovered with
:func:`streaming.recover`). The intended differences (README, "Delta Spark's source or ours")
are pinned here:

* ours emits every row committed *before* a commit it cannot stream, then fails; Delta Spark
  fails the whole pending range, and emits those rows only once restarted with an option
  that lets it pass (the same rows in the end, in other batches);
* ours stops on a change of table properties or protocol, Delta Spark only on a schema (or
  partitioning) change;
* ours refuses ``ignoreChanges`` (it re-emits every row of a rewritten file, old rows included).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import StreamingQueryException

from eventlog import Table
from streaming import ChangeCommitError, SourceMetadataChangedError, StreamingError, recover
from tests.conftest import SCHEMA, rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

FORMATS = ("eventlog", "delta")
WAIT = 120  # seconds: a query not done by then fails the test
Row = tuple[Any, ...]


@dataclass
class Drained:
    """What one query emitted, batch by batch (each batch's rows sorted), and how it ended."""

    batches: list[list[Row]] = field(default_factory=list)
    error: StreamingQueryException | None = None

    @property
    def rows(self) -> list[Row]:
        return sorted(r for batch in self.batches for r in batch)

    def collect(self, batch: Any, batch_id: int) -> None:
        self.batches.append(sorted(tuple(r) for r in batch.collect()))


class Streams:
    """One table read by both sources, each with its own checkpoint (kept across runs)."""

    def __init__(self, spark: Any, root: Path, uri: str) -> None:
        self.spark = spark
        self.root = root
        self.uri = uri

    def load(self, fmt: str, **options: str) -> Any:
        return self.spark.readStream.format(fmt).options(**options).load(self.uri)

    def start(self, fmt: str, out: Drained, options: Mapping[str, str], *, available_now: bool = True) -> Any:
        writer = (
            self.load(fmt, **options)
            .writeStream.foreachBatch(out.collect)
            .option("checkpointLocation", str(self.root / f"checkpoint-{fmt}"))
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        return writer.start()

    def drain(self, fmt: str, **options: str) -> Drained:
        """One ``availableNow`` run to its end (or its failure)."""
        out = Drained()
        query = self.start(fmt, out, options)
        try:
            assert query.awaitTermination(WAIT), f"the {fmt} query did not finish in {WAIT} s"
        except StreamingQueryException as exc:
            out.error = exc
        finally:
            query.stop()
        return out

    def both(self, **options: str) -> dict[str, Drained]:
        return {fmt: self.drain(fmt, **options) for fmt in FORMATS}


def expected(ids: Sequence[int], date: str = "2024-01-01", **extra: Any) -> list[Row]:
    """The rows ``rows(ids, date)`` as Spark returns them (plus ``extra`` columns)."""
    table = rows(list(ids), date=date)
    for name, value in extra.items():
        table = table.append_column(name, pa.array([value] * len(ids)))
    return sorted(tuple(r.values()) for r in table.to_pylist())


def delta_condition(exc: StreamingQueryException | None) -> str:
    """The error condition of the exception Delta Spark's source raised inside the query
    (Spark wraps it as ``[STREAM_FAILED] ... terminated with exception: [CONDITION] ...``)."""
    assert exc is not None, "the Delta Spark query did not fail"
    assert exc.getCondition() == "STREAM_FAILED"
    found = re.search(r"terminated with exception: \[([A-Z_]+)\]", str(exc))
    assert found is not None, str(exc)[:2000]
    return found.group(1)


def our_error(exc: StreamingQueryException | None) -> StreamingError:
    """Our typed error behind the query's failure; its condition is in the text too."""
    assert exc is not None, "the eventlog query did not fail"
    assert exc.getCondition() == "STREAM_FAILED"
    error = recover(exc)
    assert error is not None, str(exc)[:2000]
    assert f"[{error.error_class}]" in str(exc)
    return error


def make_table(path: Path, *, partitioned: bool, **properties: str) -> Table:
    """Versions 0..3: an empty table, then three appends of two rows (ids k*10, k*10+1), one
    file each, on 2024-01-01, -02 and -03."""
    t = Table.create(str(path), SCHEMA, partition_by=["date"] if partitioned else None, properties=properties)
    for k in range(3):
        t.append(rows([10 * k, 10 * k + 1], date=f"2024-01-0{k + 1}"))
        time.sleep(0.01)  # distinct modification times: the snapshot's order does not hang on names
    return t


SNAPSHOT = [expected([0, 1]), expected([10, 11], "2024-01-02"), expected([20, 21], "2024-01-03")]


# --------------------------------------------------------------------------- same batches


@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
def test_same_batches_for_the_snapshot_appends_and_starting_version(
    spark: Any, tmp_path: Path, partitioned: bool
) -> None:
    table = make_table(tmp_path / "t", partitioned=partitioned)
    streams = Streams(spark, tmp_path / "from-start", table.uri)
    first = streams.both(maxFilesPerTrigger="1")
    assert first["delta"].batches == first["eventlog"].batches == SNAPSHOT  # one file per batch

    # Later appends by our writers: one of two files when partitioned (two dates), then one.
    table.append(pa.concat_tables([rows([30]), rows([31], date="2024-01-04")]))  # v4
    table.append(rows([40, 41], date="2024-01-04"))  # v5
    later = streams.both(maxFilesPerTrigger="2")  # the same checkpoints: only the new commits
    v4, v5 = expected([30]) + expected([31], "2024-01-04"), expected([40, 41], "2024-01-04")
    want = [sorted(v4), v5] if partitioned else [sorted(v4 + v5)]  # 2 files then 1, or 2 files
    assert later["delta"].batches == later["eventlog"].batches == want

    from_two = Streams(spark, tmp_path / "from-v2", table.uri)
    commits = from_two.both(startingVersion="2", maxFilesPerTrigger="1")
    by_file = [expected([10, 11], "2024-01-02"), expected([20, 21], "2024-01-03")]
    by_file += [expected([30]), expected([31], "2024-01-04")] if partitioned else [sorted(v4)]
    by_file.append(v5)
    assert sorted(commits["delta"].batches) == sorted(commits["eventlog"].batches) == sorted(by_file)
    assert commits["delta"].batches == commits["eventlog"].batches  # the same order, too
    assert all(d.error is None for d in (*first.values(), *later.values(), *commits.values()))


# --------------------------------------------------------------------------- metadata changes


def running(streams: Streams) -> dict[str, tuple[Any, Drained]]:
    """Both sources as long-running queries (default trigger), caught up with the table."""
    out: dict[str, tuple[Any, Drained]] = {}
    for fmt in FORMATS:
        drained = Drained()
        query = streams.start(fmt, drained, {}, available_now=False)
        query.processAllAvailable()
        out[fmt] = (query, drained)
    return out


def await_failure(query: Any) -> StreamingQueryException:
    try:
        with pytest.raises(StreamingQueryException) as info:
            query.awaitTermination(WAIT)
    finally:
        query.stop()
    return info.value


def add_column(table: Table, spark: Any) -> None:
    table.add_columns([pa.field("z", pa.string())])


def replace_schema(table: Table, spark: Any) -> None:
    """A non-additive change (``y`` dropped, ``x`` from bigint to string): Delta Spark's
    overwrite with ``overwriteSchema``, as our writers make none."""
    spark.createDataFrame([(50, "2024-01-01", "5")], "id bigint, date string, x string").write.format(
        "delta"
    ).mode("overwrite").option("overwriteSchema", "true").save(table.uri)


@pytest.mark.parametrize("change", [add_column, replace_schema], ids=["add-column", "non-additive"])
def test_a_schema_change_stops_both_at_that_commit(
    spark: Any, tmp_path: Path, change: Callable[[Table, Any], None]
) -> None:
    table = make_table(tmp_path / "t", partitioned=False)
    streams = Streams(spark, tmp_path, table.uri)
    queries = running(streams)
    table.append(rows([30]))  # v4, streamable
    change(table, spark)  # v5
    ours, theirs = await_failure(queries["eventlog"][0]), await_failure(queries["delta"][0])
    assert delta_condition(theirs) == "DELTA_SCHEMA_CHANGED_WITH_VERSION"
    assert "Detected schema change in version 5" in str(theirs)
    error = our_error(ours)
    assert isinstance(error, SourceMetadataChangedError)
    assert (error.error_class, error.version, error.changed, error.read_version) == (
        "EVENTLOG_SOURCE_METADATA_CHANGED", 5, ["schema"], 3,
    )  # fmt: skip
    snapshot = sorted(r for batch in SNAPSHOT for r in batch)
    # Intended difference: ours emits v4 before failing, always. Delta Spark emits it only if a
    # batch ended before v5 was committed (timing); otherwise its whole pending range fails
    # (the deterministic case is pinned in test_delete_and_update_fail_both_until_skipped).
    assert queries["eventlog"][1].batches == [snapshot, expected([30])]
    assert queries["delta"][1].batches in ([snapshot], [snapshot, expected([30])])
    if change is not add_column:
        return
    # Restarted from the same checkpoints with a fresh load (the new schema), both go on
    # from where they stopped: every row once, the new column null before v5.
    table.append(rows([40]).append_column("z", pa.array(["new"])))  # v6
    restarted = streams.both()
    assert restarted["eventlog"].batches == [expected([40], z="new")]
    assert restarted["delta"].rows[-1] == expected([40], z="new")[0]
    assert all(len(r) == 5 for r in restarted["delta"].rows)
    emitted = {fmt: sorted(r[0] for r in queries[fmt][1].rows + restarted[fmt].rows) for fmt in FORMATS}
    assert emitted["eventlog"] == emitted["delta"] == [0, 1, 10, 11, 20, 21, 30, 40]


def test_a_property_or_protocol_change_stops_ours_only(spark: Any, tmp_path: Path) -> None:
    """Intended difference: ours cannot know whether new properties or a new protocol change
    how rows must be read, so it stops (``streaming.supervise`` restarts it); Delta Spark's
    source checks the schema and partitioning only."""
    table = make_table(tmp_path / "t", partitioned=True)
    streams = Streams(spark, tmp_path, table.uri)
    queries = running(streams)
    table.append(rows([30]))  # v4
    table.set_properties({"delta.enableDeletionVectors": "true"})  # v5: properties and protocol
    table.append(rows([40]))  # v6
    ours = our_error(await_failure(queries["eventlog"][0]))
    assert isinstance(ours, SourceMetadataChangedError)
    assert (ours.version, ours.changed) == (5, ["properties", "protocol"])
    assert ours.new_properties == {"delta.enableDeletionVectors": "true"}
    delta_query, delta_out = queries["delta"]
    try:
        delta_query.processAllAvailable()
        assert delta_query.isActive and delta_query.exception() is None
    finally:
        delta_query.stop()
    assert delta_out.rows == sorted([r for b in SNAPSHOT for r in b] + expected([30, 40]))
    assert queries["eventlog"][1].batches[-1] == expected([30])
    # A restart (a fresh load) takes the new metadata: ours then emits v6 too, as Delta did.
    assert streams.drain("eventlog").batches == [expected([40])]


# --------------------------------------------------------------------------- change commits


def test_delete_and_update_fail_both_until_skipped(spark: Any, tmp_path: Path) -> None:
    """A DELETE of a whole partition (files removed, none added), then an UPDATE (deletion
    vector and new file): both sources fail on each, Delta Spark with
    ``DELTA_SOURCE_IGNORE_DELETE`` / ``DELTA_SOURCE_TABLE_IGNORE_CHANGES``, ours with
    ``ChangeCommitError`` (``added_files`` 0 / not 0); ``ignoreDeletes`` passes the first,
    ``skipChangeCommits`` both. In the end both emitted the same rows."""
    table = make_table(tmp_path / "t", partitioned=True, **{"delta.enableDeletionVectors": "true"})
    streams = Streams(spark, tmp_path, table.uri)
    first = streams.both()
    assert first["delta"].batches == first["eventlog"].batches == [sorted(r for b in SNAPSHOT for r in b)]
    table.append(rows([30]))  # v4
    table.delete("date = '2024-01-02'")  # v5: whole files
    table.append(rows([40]))  # v6
    table.update("id = 0", {"x": "99"})  # v7: a deletion vector and a new file
    table.append(rows([50]))  # v8

    plain = streams.both()
    assert delta_condition(plain["delta"].error) == "DELTA_SOURCE_IGNORE_DELETE"
    assert "from streaming source at version 5" in str(plain["delta"].error)
    deleted = our_error(plain["eventlog"].error)
    assert isinstance(deleted, ChangeCommitError)
    assert (deleted.error_class, deleted.version, deleted.operation, deleted.added_files) == (
        "EVENTLOG_SOURCE_CHANGE_COMMIT", 5, "DELETE", 0,
    )  # fmt: skip
    assert plain["delta"].batches == [] and plain["eventlog"].batches == [expected([30])]

    past_deletes = streams.both(ignoreDeletes="true")
    assert delta_condition(past_deletes["delta"].error) == "DELTA_SOURCE_TABLE_IGNORE_CHANGES"
    assert "in the source table at version 7" in str(past_deletes["delta"].error)
    updated = our_error(past_deletes["eventlog"].error)
    assert isinstance(updated, ChangeCommitError)
    assert (updated.version, updated.operation) == (7, "UPDATE") and updated.added_files > 0
    assert past_deletes["delta"].batches == [] and past_deletes["eventlog"].batches == [expected([40])]

    skipping = streams.both(skipChangeCommits="true")
    assert skipping["delta"].error is None and skipping["eventlog"].error is None
    assert skipping["delta"].batches == [expected([30, 40]) + expected([50])]
    assert skipping["eventlog"].batches == [expected([50])]
    emitted = {
        fmt: sorted(r for run in (first, plain, past_deletes, skipping) for r in run[fmt].rows)
        for fmt in FORMATS
    }
    assert emitted["delta"] == emitted["eventlog"] == sorted(
        expected([0, 1]) + expected([10, 11], "2024-01-02") + expected([20, 21], "2024-01-03")
        + expected([30, 40, 50])
    )  # fmt: skip


def test_ignore_changes_is_delta_sparks_only(spark: Any, tmp_path: Path) -> None:
    """Intended difference: Delta Spark's ``ignoreChanges`` re-emits every row of a file a
    DML rewrote (the unchanged ones again, the changed ones with new values); ours refuses
    the option before reading anything and points to ``skipChangeCommits``."""
    table = make_table(tmp_path / "t", partitioned=False)
    table.update("id = 0", {"x": "99"})  # v4: file 1 rewritten (no deletion vectors)
    streams = Streams(spark, tmp_path, table.uri)
    runs = streams.both(startingVersion="4", ignoreChanges="true")
    assert runs["delta"].error is None
    assert runs["delta"].batches == [sorted([(0, "2024-01-01", 99, 0.0), (1, "2024-01-01", 1, 1.0)])]
    ours = runs["eventlog"].error
    assert ours is not None and ours.getCondition() == "STREAM_FAILED"
    assert "InvalidInputError" in str(ours) and "option ignoreChanges is not supported" in str(ours)
    assert runs["eventlog"].batches == []
