#!/usr/bin/env bash
# The release as a user gets it, without the checkout: build the sdist and the wheel
# (python -m build, the wheel built from the sdist), install the wheel with [all] into a clean
# venv in a temporary folder, run `kbgraph demo` from there on a free loopback port, ask KB
# homelab a graph_context question over HTTP with the token the demo printed, check that the
# answer names a note of the example vault served from the installed package, and stop the
# service. Every wait has a deadline. Prints the stages' durations; the last line is JSON.
# Needs python3 with venv, and `build` in .venv (the [test] extra); about 2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON="${KBGRAPH_SMOKE_PYTHON:-$ROOT/.venv/bin/python}"
READY_SECONDS="${KBGRAPH_SMOKE_READY_SECONDS:-300}"  # seeding, the vault and the first JIT
STOP_SECONDS=20
work=$(mktemp -d "${TMPDIR:-/tmp}/kbgraph-wheel-smoke.XXXXXX")
server=""
cleanup() {
    if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
        kill -KILL "$server" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
start=$(now)

echo "wheel-smoke: building the sdist and the wheel in $work/dist" >&2
"$PYTHON" -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log" >&2; exit 1; }
wheel=$(ls "$work"/dist/kbgraph-*.whl)
ls "$work"/dist/kbgraph-*.tar.gz >/dev/null
built=$(since "$start")

echo "wheel-smoke: installing $(basename "$wheel")[all] into a clean venv" >&2
t=$(now)
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel[all]" \
    >"$work/pip.log" 2>&1 || { tail -30 "$work/pip.log" >&2; exit 1; }
installed=$(since "$t")
venv_mb=$(du -sm "$work/venv" | cut -f1)

port=$("$work/venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir "$work/run"
echo "wheel-smoke: kbgraph demo on 127.0.0.1:$port (from $work/run, not the checkout)" >&2
t=$(now)
(cd "$work/run" && exec env -u PYTHONPATH "$work/venv/bin/kbgraph" demo --dir demo --port "$port" \
    --size 200 >"$work/demo.log" 2>&1) &
server=$!

# The question, the answer's check and every wait's deadline, with the venv's own Python
"$work/venv/bin/python" - "$work/demo.log" "$port" "$READY_SECONDS" "$ROOT/examples/vault" \
    "$work/venv" <<'PY' || { echo "--- demo log" >&2; tail -40 "$work/demo.log" >&2; exit 1; }
import json, pathlib, re, sys, time, urllib.request

log, port, ready_seconds, vault, venv = sys.argv[1:]
deadline = time.monotonic() + float(ready_seconds)
base = f"http://127.0.0.1:{port}"
token = None
while True:
    if time.monotonic() > deadline:
        sys.exit(f"wheel-smoke: not ready within {ready_seconds} s")
    text = pathlib.Path(log).read_text()
    found = re.search(r"^admin token: (\S+)$", text, re.M)
    token = found.group(1) if found else None
    if token:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=5) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
    time.sleep(0.5)
served = re.search(r"^KB 'homelab' from (.+):$", text, re.M)
if not served or not pathlib.Path(served.group(1)).resolve().is_relative_to(pathlib.Path(venv).resolve()):
    sys.exit(f"wheel-smoke: KB homelab not served from the installed package: {served and served.group(1)}")
question = {"query": "how do I get the photos off my phone", "limit": 5}
request = urllib.request.Request(
    f"{base}/v1/kbs/homelab/tools/graph_context",
    data=json.dumps(question).encode(),
    headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
)
with urllib.request.urlopen(request, timeout=30) as answer:
    body = json.load(answer)
notes = {str(p.relative_to(vault).with_suffix("")) for p in pathlib.Path(vault).rglob("*.md")}
named = [item["id"] for item in body["seeds"] + body["results"] if item["id"] in notes]
if not named:
    sys.exit(f"wheel-smoke: the answer names no note of the example vault: {body}")
print(f"wheel-smoke: answered with {named[:3]}", file=sys.stderr)
PY
answered=$(since "$t")

t=$(now)
kill -TERM "$server"
for _ in $(seq $((STOP_SECONDS * 10))); do
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$server" 2>/dev/null; then
    echo "wheel-smoke: the demo did not stop within $STOP_SECONDS s" >&2
    exit 1
fi
server=""
if "$work/venv/bin/python" -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 2)' "$port" 2>/dev/null; then
    echo "wheel-smoke: something still answers on port $port after the demo stopped" >&2
    exit 1
fi
stopped=$(since "$t")
printf '{"kind":"wheel_smoke","ok":true,"seconds":%.1f,"build_s":%.1f,"install_s":%.1f,"first_answer_s":%.1f,"stop_s":%.1f,"venv_mb":%d}\n' \
    "$(since "$start")" "$built" "$installed" "$answered" "$stopped" "$venv_mb"
