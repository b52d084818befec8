#!/usr/bin/env bash
# t_deterministic.sh — `serve --enable-deterministic-inference` (issue 29 item 6) on
# the tiny-v3 model (BF16 weights, --dtype auto): 16 concurrent greedy requests give
# exactly the tokens each gives alone over 200 tokens, and without the flag the same
# check sees batch-dependent tokens (tests/deterministic_test.py).  The kernel-level
# property (each row of an M-row product has the bits of M = 1, every path) is
# build/tests/test_kernels' matmul_batch_invariant.  Prints "N passed, N failed".
set -u
export MOESERVE=${MOESERVE:-build/moeserve}
. "$(dirname "$0")/lib.sh"
serve_setup
out=$(/usr/bin/python3 tests/deterministic_test.py "$M" 200 2>&1)
printf '%s\n' "$out" | grep -v '^[0-9]* passed'
add_counts "$out" || bad "deterministic_test.py" "$out"
report
