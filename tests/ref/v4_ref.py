#!/usr/bin/python3
"""v4_ref.py — float64 oracle forward for DeepSeek-V4 checkpoints (model_type deepseek_v4).

Owns the V4 math for tests: mHC (hc_pre / hc_post / hc_head with Sinkhorn), attention (q-LoRA,
per-head RMS norm, interleaved RoPE on the last rope dims, sliding window, learned sink, inverse
RoPE, grouped low-rank output), the compressor (ratio 4 overlapping, ratio 128), the CSA lightning
indexer, and MoE (sqrt-softplus, bias for selection only, tid2eid hash routing, clamped SwiGLU,
shared expert).  Written from ../shared/reference/arch.md §0, §2, §5.2, not from the C engine.
No activation / KV / indexer quantisation simulation by default (the engine's --dtype float32
has none); the indexer's Hadamard rotation is omitted too (orthogonal: q·k is unchanged).
--kv-fp8 simulates the deployed main KV entries (--kv-cache-dtype fp8_e4m3): every window kv
and compressed entry's nope dims quantised to e4m3 in blocks of 64 with a power-of-two
scale 2^ceil(log2(max(amax, 1e-4) / 448)), its rope dims rounded to BF16 (arch.md §2.11).
--fp4-indexer simulates MXFP4 index keys (--enable-deepseek-v4-fp4-indexer): index keys and
the indexer's roped queries rotated by the normalised Sylvester Hadamard matrix, then
quantised to e2m1 in blocks of 32 with scale 2^ceil(log2(max(amax, 1e-4) / 6)), nearest
value, ties to the even code (arch.md §2.7).  --fp8-indexer simulates SGLang's FP8 index keys
(--kv-cache-dtype fp8_e4m3 without the FP4 indexer): the same rotation, then e4m3 in blocks of
128 with scale 2^ceil(log2(max(amax, 1e-4) / 448)).  Written from those definitions.

Interface (Debian's /usr/bin/python3, numpy):

    v4_ref.py --model DIR --prompt-ids 1,2,3 --decode N [--greedy] --out FILE.json
              [--digits 10] [--no-incremental-check] [--kv-fp8] [--fp4-indexer | --fp8-indexer]
    v4_ref.py --model DIR --mtp-check DUMP.json   (the MTP block as a draft chain, arch.md
              §2.10: the engine's draft logits to 1e-4 relative, the same draft tokens)

DIR holds config.json (HF names, arch.md §2.2) and model.safetensors (or shards + index) with
the official tensor names (arch.md §2.3): BF16/F16/F32, FP8 e4m3 with `.scale` block scales
(F8_E8M0 or F32, weight_block_size, default 128x128) and FP4 e2m1 (I8, two codes per byte, low
nibble = even column) with per-32 F8_E8M0 `.scale`, all dequantised exactly to float64.
Output JSON:
    prefill_logits   vocab floats for the last prompt position
    steps            N entries {"token": id fed at this step, "logits": vocab floats after it}
    greedy           N+1 ids: greedy[0] = argmax(prefill_logits), greedy[i] = steps[i].token,
                     greedy[N] = argmax(steps[N-1].logits); argmax ties -> lowest id
    min_topk_margin  smallest indexer top-k decision gap (k-th minus (k+1)-th score, divided by
                     the largest |score| of that query), over every query of the final
                     sequence; null when no query had more valid entries than index_topk
    min_route_margin smallest biased-score gap (k-th minus (k+1)-th) of a non-hash MoE
                     routing decision; null when there is none
    min_argmax_margin  smallest top-1 minus top-2 logit over the outputs
    results          the same N+1 outputs in deepseek_ref.py's layout (tests/compare_logits.py):
                     [{"prompt_ids", "steps": [{"step": i, "token": greedy[i], "logits"}]}]
    incremental_rel_diff  max relative difference of the incremental decoder (ring buffer +
                     compressor state, prefill = N single steps) from the full forward
Every output is a row of the full causal forward over the whole sequence (the definition); the
incremental decoder (arch.md §2.7 decode state, §5.2) chooses the greedy tokens and must agree
with every row to 1e-9 (--no-incremental-check: one full forward per token instead).
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_ref as R  # noqa: E402  (safetensors reader, FP8 table, RoPE, YaRN, small math)

INCREMENTAL_TOL = 1e-9

# ----------------------------------------------------------------------------------------------
# Checkpoint: names and number formats of arch.md §0.6, §0.7, §2.3


def e8m0(codes):
    """UE8M0 bytes -> 2^(b-127) float64; byte 255 is NaN (refused)."""
    c = np.asarray(codes, dtype=np.int64)
    if (c == 255).any():
        raise ValueError("F8_E8M0 scale holds the NaN code 255")
    return np.ldexp(1.0, c - 127)


FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


class V4Checkpoint:
    """Tensors of a V4 directory as float64 (tid2eid as int64), every one used at most once."""

    def __init__(self, model_dir):
        ck = R.Checkpoint(model_dir)          # V3 reader: files, shards, header validation
        self.config = ck.config
        self.where = ck.where
        qc = self.config.get("quantization_config") or {}
        self.block = tuple(qc.get("weight_block_size", [128, 128]))
        self.used = set()

    def raw(self, name):
        if name not in self.where:
            raise KeyError(f"missing tensor {name}")
        self.used.add(name)
        return self.where[name].raw(name)

    def has(self, name):
        return name in self.where

    def plain(self, name, shape):
        dt, a = self.raw(name)
        if dt == "BF16":
            out = R.bf16_to_f64(a)
        elif dt in ("F64", "F32", "F16"):
            out = a.astype(np.float64)
        else:
            raise ValueError(f"{name}: dtype {dt} not allowed here")
        return self._shape(name, out, shape)

    def linear(self, prefix, shape):
        """`prefix.weight` [out, in], dequantised with `prefix.scale` when FP8 / FP4."""
        name, sname = prefix + ".weight", prefix + ".scale"
        dt, a = self.raw(name) if name in self.where else (None, None)
        if dt is None:
            raise KeyError(f"missing tensor {name}")
        if dt == "F8_E4M3":
            w = R.FP8_E4M3[a]
            if np.isnan(w).any():
                raise ValueError(f"{name}: FP8 NaN code")
            s = self._scale(sname)
            bo, bi = self.block
            want = (-(-a.shape[0] // bo), -(-a.shape[1] // bi))
            if s.shape != want:
                raise ValueError(f"{sname}: shape {s.shape}, expected {want}")
            w = w * np.repeat(np.repeat(s, bo, 0), bi, 1)[:a.shape[0], :a.shape[1]]
        elif dt == "I8":                       # FP4 e2m1, [out, in/2], low nibble first
            u = a.view(np.uint8)
            w = np.empty((u.shape[0], u.shape[1] * 2))
            w[:, 0::2] = FP4_E2M1[u & 0xF]
            w[:, 1::2] = FP4_E2M1[u >> 4]
            s = self._scale(sname)
            if s.shape != (w.shape[0], w.shape[1] // 32):
                raise ValueError(f"{sname}: shape {s.shape}, expected per-32 scales")
            w = w * np.repeat(s, 32, 1)
        else:
            if sname in self.where:
                raise ValueError(f"{sname} present but {name} is {dt}")
            return self.plain(name, shape)
        return self._shape(name, w, shape)

    def _scale(self, sname):
        dt, s = self.raw(sname)
        if dt == "F8_E8M0":
            return e8m0(s)
        if dt == "F32":
            return s.astype(np.float64)
        raise ValueError(f"{sname}: scale dtype {dt}")

    def ids(self, name, shape):
        dt, a = self.raw(name)
        if dt not in ("I64", "I32"):
            raise ValueError(f"{name}: dtype {dt}, expected I64")
        return self._shape(name, a.astype(np.int64), shape)

    @staticmethod
    def _shape(name, a, shape):
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {tuple(a.shape)}, expected {tuple(shape)}")
        return a


# ----------------------------------------------------------------------------------------------
# Configuration (arch.md §2.2, HF names)


class V4Config:
    def __init__(self, c):
        def req(k):
            if c.get(k) is None:
                raise ValueError(f"config.json: missing {k}")
            return c[k]

        self.raw = c
        self.vocab, self.dim = int(req("vocab_size")), int(req("hidden_size"))
        self.n_layers, self.n_heads = int(req("num_hidden_layers")), int(req("num_attention_heads"))
        self.hd, self.dr = int(req("head_dim")), int(req("qk_rope_head_dim"))
        self.q_lora = int(req("q_lora_rank"))
        self.groups, self.o_lora = int(req("o_groups")), int(req("o_lora_rank"))
        self.window = int(req("sliding_window"))
        self.n_idx, self.d_idx = int(req("index_n_heads")), int(req("index_head_dim"))
        self.idx_topk = int(req("index_topk"))
        self.n_exp, self.n_shared = int(req("n_routed_experts")), int(c.get("n_shared_experts") or 0)
        self.topk, self.moe_inter = int(req("num_experts_per_tok")), int(req("moe_intermediate_size"))
        self.n_hash = int(c.get("num_hash_layers") or 0)
        self.route_scale = float(c.get("routed_scaling_factor", 1.0))
        self.norm_topk = bool(c.get("norm_topk_prob", True))
        self.limit = float(c.get("swiglu_limit") or 0.0)        # 0: no clamp
        self.hc, self.sinkhorn = int(req("hc_mult")), int(c.get("hc_sinkhorn_iters", 20))
        self.hc_eps, self.eps = float(c.get("hc_eps", 1e-6)), float(c.get("rms_norm_eps", 1e-6))
        self.ratios = [int(x) for x in req("compress_ratios")][:self.n_layers]
        if len(self.ratios) < self.n_layers or any(r not in (0, 4, 128) for r in self.ratios):
            raise ValueError("compress_ratios: one of 0, 4, 128 per layer")
        if c.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
            raise ValueError(f"scoring_func {c.get('scoring_func')} unsupported")
        if self.n_heads % self.groups or self.dr > self.hd or self.dr > self.d_idx or self.dr % 2:
            raise ValueError("head / o_groups / rope dims inconsistent")
        # RoPE tables (§0.4): ratio-0 layers plain rope_theta; compressed layers
        # compress_rope_theta with YaRN when rope_scaling is given.
        self.theta_plain = 1.0 / np.power(float(c.get("rope_theta", 10000.0)),
                                          np.arange(0, self.dr, 2, dtype=np.float64) / self.dr)
        base_c = float(c.get("compress_rope_theta", 160000.0))
        rs = c.get("rope_scaling")
        if rs and int(rs.get("original_max_position_embeddings", 0)) > 0:
            self.theta_comp, _ = R.yarn_inv_freq(self.dr, base_c, float(rs["factor"]),
                                                 int(rs["original_max_position_embeddings"]),
                                                 float(rs.get("beta_fast", 32)),
                                                 float(rs.get("beta_slow", 1)))
        else:
            self.theta_comp = 1.0 / np.power(base_c, np.arange(0, self.dr, 2,
                                                               dtype=np.float64) / self.dr)
        self.scale = self.hd ** -0.5

    def ratio(self, layer):
        """Layer `layer`'s compress ratio; the MTP block (layer n_layers) has
        compress_ratios[n_layers], 0 (window-only, base RoPE) when absent (arch.md §2.10)."""
        if layer < self.n_layers:
            return self.ratios[layer]
        r = [int(x) for x in self.raw["compress_ratios"]]
        return r[layer] if layer < len(r) else 0

    def theta(self, layer):
        return self.theta_plain if self.ratio(layer) == 0 else self.theta_comp


# ----------------------------------------------------------------------------------------------
# Small math


def rms(x, w, eps):
    """RMSNorm over the last axis; w None = unweighted."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def rope_tail(x, pos, theta, dr, inverse=False):
    """Interleaved RoPE on the last dr channels of x [T, ..., C] at positions pos [T]."""
    y = x.copy()
    th = -theta if inverse else theta
    y[..., -dr:] = R.rope_interleaved(x[..., -dr:], pos, th)
    return y


