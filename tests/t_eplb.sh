#!/usr/bin/env bash
# t_eplb.sh — `moeserve eplb`: the upstream README golden printed exactly by --json,
# the global-policy fallback, a recorded distribution ({"logical_count": [steps][L][E]})
# read as its sum over steps, clear refusals (.pt, a bad --algorithm, replicas that do
# not divide over the GPUs), and 40 seeded random shapes against the independent
# re-derivation tests/ref/eplb_ref.py.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
cat >"$tmp/w.json" <<'J'
[[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
 [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
J
want='{"phy2log": [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1], [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]], "logcnt": [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1], [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1]], "log2phy": [[[12, -1], [15, 13], [11, -1], [6, -1], [7, 5], [0, 2], [1, -1], [3, -1], [4, -1], [9, -1], [8, 10], [14, -1]], [[13, -1], [15, 11], [8, -1], [14, -1], [9, -1], [10, 12], [2, 4], [0, -1], [6, 3], [7, -1], [1, -1], [5, -1]]]}'
args="--num-replicas 16 --num-groups 4 --num-nodes 2 --num-gpus 8"
got=$("$MOESERVE" eplb --weights "$tmp/w.json" $args --json 2>&1)
t "README golden, --json exactly" '[ "$got" = "$want" ]' || echo "$got"
txt=$("$MOESERVE" eplb --weights "$tmp/w.json" $args 2>&1)
t "table names the hierarchical policy and each layer" \
    'echo "$txt" | grep -q "^policy deepseek_hierarchical" && [ "$(echo "$txt" | grep -c "phy2log \[")" = 2 ]'
glob=$("$MOESERVE" eplb --weights "$tmp/w.json" --num-replicas 16 --num-groups 3 --num-nodes 2 --num-gpus 8 --json)
t "3 groups over 2 nodes: the global policy (testing.md golden)" \
    'echo "$glob" | grep -q "\"phy2log\": \[\[10, 6, 10, 7, 0, 2, 11, 4, 5, 9, 5, 4, 8, 3, 1, 1\], \[1, 10, 2, 4, 5, 11, 5, 0, 6, 7, 6, 3, 8, 8, 9, 7\]\]"'
# a recorded distribution: two steps summing to the golden loads
/usr/bin/python3 -c "
import json; w=json.load(open('$tmp/w.json'))
a=[[x//2 for x in r] for r in w]; b=[[x-x//2 for x in r] for r in w]
json.dump({'logical_count': [a, b], 'physical_to_logical_map': [list(range(12))]*2}, open('$tmp/rec.json','w'))"
rec=$("$MOESERVE" eplb --weights "$tmp/rec.json" $args --json 2>&1)
t "recorded logical_count [steps][L][E] = its sum" '[ "$rec" = "$want" ]'
cp "$tmp/w.json" "$tmp/d.pt"
err=$("$MOESERVE" eplb --weights "$tmp/d.pt" $args 2>&1)
t ".pt refused naming JSON" 'echo "$err" | grep -q "torch pickle" && echo "$err" | grep -q JSON'
err=$("$MOESERVE" eplb --weights "$tmp/w.json" $args --algorithm waterfill 2>&1)
t "bad --algorithm refused" 'echo "$err" | grep -q "auto, deepseek or deepseek_hierarchical"'
"$MOESERVE" eplb --weights "$tmp/w.json" --num-replicas 15 --num-groups 4 --num-nodes 2 --num-gpus 8 >/dev/null 2>"$tmp/e"
rc=$?
t "15 replicas over 8 GPUs refused (exit 2)" '[ $rc -eq 2 ] && grep -q "do not divide over 8 GPUs" "$tmp/e"'
"$MOESERVE" eplb --weights "$tmp/w.json" --num-replicas 16 --num-groups 3 --num-nodes 2 --num-gpus 8 \
    --algorithm deepseek_hierarchical >/dev/null 2>"$tmp/e"
rc=$?
t "deepseek_hierarchical with groups not dividing by nodes refused" '[ $rc -eq 2 ] && grep -q "divide over 2 nodes" "$tmp/e"'
mkdir "$tmp/cases"
/usr/bin/python3 "$(dirname "$0")/ref/eplb_ref.py" "$tmp/cases" 40 27
nbad=0
for i in $(seq 0 39); do
    g=$("$MOESERVE" eplb --weights "$tmp/cases/case_$i.json" $(cat "$tmp/cases/case_$i.args") --json 2>&1)
    if [ "$g" != "$(cat "$tmp/cases/case_$i.want.json")" ]; then
        nbad=$((nbad + 1))
        echo "case $i ($(cat "$tmp/cases/case_$i.args")): $g"
    fi
done
t "40 random shapes = the Python re-derivation ($nbad differ)" '[ $nbad -eq 0 ]'
report
