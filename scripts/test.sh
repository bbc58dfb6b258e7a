#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, lint, types, import contracts, tests, then
# the Delta Spark peer tests (tests/deltaspark) in their own environment: .venv-delta, on the
# pyspark release Delta Spark is built for, with its jars from Maven (scripts/bootstrap_delta.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
./scripts/bootstrap_delta.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy eventlog lockstore streaming spark_adapter
.venv/bin/lint-imports
# The documentation site: a broken link, a missing page or a docstring it cannot render fails here.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$(mktemp -d)"
.venv/bin/pytest -q "$@"
.venv-delta/bin/pytest -q tests/deltaspark
# The site's Delta Spark tables (features, conflicts) must be the ones this run of the peer tests produced.
.venv/bin/python -m scripts.deltaspark_features --check docs/concepts/delta-spark.md
.venv/bin/python -m scripts.deltaspark_conflicts --check docs/concepts/delta-spark.md
