"""The Delta Spark feature table: what our reader and writer do with each table feature.

Reads .cache/deltaspark-report/features.json, which the Delta Spark peer tests write at the end
of their run (tests/deltaspark/test_we_read_theirs.py, ``./scripts/test.sh`` or
``.venv-delta/bin/pytest tests/deltaspark``), and prints it as a Markdown table:
feature, Delta Spark's protocol for it, read, write.

Run: ``python -m scripts.deltaspark_features [--json PATH] [--write PAGE | --check PAGE]``.
``--write`` puts the table into a page between the markers (:data:`MARKERS`);
``--check`` exits 1 when the page's table is not the one the last run of the peer tests
produced (``scripts/test.sh`` runs it after them, so the page cannot go stale).
"""

from __future__ import annotations

from typing import Any

from scripts.readme_block import DELTA_SPARK_PAGE, deltaspark_main, markers

#: The site's page that holds the table, and the markers around it there.
PAGE = DELTA_SPARK_PAGE
MARKERS = markers("features")


def _cell(outcome: str | None, detail: Any) -> str:
    if outcome is None:
        return "not run"
    if outcome.startswith("refused") and isinstance(detail, dict):
        return f"{outcome} ({', '.join(detail.get('features', []))})"
    if outcome == "WRONG" and detail:
        return f"**WRONG**: {'; '.join(detail) if isinstance(detail, list) else detail}"
    return outcome


def _protocol(row: dict[str, Any]) -> str:
    protocol = row.get("protocol")
    if not protocol:
        return ""
    return f"({protocol['minReaderVersion']}, {protocol['minWriterVersion']})"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Delta Spark {report.get('delta_spark', '?')}: tables it writes, read and appended to by eventlog.",
        "",
        "| feature | kind | Delta Spark protocol | read | write |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in report["features"]:
        read = _cell(row.get("read"), row.get("read_detail"))
        write = _cell(row.get("write"), row.get("write_detail"))
        lines.append(f"| {row['feature']} | {row.get('kind', '')} | {_protocol(row)} | {read} | {write} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return deltaspark_main(
        argv,
        name="features",
        doc=str(__doc__),
        render=render,
        what="Delta Spark feature table",
        produced_by=".venv-delta/bin/pytest tests/deltaspark",
    )


if __name__ == "__main__":
    raise SystemExit(main())
