#!/usr/bin/python3
"""v4_selftest.py — checks of the V4 reference (v4_ref.py) that need no C code: prefill of N
tokens equals N single decode steps at every position (window, ratio-4 and ratio-128 compressor
state, indexer keys), UE8M0 / FP4 e2m1 / FP8 e4m3 dequantisation against their definitions,
quantised checkpoints loading close to the fp32 weights, Sinkhorn, loader errors, and the CLI
JSON.  Prints "N passed, N failed"; exits non-zero on failure.  tests/t_v4ref_self.sh runs it
(a few seconds).  /usr/bin/python3 only."""

import contextlib
import io
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_random_ckpt as MK  # noqa: E402
import selftest as ST  # noqa: E402
import make_v4_ckpt as MV  # noqa: E402
import v4_ref as V  # noqa: E402

# the harness (check / expect / expect_raises, counters, temporary directory) is selftest.py's
check, expect, expect_raises, TMP = ST.check, ST.expect, ST.expect_raises, ST.TMP


def ckpt(name, *args):
    d = os.path.join(TMP, name)
    if not os.path.exists(d):
        MV.main(["--out", d] + list(args))
    return d


def model(name, *args):
    return V.V4Model(V.V4Checkpoint(ckpt(name, *args)))


def t_prefill_equals_steps():
    """Full causal forward of 140 tokens vs the decoder fed one token at a time, every
    position: crosses the window (8), 35 ratio-4 entries and the first ratio-128 entry."""
    m = model("fp32", "--seed", "1")
    seq = [int(t) for t in np.random.default_rng(5).integers(0, m.cfg.vocab, 140)]
    full = m.forward_full(seq)
    dec = V.Decoder(m)
    worst = max(V.R.rel_diff(dec.step(t), full[p]) for p, t in enumerate(seq))
    expect(worst < 1e-12, f"decoder vs full forward rel {worst:.2e}")
    expect(m.margins.topk < np.inf and m.margins.route < np.inf, "both margins measured")


def t_e8m0_fp4_definitions():
    codes = np.arange(255)
    expect(np.array_equal(V.e8m0(codes), 2.0 ** (codes - 127.0)), "UE8M0 = 2^(b-127)")
    expect_raises(lambda: V.e8m0([255]), "NaN scale")
    for c in range(16):                      # E2M1: sign bit 3, exponent bits 2..1, mantissa bit 0
        e, mt, s = (c >> 1) & 3, c & 1, -1.0 if c & 8 else 1.0
        want = s * (mt * 0.5 if e == 0 else (1 + mt / 2) * 2.0 ** (e - 1))
        expect(V.FP4_E2M1[c] == want, f"fp4 code {c}")


def _write(path, tensors):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"quantization_config": {"weight_block_size": [128, 128]}}, f)
    MK.write_safetensors(os.path.join(path, "model.safetensors"), tensors)


