#!/usr/bin/env bash
# t_expert_recorder.sh — the expert distribution recorder through the server: a known
# batch (one 20-token prompt, 8 greedy tokens) gives exactly (20 + 7) x top-k routed hits
# in every MoE layer and none in the dense one; the same batch under EP 2 over MPI
# (all-to-all) gives the identical per-expert logical_count (each rank records its own
# rows, the pass is summed over the ranks); per_pass dumps one record per forward pass
# summing to logical_count; a `mkmodel --route-skew 1.2` model routes served tokens with
# the skew it was calibrated for (expert 0 near its 1/top-k cap, the first quarter of the
# experts well over a quarter of the hits); balancedness in /metrics (sglang:eplb_balancedness); the
# endpoints refuse clearly when the recorder is off and a .pt dump.  per_token (also on
# DeepSeek-V4, 1 rank and EP 2), on 1 rank,
# EP 2 (all-to-all) and DP-attention 2 (gathered MoE): the dump's tokens are the batch's
# (prompt then 7 decode steps, positions 0..26) and each token's top-k experts, mapped
# back to logical ids, are the float64 reference's routing of those tokens
# (tests/ref/route_ref.py); each record's counts are its tokens' hits.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
. "$(dirname "$0")/lib.sh"
serve_setup
PROMPT="[0,17,400,999,3,250,64,12,900,33,1,2,3,4,5,6,7,8,9,10]"
BODY="{\"input_ids\": $PROMPT, \"sampling_params\": {\"max_new_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}}"
run_batch() { # $1 = name, rest: serve flags; leaves the dump in $tmp/$1.json
    local name=$1
    shift
    PORT=$(free_port)
    serve_up "$name" "$MOESERVE" serve --model-path "$M" --port "$PORT" --dtype float32 --threads 1 \
        --skip-server-warmup --enable-metrics "$@" || return 1
    curl -s -X POST "http://127.0.0.1:$PORT/start_expert_distribution_record" >"$tmp/$name.start"
    curl -s -X POST "http://127.0.0.1:$PORT/generate" -d "$BODY" >"$tmp/$name.gen"
    curl -s -X POST "http://127.0.0.1:$PORT/dump_expert_distribution_record" >"$tmp/$name.json"
    curl -s "http://127.0.0.1:$PORT/metrics" >"$tmp/$name.metrics"
    curl -s -X POST "http://127.0.0.1:$PORT/dump_expert_distribution_record" -d '{"path": "/tmp/x.pt"}' >"$tmp/$name.pt"
    curl -s -X POST "http://127.0.0.1:$PORT/dump_expert_distribution_record" >"$tmp/$name.again"
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
}
check() { /usr/bin/python3 - "$@" <<'PY'
import json, sys
mode, path, cfg = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3] + "/config.json"))
d = json.load(open(path))
K, E, L = cfg["num_experts_per_tok"], cfg["n_routed_experts"], cfg["num_hidden_layers"]
lc = d["logical_count"]
assert len(lc) == L and all(len(r) == E for r in lc), "shape"
for l in range(L):
    want = 0 if l < cfg["first_k_dense_replace"] else (20 + 7) * K
    assert sum(lc[l]) == want, f"layer {l}: {sum(lc[l])} hits, want {want}"
assert d["physical_to_logical_map"][1] == list(range(E)) or mode != "identity"
if mode == "per_pass":
    recs = d["records"]
    assert len(recs) == d["num_passes"] == 8, f"{len(recs)} records"
    for l in range(L):
        s = [sum(r["global_physical_count"][l][p] for r in recs) for p in range(E)]
        assert s == lc[l], f"layer {l}: records do not sum to logical_count"
print("ok", d["num_passes"], "passes")
PY
}
run_batch one --expert-distribution-recorder-mode per_pass
t "start answers success" 'grep -Eq "\"success\": ?true" "$tmp/one.start"'
out=$(check per_pass "$tmp/one.json" "$M" 2>&1)
t "1 rank per_pass: (20 + 7) x top-k hits per MoE layer, 8 records summing to logical_count ($out)" \
    'echo "$out" | grep -q "^ok"'
