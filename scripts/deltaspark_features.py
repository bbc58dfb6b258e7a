"""The Delta Spark feature table: what our reader and writer do with each table feature.

Reads .cache/deltaspark-report/features.json, which the Delta Spark peer tests write at the end
of their run (tests/deltaspark/test_we_read_theirs.py, ``./scripts/test.sh`` or
``.venv-delta/bin/pytest tests/deltaspark``), and prints it as a Markdown table:
feature, Delta Spark's protocol for it, read, write.

Run: ``python -m scripts.deltaspark_features [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

REPORT = Path(__file__).resolve().parent.parent / ".cache" / "deltaspark-report" / "features.json"


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=REPORT, help=f"the report (default {REPORT})")
    args = parser.parse_args(argv)
    if not args.json.is_file():
        parser.error(f"{args.json} does not exist: run .venv-delta/bin/pytest tests/deltaspark first")
    print(render(json.loads(args.json.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