def stable_topk(v, k):
    """Indices of the k largest (ties -> lowest index) and the decision gap (k-th − (k+1)-th)."""
    order = np.argsort(-v, kind="stable")
    gap = v[order[k - 1]] - v[order[k]] if len(v) > k else math.inf
    return order[:k], gap


class Margins:
    def __init__(self):
        self.topk = math.inf
        self.route = math.inf


# ----------------------------------------------------------------------------------------------
# mHC (arch.md §2.5).  X: [T, n, D] residual streams.


def sinkhorn(c0, iters, eps):
    """c0 [T, n, n] -> approximately doubly stochastic: row softmax + eps, column normalise,
    then (iters-1) x (row normalise, column normalise); each division adds eps."""
    c = R.softmax(c0, axis=-1) + eps
    c = c / (c.sum(axis=-2, keepdims=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(axis=-1, keepdims=True) + eps)
        c = c / (c.sum(axis=-2, keepdims=True) + eps)
    return c


def hc_pre(cfg, X, fn, base, scale):
    """X [T,n,D] -> u [T,D], post [T,n], C [T,n,n]."""
    T, n, D = X.shape
    v = X.reshape(T, n * D)
    mix = (v @ fn.T) / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + cfg.eps)   # [T, (2+n)n]
    pre = R.sigmoid(scale[0] * mix[:, :n] + base[:n]) + cfg.hc_eps
    post = 2.0 * R.sigmoid(scale[1] * mix[:, n:2 * n] + base[n:2 * n])
    c0 = (scale[2] * mix[:, 2 * n:] + base[2 * n:]).reshape(T, n, n)
    C = sinkhorn(c0, cfg.sinkhorn, cfg.hc_eps)
    u = np.einsum("tk,tkd->td", pre, X)
    return u, post, C


