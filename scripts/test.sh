#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, lint, then pytest (extra args go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check kbgraph tests loadtest
.venv/bin/ruff format --check kbgraph tests loadtest
exec .venv/bin/python -m pytest "$@"
