# lib.sh — what the shell tests (tests/t_*.sh) share; each sources it first:
#   . "$(dirname "$0")/lib.sh"
# ok NAME / bad NAME [DETAIL] record one check (DETAIL: its last 25 lines are
# shown, indented); t NAME CONDITION records whether the shell condition holds;
# add_counts TEXT adds the closing line of a sub-run ("N passed, N failed",
# the last one in TEXT; returns 1 when there is none); report prints this
# test's closing line, which run_tests.sh reads, and returns non-zero when a
# check failed.
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    if [ -n "${2:-}" ]; then printf '%s\n' "$2" | tail -n 25 | sed 's/^/    /'; fi
}
t() { # name, then a shell condition
    local name=$1
    shift
    if eval "$@"; then ok "$name"; else bad "$name"; fi
}
add_counts() {
    local line
    line=$(printf '%s\n' "$1" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    [ -n "$line" ] || return 1
    pass=$((pass + $(echo "$line" | awk '{print $1}')))
    fail=$((fail + $(echo "$line" | awk '{print $3}')))
}
report() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
