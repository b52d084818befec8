#!/usr/bin/python3
# make_random_ckpt.py — writes a small seeded random DeepSeek-V2/V3-style checkpoint in HF layout.
#
# Owns: the test presets (tiny-v3, tiny-v2, tiny-greedy), random weights, and the safetensors
# *writer* with its own FP32/BF16/F8_E4M3 encoders (kept separate from deepseek_ref.py's decoder so
# a shared bug cannot hide).  It is a test fixture for the Python reference only; the C engine's
# checkpoints come from `moeserve mkmodel`.  Run with /usr/bin/python3 (Debian numpy).

import argparse
import json
import os
import struct
import sys

import numpy as np

TINY_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
    "moe_intermediate_size": 128, "num_hidden_layers": 4, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "num_attention_heads": 8, "num_key_value_heads": 8,
    "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
    "v_head_dim": 32, "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
    "n_group": 4, "topk_group": 2, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "max_position_embeddings": 16384, "num_nextn_predict_layers": 1,
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "torch_dtype": "float32",
}


def preset(name):
    c = json.loads(json.dumps(TINY_V3))
    if name == "tiny-v3":
        return c
    if name in ("tiny-v2", "tiny-greedy"):
        c.update({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                  "q_lora_rank": None, "scoring_func": "softmax",
                  "topk_method": "group_limited_greedy", "norm_topk_prob": False,
                  "routed_scaling_factor": 1.0, "num_nextn_predict_layers": 0})
        c["rope_scaling"].update({"mscale": 0.707, "mscale_all_dim": 0.707})
        if name == "tiny-greedy":   # V2-Lite-like: no groups
            c.update({"topk_method": "greedy", "n_group": 1, "topk_group": 1,
                      "n_shared_experts": 2, "first_k_dense_replace": 2, "moe_layer_freq": 1})
        return c
    raise SystemExit(f"unknown preset {name}")


# ----------------------------------------------------------------------------------------------
# Encoders