def hc_post(f, X, post, C):
    """X'_k = post_k f + Σ_j C[j,k] X_j.  f [T,D], X [T,n,D] -> [T,n,D]."""
    return post[:, :, None] * f[:, None, :] + np.einsum("tjk,tjd->tkd", C, X)


def hc_head(cfg, X, fn, base, scale):
    """X [T,n,D] -> y [T,D]: pre-weights only (sigmoid + eps)."""
    T, n, D = X.shape
    v = X.reshape(T, n * D)
    mix = (v @ fn.T) / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + cfg.eps)   # [T, n]
    pre = R.sigmoid(mix * scale[0] + base) + cfg.hc_eps
    return np.einsum("tk,tkd->td", pre, X)


# ----------------------------------------------------------------------------------------------
# Cache quantisation simulations (--kv-fp8, --fp4-indexer)


def pow2_ceil_exp(v):
    """ceil(log2(v)) for v > 0, exactly (frexp: v = m 2^k, m in [0.5, 1))."""
    m, k = np.frexp(v)
    return k - (m == 0.5)


def blocks_scale(x, n, qmax):
    """x [..., d] in blocks of n along the last axis -> per-value scale 2^ceil(log2(amax/qmax))."""
    d = x.shape[-1]
    s = np.empty_like(x)
    for b in range(0, d, n):
        amax = np.maximum(np.abs(x[..., b:b + n]).max(axis=-1, keepdims=True), 1e-4)
        s[..., b:b + n] = np.ldexp(1.0, pow2_ceil_exp(amax / qmax))
    return s


def e4m3_round(v):
    """Nearest e4m3fn value (3 mantissa bits, subnormal step 2^-9), ties to even, |v| <= 448."""
    a = np.abs(v)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    step = np.where(a < 2.0 ** -6, 2.0 ** -9, np.ldexp(1.0, (np.maximum(e, -6) - 3).astype(int)))
    return np.clip(np.round(v / step) * step, -448.0, 448.0)


def bf16_round(v):
    """Nearest BF16 value (through float32), ties to even."""
    u = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def fp8ds_sim(x, dr):
    """Main KV entries [..., hd]: e4m3 nope dims (block 64), BF16 rope dims."""
    nope = x.shape[-1] - dr
    y = np.array(x, dtype=np.float64)
    s = blocks_scale(y[..., :nope], 64, 448.0)
    v = note_edges("entry", np.clip(y[..., :nope] / s, -448.0, 448.0))
    y[..., :nope] = e4m3_round(v) * s
    y[..., nope:] = bf16_round(note_edges("rope", y[..., nope:]))
    return y


def fp4_round(v):
    """Nearest e2m1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6), ties to the even code, saturating."""
    a = np.minimum(np.abs(v), 6.0)
    step = np.where(a < 2.0, 0.5, np.where(a < 4.0, 1.0, 2.0))
    return np.sign(v) * np.minimum(np.round(a / step) * step, 6.0)


def hadamard(d):
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(d)


# The smallest distances of FP8-key inputs to an e4m3 rounding edge (fp8key_sim): relative
# distance |v - midpoint| / |v| of the scaled values v, per kind ('key', 'query'): a value within
# ~1e-6 of an edge can round the other way from the engine's float32 forward.
FP8_EDGES = {"key": [math.inf, 0], "query": [math.inf, 0], "entry": [math.inf, 0],
             "rope": [math.inf, 0]}
FP8_EDGE_NEAR = 1e-6


# --fp8-flip KIND:V,...: scaled values (as listed in fp8_edges' "values") rounded to their other
# e4m3 neighbour: a what-if for a value the engine's float32 forward puts on the other side of
# its edge (the flipped values' identity: kind and |v| to 9 significant digits).
FP8_FLIP = set()


def flip_key(kind, v):
    return f"{kind}:{abs(float(v)):.9e}"


def note_edges(kind, v):
    """Record the scaled values v's distances to an e4m3 edge; returns v with the --fp8-flip
    values moved across their edge (by 2 * their distance: the other neighbour)."""
    if not v.size:
        return v
    bf16 = kind == "rope"
    dist = e4m3_edge_dist(v, bf16)
    rec = FP8_EDGES[kind]
    rec[0] = min(rec[0], float(dist.min()))
    near = np.argwhere(dist < FP8_EDGE_NEAR)
    rec[1] += len(near)
    if len(rec) < 3:
        rec.append([])
    out = v
    for idx in map(tuple, near):
        key = flip_key(kind, v[idx])
        if key not in rec[2]:
            rec[2].append(key)
        if key in FP8_FLIP:
            out = np.array(v, dtype=np.float64) if out is v else out
            a = abs(v[idx])
            step = float(edge_step(np.array(a), bf16))
            mid = (math.floor(a / step) + 0.5) * step
            out[idx] = math.copysign(2 * mid - a, v[idx])
    return out