def t_fp4_fp8_loader_exhaustive():
    """Every FP4 code in both nibbles under every scale exponent; every finite e4m3 code under
    two block scales."""
    lo = np.arange(32) % 16                                  # element codes, row layout
    packed = (lo[0::2] | (lo[1::2] << 4)).astype(np.uint8)
    hi = np.arange(32)[::-1] % 16
    packed2 = (hi[0::2] | (hi[1::2] << 4)).astype(np.uint8)
    w4 = np.stack([packed, packed2] * 255).view(np.int8)     # [510, 16]
    s4 = np.repeat(np.arange(255, dtype=np.uint8), 2)[:, None]
    e4 = np.arange(256, dtype=np.uint8)
    e4 = e4[(e4 & 0x7F) != 0x7F]                              # 254 finite codes
    w8 = np.zeros((128, 256), np.uint8)
    w8[:, :254] = e4[None, :]
    s8 = np.array([[100, 140]], np.uint8)
    d = os.path.join(TMP, "fmt")
    _write(d, [("a.weight", "I8", w4), ("a.scale", "F8_E8M0", s4),
               ("b.weight", "F8_E4M3", w8), ("b.scale", "F8_E8M0", s8)])
    ck = V.V4Checkpoint(d)
    a = ck.linear("a", (510, 32))
    for r in range(510):
        codes = lo if r % 2 == 0 else hi
        expect(np.array_equal(a[r], V.FP4_E2M1[codes] * 2.0 ** (r // 2 - 127)), f"fp4 row {r}")
    b = ck.linear("b", (128, 256))
    ref = V.R.FP8_E4M3[w8] * np.repeat(2.0 ** (s8.astype(float) - 127), 128, 1)
    expect(np.array_equal(b, ref), "fp8 e4m3 x UE8M0 blocks")


def t_quantised_checkpoints():
    """fp8 / fp8-fp4 / bf16 checkpoints of the same seed load, and their dequantised weights are
    close to the fp32 ones (e4m3: 2^-4 relative, e2m1 with per-32 scales: coarse)."""
    f = V.V4Checkpoint(ckpt("fp32", "--seed", "1"))
    for dt, name, shape, tol in (("bf16", "layers.1.attn.compressor.wkv", (64, 64), 2 ** -8),
                                 ("fp8", "layers.1.attn.wq_a", (32, 64), 2 ** -4),
                                 ("fp8-fp4", "layers.1.ffn.experts.3.w1", (32, 64), 0.35)):
        q = V.V4Checkpoint(ckpt(dt, "--seed", "1", "--dtype", dt))
        wf = f.linear(name, shape)
        wq = q.linear(name, shape)
        err = np.linalg.norm(wq - wf) / np.linalg.norm(wf)
        expect(0 < err < tol, f"{dt} {name}: rel err {err:.3g}")
        mq = V.V4Model(q)
        lg = mq.forward_full([3, 1, 4, 1, 5])
        expect(np.isfinite(lg).all(), f"{dt} forward finite")


def t_sinkhorn():
    rng = np.random.default_rng(0)
    c = V.sinkhorn(rng.standard_normal((3, 4, 4)) * 3, 20, 1e-6)
    expect(np.abs(c.sum(-2) - 1).max() < 1e-5, "columns sum to 1")
    expect(np.abs(c.sum(-1) - 1).max() < 1e-2, "rows sum to ~1")
    X = rng.standard_normal((1, 4, 5))
    post, f = rng.random((1, 4)), rng.standard_normal((1, 5))
    y = V.hc_post(f, X, post, c[:1])
    for k in range(4):
        want = post[0, k] * f[0] + sum(c[0, j, k] * X[0, j] for j in range(4))
        expect(np.allclose(y[0, k], want, rtol=1e-13), "hc_post sums over the first index")


def t_loader_errors():
    src = os.path.join(ckpt("fp32", "--seed", "1"), "model.safetensors")
    st = V.R.SafetensorsFile(src)
    base = [(n, st.tensors[n][0], st.raw(n)[1]) for n in st.tensors]
    cfg = json.load(open(os.path.join(ckpt("fp32", "--seed", "1"), "config.json")))

    def variant(name, tensors, want):
        d = os.path.join(TMP, name)
        os.makedirs(d, exist_ok=True)
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        MK.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        try:
            V.V4Model(V.V4Checkpoint(d))
        except (ValueError, KeyError) as e:
            expect(want in str(e), f"{name}: message {e}")
            return
        raise AssertionError(f"{name}: accepted")

    variant("extra", base + [("layers.0.attn.bogus", "F32", np.zeros(2, np.float32))],
            "not used")
    variant("missing", [t for t in base if t[0] != "layers.2.attn.compressor.ape"],
            "layers.2.attn.compressor.ape")
    variant("shape", [(n, d, a[:, :-1] if n == "layers.1.attn.wkv.weight" else a)
                      for n, d, a in base], "layers.1.attn.wkv.weight: shape")
    bad = [(n, d, np.full_like(a, 99) if n.endswith("tid2eid") else a) for n, d, a in base]
    variant("tid2eid", bad, "expert id out of range")
    m = model("fp32", "--seed", "1")
    expect_raises(lambda: m.forward_full([256]), "token id 256")


def t_cli_json():
    out = os.path.join(TMP, "o.json")
    with contextlib.redirect_stderr(io.StringIO()):
        V.main(["--model", ckpt("fp32", "--seed", "1"), "--prompt-ids",
                "5,6,7,8,9,10,11,12,13", "--decode", "3", "--greedy", "--out", out,
                "--digits", "17"])
    r = json.load(open(out))
    m = model("fp32", "--seed", "1")
    expect(len(r["steps"]) == 3 and len(r["greedy"]) == 4, "3 steps, 4 greedy ids")
    seq = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    outs = [r["prefill_logits"]] + [s["logits"] for s in r["steps"]]
    for i, lg in enumerate(outs):
        lg = np.array(lg)
        expect(lg.shape == (256,) and r["greedy"][i] == int(np.argmax(lg)), "greedy = argmax")
        expect(V.R.rel_diff(lg, m.forward_full(seq)[-1]) < 1e-14, "logits of a fresh forward")
        if i < 3:
            expect(r["steps"][i]["token"] == r["greedy"][i], "step token = greedy")
        seq.append(r["greedy"][i])
    for k in ("min_topk_margin", "min_route_margin", "min_argmax_margin"):
        expect(k in r, k)
    expect(r["incremental_rel_diff"] < 1e-12, "incremental check ran")


def main():
    try:
        check("prefill_equals_single_steps", t_prefill_equals_steps)
        check("e8m0_fp4_definitions", t_e8m0_fp4_definitions)
        check("fp4_fp8_loader_exhaustive", t_fp4_fp8_loader_exhaustive)
        check("quantised_checkpoints", t_quantised_checkpoints)
        check("sinkhorn_hc_post", t_sinkhorn)
        check("loader_errors", t_loader_errors)
        check("cli_json", t_cli_json)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print(f"{ST.PASSED} passed, {ST.FAILED} failed")
    return 1 if ST.FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
