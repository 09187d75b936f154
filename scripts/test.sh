#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, lint, then pytest (extra args go to pytest).
# Hypothesis runs its deterministic "ci" profile here (tests/conftest.py): every run draws the
# same examples, so the result never depends on chance or on an earlier run.
#
# Then the SQLite matrix: the store, ingest, crash and JetStream tests again on each SQLite
# build of tests/sqlite_swap/builds.txt (sqlean.py wheels from PyPI, installed by setup.sh),
# swapped in for the sqlite3 module by tests/sqlite_swap/sitecustomize.py in the test process
# and every server it starts. Each run prints the SQLite it used (pytest's header) and
# tests/test_sqlite_matrix.py asserts it. KBGRAPH_SQLITE_MATRIX=0 skips the matrix.
# Every run goes on after a failed one; the script fails if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check kbgraph tests loadtest
.venv/bin/ruff format --check kbgraph tests loadtest
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
MATRIX_TESTS=(
    tests/test_sqlite_matrix.py tests/test_store_json_text.py tests/test_store.py
    tests/test_ingest.py tests/test_ingest_hardening.py tests/test_crash.py
    tests/test_jetstream_unit.py
)
# Kept under .ci/run's 15 minutes: the JetStream cluster tests (4 minutes a build) run on the
# machine's SQLite and on 3.45.1, the release whose JSONB reading halted clusters, not again on
# the newest; every build runs the store, ingest, crash and JetStream unit tests, which hold
# every statement the cluster's nodes run. The 75 s kill-and-restart cycle of three nodes runs
# once, in the whole suite, and so does the node of two workers (its store statements, the
# stream_result rows, are in the JetStream unit tests of every build).
MATRIX_SKIP="not test_kills_lose_no_acknowledged_delivery and not test_two_workers_per_node"
MATRIX_CLUSTER_BUILDS="3.45.1"
failed=()
echo "== the whole suite on the machine's SQLite" >&2
.venv/bin/python -m pytest "$@" || failed+=("the whole suite (machine's SQLite)")
if [ "${KBGRAPH_SQLITE_MATRIX:-1}" != 0 ]; then
    while read -r build; do
        [ -n "$build" ] || continue
        version=$(echo "$build" | cut -d. -f1-3)
        tests=("${MATRIX_TESTS[@]}")
        if [[ " $MATRIX_CLUSTER_BUILDS " == *" $version "* ]]; then
            tests+=(tests/test_jetstream.py)
        fi
        echo "== SQLite $version (sqlean.py $build): ${tests[*]}" >&2
        KBGRAPH_TEST_SQLITE="$PWD/.venv/sqlite/$build" KBGRAPH_TEST_SQLITE_VERSION="$version" \
            PYTHONPATH="$PWD/tests/sqlite_swap${PYTHONPATH:+:$PYTHONPATH}" \
            .venv/bin/python -m pytest "${tests[@]}" -k "$MATRIX_SKIP" \
            || failed+=("SQLite $version")
    done < tests/sqlite_swap/builds.txt
fi
if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "all runs passed" >&2
