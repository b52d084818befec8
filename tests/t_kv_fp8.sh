#!/usr/bin/env bash
# t_kv_fp8.sh — `--kv-cache-dtype fp8_e4m3` on DeepSeek-V3's MLA latent cache
# (e4m3 values, per-tensor scale 1 as SGLang's default k_scale):
#   pool      the KV pool's bytes per token halve (BF16 -> FP8; FP32 -> FP8 with
#             --dtype float32 is a quarter), tiny-v3;
#   tiny      generate runs prefill and decode over an FP8 cache; the prefill's
#             last-position logits are within 0.1 of max|logit| of the BF16
#             cache's and its greedy token is the same (random weights: the
#             latents are wide, e4m3's 3 mantissa bits show);
#   small     models/small-code (trained) `perplexity --kl-base` against the BF16
#             cache's logits on 8 held-out windows: mean KL <= 0.005, top-1
#             agreement >= 0.95 (measured: bench/RESULTS.md);
#   refused   fp8_e5m2 and fp16 are refused naming the flag.
# Prints "N passed, N failed".
set -u
MOESERVE=${MOESERVE:-build/moeserve}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"

"$MOESERVE" mkmodel --preset tiny-v3 --seed 7 --out "$tmp/m" >/dev/null 2>&1 || { bad mkmodel; report; exit 1; }
P="The quick brown fox jumps over the lazy dog and"
per_tok() { echo "$1" | grep 'KV pool:' | sed 's/.* \([0-9]*\) B per token.*/\1/' | head -1; }
for d in auto fp8_e4m3; do
    out=$("$MOESERVE" generate --model "$tmp/m" --prompt "$P" --max-new-tokens 8 --threads 1 \
          --kv-cache-dtype $d --dump-logits "$tmp/$d.jsonl" 2>&1)
    t "generate --kv-cache-dtype $d" "[ -s '$tmp/$d.jsonl' ]" || printf '%s\n' "$out" | tail -5
    eval "b_$d=\$(per_tok \"\$out\")"
done
t "pool: FP8 bytes per token ($b_fp8_e4m3) = BF16's ($b_auto) / 2" \
    "[ -n '$b_auto' ] && [ $((b_auto)) -eq $((2 * b_fp8_e4m3)) ]"
out=$("$MOESERVE" generate --model "$tmp/m" --prompt "$P" --max-new-tokens 2 --threads 1 \
      --dtype float32 --kv-cache-dtype fp8_e4m3 2>&1)
t "pool: FP8 with --dtype float32 is FP32's / 4 ($(per_tok "$out") B)" "[ \$((4 * $(per_tok "$out"))) -eq \$((2 * b_auto)) ]"
out=$(/usr/bin/python3 - "$tmp/auto.jsonl" "$tmp/fp8_e4m3.jsonl" <<'EOF'
import json, sys
a = json.loads(open(sys.argv[1]).readline()); b = json.loads(open(sys.argv[2]).readline())
m = max(abs(v) for v in a["logits"])
e = max(abs(p - q) for p, q in zip(a["logits"], b["logits"])) / m
print("%.4f %d %d" % (e, a["token"], b["token"]))
EOF
)
set -- $out
echo "    tiny-v3 prefill: max |logit change| / max|logit| = $1 (tokens $2 / $3)"
t "tiny: prefill logits within 0.1 ($1)" "awk -v e=${1:-9} 'BEGIN { exit !(e <= 0.1) }'"
t "tiny: same greedy token after the prefill" "[ '${2:-x}' = '${3:-y}' ]"

M=models/small-code
cat /usr/lib/python3.11/hmac.py /usr/lib/python3.11/netrc.py >"$tmp/held.py"
out=$("$MOESERVE" perplexity --model "$M" --file "$tmp/held.py" --ctx 256 --stride 128 --chunks 8 \
      --threads 2 --save-logits "$tmp/bf16.lg" 2>&1)
t "small: perplexity with the BF16 cache" "echo \"\$out\" | grep -q '^result:'" || printf '%s\n' "$out" | tail -5
out=$("$MOESERVE" perplexity --model "$M" --file "$tmp/held.py" --ctx 256 --stride 128 --chunks 8 \
      --threads 2 --kv-cache-dtype fp8_e4m3 --kl-base "$tmp/bf16.lg" 2>&1)
res=$(echo "$out" | grep '^result:')
if [ -z "$res" ]; then
    bad "small: perplexity with the FP8 cache" "$out"
else
    kl=$(echo "$res" | sed 's/.* kl_mean=\([0-9.]*\).*/\1/')
    top1=$(echo "$res" | sed 's/.* top1=\([0-9.]*\).*/\1/')
    echo "    $(echo "$out" | grep '^KL')"
    t "small: mean KL $kl <= 0.005" "awk -v a=$kl 'BEGIN { exit !(a <= 0.005) }'"
    t "small: top-1 agreement $top1 >= 0.95" "awk -v a=$top1 'BEGIN { exit !(a >= 0.95) }'"
fi

for d in fp8_e5m2 fp16; do
    out=$("$MOESERVE" generate --model "$tmp/m" --prompt hi --max-new-tokens 1 --kv-cache-dtype $d 2>&1)
    t "refused: --kv-cache-dtype $d" "echo \"\$out\" | grep -q -- '--kv-cache-dtype $d: not implemented'"
done
report
