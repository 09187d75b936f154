#!/usr/bin/env bash
# The whole test suite on Debian 13 "trixie" (Python 3.13, SQLite 3.46): a debootstrap chroot
# built from Debian's packages, the repository copied in, scripts/test.sh run there on the
# chroot's own SQLite (the sqlean.py matrix is this machine's job: KBGRAPH_SQLITE_MATRIX=0).
# Not part of .ci/run (building the chroot and installing the dependencies takes longer than
# CI's budget allows); run it by hand, as root, before a release or after a platform change.
#
#   sudo bash scripts/test-debian13.sh [pytest args]
#
# The chroot is kept (DEBIAN13_ROOT, default /var/tmp/kbgraph-trixie) and reused by the next
# run; delete it to start afresh. setup.sh installs chromium in the chroot (apt-get as root) so
# the explorer's browser tests run there too; e2fsprogs (chattr) is part of the chroot so the
# read-only-store tests run rather than skip.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
ROOT="${DEBIAN13_ROOT:-/var/tmp/kbgraph-trixie}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[ "$(id -u)" = 0 ] || { echo "test-debian13: needs root (debootstrap, chroot)" >&2; exit 2; }
if ! command -v debootstrap >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
fi
if [ ! -x "$ROOT/usr/bin/python3" ]; then
    echo "test-debian13: building the trixie chroot in $ROOT" >&2
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,e2fsprogs \
        trixie "$ROOT" "$MIRROR"
fi
# The host's resolver and CA bundle (a proxying CA, if this machine has one) for apt and pip.
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
mounted=()
cleanup() {
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" || true; done
}
trap cleanup EXIT
for fs in proc sys dev dev/pts dev/shm; do
    mkdir -p "$ROOT/$fs"
    if ! mountpoint -q "$ROOT/$fs"; then
        case $fs in
            proc) mount -t proc proc "$ROOT/proc" ;;
            dev/shm) mount -t tmpfs -o mode=1777 shm "$ROOT/dev/shm" ;;
            *) mount --rbind "/$fs" "$ROOT/$fs"; mount --make-rslave "$ROOT/$fs" ;;
        esac
        mounted+=("$ROOT/$fs")
    fi
done
# The working tree as it is (committed or not), without this machine's venv; the chroot's
# own .venv and pip cache stay between runs.
mkdir -p "$ROOT/kbgraph"
tar -C "$REPO" --exclude=./.venv --exclude=./.git --exclude='*/__pycache__' -cf - . \
    | tar -C "$ROOT/kbgraph" -xf -
chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    DEBIAN_FRONTEND=noninteractive KBGRAPH_SQLITE_MATRIX=0 \
    bash -c 'cd /kbgraph && echo "== $(. /etc/os-release; echo "$PRETTY_NAME"), $(python3 --version)" >&2 && bash scripts/test.sh "$@"' \
    test-debian13 "$@"
