#!/usr/bin/env bash
# t_flags.sh — honest flags (issue 23): tests/flags_test.py over every flag of the
# tests' own table (tests/flag_table.py) against a tiny-v3 server on loopback:
# refused / warned / started as each kind says, --page-size values, EAGLE3 refused,
# --stream-interval chunks.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$MOESERVE" mkmodel --preset tiny-v3 --seed 7 --out "$tmp/model" >/dev/null 2>&1 ||
    { echo "0 passed, 1 failed"; exit 1; }
MOESERVE=$MOESERVE timeout -k 5 400 /usr/bin/python3 tests/flags_test.py "$tmp/model"
