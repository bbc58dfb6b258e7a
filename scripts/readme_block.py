"""A generated block of the README, between two HTML-comment markers, written or checked by
the scripts that render the Delta Spark peer tests' reports (``deltaspark_features``,
``deltaspark_conflicts``): ``--write README.md`` puts the rendering in, ``--check README.md``
exits 1 when the README holds another one (``scripts/test.sh`` checks after the peer tests)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _block(readme: str, start_marker: str, end_marker: str) -> tuple[int, int]:
    start, end = readme.find(start_marker), readme.find(end_marker)
    if start < 0 or end < start:
        raise SystemExit(f"the README has no {start_marker!r} ... {end_marker!r} block")
    return start + len(start_marker), end


def run(
    argv: list[str] | None,
    *,
    description: str,
    report: Path,
    render: Callable[[dict[str, Any]], str],
    markers: tuple[str, str],
    what: str,
    module: str,
    produced_by: str,
) -> int:
    """The command line of a report renderer: print, ``--write`` or ``--check`` the block."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", type=Path, default=report, help=f"the report (default {report})")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", type=Path, metavar="README", help=f"put the {what} into this README")
    action.add_argument(
        "--check", type=Path, metavar="README", help=f"fail unless this README has the {what}"
    )
    args = parser.parse_args(argv)
    if not args.json.is_file():
        parser.error(f"{args.json} does not exist: run {produced_by} first")
    text = render(json.loads(args.json.read_text()))
    if args.write is None and args.check is None:
        print(text)
        return 0
    path = args.write or args.check
    readme = path.read_text()
    start, end = _block(readme, *markers)
    wanted = f"\n\n{text}\n\n"
    if args.write is not None:
        path.write_text(readme[:start] + wanted + readme[end:])
        return 0
    if readme[start:end] != wanted:
        print(f"{path}: the {what} is stale; the peer tests now give:\n{text}")
        print(f"update it with: python -m {module} --write {path}")
        return 1
    return 0
