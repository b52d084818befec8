"""model.py — the DeepSeek-V3 architecture in torch, for training the small model
(train.py) and as a second, independent forward to check the C engine against
(check_logits.py).  Written from the official inference/model.py semantics
(reference/arch.md §1), not from the engine's code:

  h = embed[t];  per layer  h += MLA(attn_norm(h));  h += FFN(ffn_norm(h))
  MLA with q-LoRA, interleaved RoPE with the YaRN table and mscale² softmax scale;
  FFN dense for layer < first_k_dense_replace, else MoE: sigmoid scores, the
  correction bias for selection only, group-limited (top-2 sum per group,
  topk_group groups kept, others -inf), top-k, renormalised, × routed_scaling_factor,
  plus the shared expert;  logits = lm_head(norm(h)).
  MTP (one layer, num_nextn_predict_layers = 1), at main position i:
      u = eh_proj([enorm(embed(t[i+1])), hnorm(norm(h)[i])])   (embedding half first)
      logits_mtp[i] = lm_head(shared_head.norm(Block(u)))      predicts t[i+2]
  fed the main model's hidden state AFTER its final norm, as SGLang's EAGLE/NextN
  path does (tools/train/README.md says where that was confirmed).

Parameter names are the Hugging Face checkpoint's (state_dict() keys map 1:1 to
safetensors names).  Works in any float dtype (float32 training, float64 checking).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Norm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False)


def yarn_inv_freq(cfg):
    """θ'_i of reference/arch.md §0.4 (float64)."""
    d, b = cfg["qk_rope_head_dim"], cfg["rope_theta"]
    i = torch.arange(0, d // 2, dtype=torch.float64)
    theta = b ** (-2.0 * i / d)
    rs = cfg.get("rope_scaling")
    if not rs or rs.get("type") != "yarn":
        return theta
    s, L = rs["factor"], rs["original_max_position_embeddings"]
    bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

    def corr(r):
        return d * math.log(L / (2 * math.pi * r)) / (2 * math.log(b))

    low = max(math.floor(corr(bf)), 0)
    high = min(math.ceil(corr(bs)), d - 1)
    if low == high:
        high += 0.001
    ramp = ((i - low) / (high - low)).clamp(0, 1)
    return theta * (1 - ramp) + theta / s * ramp


def softmax_scale(cfg):
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs and rs.get("type") == "yarn":
        m = 0.1 * rs.get("mscale_all_dim", 1.0) * math.log(rs["factor"]) + 1.0
        scale *= m * m
    return scale


def rope(x, cos, sin):
    """Interleaved pairs (x[2i], x[2i+1]) rotated by the angle of their position.
    x [..., S, d]; cos/sin [S, d/2]."""
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, H = cfg["hidden_size"], cfg["num_attention_heads"]
        self.H, self.dn, self.dr, self.dv = H, cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        self.c = cfg["kv_lora_rank"]
        eps = cfg["rms_norm_eps"]
        self.q_a_proj = linear(D, cfg["q_lora_rank"])
        self.q_a_layernorm = Norm(cfg["q_lora_rank"], eps)
        self.q_b_proj = linear(cfg["q_lora_rank"], H * (self.dn + self.dr))
        self.kv_a_proj_with_mqa = linear(D, self.c + self.dr)
        self.kv_a_layernorm = Norm(self.c, eps)
        self.kv_b_proj = linear(self.c, H * (self.dn + self.dv))
        self.o_proj = linear(H * self.dv, D)
        self.scale = softmax_scale(cfg)

    def forward(self, x, cos, sin, cache=None):
        """x [B, S, D] at positions P..P+S-1 (cos/sin [S, dr/2] of those positions);
        cache: None (P = 0, training), or a dict holding the earlier positions' k_nope
        [B, H, P, dn], k_pe [B, 1, P, dr] and v [B, H, P, dv], extended in place."""
        B, S, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, S, self.H, self.dn + self.dr)
        q = q.transpose(1, 2)                                   # [B,H,S,dn+dr]
        q_nope, q_pe = q[..., :self.dn], rope(q[..., self.dn:], cos, sin)
        kv = self.kv_a_proj_with_mqa(x)
        c_kv = self.kv_a_layernorm(kv[..., :self.c])
        k_pe = rope(kv[..., self.c:], cos, sin).unsqueeze(1)    # [B,1,S,dr], shared by the heads
        kvb = self.kv_b_proj(c_kv).view(B, S, self.H, self.dn + self.dv).transpose(1, 2)
        k_nope, v = kvb[..., :self.dn], kvb[..., self.dn:]
        P = 0
        if cache is not None:
            if cache:
                P = cache["v"].shape[2]
                k_nope = torch.cat((cache["k_nope"], k_nope), 2)
                k_pe = torch.cat((cache["k_pe"], k_pe), 2)
                v = torch.cat((cache["v"], v), 2)
            cache.update(k_nope=k_nope, k_pe=k_pe, v=v)
        s = (q_nope @ k_nope.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)) * self.scale
        mask = torch.ones(S, P + S, dtype=torch.bool, device=x.device).triu(P + 1)
        p = s.masked_fill(mask, float("-inf")).softmax(-1)
        o = (p @ v).transpose(1, 2).reshape(B, S, self.H * self.dv)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, D, inter):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear(D, inter), linear(D, inter), linear(inter, D)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        E = cfg["n_routed_experts"]
        self.weight = nn.Parameter(torch.empty(E, cfg["hidden_size"]))
        # selection-only bias (aux-loss-free balancing, updated by train.py outside autograd)
        self.register_buffer("e_score_correction_bias", torch.zeros(E, dtype=torch.float32))
        self.k, self.G, self.kg = cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"]
        self.scale, self.renorm = cfg["routed_scaling_factor"], cfg["norm_topk_prob"]

    def forward(self, x):
        """x [T, D] -> (weights [T, k], indices [T, k])."""
        scores = F.linear(x, self.weight).sigmoid()
        sel = scores + self.e_score_correction_bias.to(scores.dtype)
        T, E = sel.shape
        g = sel.detach().view(T, self.G, E // self.G).topk(2, dim=-1).values.sum(-1)   # [T, G]
        keep = torch.zeros_like(g, dtype=torch.bool).scatter_(1, g.topk(self.kg, dim=-1).indices, True)
        sel = sel.masked_fill(~keep.repeat_interleave(E // self.G, dim=1), float("-inf"))
        idx = sel.detach().topk(self.k, dim=-1).indices
        w = scores.gather(1, idx)
        if self.renorm:
            w = w / w.sum(-1, keepdim=True)
        return w * self.scale, idx


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, I = cfg["hidden_size"], cfg["moe_intermediate_size"]
        self.gate = Gate(cfg)
        self.experts = nn.ModuleList(MLP(D, I) for _ in range(cfg["n_routed_experts"]))
        self.shared_experts = MLP(D, I * cfg["n_shared_experts"])
        self.last_load = None   # tokens per expert in the last forward (train.py's bias update)

    def forward(self, x):
        """Every routed expert at once: the (token, slot) pairs sorted by expert into a
        zero-padded [E, max load, D] buffer, three batched matmuls, the outputs scattered
        back weighted (the same sum as a per-expert loop, in fewer, larger kernels)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        w, idx = self.gate(x)
        y = self.shared_experts(x)
        E, k = len(self.experts), idx.shape[1]
        flat = idx.flatten()                                   # [T*k] expert of each pair
        load = torch.bincount(flat, minlength=E)
        self.last_load = load
        order = flat.argsort(stable=True)
        e_sorted = flat[order]
        first = torch.cumsum(load, 0) - load                   # first sorted pair of each expert
        pos = torch.arange(flat.numel(), device=x.device) - first[e_sorted]
        tok = order // k
        cap = int(load.max())
        buf = x.new_zeros(E, cap, x.shape[1])
        buf = buf.index_put((e_sorted, pos), x[tok])
        wg = torch.stack([ex.gate_proj.weight for ex in self.experts])    # [E, I, D]
        wu = torch.stack([ex.up_proj.weight for ex in self.experts])
        wd = torch.stack([ex.down_proj.weight for ex in self.experts])    # [E, D, I]
        hmid = F.silu(buf @ wg.transpose(1, 2)) * (buf @ wu.transpose(1, 2))
        out = (hmid @ wd.transpose(1, 2))[e_sorted, pos]       # [T*k, D] in sorted order
        out = out * w.flatten()[order].unsqueeze(-1).to(out.dtype)
        y = y.index_add(0, tok, out.to(y.dtype))
        return y.view(shape)


class Block(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        D, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_layernorm = Norm(D, eps)
        self.self_attn = MLA(cfg)
        self.post_attention_layernorm = Norm(D, eps)
        moe = layer >= cfg["first_k_dense_replace"] and layer % cfg.get("moe_layer_freq", 1) == 0
        self.mlp = MoE(cfg) if moe else MLP(D, cfg["intermediate_size"])

    def forward(self, h, cos, sin, cache=None):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class MTPLayer(Block):
    """Layer num_hidden_layers of the checkpoint: a Block plus enorm, hnorm, eh_proj and
    shared_head.norm (shared_head.head and embed_tokens are the main model's, not stored)."""

    def __init__(self, cfg, layer):
        super().__init__(cfg, layer)
        D, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.enorm, self.hnorm = Norm(D, eps), Norm(D, eps)
        self.eh_proj = linear(2 * D, D)
        self.shared_head = nn.Module()
        self.shared_head.norm = Norm(D, eps)


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        D, L = cfg["hidden_size"], cfg["num_hidden_layers"]
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg["vocab_size"], D)
        layers = [Block(cfg, l) for l in range(L)]
        layers += [MTPLayer(cfg, L + k) for k in range(cfg.get("num_nextn_predict_layers", 0))]
        self.model.layers = nn.ModuleList(layers)
        self.model.norm = Norm(D, cfg["rms_norm_eps"])
        self.lm_head = linear(D, cfg["vocab_size"])
        self.register_buffer("inv_freq", yarn_inv_freq(cfg), persistent=False)

    def rope_tables(self, S, dtype, start=0):
        """cos/sin [S, dr/2] of positions start .. start+S-1."""
        pos = torch.arange(start, start + S, dtype=torch.float64)
        ang = pos.unsqueeze(1) * self.inv_freq.unsqueeze(0)
        return ang.cos().to(dtype), ang.sin().to(dtype)

    def greedy(self, prompts, n):
        """Greedy decoding with a KV cache: prompts [B, P] ids (one length; BOS first if
        wanted) -> [B, n] tokens, each the argmax of the main model's logits (the first
        index on ties, as torch.argmax).  One prefill forward, then one forward of B
        tokens per step over the cached k_nope / k_pe / v of every layer.  The caller
        picks the precision (no_grad and autocast are the caller's; float32 here equals
        `moeserve generate --dtype float32`: check_logits.py checks it)."""
        L = self.cfg["num_hidden_layers"]
        dtype = self.lm_head.weight.dtype
        caches = [dict() for _ in range(L)]
        x, pos, out = prompts, 0, []
        for _ in range(n):
            cos, sin = self.rope_tables(x.shape[1], dtype, pos)
            h = self.model.embed_tokens(x)
            for layer, c in zip(self.model.layers[:L], caches):
                h = layer(h, cos, sin, c)
            nxt = self.lm_head(self.model.norm(h[:, -1:])).float().argmax(-1)   # [B, 1]
            out.append(nxt)
            pos += x.shape[1]
            x = nxt
        return torch.cat(out, 1)

    def forward(self, tokens, mtp=False):
        """tokens [B, S] -> logits [B, S, V] (position i predicts t[i+1]); with mtp also
        the MTP logits [B, S-1, V] (position i, fed t[i+1], predicts t[i+2])."""
        L = self.cfg["num_hidden_layers"]
        S = tokens.shape[1]
        dtype = self.lm_head.weight.dtype
        cos, sin = self.rope_tables(S, dtype)
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers[:L]:
            h = layer(h, cos, sin)
        h = self.model.norm(h)
        logits = self.lm_head(h)
        if not mtp:
            return logits
        m = self.model.layers[L]
        e = self.model.embed_tokens(tokens[:, 1:])
        u = m.eh_proj(torch.cat((m.enorm(e), m.hnorm(h[:, :-1])), dim=-1))
        u = m(u, cos[:S - 1], sin[:S - 1])
        return logits, self.lm_head(m.shared_head.norm(u))

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        n_res = 2 * (self.cfg["num_hidden_layers"] + 1)
        for name, p in sorted(self.named_parameters()):
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                nn.init.ones_(p)
                continue
            std = 0.02
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                std = 0.02 / math.sqrt(n_res)
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)
