#!/usr/bin/env bash
# t_load.sh — start-up refuses a corrupt checkpoint with a message naming
# what is wrong: a NaN or infinity in a weight (BF16, F32, FP8 codes and
# their block scales, norm vectors, the embedding), found by the copy into
# 2 MiB pages and by the one extra read of MOESERVE_WEIGHTS=mmap (skipped by
# mmap-nocheck, which says so); a config.json without a field the model's
# shapes need; a tokenizer.json with ids beyond the model's vocabulary.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
POKE="python3 $(dirname "$0")/st_poke.py"
for dt in bf16 fp32 fp8; do
    "$MOESERVE" mkmodel --preset tiny-v3 --seed 2 --dtype $dt --out "$tmp/$dt" 2>/dev/null
done
# load DIR: runs a one-token generate, leaves its exit code in $rc and stderr in $msg
load() {
    msg=$("$MOESERVE" generate --model "$1" --prompt-ids 1,2 --max-new-tokens 1 2>&1 >/dev/null)
    rc=$?
}
load "$tmp/bf16"
t "a clean checkpoint loads (copy checked)" '[ $rc -eq 0 ] && echo "$msg" | grep -q "checked finite"'
# corrupt DT TENSOR INDEX VALUE WANT: a copy with one element changed is refused
# naming the tensor (and WANT, e.g. the stored row and column), in both placements
corrupt() {
    local dt=$1 tensor=$2 index=$3 value=$4 want=$5 d=$tmp/c
    rm -rf "$d" && cp -r "$tmp/$dt" "$d"
    $POKE "$d/model.safetensors" "$tensor" "$index" "$value"
    load "$d"
    t "$dt $value in $tensor refused (copy)" \
        '[ $rc -ne 0 ] && echo "$msg" | grep -qF "tensor '"'$tensor'"'" && echo "$msg" | grep -qF -- "$want"'
    msg=$(MOESERVE_WEIGHTS=mmap "$MOESERVE" generate --model "$d" --prompt-ids 1,2 \
        --max-new-tokens 1 2>&1 >/dev/null)
    rc=$?
    t "$dt $value in $tensor refused (mmap)" \
        '[ $rc -ne 0 ] && echo "$msg" | grep -qF "tensor '"'$tensor'"'" && echo "$msg" | grep -qF -- "$want"'
}
# expert 5's up_proj is [128][256]: element 300 is row 1, column 44
corrupt bf16 model.layers.1.mlp.experts.5.up_proj.weight 300 nan "nan at row 1, column 44"
corrupt bf16 model.layers.0.self_attn.o_proj.weight 65535 inf "inf at row 255, column 255"
corrupt bf16 model.layers.2.mlp.shared_experts.down_proj.weight 0 -inf "-inf at row 0, column 0"
corrupt bf16 lm_head.weight 1000 nan "nan"
corrupt bf16 model.embed_tokens.weight 77 inf "inf"
corrupt fp32 model.layers.3.self_attn.kv_b_proj.weight 513 inf "inf at row 8, column 1"
corrupt fp32 model.layers.2.mlp.gate.weight 9 nan "nan"
corrupt fp8 model.layers.1.mlp.experts.15.down_proj.weight 4000 nan "nan at row 31, column 32"
corrupt fp8 model.layers.0.mlp.gate_proj.weight_scale_inv 5 inf "inf at row 2, column 1"
corrupt bf16 model.layers.2.post_attention_layernorm.weight 3 nan "nan at element 3"
# mmap-nocheck loads the same corrupt copy, and says it did not check
rm -rf "$tmp/c" && cp -r "$tmp/bf16" "$tmp/c"
$POKE "$tmp/c/model.safetensors" model.layers.1.mlp.experts.5.up_proj.weight 300 nan
msg=$(MOESERVE_WEIGHTS=mmap-nocheck "$MOESERVE" generate --model "$tmp/c" --prompt-ids 1,2 \
    --max-new-tokens 1 2>&1 >/dev/null)
rc=$?
t "MOESERVE_WEIGHTS=mmap-nocheck skips the check and says so" \
    '[ $rc -eq 0 ] && echo "$msg" | grep -q "not checked for NaN or infinity"'
# the fields the shapes need are required
for f in hidden_size vocab_size num_hidden_layers moe_intermediate_size kv_lora_rank q_lora_rank; do
    rm -rf "$tmp/c" && cp -r "$tmp/bf16" "$tmp/c"
    grep -v "\"$f\"" "$tmp/bf16/config.json" >"$tmp/c/config.json"
    load "$tmp/c"
    t "config without $f is refused naming it" \
        '[ $rc -ne 0 ] && echo "$msg" | grep -q "'"'$f'"' is required"'
done
# tokenizer ids beyond the vocabulary (1024): refused by generate and serve
rm -rf "$tmp/c" && cp -r "$tmp/bf16" "$tmp/c"
python3 - "$tmp/c/tokenizer.json" <<'PY'
import json, sys
p = sys.argv[1]
j = json.load(open(p))
j["added_tokens"].append({"id": 5000, "content": "<|far|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True})
json.dump(j, open(p, "w"))
PY
msg=$("$MOESERVE" generate --model "$tmp/c" --prompt "hi" --max-new-tokens 1 2>&1 >/dev/null)
rc=$?
t "generate refuses a tokenizer.json beyond the vocabulary" \
    '[ $rc -ne 0 ] && echo "$msg" | grep -q "id 5000" && echo "$msg" | grep -q "vocab_size 1024"'
msg=$(timeout 60 "$MOESERVE" serve --model-path "$tmp/c" --port 0 2>&1 >/dev/null)
rc=$?
t "serve refuses a tokenizer.json beyond the vocabulary" \
    '[ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$msg" | grep -q "id 5000"'
report