def edge_step(a, bf16=False):
    """The rounding step at |values| a: e4m3 (3 mantissa bits, subnormal step 2^-9) or BF16 (7)."""
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    if bf16:
        return np.ldexp(1.0, (e - 7).astype(int))
    return np.where(a < 2.0 ** -6, 2.0 ** -9, np.ldexp(1.0, (np.maximum(e, -6) - 3).astype(int)))


def e4m3_edge_dist(v, bf16=False):
    """Relative distance of each scaled value v (|v| <= 448) to the nearest e4m3 (or BF16)
    rounding midpoint."""
    a = np.abs(v)
    step = edge_step(a, bf16)
    mid = (np.floor(a / step) + 0.5) * step
    return np.where(a > 0, np.abs(a - mid) / np.maximum(a, 1e-300), np.inf)


def fp8key_sim(x, kind="key"):
    """Index keys / queries [..., d]: Hadamard-rotated, then e4m3 in blocks of 128 with SGLang's
    rule (fused_store_indexer_cache / fused_q_indexer_rope_hadamard_quant): in float32, as SGLang
    and the engine compute it, s = max(amax, 1e-4) / 448, v = clamp(x * (1 / s), +-448), code =
    e4m3(v) to nearest even, value = code * s."""
    y = (np.asarray(x, dtype=np.float64) @ hadamard(x.shape[-1]).T).astype(np.float32)
    out = np.empty(y.shape, dtype=np.float64)
    f32 = np.float32
    for b in range(0, y.shape[-1], 128):
        blk = y[..., b:b + 128]
        s = np.maximum(np.abs(blk).max(axis=-1, keepdims=True), f32(1e-4)) / f32(448.0)
        v = np.clip(blk * (f32(1.0) / s), f32(-448.0), f32(448.0))
        v = note_edges(kind, v.astype(np.float64))
        out[..., b:b + 128] = (e4m3_round(v).astype(np.float32) * s).astype(np.float64)
    return out


def index_sim(x, fmt, kind="key"):
    """The index keys' / queries' format: 'fp4', 'fp8' or None (exact)."""
    return mxfp4_sim(x) if fmt == "fp4" else fp8key_sim(x, kind) if fmt == "fp8" else x


def mxfp4_sim(x):
    """Index keys / queries [..., d]: Hadamard-rotated, then e2m1 in blocks of 32."""
    y = np.asarray(x, dtype=np.float64) @ hadamard(x.shape[-1]).T
    s = blocks_scale(y, 32, 6.0)
    return fp4_round(y / s) * s


# ----------------------------------------------------------------------------------------------
# Layer weights


