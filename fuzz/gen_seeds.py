#!/usr/bin/python3
"""gen_seeds.py — writes the small seed corpora under fuzz/corpus/ (stdlib only).

Run from the repository root: /usr/bin/python3 fuzz/gen_seeds.py
fuzz_safetensors: valid images of every supported dtype plus a few near-misses;
fuzz_config: DeepSeek V3 / V2-Lite / Moonlight style config.json variants.
"""
import json, os, struct

def st_image(tensors, meta=None, pad=True):
    hdr, off, data = {}, 0, b""
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape, blob in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(blob)]}
        off += len(blob)
        data += blob
    h = json.dumps(hdr, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data

def write(d, name, blob):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(blob)

st = "fuzz/corpus/fuzz_safetensors"
write(st, "empty", st_image([]))
write(st, "f32", st_image([("w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))]))
write(st, "mixed", st_image([
    ("model.embed_tokens.weight", "BF16", [3, 2], b"\x80\x3f" * 6),
    ("model.layers.0.self_attn.q_a_proj.weight", "F8_E4M3", [3, 5], bytes(range(15))),
    ("model.layers.0.self_attn.q_a_proj.weight_scale_inv", "F32", [1, 1], struct.pack("<f", 0.5)),
    ("scale.e8m0", "F8_E8M0", [2], b"\x7f\x80"),
    ("ids", "I64", [], struct.pack("<q", 7)),
    ("i32", "I32", [1], struct.pack("<i", -1)),
    ("f16", "F16", [1], b"\x00\x3c"),
    ("f64", "F64", [1], struct.pack("<d", 1.5)),
    ("i8", "I8", [2], b"\x01\xff"),
    ("empty", "U8", [0, 4], b""),
], meta={"format": "pt"}))
write(st, "unpadded", st_image([("a", "U8", [3], b"abc")], pad=False))
write(st, "truncated", st_image([("a", "U8", [1], b"a")])[:-1])
bad = st_image([("a", "U8", [2], b"ab"), ("b", "U8", [2], b"cd")])
write(st, "overlap", bad.replace(b'"data_offsets":[2,4]', b'"data_offsets":[1,3]'))
write(st, "unicode", st_image([("\u00e9\u4e2d", "F16", [1, 1, 1], b"\x00\x3c")]))

cf = "fuzz/corpus/fuzz_config"
v3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
      "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
      "moe_intermediate_size": 2048, "num_hidden_layers": 61, "first_k_dense_replace": 3,
      "moe_layer_freq": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
      "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8,
      "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
      "norm_topk_prob": True, "routed_scaling_factor": 2.5, "q_lora_rank": 1536,
      "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
      "rms_norm_eps": 1e-06, "rope_theta": 10000,
      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                       "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                       "type": "yarn"},
      "max_position_embeddings": 163840, "num_nextn_predict_layers": 1, "bos_token_id": 0,
      "eos_token_id": 1, "tie_word_embeddings": False, "hidden_act": "silu",
      "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                              "quant_method": "fp8", "weight_block_size": [128, 128]}}
write(cf, "v3.json", json.dumps(v3, indent=1).encode())
v2 = dict(v3, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
          vocab_size=102400, hidden_size=2048, intermediate_size=10944,
          moe_intermediate_size=1408, num_hidden_layers=27, first_k_dense_replace=1,
          num_attention_heads=16, num_key_value_heads=16, n_routed_experts=64,
          n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1,
          topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
          routed_scaling_factor=1.0, q_lora_rank=None,
          rope_scaling=dict(v3["rope_scaling"], mscale=0.707, mscale_all_dim=0.707),
          bos_token_id=100000, eos_token_id=100001)
del v2["quantization_config"]
write(cf, "v2lite.json", json.dumps(v2).encode())
moon = dict(v2, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
            rope_scaling=None, rope_theta=50000.0, topk_method="noaux_tc",
            scoring_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.446)
write(cf, "moonlight.json", json.dumps(moon).encode())
write(cf, "minimal.json", b'{"architectures":["DeepseekV3ForCausalLM"]}')
write(cf, "tiny.json", json.dumps({
    "model_type": "deepseek_v2", "vocab_size": 99, "hidden_size": 32, "intermediate_size": 32,
    "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2,
    "topk_group": 1, "topk_method": "group_limited_greedy", "kv_lora_rank": 16,
    "q_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32,
    "eos_token_id": [1, 2], "n_routed_experts": 8}).encode())
write(cf, "t5.json", json.dumps({
    "architectures": ["DeepseekV2ForCausalLM"], "num_experts_per_tok": 6,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                        "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                        "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}}).encode())
