#!/usr/bin/python3
# torch_check.py — second, independent implementation of the DeepSeek-V3 forward in torch (CPU,
# float64), used only to cross-check deepseek_ref.py.
#
# Owns nothing the engine uses.  Written in the style of the official inference/model.py:
# complex-number RoPE (view_as_complex over consecutive pairs, polar frequencies), torch.topk,
# masked_fill(-inf) group masking, scatter-based expert dispatch.  It has its own safetensors
# reader (torch.frombuffer; F32/BF16 only — torch 1.13 has no float8) and its own YaRN table,
# so a shared bug with deepseek_ref.py would have to be made twice.  /usr/bin/python3 only.

import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        dt = {"F32": torch.float32, "BF16": torch.bfloat16}[info["dtype"]]
        t = torch.frombuffer(bytearray(data[base + b:base + e]), dtype=dt)
        out[name] = t.reshape(info["shape"]).to(torch.float64)
    return out


def load_dir(d):
    w = {}
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for fn in files:
        w.update(load_safetensors(os.path.join(d, fn)))
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f), w


def freqs_cis(cfg, seqlen):
    dim, base = cfg["qk_rope_head_dim"], cfg["rope_theta"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = cfg.get("rope_scaling")
    if rs:
        fac, orig = rs["factor"], rs["original_max_position_embeddings"]

        def cdim(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

        lo = max(math.floor(cdim(rs["beta_fast"])), 0)
        hi = min(math.ceil(cdim(rs["beta_slow"])), dim - 1)
        if lo == hi:
            hi += 0.001
        smooth = 1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo),
                                 0, 1)
        freqs = freqs / fac * (1 - smooth) + freqs * smooth
    ang = torch.outer(torch.arange(seqlen, dtype=torch.float64), freqs)
    return torch.polar(torch.ones_like(ang), ang)


def rot(x, fc):
    # x [T, H, dr]
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * fc[:, None, :]).flatten(-2)


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def forward(cfg, W, tokens):
    T = len(tokens)
    H, dn, dr, dv = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim",
                                      "qk_rope_head_dim", "v_head_dim"))
    kl, eps = cfg["kv_lora_rank"], cfg["rms_norm_eps"]
    scale = (dn + dr) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        m = 0.1 * rs["mscale_all_dim"] * math.log(rs["factor"]) + 1.0
        scale = scale * m * m
    fc = freqs_cis(cfg, T)
    mask = torch.full((T, T), float("-inf")).triu_(1)
    x = W["model.embed_tokens.weight"][torch.tensor(tokens)]
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        a = p + "self_attn."
        h = rms(x, W[p + "input_layernorm.weight"], eps)
        if cfg.get("q_lora_rank"):
            q = F.linear(rms(F.linear(h, W[a + "q_a_proj.weight"]), W[a + "q_a_layernorm.weight"],
                             1e-6), W[a + "q_b_proj.weight"])
        else:
            q = F.linear(h, W[a + "q_proj.weight"])
        q = q.view(T, H, dn + dr)
        q_nope, q_pe = torch.split(q, [dn, dr], dim=-1)
        q_pe = rot(q_pe, fc)
        kv = F.linear(h, W[a + "kv_a_proj_with_mqa.weight"])
        kv, k_pe = torch.split(kv, [kl, dr], dim=-1)
        k_pe = rot(k_pe.unsqueeze(1), fc)
        kv = F.linear(rms(kv, W[a + "kv_a_layernorm.weight"], 1e-6), W[a + "kv_b_proj.weight"])
        k_nope, v = torch.split(kv.view(T, H, dn + dv), [dn, dv], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, H, -1)], dim=-1)
        qq = torch.cat([q_nope, q_pe], dim=-1)
        sc = torch.einsum("shd,thd->sht", qq, k) * scale + mask.unsqueeze(1)
        o = torch.einsum("sht,thd->shd", sc.softmax(dim=-1), v)
        x = x + F.linear(o.flatten(1), W[a + "o_proj.weight"])

        h = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        m_ = p + "mlp."

        def mlp(pre, z):
            return F.linear(F.silu(F.linear(z, W[pre + "gate_proj.weight"])) *
                            F.linear(z, W[pre + "up_proj.weight"]), W[pre + "down_proj.weight"])

        is_moe = (cfg.get("n_routed_experts") and L >= cfg["first_k_dense_replace"]
                  and L % cfg["moe_layer_freq"] == 0)
        if not is_moe:
            x = x + mlp(m_, h)
            continue
        E, k_, G, TG = (cfg[k] for k in ("n_routed_experts", "num_experts_per_tok", "n_group",
                                         "topk_group"))
        s = F.linear(h, W[m_ + "gate.weight"])
        s = s.softmax(dim=-1) if cfg["scoring_func"] == "softmax" else s.sigmoid()
        orig = s
        bias = W.get(m_ + "gate.e_score_correction_bias")
        if bias is not None:
            s = s + bias
        if cfg["topk_method"] != "greedy" and G > 1:
            s = s.view(T, G, -1)
            gs = s.amax(dim=-1) if bias is None else s.topk(2, dim=-1)[0].sum(dim=-1)
            keep = gs.topk(TG, dim=-1)[1]
            drop = torch.ones(T, G, dtype=torch.bool).scatter_(1, keep, False)
            s = s.masked_fill(drop.unsqueeze(-1), float("-inf")).flatten(1)
        idx = s.topk(k_, dim=-1)[1]
        wts = orig.gather(1, idx)
        if cfg["norm_topk_prob"]:
            wts = wts / wts.sum(dim=-1, keepdim=True)
        wts = wts * cfg["routed_scaling_factor"]
        y = torch.zeros_like(h)
        for e in range(E):
            ti, slot = torch.where(idx == e)
            if ti.numel():
                y[ti] += mlp(f"{m_}experts.{e}.", h[ti]) * wts[ti, slot, None]
        if cfg.get("n_shared_experts"):
            y = y + mlp(m_ + "shared_experts.", h)
        x = x + y
    x = rms(x, W["model.norm.weight"], eps)
    return F.linear(x, W["lm_head.weight"])


def main():
    d, toks = sys.argv[1], [int(t) for t in sys.argv[2].split(",")]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import deepseek_ref as R
    cfg, W = load_dir(d)
    lt = forward(cfg, W, toks).numpy()
    lr = R.Model(R.Checkpoint(d)).forward_naive(toks)
    diff = R.rel_diff(lr, lt)
    print(f"torch vs numpy reference: max rel diff {diff:.3e} over {lt.shape}")
    return 0 if diff < 1e-11 else 1


if __name__ == "__main__":
    sys.exit(main())