class Layer:
    def __init__(self, ck, cfg, L, prefix=None):
        """Block L of the stack, or (prefix "mtp.0.", L = n_layers) the MTP block's."""
        p = prefix or f"layers.{L}."
        D, n, H, hd = cfg.dim, cfg.hc, cfg.n_heads, cfg.hd
        M = (2 + n) * n
        self.L, self.m = L, cfg.ratio(L)
        for site in ("attn", "ffn"):
            setattr(self, f"hc_{site}", (ck.plain(f"{p}hc_{site}_fn", (M, n * D)),
                                         ck.plain(f"{p}hc_{site}_base", (M,)),
                                         ck.plain(f"{p}hc_{site}_scale", (3,))))
        self.attn_norm = ck.plain(p + "attn_norm.weight", (D,))
        self.ffn_norm = ck.plain(p + "ffn_norm.weight", (D,))
        a = p + "attn."
        self.wq_a = ck.linear(a + "wq_a", (cfg.q_lora, D))
        self.q_norm = ck.plain(a + "q_norm.weight", (cfg.q_lora,))
        self.wq_b = ck.linear(a + "wq_b", (H * hd, cfg.q_lora))
        self.wkv = ck.linear(a + "wkv", (hd, D))
        self.kv_norm = ck.plain(a + "kv_norm.weight", (hd,))
        G, Rk = cfg.groups, cfg.o_lora
        self.wo_a = ck.linear(a + "wo_a", (G * Rk, H * hd // G)).reshape(G, Rk, H * hd // G)
        self.wo_b = ck.linear(a + "wo_b", (D, G * Rk))
        self.sink = ck.plain(a + "attn_sink", (H,))
        self.comp = self.idx = None
        if self.m:
            self.comp = self._compressor(ck, a + "compressor.", D, hd, self.m)
        if self.m == 4:
            i = a + "indexer."
            self.idx_wq_b = ck.linear(i + "wq_b", (cfg.n_idx * cfg.d_idx, cfg.q_lora))
            self.idx_wproj = ck.linear(i + "weights_proj", (cfg.n_idx, D))
            self.idx = self._compressor(ck, i + "compressor.", D, cfg.d_idx, 4)
            self.idx["index"] = True
        f = p + "ffn."
        self.gate = ck.linear(f + "gate", (cfg.n_exp, D))
        self.hash = L < cfg.n_hash
        if self.hash:
            self.tid2eid = ck.ids(f + "gate.tid2eid", (cfg.vocab, cfg.topk))
            if (self.tid2eid < 0).any() or (self.tid2eid >= cfg.n_exp).any():
                raise ValueError(f"{f}gate.tid2eid: expert id out of range")
        else:
            self.bias = ck.plain(f + "gate.bias", (cfg.n_exp,))
        I = cfg.moe_inter
        self.experts = [tuple(ck.linear(f"{f}experts.{e}.{w}", s) for w, s in
                              (("w1", (I, D)), ("w2", (D, I)), ("w3", (I, D))))
                        for e in range(cfg.n_exp)]
        Is = I * cfg.n_shared
        self.shared = tuple(ck.linear(f"{f}shared_experts.{w}", s) for w, s in
                            (("w1", (Is, D)), ("w2", (D, Is)), ("w3", (Is, D)))) \
            if cfg.n_shared else None

    @staticmethod
    def _compressor(ck, p, D, d, m):
        c2 = 2 if m == 4 else 1
        return dict(m=m, d=d, overlap=(m == 4),
                    wkv=ck.linear(p + "wkv", (c2 * d, D)), wgate=ck.linear(p + "wgate", (c2 * d, D)),
                    ape=ck.plain(p + "ape", (m, c2 * d)), norm=ck.plain(p + "norm.weight", (d,)))


# ----------------------------------------------------------------------------------------------
# The model


class V4Model:
    def __init__(self, ck):
        self.cfg = cfg = V4Config(ck.config)
        D, n = cfg.dim, cfg.hc
        self.embed = ck.plain("embed.weight", (cfg.vocab, D))
        self.head = ck.plain("head.weight", (cfg.vocab, D))
        self.norm = ck.plain("norm.weight", (D,))
        self.hc_head_w = (ck.plain("hc_head_fn", (n, n * D)), ck.plain("hc_head_base", (n,)),
                          ck.plain("hc_head_scale", (1,)))
        self.layers = [Layer(ck, cfg, L) for L in range(cfg.n_layers)]
        self.kv_fp8 = self.fp4_indexer = False  # the cache simulations (main(): the flags)
        self.fp8_indexer = False
        unused = [k for k in ck.where if k not in ck.used and not k.startswith("mtp.")]
        if unused:
            raise ValueError(f"{len(unused)} tensors not used, e.g. {sorted(unused)[:5]}")
        self.margins = Margins()

    # --- compressor, definition form (arch.md §2.7) ------------------------------------------

    def compress_full(self, c, u, theta):
        """u [T,D] -> entries [T//m, d]: entry j pools window j (tokens jm..jm+m-1) per channel
        with a softmax over the gates; ratio 4 also pools the previous window's first halves."""
        m, d = c["m"], c["d"]
        T = u.shape[0]
        a = u @ c["wkv"].T                                          # [T, c'd]
        g = u @ c["wgate"].T + c["ape"][np.arange(T) % m]           # [T, c'd]
        out = np.zeros((T // m, d))
        for j in range(T // m):
            cur = slice(j * m, j * m + m)
            if c["overlap"]:
                vals, gates = a[cur, d:], g[cur, d:]
                if j > 0:
                    prev = slice(j * m - m, j * m)
                    vals = np.concatenate([a[prev, :d], vals])
                    gates = np.concatenate([g[prev, :d], gates])
            else:
                vals, gates = a[cur], g[cur]
            out[j] = (R.softmax(gates, axis=0) * vals).sum(axis=0)
        return self._finish_entries(c, out, np.arange(T // m) * m, theta)

    def _finish_entries(self, c, e, pos, theta):
        """RMSNorm(norm) then RoPE on the last rope dims at the window's first position."""
        e = rms(e, c["norm"], self.cfg.eps)
        e = rope_tail(e, pos, theta, self.cfg.dr) if len(pos) else e
        if c.get("index"):
            return index_sim(e, "fp4" if self.fp4_indexer else "fp8" if self.fp8_indexer else None)
        return fp8ds_sim(e, self.cfg.dr) if self.kv_fp8 else e

    # --- indexer, definition form (arch.md §2.8) ---------------------------------------------

    def index_scores(self, ly, u, qr, pos, keys, theta):
        """u [T,D], qr [T,q_lora], keys [nE, d_idx] -> scores [T, nE] (causally invalid -inf)."""
        cfg = self.cfg
        T = u.shape[0]
        q = (qr @ ly.idx_wq_b.T).reshape(T, cfg.n_idx, cfg.d_idx)
        q = rope_tail(q, pos, theta, cfg.dr)
        q = index_sim(q, "fp4" if self.fp4_indexer else "fp8" if self.fp8_indexer else None,
                      "query")
        w = (u @ ly.idx_wproj.T) * (cfg.d_idx ** -0.5 * cfg.n_idx ** -0.5)        # [T, n_idx]
        s = np.einsum("th,thj->tj", w, np.maximum(np.einsum("thd,jd->thj", q, keys), 0.0))
        valid = np.arange(keys.shape[0])[None, :] < ((np.asarray(pos) + 1) // 4)[:, None]
        return np.where(valid, s, -np.inf)

    def index_select(self, s):
        """One query's scores [nE] (-inf = invalid) -> selected entry indices (top-k)."""
        nv = int(np.isfinite(s).sum())
        k = min(self.cfg.idx_topk, nv)
        if k == 0:
            return np.zeros(0, dtype=np.int64)
        sel, gap = stable_topk(s, k)
        if nv > k:
            self.margins.topk = min(self.margins.topk,
                                    gap / max(np.max(np.abs(s[np.isfinite(s)])), 1e-300))
        return sel

    # --- attention pieces shared by both forms -----------------------------------------------

    def q_kv(self, ly, u, pos):
        """u [T,D] -> qr [T,q_lora], q [T,H,hd] (normed, roped), kv [T,hd] (normed, roped)."""
        cfg = self.cfg
        th = cfg.theta(ly.L)
        qr = rms(u @ ly.wq_a.T, ly.q_norm, cfg.eps)
        q = rms((qr @ ly.wq_b.T).reshape(len(pos), cfg.n_heads, cfg.hd), None, cfg.eps)
        q = rope_tail(q, pos, th, cfg.dr)
        kv = rope_tail(rms(u @ ly.wkv.T, ly.kv_norm, cfg.eps), pos, th, cfg.dr)
        return qr, q, fp8ds_sim(kv, cfg.dr) if self.kv_fp8 else kv

    def attend(self, ly, q, cand, p):
        """One query: q [H,hd], candidates cand [nc,hd] (K = V) -> projected output [D]."""
        cfg = self.cfg
        s = (q @ cand.T) * cfg.scale                                 # [H, nc]
        z = s.max(axis=1, keepdims=True)
        e = np.exp(s - z)
        o = (e @ cand) / (e.sum(axis=1, keepdims=True) + np.exp(ly.sink[:, None] - z))
        o = rope_tail(o[None], [p], cfg.theta(ly.L), cfg.dr, inverse=True)[0]     # [H, hd]
        og = o.reshape(cfg.groups, -1)                               # [G, H/G*hd]
        zg = np.einsum("grc,gc->gr", ly.wo_a, og)                    # [G, R]
        return ly.wo_b @ zg.reshape(-1)

    def attention_full(self, ly, u):
        """Causal attention over the whole sequence, u [T,D] -> [T,D]."""
        cfg = self.cfg
        T = u.shape[0]
        pos = np.arange(T)
        th = cfg.theta(ly.L)
        qr, q, kv = self.q_kv(ly, u, pos)
        if ly.m:
            ent = self.compress_full(ly.comp, u, th)
        if ly.m == 4:
            scores = self.index_scores(ly, u, qr, pos, self.compress_full(ly.idx, u, th), th)
        out = np.zeros((T, cfg.dim))
        for p in range(T):
            cand = kv[max(0, p - cfg.window + 1):p + 1]
            if ly.m == 4:
                cand = np.concatenate([cand, ent[self.index_select(scores[p])]])
            elif ly.m == 128:
                cand = np.concatenate([cand, ent[:(p + 1) // 128]])
            out[p] = self.attend(ly, q[p], cand, p)
        return out

    # --- MoE (arch.md §2.9) ------------------------------------------------------------------

    def swiglu(self, w, x):
        w1, w2, w3 = w
        g, v = x @ w1.T, x @ w3.T
        if self.cfg.limit > 0:
            g = np.minimum(g, self.cfg.limit)
            v = np.clip(v, -self.cfg.limit, self.cfg.limit)
        return R.silu(g) * v, w2

    def moe(self, ly, u, tokens):
        """u [T,D], tokens [T] -> [T,D]."""
        cfg = self.cfg
        T = u.shape[0]
        s = np.sqrt(np.logaddexp(0.0, u @ ly.gate.T))               # sqrt(softplus), [T, E]
        if ly.hash:
            idx = ly.tid2eid[np.asarray(tokens)]                    # [T, k]
        else:
            idx = np.zeros((T, cfg.topk), dtype=np.int64)
            for t in range(T):
                idx[t], gap = stable_topk(s[t] + ly.bias, cfg.topk)
                self.margins.route = min(self.margins.route, gap)
        w = np.take_along_axis(s, idx, axis=1)                      # unbiased scores, [T, k]
        if cfg.norm_topk:
            w = w / w.sum(axis=1, keepdims=True)
        w = w * cfg.route_scale
        y = np.zeros_like(u)
        for e in range(cfg.n_exp):
            rows, slot = np.nonzero(idx == e)
            if len(rows):
                h, w2 = self.swiglu(ly.experts[e], u[rows])
                y[rows] += (w[rows, slot, None] * h) @ w2.T      # weight before the down proj
        if ly.shared:
            h, w2 = self.swiglu(ly.shared, u)
            y += h @ w2.T
        return y

    # --- whole model -------------------------------------------------------------------------

    def check_ids(self, ids):
        if not ids or min(ids) < 0 or max(ids) >= self.cfg.vocab:
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab})")

    def block_full(self, ly, X, ids):
        """One block over the whole sequence: streams X [T,n,D] -> [T,n,D]."""
        cfg = self.cfg
        u, post, C = hc_pre(cfg, X, *ly.hc_attn)
        X = hc_post(self.attention_full(ly, rms(u, ly.attn_norm, cfg.eps)), X, post, C)
        u, post, C = hc_pre(cfg, X, *ly.hc_ffn)
        return hc_post(self.moe(ly, rms(u, ly.ffn_norm, cfg.eps), ids), X, post, C)

    def forward_streams(self, ids):
        """The final residual streams [T, n, D] (before hc_head)."""
        self.check_ids(ids)
        X = np.repeat(self.embed[ids][:, None, :], self.cfg.hc, axis=1)     # [T, n, D]
        for ly in self.layers:
            X = self.block_full(ly, X, ids)
        return X

    def forward_full(self, ids):
        """The definition: every position of ids at once.  -> logits [T, vocab]."""
        X = self.forward_streams(ids)
        y = rms(hc_head(self.cfg, X, *self.hc_head_w), self.norm, self.cfg.eps)
        return y @ self.head.T

    # --- the MTP block (arch.md §2.10; the official MTPBlock) ---------------------------------

    def mtp_full(self, mtp, toks, H):
        """Row p: the token after position p and the streams H[p] [n, D] that precede it (the
        main model's final streams, or further along a draft chain the block's own output) ->
        (draft logits [T, vocab], the block's output streams [T, n, D]).  e = enorm(embed(t)),
        X_k = e_proj(e) + h_proj(hnorm(H_k)) per stream, one causal block, the block's own
        hc_head and norm, the shared head."""
        cfg = self.cfg
        e = rms(self.embed[toks], mtp.enorm, cfg.eps)                          # [T, D]
        X = (e @ mtp.e_proj.T)[:, None, :] + rms(H, mtp.hnorm, cfg.eps) @ mtp.h_proj.T
        X = self.block_full(mtp.layer, X, toks)
        y = rms(hc_head(cfg, X, *mtp.hc_head_w), mtp.norm, cfg.eps)
        return y @ self.head.T, X


class MTPBlock:
    """mtp.0.*: a Block at layer index n_layers plus e_proj, h_proj, enorm, hnorm, norm and its
    own hc_head (the embedding and head are the main model's)."""

    def __init__(self, ck, cfg):
        p, D, n = "mtp.0.", cfg.dim, cfg.hc
        self.layer = Layer(ck, cfg, cfg.n_layers, p)
        if self.layer.hash or self.layer.m:
            raise ValueError("the MTP block must be window-only (ratio 0) and not hash-routed")
        self.e_proj = ck.linear(p + "e_proj", (D, D))
        self.h_proj = ck.linear(p + "h_proj", (D, D))
        self.enorm = ck.plain(p + "enorm.weight", (D,))
        self.hnorm = ck.plain(p + "hnorm.weight", (D,))
        self.norm = ck.plain(p + "norm.weight", (D,))
        self.hc_head_w = (ck.plain(p + "hc_head_fn", (n, n * D)), ck.plain(p + "hc_head_base", (n,)),
                          ck.plain(p + "hc_head_scale", (1,)))


def mtp_check(ck, model, path, tol=1e-4):
    """The engine's draft chain (test_v4_draft.c's MS_V4_DRAFT_DUMP: prompt_ids, the target's
    next token, S drafts and their logits) against the definition: the extend over the prompt
    (row p: token p + 1, the target's streams at p; the last row's token the target's greedy
    next), then single rows fed the block's own last output streams and the previous draft.
    -> (ok, message)."""
    d = json.load(open(path))
    ids = [int(t) for t in d["prompt_ids"]]
    mtp = MTPBlock(ck, model.cfg)
    H = model.forward_streams(ids)
    last = rms(hc_head(model.cfg, H[-1:], *model.hc_head_w), model.norm, model.cfg.eps) @ model.head.T
    nxt = int(np.argmax(last[0]))
    toks, drafts, worst = ids[1:] + [nxt], [], 0.0
    for k, want in enumerate(d["logits"]):
        lg, Xo = model.mtp_full(mtp, np.asarray(toks), H)
        worst = max(worst, R.rel_diff(np.asarray(want, dtype=np.float64), lg[-1]))
        t = int(np.argmax(lg[-1]))
        drafts.append(t)
        toks.append(t)
        H = np.concatenate([H, Xo[-1:]])
    srt = np.sort(lg[-1])
    ok = nxt == d["next"] and drafts == d["drafts"] and worst <= tol
    return ok, (f"mtp draft chain: max relative {worst:.3e}, next {nxt} (engine {d['next']}), "
                f"drafts {drafts} (engine {d['drafts']}), last argmax margin {srt[-1] - srt[-2]:.3e}")


# ----------------------------------------------------------------------------------------------
# Incremental decoder (arch.md §2.6 cache handling, §2.7 decode state, §5.2)


class CompressorState:
    """Per-sequence running state of one compressor: kv / score buffers [c'm, c'd], initialised
    to 0 / -inf; emits entry j when token jm+m-1 has been fed."""

    def __init__(self, c):
        self.c = c
        m, d = c["m"], c["d"]
        rows, cols = (2 * m, 2 * d) if c["overlap"] else (m, d)
        self.kv = np.zeros((rows, cols))
        self.score = np.full((rows, cols), -np.inf)

    def step(self, u, t):
        """u [D] of token t -> pooled raw entry [d] or None."""
        c = self.c
        m, d = c["m"], c["d"]
        a = c["wkv"] @ u
        g = c["wgate"] @ u + c["ape"][t % m]
        slot = (m + t % m) if c["overlap"] else t % m
        self.kv[slot], self.score[slot] = a, g
        if (t + 1) % m:
            return None
        if c["overlap"]:
            vals = np.concatenate([self.kv[:m, :d], self.kv[m:, d:]])
            gates = np.concatenate([self.score[:m, :d], self.score[m:, d:]])
            self.kv[:m], self.score[:m] = self.kv[m:], self.score[m:]
        else:
            vals, gates = self.kv, self.score
        return (R.softmax(gates, axis=0) * vals).sum(axis=0)


class Decoder:
    """One sequence fed one token at a time: ring of the last W kv vectors, compressed entries,
    index keys and compressor states per layer."""

    def __init__(self, model):
        self.M = model
        cfg = model.cfg
        self.p = 0
        self.ring = [np.zeros((cfg.window, cfg.hd)) for _ in model.layers]
        self.ent = [np.zeros((0, cfg.hd)) for _ in model.layers]
        self.keys = [np.zeros((0, cfg.d_idx)) for _ in model.layers]
        self.cst = [CompressorState(ly.comp) if ly.m else None for ly in model.layers]
        self.ist = [CompressorState(ly.idx) if ly.m == 4 else None for ly in model.layers]

    def _emit(self, ly, state, u, store, th):
        e = state.step(u, self.p)
        if e is None:
            return store
        j = (self.p + 1) // ly.m - 1
        return np.concatenate([store, self.M._finish_entries(state.c, e[None], [j * ly.m], th)])

    def attention(self, L, ly, u):
        M, cfg, p = self.M, self.M.cfg, self.p
        th = cfg.theta(L)
        qr, q, kv = M.q_kv(ly, u[None], [p])
        W = cfg.window
        self.ring[L][p % W] = kv[0]
        cand = self.ring[L][:p + 1] if p < W else self.ring[L]
        if ly.m == 4:
            self.keys[L] = self._emit(ly, self.ist[L], u, self.keys[L], th)
        if ly.m:
            self.ent[L] = self._emit(ly, self.cst[L], u, self.ent[L], th)
        if ly.m == 4 and len(self.keys[L]):
            s = M.index_scores(ly, u[None], qr, [p], self.keys[L], th)[0]
            cand = np.concatenate([cand, self.ent[L][M.index_select(s)]])
        elif ly.m == 128:
            cand = np.concatenate([cand, self.ent[L]])
        return M.attend(ly, q[0], cand, p)

    def step(self, tok):
        """Feed token tok at position self.p -> logits [vocab]."""
        M, cfg = self.M, self.M.cfg
        M.check_ids([tok])
        X = np.repeat(M.embed[[tok]][:, None, :], cfg.hc, axis=1)      # [1, n, D]
        for L, ly in enumerate(M.layers):
            u, post, C = hc_pre(cfg, X, *ly.hc_attn)
            f = self.attention(L, ly, rms(u[0], ly.attn_norm, cfg.eps))
            X = hc_post(f[None], X, post, C)
            u, post, C = hc_pre(cfg, X, *ly.hc_ffn)
            X = hc_post(M.moe(ly, rms(u, ly.ffn_norm, cfg.eps), [tok]), X, post, C)
        self.p += 1
        y = rms(hc_head(cfg, X, *M.hc_head_w), M.norm, cfg.eps)
        return (y @ M.head.T)[0]


# ----------------------------------------------------------------------------------------------
# Generation and the command line


def generate(model, prompt, n_decode, incremental=True):
    """-> dict of the JSON fields (logits as float64 arrays).  The outputs are rows of one full
    causal forward over prompt + greedy tokens (row p = logits after position p).  With
    `incremental` the decoder chooses the tokens (prompt fed one token at a time) and every
    output row must agree with it to INCREMENTAL_TOL; without, each token comes from a full
    forward of the sequence so far."""
    seq = list(prompt)
    dec = Decoder(model) if incremental else None
    inc = []
    for i in range(n_decode + 1):
        if dec is not None:
            for tok in seq[dec.p:]:
                li = dec.step(tok)
            inc.append(li)
        else:
            li = model.forward_full(seq)[-1]
        seq.append(int(np.argmax(li)))                  # first maximum -> lowest id on ties
    model.margins = Margins()
    for rec in FP8_EDGES.values():
        rec[:] = [math.inf, 0, []]
    full = model.forward_full(seq[:-1])[len(prompt) - 1:]   # [n_decode + 1, vocab]
    margins = model.margins
    worst = max((R.rel_diff(x, y) for x, y in zip(inc, full)), default=0.0)
    if not worst <= INCREMENTAL_TOL:
        raise AssertionError(f"incremental decoder vs full forward: rel {worst:.3e}")
    feed = seq[len(prompt):]
    if [int(np.argmax(x)) for x in full] != feed:
        raise AssertionError("greedy tokens of the decoder and the full forward differ (a tie)")
    srt = np.sort(full, axis=1)
    fin = lambda v: None if not math.isfinite(v) else float(v)  # noqa: E731
    return {"prefill_logits": full[0], "steps": [{"token": feed[i], "logits": full[i + 1]}
                                                 for i in range(n_decode)],
            "greedy": feed, "min_topk_margin": fin(margins.topk),
            "min_route_margin": fin(margins.route),
            "min_argmax_margin": float(np.min(srt[:, -1] - srt[:, -2])),
            "fp8_edges": {k: {"min_rel_dist": fin(v[0]), "near": v[1], "values": v[2] if len(v) > 2
                              else []} for k, v in FP8_EDGES.items()}
            if model.fp8_indexer or model.kv_fp8 else None,
            "incremental_rel_diff": worst if incremental else None}


def main(argv=None):
    global FP8_EDGE_NEAR
    ap = argparse.ArgumentParser(description="DeepSeek-V4 float64 reference forward")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", help="comma-separated token ids")
    ap.add_argument("--decode", type=int, default=8, help="greedy decode steps after prefill")
    ap.add_argument("--greedy", action="store_true", help="accepted; decoding is always greedy")
    ap.add_argument("--out")
    ap.add_argument("--mtp-check", metavar="JSON",
                    help="check an engine's MTP draft chain (test_v4_draft.c's dump) instead")
    ap.add_argument("--digits", type=int, default=10, help="significant digits per logit")
    ap.add_argument("--no-incremental-check", action="store_true")
    ap.add_argument("--kv-fp8", action="store_true", help="simulate FP8 ds main KV entries")
    ap.add_argument("--fp4-indexer", action="store_true", help="simulate MXFP4 index keys/queries")
    ap.add_argument("--fp8-indexer", action="store_true", help="simulate FP8 index keys/queries")
    ap.add_argument("--fp8-flip", default="", metavar="KIND:V,...",
                    help="round these near-edge scaled values (fp8_edges' values) the other way")
    ap.add_argument("--fp8-edge-near", type=float, default=FP8_EDGE_NEAR,
                    help="list scaled values this close (relative) to an e4m3 edge")
    a = ap.parse_args(argv)
    if a.mtp_check:
        ck = V4Checkpoint(a.model)
        ok, msg = mtp_check(ck, V4Model(ck), a.mtp_check)
        print(msg)
        return 0 if ok else 1
    if not a.prompt_ids or not a.out:
        ap.error("--prompt-ids and --out are required (without --mtp-check)")
    ids = [int(t) for t in a.prompt_ids.replace(" ", "").split(",") if t]
    if not ids or not (0 <= a.decode <= 4096) or not (1 <= a.digits <= 17):
        ap.error("need >= 1 prompt id, 0 <= --decode <= 4096, 1 <= --digits <= 17")
    model = V4Model(V4Checkpoint(a.model))
    if a.fp4_indexer and a.fp8_indexer:
        ap.error("--fp4-indexer and --fp8-indexer are two formats of the same keys")
    model.kv_fp8, model.fp4_indexer, model.fp8_indexer = a.kv_fp8, a.fp4_indexer, a.fp8_indexer
    FP8_FLIP.update(k for k in a.fp8_flip.split(",") if k)
    FP8_EDGE_NEAR = a.fp8_edge_near
    r = generate(model, ids, a.decode, not a.no_incremental_check)
    fl = lambda x: [float(f"{v:.{a.digits}g}") for v in x.tolist()]  # noqa: E731
    r["prefill_logits"] = fl(r["prefill_logits"])
    for s in r["steps"]:
        s["logits"] = fl(s["logits"])
    r.update(generator="tests/ref/v4_ref.py (float64)", prompt_ids=ids)
    # the same outputs in deepseek_ref.py's golden layout, which tests/compare_logits.py reads:
    # step i = logits for prompt + greedy[0..i-1], token = greedy[i]
    outs = [r["prefill_logits"]] + [s["logits"] for s in r["steps"]]
    r["results"] = [{"prompt_ids": ids, "steps": [{"step": i, "token": r["greedy"][i], "logits": lg}
                                                  for i, lg in enumerate(outs)]}]
    print(f"v4_ref: greedy {r['greedy']} min topk margin {r['min_topk_margin']} min route "
          f"margin {r['min_route_margin']} min argmax margin {r['min_argmax_margin']:.3e} "
          f"incremental {r['incremental_rel_diff']}"
          + (f" fp8 edges (smallest relative distance of a scaled value to an e4m3 rounding "
             f"edge; values within {FP8_EDGE_NEAR:g}) {r['fp8_edges']}" if r["fp8_edges"] else ""),
          file=sys.stderr)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(r, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
