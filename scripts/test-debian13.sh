#!/usr/bin/env bash
# The whole test suite on Debian 13 "trixie" (Python 3.13, SQLite 3.46): a debootstrap chroot
# built from Debian's packages, the repository copied in, scripts/test.sh run there on the
# chroot's own Python and SQLite (the sqlean.py matrix is this machine's job). scripts/test.sh
# calls it (so .ci/run does); alone, as root:
#
#   bash scripts/test-debian13.sh [pytest args]
#
# The chroot is kept (DEBIAN13_ROOT, default /var/tmp/kbgraph-trixie) with its apt and pip
# caches and its .venv, and reused by the next run: a fresh machine builds it (debootstrap,
# then chromium and the Python packages), a later run only brings them up to date. Delete the
# folder to start afresh. Everything comes from Debian's packages and PyPI: pip in the chroot
# uses this machine's CA bundle, timeout and proxy settings, not its local wheel folders.
# e2fsprogs (chattr) is part of the chroot so the read-only-store tests run rather than skip.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
ROOT="${DEBIAN13_ROOT:-/var/tmp/kbgraph-trixie}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[ "$(id -u)" = 0 ] || { echo "test-debian13: needs root (debootstrap, chroot)" >&2; exit 2; }
started=$SECONDS
# One run at a time in the chroot (another checkout's run waits here rather than mix trees).
mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock 9
if ! command -v debootstrap >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
fi
if [ ! -x "$ROOT/usr/bin/python3" ]; then
    echo "test-debian13: building the trixie chroot in $ROOT" >&2
    # a build cut short is started again (never across a file system still mounted there)
    rm -rf --one-file-system "$ROOT"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,e2fsprogs \
        trixie "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 \
        || { tail -20 "$ROOT.debootstrap.log" >&2; exit 1; }
    echo "test-debian13: chroot built in $((SECONDS - started)) s" >&2
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
# Debian packages the suite needs beyond debootstrap's, installed into a kept chroot too: a real
# MediaWiki served by php -S (tests/mediawiki_server.py). policy-rc.d keeps apt from starting
# the web server they bring (apache2) in the chroot.
CHROOT_PACKAGES="mediawiki php-cli php-sqlite3"
installed=$(chroot "$ROOT" dpkg-query -W -f='${db:Status-Status}\n' $CHROOT_PACKAGES 2>/dev/null \
    | grep -c '^installed$' || true)
if [ "$installed" != "$(echo $CHROOT_PACKAGES | wc -w)" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
    chmod 755 "$ROOT/usr/sbin/policy-rc.d"
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        DEBIAN_FRONTEND=noninteractive sh -c "apt-get update -qq \
            && apt-get install -y -qq --no-install-recommends $CHROOT_PACKAGES" \
        >"$ROOT.apt.log" 2>&1 || { tail -20 "$ROOT.apt.log" >&2; exit 1; }
    echo "test-debian13: installed $CHROOT_PACKAGES in the chroot" >&2
fi
# The working tree as it is (committed or not), without this machine's venv, in place of the
# last run's; the chroot's own .venv, pip cache and numba cache (NUMBA_CACHE_DIR) stay.
mkdir -p "$ROOT/kbgraph"
find "$ROOT/kbgraph" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +
tar -C "$REPO" --exclude=./.venv --exclude=./.git --exclude='*/__pycache__' -cf - . \
    | tar -C "$ROOT/kbgraph" -xf -
# pip as this machine's is set up to reach PyPI (its CA bundle, its timeout, a proxy if any).
forward=()
for name in PIP_DEFAULT_TIMEOUT PIP_INDEX_URL http_proxy https_proxy no_proxy HTTP_PROXY \
    HTTPS_PROXY NO_PROXY CI HYPOTHESIS_PROFILE; do
    [ -z "${!name:-}" ] || forward+=("$name=${!name}")
done
chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    DEBIAN_FRONTEND=noninteractive KBGRAPH_SQLITE_MATRIX=0 KBGRAPH_DEBIAN13=0 \
    KBGRAPH_WHEEL_SMOKE=0 "${forward[@]}" \
    NUMBA_CACHE_DIR=/var/cache/kbgraph-numba \
    bash -c 'cd /kbgraph && echo "== $(. /etc/os-release; echo "$PRETTY_NAME"), $(python3 --version)" >&2 && bash scripts/test.sh "$@"' \
    test-debian13 "$@" 9>&-  # the lock is this script's, not the tests' servers'
