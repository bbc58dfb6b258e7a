"""Identity columns both ways with Delta Spark: it inserts into our identity tables after our
concurrent inserts and never collides with our values; we insert into its identity tables
(GENERATED ALWAYS and BY DEFAULT, positive and negative steps) and never collide with its
values; a Delta Spark insert that lands while one of ours is in flight and reached its
reserved values fails ours with MetadataChangedException (as in Delta), never duplicates."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from eventlog import MetadataChangedException, Table, identity_field
from eventlog.files.identity import identity_columns
from tests.deltaspark.peer import delta_arrow, delta_detail, same_rows

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def _sql(spark: Any, statement: str, path: str) -> None:
    spark.sql(statement.format(t=f"delta.`{path}`"))


def _values(rows: pa.Table, column: str = "id") -> list[int]:
    return sorted(rows.column(column).to_pylist())


def _mark(path: str, column: str = "id") -> int | None:
    with Table.open(path) as t:
        return next(c.high_water_mark for c in identity_columns(t.refresh().schema) if c.name == column)


@pytest.mark.parametrize("step", [1, -5])
def test_delta_spark_inserts_after_our_concurrent_inserts_never_collide(
    spark: Any, tmp_path: Path, step: int
) -> None:
    path = str(tmp_path / "t")
    Table.create(path, pa.schema([identity_field("id", start=0, step=step), ("v", pa.string())])).close()
    errors: list[BaseException] = []

    def insert(worker: int) -> None:
        try:
            with Table.open(path) as t:
                for batch in range(5):
                    t.append(pa.table({"v": [f"w{worker}b{batch}r{r}" for r in range(3)]}))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=insert, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    with Table.open(path) as t:
        ours = t.to_arrow()
    assert ours.num_rows == 60 and len(set(_values(ours))) == 60
    assert "identityColumns" in delta_detail(spark, path)["tableFeatures"]
    got, want = same_rows(ours, delta_arrow(spark, path))
    assert got == want  # Delta Spark reads our table exactly
    _sql(spark, "INSERT INTO {t} (v) VALUES ('delta1'), ('delta2')", path)
    _sql(spark, "INSERT INTO {t} (v) VALUES ('delta3')", path)
    theirs = delta_arrow(spark, path)
    ids = _values(theirs)
    assert theirs.num_rows == 63 and len(set(ids)) == 63
    delta_ids = [r["id"] for r in theirs.to_pylist() if r["v"].startswith("delta")]
    our_ids = _values(ours)
    beyond = (lambda v: v > max(our_ids)) if step > 0 else (lambda v: v < min(our_ids))
    assert all(beyond(v) for v in delta_ids)
    with Table.open(path) as t:  # and we continue past Delta Spark's values
        t.append(pa.table({"v": ["ours-after"]}))
        last = next(r["id"] for r in t.to_arrow().to_pylist() if r["v"] == "ours-after")
    assert all((last > v) if step > 0 else (last < v) for v in delta_ids)
    assert len(set(_values(delta_arrow(spark, path)))) == 64


@pytest.mark.parametrize(
    "generated, step",
    [("ALWAYS", 3), ("BY DEFAULT", 3), ("ALWAYS", -2)],
)
def test_we_insert_into_delta_spark_identity_tables_without_colliding(
    spark: Any, tmp_path: Path, generated: str, step: int
) -> None:
    path = str(tmp_path / "t")
    _sql(
        spark,
        f"CREATE TABLE {{t}} (k BIGINT GENERATED {generated} AS IDENTITY (START WITH 10 INCREMENT BY {step}),"
        " v STRING) USING delta",
        path,
    )
    _sql(spark, "INSERT INTO {t} (v) VALUES ('d1'), ('d2')", path)
    with Table.open(path) as t:
        t.append(pa.table({"v": ["o1", "o2", "o3"]}))
        if generated == "BY DEFAULT":  # explicit values are kept, the mark does not move
            mark = _mark(path, "k")
            t.append(pa.table({"k": pa.array([1000], pa.int64()), "v": ["explicit"]}))
            assert _mark(path, "k") == mark
    _sql(spark, "INSERT INTO {t} (v) VALUES ('d3'), ('d4')", path)
    rows = {r["v"]: r["k"] for r in delta_arrow(spark, path).to_pylist()}
    generated_values = [k for v, k in rows.items() if v != "explicit"]
    assert len(set(generated_values)) == len(generated_values) == 7
    d12, ours, d34 = [rows["d1"], rows["d2"]], [rows[v] for v in ("o1", "o2", "o3")], [rows["d3"], rows["d4"]]
    before = max(d12) if step > 0 else min(d12)
    after = min(d34) if step > 0 else max(d34)
    assert all((v > before) if step > 0 else (v < before) for v in ours)  # past Delta's first insert
    assert all((after > v) if step > 0 else (after < v) for v in ours)  # Delta's next insert is past ours
    assert all((v - 10) % step == 0 for v in ours)
    with Table.open(path) as t:
        got, want = same_rows(t.to_arrow(), delta_arrow(spark, path))
    assert got == want


def test_a_delta_spark_insert_reaching_our_reserved_values_fails_our_commit(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    Table.create(
        path, pa.schema([identity_field("id"), ("v", pa.string())]), data=pa.table({"v": ["a"]})
    ).close()
    with Table.open(path) as t:
        txn = t.transaction()
        txn.append(pa.table({"v": ["ours"]}))  # reserves 2 (the log's mark is 1)
        _sql(spark, "INSERT INTO {t} (v) VALUES ('delta')", path)  # Delta Spark generates 2 too
        with pytest.raises(MetadataChangedException) as err:
            txn.commit()
        assert err.value.winning_version == 1
        rows = {r["v"]: r["id"] for r in t.to_arrow().to_pylist()}
    assert rows == {"a": 1, "delta": 2}  # no duplicate landed
    with Table.open(path) as t:  # a new insert reserves past both
        t.append(pa.table({"v": ["next"]}))
        assert {r["v"]: r["id"] for r in t.to_arrow().to_pylist()}["next"] == 3
