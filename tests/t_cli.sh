#!/usr/bin/env bash
# t_cli.sh — the command line: generate's output contract (timing line, ids,
# text), a checkpoint without tokenizer.json (ids in and out), a checkpoint with
# MTP layers, sharded checkpoints, --config for mkmodel, clear errors naming
# the flag for bad input, and which FP8 rows the loader marks plain.
set -u
MOESERVE=${MOESERVE:-build/moeserve}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/lib.sh"
M=$tmp/m
"$MOESERVE" mkmodel --preset tiny-v3 --seed 2 --out "$M" 2>/dev/null
out=$("$MOESERVE" generate --model "$M" --prompt "Hello world" --max-new-tokens 5 --ids --ignore-eos 2>"$tmp/err")
t "timing line" 'echo "$out" | grep -qE "^timing: prefill_tokens=[0-9]+ prefill_tok_s=[0-9.]+ decode_tokens=4 decode_tok_s=[0-9.]+$"'
t "ids line with 5 ids" '[ "$(echo "$out" | grep "^ids:" | wc -w)" = 6 ]'
t "MTP layer loaded and skipped" 'grep -q "(+1 MTP)" "$tmp/err"'
# generate starts as serve does: the warm-up (prepack + one prompt) unless --skip-server-warmup,
# and its tokens do not depend on it
t "generate runs the serve warm-up: $(grep -o 'warm-up: .*' "$tmp/err")" \
    'grep -q "warm-up: [0-9]* weight matrices prepacked .* a [1-9][0-9]*-token prompt" "$tmp/err"'
outs=$("$MOESERVE" generate --model "$M" --prompt "Hello world" --max-new-tokens 5 --ids --ignore-eos \
       --skip-server-warmup 2>"$tmp/err2")
t "generate --skip-server-warmup: no warm-up, same ids" \
    '! grep -q "warm-up:" "$tmp/err2" && [ "$(echo "$outs" | grep "^ids:")" = "$(echo "$out" | grep "^ids:")" ]'
# sharded checkpoint gives the same tokens
"$MOESERVE" mkmodel --preset tiny-v3 --seed 2 --out "$tmp/sh" --shard-mb 2 2>/dev/null
t "sharded checkpoint (index.json)" '[ -f "$tmp/sh/model.safetensors.index.json" ]'
out2=$("$MOESERVE" generate --model "$tmp/sh" --prompt "Hello world" --max-new-tokens 5 --ids --ignore-eos 2>/dev/null)
t "sharded = single file" '[ "$(echo "$out" | grep ^ids:)" = "$(echo "$out2" | grep ^ids:)" ]'
# weights copied into 2 MiB pages (default) and read from the file mapping
# (MOESERVE_WEIGHTS=mmap) give the same logits, bit for bit, in both precisions
for dt in float32 auto; do
    "$MOESERVE" generate --model "$M" --prompt "Hello world" --max-new-tokens 4 --ignore-eos \
        --dtype $dt --dump-logits "$tmp/l_copy_$dt.bin" >/dev/null 2>"$tmp/err_copy"
    MOESERVE_WEIGHTS=mmap "$MOESERVE" generate --model "$M" --prompt "Hello world" \
        --max-new-tokens 4 --ignore-eos --dtype $dt --dump-logits "$tmp/l_mmap_$dt.bin" \
        >/dev/null 2>/dev/null
    t "weights in 2 MiB pages = file mapping ($dt logits)" \
        '[ -s "$tmp/l_copy_$dt.bin" ] && cmp -s "$tmp/l_copy_$dt.bin" "$tmp/l_mmap_$dt.bin"'
done
t "weights copy is logged" 'grep -q "copied into 2 MiB pages" "$tmp/err_copy"'
# the thread count changes how work is split, never the result: a 30-token
# prompt (batched expert rows, routing and combine on the pool) and decode
ids30=$(seq -s, 3 32)
for dt in auto float32; do
    for th in 1 2 3; do
        "$MOESERVE" generate --model "$M" --prompt-ids "$ids30" --max-new-tokens 4 --ignore-eos \
            --dtype $dt --threads $th --dump-logits "$tmp/l_th${th}_$dt.bin" >/dev/null 2>/dev/null
    done
    t "same logits at 1, 2 and 3 threads ($dt)" \
        '[ -s "$tmp/l_th1_$dt.bin" ] && cmp -s "$tmp/l_th1_$dt.bin" "$tmp/l_th2_$dt.bin" && cmp -s "$tmp/l_th1_$dt.bin" "$tmp/l_th3_$dt.bin"'
