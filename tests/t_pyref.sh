#!/usr/bin/env bash
# t_pyref.sh — quick self-test of the Python float64 reference (tests/ref/deepseek_ref.py):
# number formats, loader errors, YaRN/RoPE, router cases, naive vs absorbed MLA, torch
# cross-check, CLI JSON; then one end-to-end CLI run.  Needs Debian's /usr/bin/python3 with
# numpy and torch.  Prints "N passed, N failed"; exits non-zero on failure.  Takes ~10 s.
set -u
PY=${PYREF_PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
out=$("$PY" "$here/ref/selftest.py" --quick 2>&1)
rc=$?
printf '%s\n' "$out" | grep -v '^[0-9]* passed, [0-9]* failed$'
add_counts "$out" || [ "$rc" -eq 0 ] || bad "selftest.py exited with $rc"
# end to end through the command line, as make_golden.sh uses it
if "$PY" "$here/ref/make_random_ckpt.py" --preset tiny-v3 --dtype fp8 --layers 2 --out "$tmp/m" &&
   "$PY" "$here/ref/deepseek_ref.py" --model "$tmp/m" --prompt-ids "0" --prompt-ids "3,1,4,1,5" \
        --steps 2 --out "$tmp/g.json" 2>/dev/null &&
   "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["results"];
assert [len(x["steps"]) for x in r]==[3,3] and r[1]["prompt_ids"]==[3,1,4,1,5]
assert all(len(s["logits"])==1024 and s["token"]==max(range(1024),key=lambda i:(s["logits"][i],-i)) for x in r for s in x["steps"])' "$tmp/g.json"
then
    ok cli_end_to_end
else
    bad cli_end_to_end
fi
report
