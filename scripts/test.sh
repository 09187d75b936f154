#!/usr/bin/env bash
# The whole test suite on a fresh machine: install, lint, then pytest (extra args go to pytest).
# Hypothesis runs its deterministic "ci" profile here (tests/conftest.py): every run draws the
# same examples, so the result never depends on chance or on an earlier run. Every test has a
# deadline (pyproject.toml, pytest-timeout): one that hangs fails with its stack.
#
# The whole suite runs on Debian 13 (Python 3.13, SQLite 3.46: the newest a stable
# distribution gives), in the chroot scripts/test-debian13.sh builds and keeps (root and the
# package registries needed); KBGRAPH_DEBIAN13=0 runs it on this machine's Python instead (the
# default when not root).
#
# Then the SQLite matrix, on this machine's Python: the store, ingest, crash and JetStream tests
# again on each SQLite build of tests/sqlite_swap/builds.txt (sqlean.py wheels from PyPI,
# installed by setup.sh),
# swapped in for the sqlite3 module by tests/sqlite_swap/sitecustomize.py in the test process
# and every server it starts. Each run prints the SQLite it used (pytest's header) and
# tests/test_sqlite_matrix.py asserts it. KBGRAPH_SQLITE_MATRIX=0 skips the matrix.
# Every run goes on after a failed one; the script fails if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
stage_start=$SECONDS
took() {  # how long the stage just ended took (docs/getting-started.md lists them)
    echo "== took $((SECONDS - stage_start)) s: $1" >&2
    stage_start=$SECONDS
}
bash scripts/setup.sh
took "setup (venv, packages)"
.venv/bin/ruff check kbgraph tests loadtest
.venv/bin/ruff format --check kbgraph tests loadtest
.venv/bin/mypy  # strict on kbgraph/ and loadtest/ (pyproject.toml [tool.mypy])
took "lint and types"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
MATRIX_TESTS=(
    tests/test_sqlite_matrix.py tests/test_store_json_text.py tests/test_store.py
    tests/test_ingest.py tests/test_ingest_hardening.py tests/test_crash.py
    tests/test_jetstream_unit.py
)
# Kept within .ci/run's budget: the whole JetStream cluster file (4 minutes a build) runs
# once, on the machine's SQLite. On 3.45.1, the release whose JSONB reading halted clusters, a
# three-node cluster takes writes and decides as one store, and snapshots trim the stream and
# restore a fresh node (SQLite's backup API); every build runs the store, ingest, crash and
# JetStream unit tests, which hold every statement the cluster's nodes run. The 75 s
# kill-and-restart cycle of three nodes runs once, in the whole suite.
MATRIX_SKIP="not test_kills_lose_no_acknowledged_delivery"
MATRIX_CLUSTER_BUILDS="3.45.1"
MATRIX_CLUSTER_TESTS=(
    "tests/test_jetstream.py::test_two_nodes_one_kb_decide_as_one_store"
    "tests/test_jetstream_snapshots.py::test_snapshots_trim_the_stream_and_a_fresh_node_starts_from_one"
)
failed=()
debian13="${KBGRAPH_DEBIAN13:-$([ "$(id -u)" = 0 ] && echo 1 || echo 0)}"
if [ "$debian13" != 0 ]; then
    echo "== the whole suite on Debian 13 (scripts/test-debian13.sh)" >&2
    bash scripts/test-debian13.sh "$@" || failed+=("the whole suite (Debian 13)")
    took "the whole suite on Debian 13 (chroot, its packages, the suite)"
else
    echo "== the whole suite on $(.venv/bin/python --version), this machine's SQLite" >&2
    .venv/bin/python -m pytest "$@" || failed+=("the whole suite (this machine)")
    took "the whole suite"
fi
if [ "${KBGRAPH_SQLITE_MATRIX:-1}" != 0 ]; then
    while read -r build; do
        [ -n "$build" ] || continue
        version=$(echo "$build" | cut -d. -f1-3)
        tests=("${MATRIX_TESTS[@]}")
        if [[ " $MATRIX_CLUSTER_BUILDS " == *" $version "* ]]; then
            tests+=("${MATRIX_CLUSTER_TESTS[@]}")
        fi
        echo "== SQLite $version (sqlean.py $build): ${tests[*]}" >&2
        KBGRAPH_TEST_SQLITE="$PWD/.venv/sqlite/$build" KBGRAPH_TEST_SQLITE_VERSION="$version" \
            PYTHONPATH="$PWD/tests/sqlite_swap${PYTHONPATH:+:$PYTHONPATH}" \
            .venv/bin/python -m pytest "${tests[@]}" -k "$MATRIX_SKIP" \
            || failed+=("SQLite $version")
        took "SQLite $version"
    done < tests/sqlite_swap/builds.txt
fi
# The release as a user installs it: the wheel with [all] in a clean venv, its demo asked a
# question (scripts/wheel-smoke.sh). KBGRAPH_WHEEL_SMOKE=0 skips it.
if [ "${KBGRAPH_WHEEL_SMOKE:-1}" != 0 ]; then
    echo "== the wheel, installed in a clean venv, and its demo (scripts/wheel-smoke.sh)" >&2
    bash scripts/wheel-smoke.sh || failed+=("the wheel smoke")
    took "the wheel smoke"
fi
if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "all runs passed" >&2