t "balancedness in /metrics by SGLang's forward_mode label: the prompt's extend pass and the decode passes (1 rank: 1)" \
    'grep -q "^sglang:eplb_balancedness_count{model_name=\"[^\"]*\",forward_mode=\"extend\"} [1-9]" "$tmp/one.metrics" && grep -q "^sglang:eplb_balancedness_count{model_name=\"[^\"]*\",forward_mode=\"decode\"} [1-9]" "$tmp/one.metrics" && grep -q "^sglang:eplb_balancedness_sum{model_name=\"[^\"]*\",forward_mode=\"decode\"} [1-9]" "$tmp/one.metrics" && grep -q "^moeserve:eplb_layer_balancedness{model_name=\"[^\"]*\",layer=\"1\"} 1.000000" "$tmp/one.metrics"'
t ".pt dump refused (400, names JSON)" 'grep -q "torch pickle" "$tmp/one.pt" && grep -q JSON "$tmp/one.pt"'
t "a dump resets the window" 'grep -Eq "\"num_passes\": ?0[,}]" "$tmp/one.again"'
run_batch ep2 --tp 2 --moe-a2a-backend deepep --expert-distribution-recorder-mode stat
out=$(check stat "$tmp/ep2.json" "$M" 2>&1)
t "EP 2 (all-to-all) stat: the same totals ($out)" 'echo "$out" | grep -q "^ok"'
t "EP 2: logical_count identical to 1 rank" \
    '[ "$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[\"logical_count\"] == json.load(open(sys.argv[2]))[\"logical_count\"])" "$tmp/one.json" "$tmp/ep2.json")" = True ]'
bal=$(grep '^moeserve:eplb_layer_balancedness{.*layer="1"}' "$tmp/ep2.metrics" | awk '{print $2}')
t "EP 2: layer balancedness $bal in [0.5, 1]" \
    '/usr/bin/python3 -c "import sys; b=float(sys.argv[1]); sys.exit(0 if 0.5 <= b <= 1 else 1)" "$bal"'
# the EP 2 metric = (mean + 1e-5) / (max + 1e-5) of per-rank hits of the last pass, from the
# 1-rank per_pass record of the same pass (identity placement: slots [0, E/2) on rank 0)
/usr/bin/python3 - "$tmp/ep2.metrics" "$tmp/one.json" <<'PY' >"$tmp/balchk" 2>&1
import json, re, sys
m, d = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
last = d["records"][-1]["global_physical_count"]
for l, row in enumerate(last):
    if not sum(row):
        continue
    h = len(row) // 2
    loads = [sum(row[:h]), sum(row[h:])]
    want = (sum(loads) / 2 + 1e-5) / (max(loads) + 1e-5)
    got = float(re.search(r'eplb_layer_balancedness\{[^}]*layer="%d"\} (\S+)' % l, m).group(1))
    assert abs(got - want) < 1e-5, f"layer {l}: metric {got}, want {want}"
