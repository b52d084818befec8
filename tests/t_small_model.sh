#!/usr/bin/env bash
# t_small_model.sh — the committed trained checkpoint (models/small-code, made by
# `make train`, tools/train/) judged through the engine, bounds fixed by issue 24:
#   load        the engine loads it (MTP layer included) and the manifest matches
#               this machine's held-out files;
#   torch       tools/train/model.py (float64) equals `generate --dtype float32`:
#               logits at 3 held-out prompts and 8 greedy steps (1e-4 relative),
#               and `perplexity --dtype float32` over 2 windows (window semantics);
#   bpb         bits per byte on held-out files (`perplexity --ctx 256 --stride 128`)
#               below gzip -9 on exactly the scored bytes (xz -9e recorded);
#   fp8         FP8 weights (tools/train/to_fp8.py) against the BF16 run's saved
#               logits: mean KL <= 0.01 and top-1 agreement >= 95 %;
#   generate    greedy continuations of 4 prompts: distinct tokens / 64 >= 0.3;
#   mtp         the MTP head's agreement with the model's own greedy token after
#               next (tools/train/mtp_agree.py) is printed (recorded, no bound).
# Needs Debian's /usr/bin/python3 (numpy, torch), gzip and xz.  Prints
# "N passed, N failed".
set -u
PY=${PYREF_PYTHON:-/usr/bin/python3}
MOESERVE=${MOESERVE:-build/moeserve}
M=models/small-code
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
HELD="/usr/lib/python3.11/hmac.py /usr/lib/python3.11/netrc.py"

# the held-out files are the manifest's, unchanged
ok_files=1
for f in $HELD; do
    line=$(awk -F'\t' -v p="$f" '$4 == p' "$M/manifest.tsv")
    if [ "$(echo "$line" | cut -f1)" != heldout ] || [ ! -f "$f" ] ||
       [ "$(sha256sum "$f" | cut -d' ' -f1)" != "$(echo "$line" | cut -f3)" ]; then
        bad "manifest: $f is not an unchanged held-out file here"
        ok_files=0
    fi
done
[ "$ok_files" = 1 ] && ok "manifest: held-out files match"
cat $HELD >"$tmp/held.py"
printf '%s\n' $HELD >"$tmp/held.list"

out=$("$MOESERVE" generate --model "$M" --prompt-ids 0 --max-new-tokens 1 2>&1)
if echo "$out" | grep -q "(+1 MTP)"; then ok "load: 4 layers + the MTP layer"; else bad "load" "$out"; fi

# torch model == engine
"$MOESERVE" tokenizer encode --model "$M" --out "$tmp/held.bin" --list "$tmp/held.list" >/dev/null
out=$("$PY" tools/train/check_logits.py --model "$M" --ids "$tmp/held.bin" --moeserve "$MOESERVE" \
      --ppl-file /usr/lib/python3.11/hmac.py --ppl-ctx 128 --ppl-chunks 2 2>&1)
printf '%s\n' "$out" | grep -v '^[0-9]* passed' | sed 's/^/    /'
add_counts "$out" || bad "check_logits.py" "$out"

# bits per byte against gzip / xz, and the BF16 logits for the FP8 comparison
out=$("$MOESERVE" perplexity --model "$M" --file "$tmp/held.py" --ctx 256 --stride 128 --threads 2 \
      --save-logits "$tmp/bf16.lg" --scored-text "$tmp/scored.txt" 2>&1)
res=$(echo "$out" | grep '^result:')
if [ -z "$res" ]; then
    bad "perplexity (bf16)" "$out"
else
    bpb=$(echo "$res" | sed 's/.* bpb=\([0-9.]*\).*/\1/')
    bytes=$(echo "$res" | sed 's/.* bytes=\([0-9]*\).*/\1/')
    gz=$(gzip -9 -c "$tmp/scored.txt" | wc -c)
    xzb=$(xz -9e -c "$tmp/scored.txt" | wc -c)
    gbpb=$(awk -v c="$gz" -v n="$bytes" 'BEGIN { printf "%.4f", 8 * c / n }')
    xbpb=$(awk -v c="$xzb" -v n="$bytes" 'BEGIN { printf "%.4f", 8 * c / n }')
    echo "    bits/byte on $bytes held-out bytes: model $bpb, gzip -9 $gbpb, xz -9e $xbpb"
    t "bpb: model $bpb < gzip -9 $gbpb" "[ \"\$(wc -c <"$tmp/scored.txt")\" = $bytes ] && awk -v a=$bpb -v b=$gbpb 'BEGIN { exit !(a < b) }'"
fi

# FP8 weights against BF16
if "$PY" tools/train/to_fp8.py "$M" "$tmp/fp8" >"$tmp/fp8.log" 2>&1; then
    out=$("$MOESERVE" perplexity --model "$tmp/fp8" --file "$tmp/held.py" --ctx 256 --stride 128 \
          --threads 2 --kl-base "$tmp/bf16.lg" 2>&1)
    res=$(echo "$out" | grep '^result:')
    if [ -z "$res" ]; then
        bad "perplexity (fp8 vs bf16)" "$out"
    else
        kl=$(echo "$res" | sed 's/.* kl_mean=\([0-9.]*\).*/\1/')
        top1=$(echo "$res" | sed 's/.* top1=\([0-9.]*\).*/\1/')
        echo "    $(echo "$out" | grep '^KL')"
        t "fp8: mean KL $kl <= 0.01" "awk -v a=$kl 'BEGIN { exit !(a <= 0.01) }'"
        t "fp8: top-1 agreement $top1 >= 0.95" "awk -v a=$top1 'BEGIN { exit !(a >= 0.95) }'"
    fi
else
    bad "to_fp8.py" "$(cat "$tmp/fp8.log")"
fi

# greedy generations do not collapse
i=0
for p in 'def fibonacci(n):' 'import os
import sys
' 'class Stack:
    def __init__(self):' '    for i in range('; do
    out=$("$MOESERVE" generate --model "$M" --prompt "$p" --max-new-tokens 64 --ignore-eos --ids \
          --threads 2 2>&1)
    ids=$(echo "$out" | grep '^ids:' | tail -1 | cut -d: -f2)
    n=$(echo $ids | wc -w)
    d=$(echo $ids | tr ' ' '\n' | sort -u | wc -l)
    ratio=$(awk -v d="$d" -v n="$n" 'BEGIN { printf "%.3f", n ? d / n : 0 }')
    t "generate: prompt $i gives 64 tokens ($n)" "[ $n = 64 ]"
    t "generate: prompt $i distinct-token ratio $ratio >= 0.3 over $n tokens" \
        "awk -v r=$ratio 'BEGIN { exit !(r >= 0.3) }'"
    i=$((i + 1))
done

# the MTP head (recorded)
out=$("$PY" tools/train/mtp_agree.py --model "$M" --ids "$tmp/held.bin" --moeserve "$MOESERVE" \
      --windows 4 --gen 32 2>&1)
if echo "$out" | grep -q '^mtp:'; then
    ok "mtp: $(echo "$out" | grep '^mtp:' | cut -d' ' -f2-)"
else
    bad "mtp_agree.py" "$out"
fi
report
