#!/usr/bin/env bash
# t_v4ref_self.sh — quick self-test of the DeepSeek-V4 float64 reference (tests/ref/v4_ref.py):
# prefill of N tokens equals N single decode steps at every position (window, ratio-4 and
# ratio-128 compressor state, indexer keys), UE8M0 / FP4 / FP8 dequantisation, quantised
# checkpoints, Sinkhorn, loader errors, CLI JSON.  Needs Debian's /usr/bin/python3 (numpy).
# The check against DeepSeek's official model.py (tests/ref/v4_official_check.py) is by hand.
# Prints "N passed, N failed"; exits non-zero on failure.  Takes a few seconds.
set -u
PY=${PYREF_PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/lib.sh"
out=$("$PY" "$here/ref/v4_selftest.py" 2>&1)
rc=$?
printf '%s\n' "$out" | grep -v '^[0-9]* passed, [0-9]* failed$'
add_counts "$out" || bad "v4_selftest.py gave no closing line (exit $rc)" "$out"
[ "$rc" -eq 0 ] || [ "$fail" -gt 0 ] || bad "v4_selftest.py exited with $rc"
report
