"""The conflict comparison with Delta Spark: each scenario's outcome on our engine and on Delta Spark.

Reads .cache/deltaspark-report/conflicts.json, which tests/deltaspark/test_conflicts.py writes
when it has run every scenario (``./scripts/test.sh`` or
``.venv-delta/bin/pytest tests/deltaspark/test_conflicts.py``), and prints it as Markdown: the
counts, the scenarios where the outcomes differ (each intended difference with its reason, each
bug), then every scenario in a collapsed table: scenario, isolation, layout, DVs, ours,
Delta Spark, agree / intended difference.

Run: ``python -m scripts.deltaspark_conflicts [--json PATH] [--write PAGE | --check PAGE]``.
``--write`` puts the tables into a page between the markers (:data:`MARKERS`);
``--check`` exits 1 when the page's tables are not the ones the last full run of the conflict
tests produced.

The page is :data:`PAGE` (the site's "Sharing tables with Delta Spark").
"""

from __future__ import annotations

from typing import Any

from scripts.readme_block import DELTA_SPARK_PAGE, deltaspark_main, markers

#: The site's page that holds the table, and the markers around it there.
PAGE = DELTA_SPARK_PAGE
MARKERS = markers("conflicts")

_TARGETS = {
    ("partitioned", "same"): "partitioned, same partition",
    ("partitioned", "disjoint"): "partitioned, other partitions",
    ("unpartitioned", "same"): "unpartitioned, same rows",
    ("unpartitioned", "disjoint"): "unpartitioned, other rows",
}


def _layout(row: dict[str, Any]) -> str:
    if row["family"] == "create":
        return f"empty path ({row['layout']})"
    return _TARGETS.get((row["layout"], row["target"]), row["layout"])


def _outcome(name: str) -> str:
    return name.removesuffix("Exception")


def render(report: dict[str, Any]) -> str:
    rows: list[dict[str, Any]] = report["rows"]
    reasons: dict[str, int] = {}
    for row in rows:
        if row["verdict"] == "intended":
            reasons.setdefault(row["reason"], len(reasons) + 1)
    counts = report["counts"]
    summary = ", ".join(f"{counts[k]} {k}" for k in ("agree", "intended", "bug", "differs") if counts.get(k))
    lines = [
        f"Delta Spark {report.get('delta_spark', '?')} (pyspark {report.get('pyspark', '?')}) and eventlog "
        f"on {report['scenarios']} conflict scenarios: {summary}. Each starts from the same table; "
        "both transactions read version v, the first commits, then the second commits.",
        "",
    ]
    if reasons:
        lines.append("Intended differences:")
        lines.append("")
        lines.extend(f"{n}. {reason}" for reason, n in reasons.items())
        lines.append("")
    lines.extend(_table([r for r in rows if r["verdict"] != "agree"], reasons))
    lines += ["", '<details markdown="1"><summary>Every scenario</summary>', ""]
    lines.extend(_table(rows, reasons))
    lines += ["", "</details>"]
    return "\n".join(lines)


def _table(rows: list[dict[str, Any]], reasons: dict[str, int]) -> list[str]:
    out = [
        "| scenario (second after first) | isolation | layout | DVs | ours | Delta Spark "
        "| agree / intended difference |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        verdict = row["verdict"]
        if verdict == "intended":
            verdict = f"intended ({reasons[row['reason']]})"
        elif verdict in ("bug", "differs"):
            verdict = f"**{verdict.upper()}**: {row['reason']}"
        out.append(
            f"| {row['second']} after {row['first']} | {row['isolation']} | {_layout(row)} "
            f"| {'yes' if row['dvs'] else 'no'} | {_outcome(row['ours'])} | {_outcome(row['delta_spark'])} "
            f"| {verdict} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    return deltaspark_main(
        argv,
        name="conflicts",
        doc=str(__doc__),
        render=render,
        what="Delta Spark conflict table",
        produced_by=".venv-delta/bin/pytest tests/deltaspark/test_conflicts.py",
    )


if __name__ == "__main__":
    raise SystemExit(main())
