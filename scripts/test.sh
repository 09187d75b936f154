#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, lint, then pytest (extra args go to pytest).
# Hypothesis runs its deterministic "ci" profile here (tests/conftest.py): every run draws the
# same examples, so the result never depends on chance or on an earlier run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check kbgraph tests loadtest
.venv/bin/ruff format --check kbgraph tests loadtest
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
exec .venv/bin/python -m pytest "$@"
