#!/usr/bin/env bash
# The main job on a fresh machine: install, then serve a 1,000-concept demo KB on the embedded
# SQLite store at http://127.0.0.1:8080 (config, secret and admin token written to ./demo/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kbgraph demo --dir demo "$@"