done
# no tokenizer.json: ids in and out
cp -r "$M" "$tmp/notok" && rm "$tmp/notok/tokenizer.json"
out3=$("$MOESERVE" generate --model "$tmp/notok" --prompt-ids 0,5,6 --max-new-tokens 3 --ignore-eos 2>/dev/null)
t "no tokenizer.json: --prompt-ids works" 'echo "$out3" | grep -qE "^ids:( [0-9]+){3}$"'
err=$("$MOESERVE" generate --model "$tmp/notok" --prompt "hi" 2>&1)
t "no tokenizer.json: --prompt says why" 'echo "$err" | grep -q "tokenizer.json"'
# mkmodel --config round trip
"$MOESERVE" mkmodel --config "$M/config.json" --seed 2 --out "$tmp/cfg" 2>/dev/null
t "mkmodel --config FILE" 'cmp -s "$M/config.json" "$tmp/cfg/config.json"'
# errors name the flag
e() { # expected flag text, then args
    want=$1; shift
    msg=$("$MOESERVE" "$@" 2>&1); rc=$?
    t "error names $want ($*)" '[ $rc -ne 0 ] && echo "$msg" | grep -q -- "$want"'
}
e "--max-new-tokens" generate --model "$M" --prompt x --max-new-tokens -3
e "--temperature" generate --model "$M" --prompt x --temperature abc
e "--dtype" generate --model "$M" --prompt x --dtype float8
e "--model" generate --prompt x
e "--prompt-ids" generate --model "$M" --prompt-ids 1,x
e "--model" generate --model "$tmp/missing" --prompt x
e "vocabulary" generate --model "$M" --prompt-ids 5,99999
e "--preset" mkmodel --preset nope --out "$tmp/x"
e "--dtype" mkmodel --preset tiny-v3 --dtype int3 --out "$tmp/x"
e "unknown command" nosuchcommand
# a corrupted checkpoint is rejected with the file and tensor named
cp -r "$M" "$tmp/bad" && truncate -s 100000 "$tmp/bad/model.safetensors"
msg=$("$MOESERVE" generate --model "$tmp/bad" --prompt-ids 1 2>&1); rc=$?
t "truncated checkpoint rejected naming the file" '[ $rc -ne 0 ] && echo "$msg" | grep -q "model.safetensors"'
# mkmodel creates missing parent directories, and says why when it cannot
"$MOESERVE" mkmodel --preset tiny-v3 --out "$tmp/nested/a/b" >/dev/null 2>&1
t "mkmodel creates parent directories" '[ -f "$tmp/nested/a/b/config.json" ]'
touch "$tmp/plainfile"
msg=$("$MOESERVE" mkmodel --preset tiny-v3 --out "$tmp/plainfile/x" 2>&1)
t "mkmodel names the directory it cannot create" 'echo "$msg" | grep -q "plainfile/x: cannot create directory: Not a directory"'
# FP8 weights: the loader marks the rows the AVX-512 kernels may convert
# without tables wherever those kernels run (also with the ISA forced to
# AVX512_BF16 where this CPU executes it), and not for --dtype float32
if "$MOESERVE" version 2>/dev/null | grep -qE "kernels: avx512"; then
    "$MOESERVE" mkmodel --preset tiny-v3 --seed 2 --dtype fp8 --out "$tmp/f8" 2>/dev/null
    isas=avx512
    MOESERVE_ISA=avx512bf16 "$MOESERVE" version 2>/dev/null | grep -q "kernels: avx512bf16" &&
        isas="avx512 avx512bf16"
    for isa in $isas; do
        MOESERVE_ISA=$isa MOESERVE_LOG=debug "$MOESERVE" generate --model "$tmp/f8" --prompt-ids 1,2 \
            --max-new-tokens 1 >/dev/null 2>"$tmp/f8err"
        t "FP8 plain rows marked ($isa)" 'grep -qE "FP8: [0-9]+ of [0-9]+ rows plain" "$tmp/f8err"'
    done
    MOESERVE_LOG=debug "$MOESERVE" generate --model "$tmp/f8" --prompt-ids 1,2 --max-new-tokens 1 \
        --dtype float32 >/dev/null 2>"$tmp/f8err"
    t "FP8 plain rows not scanned for float32" '! grep -q "rows plain" "$tmp/f8err"'
fi
report