s = sum(float(v) for v in re.findall(r"sglang:eplb_balancedness_sum\{[^}]*\} (\S+)", m))
n = int(sum(float(v) for v in re.findall(r"sglang:eplb_balancedness_count\{[^}]*\} (\S+)", m)))
assert n >= 8 and 0.5 * n <= s <= n, (s, n)
print("ok")
PY
t "EP 2 balancedness per layer = the formula on the last pass's per-rank hits" 'grep -q "^ok" "$tmp/balchk"' || cat "$tmp/balchk"
# --route-skew: served routing follows the calibrated skew
"$MOESERVE" mkmodel --preset tiny-v3 --seed 7 --route-skew 1.2 --out "$tmp/skew" 2>"$tmp/mk.log"
t "mkmodel --route-skew calibrates every MoE layer's bias" '[ "$(grep -c "router bias for skew 1.20" "$tmp/mk.log")" -ge 3 ]'
M0=$M
M=$tmp/skew
BODY="{\"input_ids\": $(/usr/bin/python3 -c 'import random; r=random.Random(1); print([r.randrange(1000) for _ in range(200)])'), \"sampling_params\": {\"max_new_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}}"
run_batch skew --expert-distribution-recorder-mode stat
M=$M0
out=$(/usr/bin/python3 - "$tmp/skew.json" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
for l, row in enumerate(d["logical_count"][1:], 1):
    s = sum(row)
    e0, q = row[0] / s, sum(row[:4]) / s
    assert e0 >= 0.2 and q >= 0.5, f"layer {l}: expert 0 {e0:.3f}, first quarter {q:.3f}"
print("ok", " ".join(f"{r[0] / sum(r):.2f}" for r in d["logical_count"][1:]))
PY
)
t "skewed model: expert 0's share per layer (cap 0.25) and the first quarter's >= 0.5 ($out)" 'echo "$out" | grep -q "^ok"'
err=$("$MOESERVE" mkmodel --preset tiny-v2 --route-skew 1 --out "$tmp/v2" 2>&1)
t "--route-skew refused without a correction bias" 'echo "$err" | grep -q "needs a router with e_score_correction_bias"'
# refusals
PORT=$(free_port)
serve_up off "$MOESERVE" serve --model-path "$M" --port "$PORT" --threads 1 --skip-server-warmup
r=$(curl -s -w ' %{http_code}' -X POST "http://127.0.0.1:$PORT/start_expert_distribution_record")
t "recorder off: 400 naming the flag" 'echo "$r" | grep -q "expert-distribution-recorder-mode" && echo "$r" | grep -q " 400$"'
kill "$PID" 2>/dev/null
wait "$PID" 2>/dev/null
PID=
# per_token: the recorded tokens and their experts against the float64 reference
tokcheck() { # $1 dump; prints "ok ..." when the records are the batch and its routing
    /usr/bin/python3 - "$1" "$M" "$PROMPT" "$tmp/route.json" <<'PY'
import hashlib, json, os, subprocess, sys
path, model, prompt, route = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
cfg = json.load(open(model + "/config.json"))
K, E, L = cfg["num_experts_per_tok"], cfg["n_routed_experts"], cfg["num_hidden_layers"]
d = json.load(open(path))
recs = d["records"]
assert d["mode"] == "per_token" and len(recs) == 8, f"{len(recs)} records"
ids = sum((r["input_ids"] for r in recs), [])
pos = sum((r["positions"] for r in recs), [])
assert ids[:20] == prompt and len(ids) == 27, ids
assert pos == list(range(27)), pos
assert [r["forward_mode"] for r in recs] == ["EXTEND"] + ["DECODE"] * 7
assert [r["extend_seq_lens"] for r in recs] == [[20]] + [[1]] * 7
route += "." + hashlib.md5(str(ids).encode()).hexdigest()
if not os.path.exists(route):
    subprocess.run(["/usr/bin/python3", os.environ["REF"], "--model", model, "--ids",
                    ",".join(map(str, ids)), "--out", route], check=True)
ref = json.load(open(route))
p2l = d["last_physical_to_logical_map"]
for l in range(L):
    rows = sum((r["topk_ids_of_layer"][l] for r in recs), [])
    assert len(rows) == 27 and all(len(x) == K for x in rows), f"layer {l}: shape"
    if ref["topk"][l] is None:
        assert all(p == -1 for x in rows for p in x), f"dense layer {l} routed"
        continue
    for t, x in enumerate(rows):
        got = sorted(p2l[l][p] for p in x)
        assert got == sorted(ref["topk"][l][t]), f"layer {l} token {t}: {got} vs {sorted(ref['topk'][l][t])}"
    for r in recs: # each record's counts are its own tokens' hits
        h = [0] * len(p2l[l])
        for x in r["topk_ids_of_layer"][l]:
            for p in x:
                h[p] += 1
        assert h == r["global_physical_count"][l], f"layer {l}: counts"
print(f"ok 27 tokens x {L} layers, route margin {ref['route_margin']:.1e}, slot 0 holds {p2l[1][0]} of {len(p2l[1])}")
PY
}
export REF="$(dirname "$0")/ref/route_ref.py"
BODY="{\"input_ids\": $PROMPT, \"sampling_params\": {\"max_new_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}}"
run_batch tok1 --expert-distribution-recorder-mode per_token
out=$(tokcheck "$tmp/tok1.json" 2>&1)
t "per_token, 1 rank: the batch's tokens and their top-k = the float64 reference's routing ($out)" \
    'echo "$out" | grep -q "^ok"'
# EP 2 with 2 redundant slots and a reversed placement: the dump's ids are physical
/usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); E=c["n_routed_experts"]
json.dump({"physical_to_logical_map": [list(range(E))[::-1] + [0, 1]] * c["num_hidden_layers"]}, open(sys.argv[2], "w"))' \
    "$M/config.json" "$tmp/rev.json"
