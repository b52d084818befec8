#!/usr/bin/python3
"""make_v4_ckpt.py — writes a small seeded random DeepSeek-V4 checkpoint (config.json with HF
names + model.safetensors with the official tensor names, arch.md §2.2/§2.3) for v4_ref.py's
own tests and v4_official_check.py.  Test fixture only; the engine's V4 checkpoints come from
`moeserve mkmodel`.  Encoders: F32, BF16 (make_random_ckpt.py's), FP8 e4m3 with F8_E8M0 128x128
block scales on the linears the release stores in FP8, FP4 e2m1 (I8, low nibble first) with
per-32 F8_E8M0 scales on routed experts.

    make_v4_ckpt.py --out DIR [--seed N] [--dtype fp32|bf16|fp8|fp8-fp4] [--layers N]
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_random_ckpt as MK  # noqa: E402  (safetensors writer, BF16 / e4m3 encoders)

# hidden 64, ratios 0/4/128 mixed, window 8, 8 index heads (top-4), hc_mult 4, 2 hash layers
TINY_V4 = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 5,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "qk_rope_head_dim": 16,
    "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
    "index_n_heads": 8, "index_head_dim": 32, "index_topk": 4,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "num_hash_layers": 2, "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0, "hidden_act": "silu", "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1},
    "max_position_embeddings": 4096, "num_nextn_predict_layers": 0,
    "compress_ratios": [0, 4, 128, 4, 0, 0],
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "torch_dtype": "float32",
}

FP4_POS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e8m0_pow2(amax, top):
    """Power-of-two scale 2^ceil(log2(amax/top)) as (float, UE8M0 byte)."""
    e = int(np.ceil(np.log2(max(amax, 1e-30) / top)))
    return 2.0 ** e, e + 127


def fp8_e8m0(w, block=128):
    rows, cols = w.shape
    sr, sc = -(-rows // block), -(-cols // block)
    codes = np.zeros(w.shape, np.uint8)
    scale = np.zeros((sr, sc), np.uint8)
    for i in range(sr):
        for j in range(sc):
            sl = (slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block))
            s, b = e8m0_pow2(np.abs(w[sl]).max(), 448.0)
            scale[i, j] = b
            codes[sl] = MK.f64_to_e4m3_codes(w[sl] / s)
    return codes, scale


def fp4_e8m0(w):
    rows, cols = w.shape
    blk = w.reshape(rows, cols // 32, 32)
    codes = np.zeros((rows, cols), np.uint8)
    scale = np.zeros((rows, cols // 32), np.uint8)
    for r in range(rows):
        for c in range(cols // 32):
            s, b = e8m0_pow2(np.abs(blk[r, c]).max(), 6.0)
            scale[r, c] = b
            x = blk[r, c] / s
            mag = np.abs(FP4_POS[None, :] - np.abs(x)[:, None]).argmin(axis=1)
            codes[r, c * 32:(c + 1) * 32] = mag | np.where(x < 0, 8, 0)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.int8), scale


def build(cfg, seed, dtype):
    rng = np.random.default_rng(seed)
    D, n, H, hd = cfg["hidden_size"], cfg["hc_mult"], cfg["num_attention_heads"], cfg["head_dim"]
    ql, G, Ro = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
    nI, dI, E = cfg["index_n_heads"], cfg["index_head_dim"], cfg["n_routed_experts"]
    I, V, k = cfg["moe_intermediate_size"], cfg["vocab_size"], cfg["num_experts_per_tok"]
    M = (2 + n) * n
    out = []

    def f32(name, a):
        out.append((name, "F32", np.asarray(a, np.float32)))

    def plain(name, a):           # BF16 in the release; F32 for an fp32 checkpoint
        if dtype == "fp32":
            f32(name, a)
        else:
            out.append((name, "BF16", MK.f32_to_bf16_bits(a)))

    def lin(prefix, o, i, kind="bf16"):
        w = rng.standard_normal((o, i)) * i ** -0.5
        if kind == "fp8" and dtype in ("fp8", "fp8-fp4") or kind == "fp4" and dtype == "fp8":
            c, s = fp8_e8m0(w)
            out.extend([(prefix + ".weight", "F8_E4M3", c), (prefix + ".scale", "F8_E8M0", s)])
        elif kind == "fp4" and dtype == "fp8-fp4":
            c, s = fp4_e8m0(w)
            out.extend([(prefix + ".weight", "I8", c), (prefix + ".scale", "F8_E8M0", s)])
        else:
            plain(prefix + ".weight", w)

    def norm(name, d):
        plain(name, 1.0 + 0.1 * rng.standard_normal(d))

    def hc(prefix, rows):
        f32(prefix + "_fn", rng.standard_normal((rows, n * D)) * (n * D) ** -0.5)
        f32(prefix + "_base", 0.3 * rng.standard_normal(rows))
        f32(prefix + "_scale", 0.5 + 0.5 * rng.random(3 if rows == M else 1))

    def compressor(p, d, m):
        c2 = 2 if m == 4 else 1
        lin(p + "wkv", c2 * d, D)
        lin(p + "wgate", c2 * d, D)
        f32(p + "ape", 0.5 * rng.standard_normal((m, c2 * d)))
        norm(p + "norm.weight", d)

    plain("embed.weight", rng.standard_normal((V, D)))
    for L in range(cfg["num_hidden_layers"]):
        p, m = f"layers.{L}.", cfg["compress_ratios"][L]
        hc(p + "hc_attn", M)
        hc(p + "hc_ffn", M)
        norm(p + "attn_norm.weight", D)
        norm(p + "ffn_norm.weight", D)
        a = p + "attn."
        f32(a + "attn_sink", rng.standard_normal(H))
        lin(a + "wq_a", ql, D, "fp8")
        norm(a + "q_norm.weight", ql)
        lin(a + "wq_b", H * hd, ql, "fp8")
        lin(a + "wkv", hd, D, "fp8")
        norm(a + "kv_norm.weight", hd)
        lin(a + "wo_a", G * Ro, H * hd // G, "fp8")
        lin(a + "wo_b", D, G * Ro, "fp8")
        if m:
            compressor(a + "compressor.", hd, m)
        if m == 4:
            lin(a + "indexer.wq_b", nI * dI, ql, "fp8")
            lin(a + "indexer.weights_proj", nI, D)
            compressor(a + "indexer.compressor.", dI, 4)
        f = p + "ffn."
        lin(f + "gate", E, D)
        if L < cfg["num_hash_layers"]:
            t2e = np.stack([rng.permutation(E)[:k] for _ in range(V)]).astype(np.int64)
            out.append((f + "gate.tid2eid", "I64", t2e))
        else:
            f32(f + "gate.bias", 0.1 * rng.standard_normal(E))
        for e in range(E):
            lin(f"{f}experts.{e}.w1", I, D, "fp4")
            lin(f"{f}experts.{e}.w2", D, I, "fp4")
            lin(f"{f}experts.{e}.w3", I, D, "fp4")
        Is = I * cfg["n_shared_experts"]
        lin(f + "shared_experts.w1", Is, D, "fp8")
        lin(f + "shared_experts.w2", D, Is, "fp8")
        lin(f + "shared_experts.w3", Is, D, "fp8")
    norm("norm.weight", D)
    plain("head.weight", rng.standard_normal((V, D)) * D ** -0.5)
    hc("hc_head", n)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="random tiny DeepSeek-V4 checkpoint")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp8", "fp8-fp4"), default="fp32")
    ap.add_argument("--layers", type=int, help="first N layers of the preset")
    a = ap.parse_args(argv)
    cfg = json.loads(json.dumps(TINY_V4))
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
        cfg["compress_ratios"] = cfg["compress_ratios"][:a.layers] + [0]
    if a.dtype != "fp32":
        cfg["torch_dtype"] = "bfloat16"
    if a.dtype in ("fp8", "fp8-fp4"):
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "scale_fmt": "ue8m0",
                                      "weight_block_size": [128, 128]}
    if a.dtype == "fp8-fp4":
        cfg["expert_dtype"] = "fp4"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    MK.write_safetensors(os.path.join(a.out, "model.safetensors"), build(cfg, a.seed, a.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
