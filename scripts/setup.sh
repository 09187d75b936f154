#!/usr/bin/env bash
# Creates .venv (once) and installs kbgraph with its test and load-test extras into it; installs
# Debian's chromium and chromium-driver for the explorer's browser tests when they are missing
# (root and apt-get needed; without them those tests are skipped with a loud message), and curl
# and openssl, which the shell examples of the docs use (tests/test_docs.py runs them), and
# systemd, whose systemd-analyze checks the example unit (tests/test_first_hour.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
# The SQLite builds of the tests' matrix (scripts/test.sh), each in its own folder: they are one
# package (sqlean.py, a drop-in sqlite3 module) in several versions, swapped in by the tests only.
[ "${KBGRAPH_SQLITE_MATRIX:-1}" = 0 ] || while read -r build; do
    if [ -n "$build" ] && [ ! -d ".venv/sqlite/$build/sqlean" ]; then
        .venv/bin/python -m pip install --quiet --disable-pip-version-check \
            --target ".venv/sqlite/$build" "sqlean.py==$build"
    fi
done < tests/sqlite_swap/builds.txt
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "setup: installing chromium and chromium-driver (browser tests)" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            chromium chromium-driver; } >/dev/null 2>&1 \
            || echo "setup: could not install chromium: the browser tests will be skipped" >&2
    else
        echo "setup: no chromium and no root apt-get: the browser tests will be skipped" >&2
    fi
fi
if ! command -v curl >/dev/null || ! command -v openssl >/dev/null; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "setup: installing curl and openssl (the docs' shell examples)" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            curl openssl; } >/dev/null 2>&1 \
            || echo "setup: could not install curl and openssl: tests/test_docs.py will fail" >&2
    else
        echo "setup: curl or openssl missing and no root apt-get: tests/test_docs.py will fail" >&2
    fi
fi
if ! command -v systemd-analyze >/dev/null; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "setup: installing systemd (systemd-analyze verify checks examples/systemd/)" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends systemd; } >/dev/null 2>&1 \
            || echo "setup: could not install systemd: the unit's test will be skipped" >&2
    else
        echo "setup: no systemd-analyze and no root apt-get: the unit's test will be skipped" >&2
    fi
fi