def f32_to_bf16_bits(x):
    """float -> BF16 bits, round to nearest even (finite inputs)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def _e4m3_positive_values():
    """Codes 0..126 decoded via float32 bit construction (independent of the reader's formula)."""
    vals = np.zeros(127, dtype=np.float64)
    for code in range(127):
        e, m = code >> 3, code & 7
        if e == 0:
            vals[code] = np.ldexp(float(m), -9)
        else:
            bits = ((e - 7 + 127) << 23) | (m << 20)
            vals[code] = struct.unpack("<f", struct.pack("<I", bits))[0]
    return vals


E4M3_POS = _e4m3_positive_values()


def f64_to_e4m3_codes(x):
    """Nearest F8_E4M3 code (|x| clamped to 448).  Ties go to the lower magnitude; exact
    rounding mode does not matter for a fixture, only that the decode is exact."""
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(E4M3_POS, a), 1, 126)
    lo = hi - 1
    pick = np.where(np.abs(E4M3_POS[hi] - a) < np.abs(a - E4M3_POS[lo]), hi, lo)
    return (pick | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def fp8_block_quant(w, block=(128, 128)):
    rows, cols = w.shape
    bo, bi = block
    sr, sc = -(-rows // bo), -(-cols // bi)
    scale = np.zeros((sr, sc), dtype=np.float32)
    codes = np.zeros(w.shape, dtype=np.uint8)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi]
            s = np.float32(max(np.abs(blk).max(), 1e-12) / 448.0)
            scale[i, j] = s
            codes[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi] = f64_to_e4m3_codes(blk / float(s))
    return codes, scale


def write_safetensors(path, tensors):
    """tensors: list of (name, dtype name, numpy array already in storage dtype)."""
    header = {}
    off = 0
    blobs = []
    for name, dt, arr in tensors:
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------------------------
# Weights


def build_weights(cfg, rng):
    """Returns [(name, float64 array, kind)], kind in {linear, norm, embed, gate, bias}."""
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ql, kl = cfg["q_lora_rank"] or 0, cfg["kv_lora_rank"]
    V = cfg["vocab_size"]
    out = []

    def lin(name, o, i):
        out.append((name, rng.standard_normal((o, i)) / np.sqrt(i), "linear"))

    def norm(name, n):
        out.append((name, 1.0 + 0.1 * rng.standard_normal(n), "norm"))

    def ffn(prefix, inter):
        lin(prefix + "gate_proj.weight", inter, D)
        lin(prefix + "up_proj.weight", inter, D)
        lin(prefix + "down_proj.weight", D, inter)

    out.append(("model.embed_tokens.weight", rng.standard_normal((V, D)), "embed"))
    n_total = cfg["num_hidden_layers"] + (cfg.get("num_nextn_predict_layers") or 0)
    for L in range(n_total):
        p = f"model.layers.{L}."
        a = p + "self_attn."
        norm(p + "input_layernorm.weight", D)
        if ql:
            lin(a + "q_a_proj.weight", ql, D)
            norm(a + "q_a_layernorm.weight", ql)
            lin(a + "q_b_proj.weight", H * (dn + dr), ql)
        else:
            lin(a + "q_proj.weight", H * (dn + dr), D)
        lin(a + "kv_a_proj_with_mqa.weight", kl + dr, D)
        norm(a + "kv_a_layernorm.weight", kl)
        lin(a + "kv_b_proj.weight", H * (dn + dv), kl)
        lin(a + "o_proj.weight", D, H * dv)
        norm(p + "post_attention_layernorm.weight", D)
        m = p + "mlp."
        moe = L >= cfg["first_k_dense_replace"] and L % cfg["moe_layer_freq"] == 0
        if moe:
            E = cfg["n_routed_experts"]
            out.append((m + "gate.weight", 2.0 * rng.standard_normal((E, D)) / np.sqrt(D),
                        "gate"))
            if cfg["topk_method"] == "noaux_tc":
                out.append((m + "gate.e_score_correction_bias", 0.1 * rng.standard_normal(E),
                            "bias"))
            for e in range(E):
                ffn(f"{m}experts.{e}.", cfg["moe_intermediate_size"])
            if cfg["n_shared_experts"]:
                ffn(m + "shared_experts.", cfg["n_shared_experts"] * cfg["moe_intermediate_size"])
        else:
            ffn(m, cfg["intermediate_size"])
        if L >= cfg["num_hidden_layers"]:   # MTP extras (ignored by the reference)
            norm(p + "enorm.weight", D)
            norm(p + "hnorm.weight", D)
            lin(p + "eh_proj.weight", D, 2 * D)
            norm(p + "shared_head.norm.weight", D)
    norm("model.norm.weight", D)
    out.append(("lm_head.weight", rng.standard_normal((V, D)) / np.sqrt(D), "linear_head"))
    return out


def encode(weights, dtype):
    """dtype fp32: all F32.  bf16: all BF16 except the bias (F32).  fp8: attention/FFN/expert
    linears F8_E4M3 + weight_scale_inv, the rest BF16 (bias F32), as in V3 checkpoints."""
    tensors = []
    for name, w, kind in weights:
        if kind == "bias" or dtype == "fp32":
            tensors.append((name, "F32", w.astype("<f4")))
        elif dtype == "bf16" or kind != "linear":
            tensors.append((name, "BF16", f32_to_bf16_bits(w.astype(np.float32))))
        else:
            codes, scale = fp8_block_quant(w)
            tensors.append((name, "F8_E4M3", codes))
            tensors.append((name + "_scale_inv", "F32", scale.astype("<f4")))
    return tensors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="tiny-v3", choices=["tiny-v3", "tiny-v2", "tiny-greedy"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp8"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--q-lora", choices=["preset", "on", "off"], default="preset")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers")
    ap.add_argument("--vocab", type=int, help="override vocab_size")
    ap.add_argument("--shards", type=int, default=1, help="write N shards + index")
    args = ap.parse_args(argv)

    cfg = preset(args.preset)
    if args.q_lora == "on":
        cfg["q_lora_rank"] = 96
    elif args.q_lora == "off":
        cfg["q_lora_rank"] = None
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    if args.vocab:
        cfg["vocab_size"] = args.vocab
    if args.dtype == "fp8":
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [128, 128]}
    cfg["torch_dtype"] = {"fp32": "float32", "bf16": "bfloat16", "fp8": "bfloat16"}[args.dtype]
    rng = np.random.default_rng(args.seed)
    tensors = encode(build_weights(cfg, rng), args.dtype)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    if args.shards <= 1:
        write_safetensors(os.path.join(args.out, "model.safetensors"), tensors)
    else:
        n = args.shards
        weight_map = {}
        for s in range(n):
            fn = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
            part = tensors[s::n]
            # keep each weight with its scale in the same shard is not required; spread them
            write_safetensors(os.path.join(args.out, fn), part)
            for name, _, _ in part:
                weight_map[name] = fn
        with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