run_batch tokep2 --tp 2 --moe-a2a-backend deepep --expert-distribution-recorder-mode per_token \
    --expert-distribution-recorder-max-tokens 64 --ep-num-redundant-experts 2 --init-expert-location "$tmp/rev.json"
out=$(tokcheck "$tmp/tokep2.json" 2>&1)
t "per_token, EP 2 all-to-all, 2 redundant slots, reversed placement: the same ($out)" \
    'echo "$out" | grep -q "^ok.*slot 0 holds $(( $(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[\"n_routed_experts\"])" "$M/config.json") - 1 )) of"'
run_batch tokdp2 --tp 2 --dp 2 --enable-dp-attention --expert-distribution-recorder-mode per_token
out=$(tokcheck "$tmp/tokdp2.json" 2>&1)
t "per_token, DP-attention 2 (gathered MoE): the same ($out)" 'echo "$out" | grep -q "^ok"'
# the cap: 20 rows keep the last 20 tokens' passes only (the 20-token prefill and 7 decodes: 7)
run_batch tokcap --expert-distribution-recorder-mode per_token --expert-distribution-recorder-max-tokens 20
out=$(/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["records"]; print(d["max_tokens"], len(r), sum(len(x["input_ids"]) for x in r), d["num_passes"], sum(map(sum, d["logical_count"])))' "$tmp/tokcap.json" 2>&1)
t "per_token --expert-distribution-recorder-max-tokens 20: 7 decode records kept of 8 passes, logical_count whole ($out)" \
    '[ "$out" = "20 7 7 8 $(( 27 * $(/usr/bin/python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c[\"num_experts_per_tok\"] * (c[\"num_hidden_layers\"] - c[\"first_k_dense_replace\"]))" "$M/config.json") ))" ]'
# per_token on DeepSeek-V4 (tiny-v4: hash-routed first layers, then biased top-k; every
# layer MoE): 8 records, the batch's 27 tokens in order, k experts per token and layer,
# each record's counts its own tokens' hits; EP 2 the same
if "$MOESERVE" mkmodel --preset tiny-v4 --dtype bf16 --seed 4 --out "$tmp/v4" >/dev/null 2>&1; then
    M=$tmp/v4
    v4check() {
        /usr/bin/python3 - "$1" "$M" "$PROMPT" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); cfg = json.load(open(sys.argv[2] + "/config.json")); prompt = json.loads(sys.argv[3])
K, E, L = cfg["num_experts_per_tok"], cfg["n_routed_experts"], cfg["num_hidden_layers"]
recs = d["records"]
assert d["mode"] == "per_token" and len(recs) == 8, f"{len(recs)} records"
ids = sum((r["input_ids"] for r in recs), [])
assert ids[:20] == prompt and len(ids) == 27, ids
for l in range(L):
    rows = sum((r["topk_ids_of_layer"][l] for r in recs), [])
    assert len(rows) == 27 and all(len(x) == K and all(0 <= p < E for p in x) for x in rows), f"layer {l}"
    for r in recs:
        h = [0] * E
        for x in r["topk_ids_of_layer"][l]:
            for p in x: h[p] += 1
        assert h == r["global_physical_count"][l], f"layer {l}: counts"
assert sum(map(sum, d["logical_count"])) == 27 * K * L
print(f"ok 27 tokens x {L} layers x top-{K}")
PY
    }
    run_batch tokv4 --expert-distribution-recorder-mode per_token
    out=$(v4check "$tmp/tokv4.json" 2>&1)
    t "per_token, DeepSeek-V4, 1 rank: the batch's tokens, top-k per layer, counts ($out)" 'echo "$out" | grep -q "^ok"'
    run_batch tokv4ep --tp 2 --moe-a2a-backend deepep --expert-distribution-recorder-mode per_token
    out=$(v4check "$tmp/tokv4ep.json" 2>&1)
    t "per_token, DeepSeek-V4, EP 2 all-to-all: the same ($out)" 'echo "$out" | grep -q "^ok"'
    M=$M0
else
    t "tiny-v4 mkmodel" false
fi
err=$("$MOESERVE" serve --model-path "$M" --expert-distribution-recorder-mode per_tok 2>&1)
t "an unknown recorder mode refused naming the modes" 'echo "$err" | grep -q "expected stat, per_pass or per_token"'
report
