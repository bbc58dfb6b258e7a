#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, lint, types, import contracts, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy eventlog lockstore streaming spark_adapter
.venv/bin/lint-imports
.venv/bin/pytest -q "$@"
