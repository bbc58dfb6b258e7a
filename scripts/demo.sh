#!/usr/bin/env bash
# The main job: concurrent writers on one table (embedded slot store, no server needed).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
exec .venv/bin/python -m scripts.demo "$@"
