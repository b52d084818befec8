#!/usr/bin/python3
# deepseek_ref.py — float64 oracle forward for DeepSeek-V2/V3-family HF checkpoints.
#
# Owns: reading an HF directory (config.json, safetensors shards, exact F32/F16/BF16/F8_E4M3
# dequantisation with 128x128 weight_scale_inv block scales), the model math (MLA with YaRN
# interleaved RoPE, dense SwiGLU, DeepSeekMoE routing) in float64, and writing golden logits
# (prefill + greedy decode) as JSON.  It does not tokenize, sample or batch; it exists only to
# regenerate tests/golden/*.json that the C engine is compared against (see make_golden.sh).
# Semantics follow deepseek-ai/DeepSeek-V3 inference/model.py; where HF differs the choice is
# written next to the code.  Run with Debian's numpy: /usr/bin/python3 (not the pyenv python3).
# Single-threaded script; no state outside the objects built in main().

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

MAX_HEADER_BYTES = 100 * 1024 * 1024   # safetensors JSON header limit
MAX_PROMPT_TOKENS = 65536
MAX_STEPS = 4096
NEAR_TIE_LOGIT_REL = 1e-4   # warn when top-2 logits differ by less than this (relative to max|l|)
NEAR_TIE_ROUTE = 1e-5       # warn when a top-k expert choice was decided by less than this
# q_a_layernorm / kv_a_layernorm eps.  Official RMSNorm defaults to 1e-6 and is never given
# rms_norm_eps; HF (transformers and the remote modeling_deepseek.py) builds these two norms with the
# default 1e-6 too.  vLLM/SGLang pass rms_norm_eps instead (differs only when it is not 1e-6, e.g.
# Moonlight's 1e-5).  input/post_attention/final norms use rms_norm_eps (HF, vLLM); the official
# code uses 1e-6 for them as well, which equals rms_norm_eps in every DeepSeek V2/V3 config.
LATENT_NORM_EPS = 1e-6

# ----------------------------------------------------------------------------------------------
# Number formats


def fp8_e4m3_table():
    """256-entry float64 table for float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits;
    no infinities; S.1111.111 is NaN; exponent 0 is subnormal m * 2^-9."""
    codes = np.arange(256, dtype=np.int64)
    sign = codes >> 7
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    mag = np.where(exp == 0, man * 2.0 ** -9, (1.0 + man / 8.0) * np.power(2.0, exp - 7))
    mag = np.where((exp == 15) & (man == 7), np.nan, mag)
    return np.where(sign == 1, -mag, mag)


FP8_E4M3 = fp8_e4m3_table()


def bf16_to_f64(u16):
    """BF16 bit patterns (uint16) -> float64, exactly (BF16 is the top half of an FP32)."""
    return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# safetensors dtype name -> (bytes per element, numpy little-endian storage dtype)
ST_DTYPES = {
    "F64": (8, "<f8"),
    "F32": (4, "<f4"),
    "F16": (2, "<f2"),
    "BF16": (2, "<u2"),
    "F8_E4M3": (1, "u1"),
    "F8_E8M0": (1, "u1"),     # V4 block scales (2^(byte-127)); read by v4_ref.py only
    "I8": (1, "i1"),          # V4 packed FP4 e2m1 experts; v4_ref.py only
    "I64": (8, "<i8"),        # V4 gate.tid2eid; v4_ref.py only
}


class SafetensorsFile:
    """One .safetensors file: 8-byte little-endian header length, JSON header, raw data."""

    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError(f"{path}: too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise ValueError(f"{path}: header length {n} is invalid (file {size} bytes)")
            header = json.loads(f.read(n).decode("utf-8"))
        self.data_start = 8 + n
        self.data_len = size - self.data_start
        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        self.tensors = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dt = info["dtype"]
            shape = tuple(int(s) for s in info["shape"])
            b, e = (int(v) for v in info["data_offsets"])
            if dt not in ST_DTYPES:
                raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
            nbytes = ST_DTYPES[dt][0] * int(np.prod(shape, dtype=np.int64))
            if not (0 <= b <= e <= self.data_len) or e - b != nbytes:
                raise ValueError(f"{path}: tensor {name}: bad data_offsets [{b}, {e}] for "
                                 f"{dt} {list(shape)}")
            self.tensors[name] = (dt, shape, b, e)

    def raw(self, name):
        """Returns (dtype name, numpy array of the stored values in storage dtype)."""
        dt, shape, b, e = self.tensors[name]
        buf = self.mm[self.data_start + b:self.data_start + e]
        arr = np.frombuffer(buf, dtype=ST_DTYPES[dt][1]).reshape(shape)
        return dt, arr


class Checkpoint:
    """An HF model directory: config.json plus model.safetensors, or shards listed in
    model.safetensors.index.json, or (fallback) every *.safetensors file in the directory."""

    def __init__(self, model_dir):
        self.dir = model_dir
        with open(os.path.join(model_dir, "config.json")) as f:
            self.config = json.load(f)
        files = []
        index = os.path.join(model_dir, "model.safetensors.index.json")
        single = os.path.join(model_dir, "model.safetensors")
        if os.path.exists(index):
            with open(index) as f:
                wm = json.load(f)["weight_map"]
            files = sorted(set(wm.values()))
        elif os.path.exists(single):
            files = ["model.safetensors"]
        else:
            files = sorted(p for p in os.listdir(model_dir) if p.endswith(".safetensors"))
        if not files:
            raise ValueError(f"{model_dir}: no safetensors files")
        self.where = {}
        for fn in files:
            st = SafetensorsFile(os.path.join(model_dir, fn))
            for name in st.tensors:
                if name in self.where:
                    raise ValueError(f"tensor {name} appears in two files")
                self.where[name] = st
        if os.path.exists(index):
            for name, fn in wm.items():
                if name not in self.where or \
                        os.path.basename(self.where[name].path) != fn:
                    raise ValueError(f"index maps {name} to {fn} but it is not there")
        qc = self.config.get("quantization_config") or {}
        self.block = tuple(qc.get("weight_block_size", [128, 128]))
        self.used = set()

    def has(self, name):
        return name in self.where

    def get(self, name, shape=None):
        """Tensor `name` as float64, exactly dequantised.  F8_E4M3 tensors need the sibling
        `<name>_scale_inv` (F32, one multiplier per block of self.block rows x cols)."""
        if name not in self.where:
            raise KeyError(f"missing tensor {name}")
        self.used.add(name)
        dt, arr = self.where[name].raw(name)
        scale_name = name + "_scale_inv"
        if dt == "F8_E4M3":
            if arr.ndim != 2:
                raise ValueError(f"{name}: F8_E4M3 tensor must be 2-D")
            if scale_name not in self.where:
                raise ValueError(f"{name}: F8_E4M3 without {scale_name}")
            self.used.add(scale_name)
            sdt, s = self.where[scale_name].raw(scale_name)
            s = self._as_f64(sdt, s)
            bo, bi = self.block
            rows, cols = arr.shape
            want = (-(-rows // bo), -(-cols // bi))
            if s.shape != want:
                raise ValueError(f"{scale_name}: shape {s.shape}, expected {want}")
            w = FP8_E4M3[arr]
            if np.isnan(w).any():
                raise ValueError(f"{name}: contains FP8 NaN codes")
            full = np.repeat(np.repeat(s, bo, axis=0), bi, axis=1)[:rows, :cols]
            out = w * full
        else:
            if scale_name in self.where:
                raise ValueError(f"{scale_name} present but {name} is {dt}, not F8_E4M3")
            out = self._as_f64(dt, arr)
        if shape is not None and tuple(out.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {tuple(out.shape)}, expected {tuple(shape)}")
        return out

    @staticmethod
    def _as_f64(dt, arr):
        if dt == "BF16":
            return bf16_to_f64(arr)
        if dt in ("F64", "F32", "F16"):
            return arr.astype(np.float64)
        raise ValueError(f"dtype {dt} not allowed here")

    def unused(self, n_layers):
        """Tensors never read, ignoring MTP layers (index >= n_layers)."""
        out = []
        for name in self.where:
            if name in self.used:
                continue
            parts = name.split(".")
            if len(parts) > 2 and parts[0] == "model" and parts[1] == "layers" and \
                    parts[2].isdigit() and int(parts[2]) >= n_layers:
                continue
            out.append(name)
        return sorted(out)


# ----------------------------------------------------------------------------------------------
# Configuration


def yarn_inv_freq(dim, base, factor, orig_len, beta_fast, beta_slow):
    """Official precompute_freqs_cis (DeepSeek-V3 inference/model.py) frequency table:
    correction range floor/ceil, clamped to [0, dim-1], ramp over i in [0, dim/2)."""
    theta = 1.0 / np.power(float(base), np.arange(0, dim, 2, dtype=np.float64) / dim)

    def corr(rot):
        return dim * math.log(orig_len / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    smooth = 1.0 - ramp
    return theta / factor * (1.0 - smooth) + theta * smooth, (low, high)


def yarn_get_mscale(scale, mscale):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


class Config:
    def __init__(self, c):
        def req(k):
            if k not in c or c[k] is None:
                raise ValueError(f"config.json: missing {k}")
            return c[k]

        self.raw = c
        self.vocab = int(req("vocab_size"))
        self.dim = int(req("hidden_size"))
        self.inter = int(req("intermediate_size"))
        self.n_layers = int(req("num_hidden_layers"))
        self.n_heads = int(req("num_attention_heads"))
        self.q_lora = int(c.get("q_lora_rank") or 0)          # null/0 -> direct q_proj
        self.kv_lora = int(req("kv_lora_rank"))
        self.dn = int(req("qk_nope_head_dim"))
        self.dr = int(req("qk_rope_head_dim"))
        self.dv = int(req("v_head_dim"))
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.n_routed = int(c.get("n_routed_experts") or 0)
        self.first_dense = int(c.get("first_k_dense_replace", 0))
        self.moe_freq = int(c.get("moe_layer_freq", 1) or 1)
        if self.n_routed:
            self.moe_inter = int(req("moe_intermediate_size"))
            self.n_shared = int(c.get("n_shared_experts") or 0)
            self.topk = int(req("num_experts_per_tok"))
            self.n_group = int(c.get("n_group") or 1)
            self.topk_group = int(c.get("topk_group") or 1)
            self.score_func = c.get("scoring_func", "softmax")
            self.topk_method = c.get("topk_method", "greedy")
            self.norm_topk_prob = bool(c.get("norm_topk_prob", False))
            self.route_scale = float(c.get("routed_scaling_factor", 1.0))
            if self.score_func not in ("softmax", "sigmoid"):
                raise ValueError(f"scoring_func {self.score_func} unsupported")
            if self.topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
                raise ValueError(f"topk_method {self.topk_method} unsupported")
            if self.n_routed % self.n_group:
                raise ValueError("n_routed_experts not a multiple of n_group")
            if self.topk_method == "greedy" and self.n_group > 1:
                # Official Gate groups whenever n_groups > 1; HF "greedy" never groups.
                raise ValueError("topk_method greedy with n_group > 1: official and HF differ")
            if self.topk_method != "greedy" and not (1 <= self.topk_group <= self.n_group):
                raise ValueError("topk_group out of range")
            if self.topk_method != "greedy" and \
                    self.topk > self.topk_group * (self.n_routed // self.n_group):
                raise ValueError("num_experts_per_tok exceeds the experts in kept groups")
        # RoPE / YaRN and the softmax scale
        self.rope_theta = float(c.get("rope_theta", 10000.0))
        rs = c.get("rope_scaling")
        self.softmax_scale = (self.dn + self.dr) ** -0.5
        self.yarn = None
        if rs:
            kind = rs.get("type", rs.get("rope_type"))
            if kind != "yarn":
                raise ValueError(f"rope_scaling type {kind} unsupported")
            factor = float(rs["factor"])
            orig = int(rs.get("original_max_position_embeddings", 4096))
            bf = float(rs.get("beta_fast", 32))
            bs = float(rs.get("beta_slow", 1))
            mscale = float(rs.get("mscale", 1.0))
            mscale_all = float(rs.get("mscale_all_dim", 0.0))
            # HF multiplies cos/sin by mscale(factor, mscale)/mscale(factor, mscale_all_dim);
            # the official code never scales the rotation.  Equal for every shipped config.
            att = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all)
            if abs(att - 1.0) > 1e-12:
                raise ValueError(f"yarn attention factor {att} != 1: official and HF differ")
            self.inv_freq, self.yarn_range = yarn_inv_freq(self.dr, self.rope_theta, factor,
                                                           orig, bf, bs)
            self.yarn = dict(factor=factor, orig=orig, beta_fast=bf, beta_slow=bs,
                             mscale=mscale, mscale_all_dim=mscale_all)
            # HF: scale *= mscale(factor, mscale_all_dim)^2 when mscale_all_dim != 0; official
            # uses its ModelArgs.mscale, which its configs set to HF's mscale_all_dim.
            if mscale_all:
                m = yarn_get_mscale(factor, mscale_all)
                self.softmax_scale *= m * m
        else:
            self.inv_freq = 1.0 / np.power(self.rope_theta,
                                           np.arange(0, self.dr, 2, dtype=np.float64) / self.dr)

    def is_moe(self, layer):
        return self.n_routed > 0 and layer >= self.first_dense and layer % self.moe_freq == 0


# ----------------------------------------------------------------------------------------------
# Math


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rope_interleaved(x, pos, inv_freq):
    """x [..., T, (H,) dr]: rotate pairs (x[2i], x[2i+1]) by pos*inv_freq[i].
    pos has length T and indexes the axis given by x.shape[0] (tokens first)."""
    ang = np.outer(np.asarray(pos, dtype=np.float64), inv_freq)     # [T, dr/2]
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (inv_freq.size,)
    cos = np.cos(ang).reshape(shape)
    sin = np.sin(ang).reshape(shape)
    a = x[..., 0::2]
    b = x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def topk_desc(v, k):
    """Indices of the k largest values, ties -> lowest index (stable descending sort)."""
    return np.argsort(-v, kind="stable")[:k]


class Stats:
    """Decision margins: how close routing and argmax decisions were (for near-tie warnings)."""

    def __init__(self):
        self.route_margin = math.inf     # k-th vs (k+1)-th masked selection score
        self.group_margin = math.inf     # topk_group-th vs next group score


class Model:
    def __init__(self, ckpt):
        self.ck = ckpt
        self.cfg = cfg = Config(ckpt.config)
        D, H = cfg.dim, cfg.n_heads
        dq = cfg.dn + cfg.dr
        g = ckpt.get
        self.embed = g("model.embed_tokens.weight", (cfg.vocab, D))
        if ckpt.has("lm_head.weight"):
            self.head = g("lm_head.weight", (cfg.vocab, D))
        elif ckpt.config.get("tie_word_embeddings"):
            self.head = self.embed
        else:
            raise ValueError("missing lm_head.weight")
        self.norm = g("model.norm.weight", (D,))
        self.layers = []
        for L in range(cfg.n_layers):
            p = f"model.layers.{L}."
            a = p + "self_attn."
            ly = {"in_norm": g(p + "input_layernorm.weight", (D,)),
                  "post_norm": g(p + "post_attention_layernorm.weight", (D,))}
            if cfg.q_lora:
                ly["q_a"] = g(a + "q_a_proj.weight", (cfg.q_lora, D))
                ly["q_a_norm"] = g(a + "q_a_layernorm.weight", (cfg.q_lora,))
                ly["q_b"] = g(a + "q_b_proj.weight", (H * dq, cfg.q_lora))
            else:
                ly["q"] = g(a + "q_proj.weight", (H * dq, D))
            ly["kv_a"] = g(a + "kv_a_proj_with_mqa.weight", (cfg.kv_lora + cfg.dr, D))
            ly["kv_a_norm"] = g(a + "kv_a_layernorm.weight", (cfg.kv_lora,))
            ly["kv_b"] = g(a + "kv_b_proj.weight", (H * (cfg.dn + cfg.dv), cfg.kv_lora))
            ly["o"] = g(a + "o_proj.weight", (D, H * cfg.dv))
            m = p + "mlp."
            if cfg.is_moe(L):
                E, I = cfg.n_routed, cfg.moe_inter
                ly["gate"] = g(m + "gate.weight", (E, D))
                bn = m + "gate.e_score_correction_bias"
                ly["bias"] = g(bn, (E,)) if ckpt.has(bn) else None
                # Official: bias exists iff the model is V3 (it keys on dim == 7168) and the
                # group score is top-2-sum iff the bias exists; HF keys on topk_method.  We
                # require both to agree so either reading gives the same routing.
                if cfg.topk_method == "noaux_tc" and ly["bias"] is None:
                    raise ValueError(f"{bn} missing but topk_method is noaux_tc")
                if cfg.topk_method != "noaux_tc" and ly["bias"] is not None:
                    raise ValueError(f"{bn} present but topk_method is {cfg.topk_method}")
                ly["experts"] = [
                    tuple(g(f"{m}experts.{e}.{n}.weight", s) for n, s in
                          (("gate_proj", (I, D)), ("up_proj", (I, D)), ("down_proj", (D, I))))
                    for e in range(E)]
                if cfg.n_shared:
                    S = cfg.n_shared * I
                    ly["shared"] = tuple(g(f"{m}shared_experts.{n}.weight", s) for n, s in
                                         (("gate_proj", (S, D)), ("up_proj", (S, D)),
                                          ("down_proj", (D, S))))
                else:
                    ly["shared"] = None
            else:
                I = cfg.inter
                ly["mlp"] = tuple(g(f"{m}{n}.weight", s) for n, s in
                                  (("gate_proj", (I, D)), ("up_proj", (I, D)),
                                   ("down_proj", (D, I))))
            self.layers.append(ly)
        self.stats = Stats()

    # --- attention pieces -----------------------------------------------------------------

    def _q(self, ly, x, pos):
        """x [T, D] -> q_nope [T, H, dn], q_pe [T, H, dr] (rotated)."""
        c = self.cfg
        if c.q_lora:
            q = rmsnorm(x @ ly["q_a"].T, ly["q_a_norm"], LATENT_NORM_EPS) @ ly["q_b"].T
        else:
            q = x @ ly["q"].T
        q = q.reshape(x.shape[0], c.n_heads, c.dn + c.dr)
        return q[..., :c.dn], rope_interleaved(q[..., c.dn:], pos, c.inv_freq)

    def _kv_latent(self, ly, x, pos):
        """x [T, D] -> c_kv [T, kv_lora] (normed), k_pe [T, dr] (rotated)."""
        c = self.cfg
        a = x @ ly["kv_a"].T
        ckv = rmsnorm(a[:, :c.kv_lora], ly["kv_a_norm"], LATENT_NORM_EPS)
        kpe = rope_interleaved(a[:, c.kv_lora:], pos, c.inv_freq)
        return ckv, kpe

    def attn_naive(self, ly, x, pos):
        """Non-absorbed MLA over the whole sequence with a causal mask."""
        c = self.cfg
        T, H = x.shape[0], c.n_heads
        q_nope, q_pe = self._q(ly, x, pos)
        ckv, kpe = self._kv_latent(ly, x, pos)
        kv = (ckv @ ly["kv_b"].T).reshape(T, H, c.dn + c.dv)
        k_nope, v = kv[..., :c.dn], kv[..., c.dn:]
        q = np.concatenate([q_nope, q_pe], axis=-1)                          # [T, H, dq]
        k = np.concatenate([k_nope, np.broadcast_to(kpe[:, None, :], (T, H, c.dr))], -1)
        s = np.einsum("shd,thd->hst", q, k) * c.softmax_scale               # [H, T, T]
        mask = np.triu(np.full((T, T), -np.inf), 1)
        p = softmax(s + mask[None], axis=-1)
        o = np.einsum("hst,thd->shd", p, v)                                 # [T, H, dv]
        return o.reshape(T, H * c.dv) @ ly["o"].T

    def attn_absorbed(self, ly, cache, x, pos):
        """Absorbed MLA for new tokens x at positions pos, appending to cache (c_kv, k_pe)."""
        c = self.cfg
        T, H = x.shape[0], c.n_heads
        q_nope, q_pe = self._q(ly, x, pos)
        ckv, kpe = self._kv_latent(ly, x, pos)
        cache["c"] = np.concatenate([cache["c"], ckv]) if cache["c"] is not None else ckv
        cache["pe"] = np.concatenate([cache["pe"], kpe]) if cache["pe"] is not None else kpe
        wkv = ly["kv_b"].reshape(H, c.dn + c.dv, c.kv_lora)
        w_uk, w_uv = wkv[:, :c.dn, :], wkv[:, c.dn:, :]
        q_abs = np.einsum("shd,hdc->shc", q_nope, w_uk)                     # [T, H, c]
        s = (np.einsum("shc,tc->hst", q_abs, cache["c"]) +
             np.einsum("shr,tr->hst", q_pe, cache["pe"])) * c.softmax_scale  # [H, T, Tall]
        Tall = cache["c"].shape[0]
        qpos = np.asarray(pos)[:, None]
        kpos = np.arange(Tall)[None, :]
        s = np.where((kpos <= qpos)[None], s, -np.inf)
        p = softmax(s, axis=-1)
        ctx = np.einsum("hst,tc->shc", p, cache["c"])
        o = np.einsum("shc,hdc->shd", ctx, w_uv)
        return o.reshape(T, H * c.dv) @ ly["o"].T

    # --- FFN ------------------------------------------------------------------------------

    @staticmethod
    def swiglu(w, x):
        wg, wu, wd = w
        return (silu(x @ wg.T) * (x @ wu.T)) @ wd.T

    def route(self, ly, x):
        """Gate for x [T, D] -> (idx [T, k], weights [T, k]).  DeepSeek-V3 official Gate:
        scores = softmax|sigmoid(logits); selection scores = scores + bias (bias for selection
        only); group-limited: group score = sum of top-2 selection scores (noaux_tc, bias present)
        or max (group_limited_greedy), keep topk_group groups, other groups' experts -> -inf;
        top-k; weights = unbiased scores of the chosen experts, renormalised when
        norm_topk_prob (HF flag; official renormalises iff sigmoid), then * routed_scaling."""
        c = self.cfg
        logits = x @ ly["gate"].T
        scores = softmax(logits, -1) if c.score_func == "softmax" else sigmoid(logits)
        sel = scores + ly["bias"][None, :] if ly["bias"] is not None else scores.copy()
        T, E, k = x.shape[0], c.n_routed, c.topk
        idx = np.empty((T, k), dtype=np.int64)
        for t in range(T):
            s = sel[t].copy()
            if c.topk_method != "greedy" and c.n_group > 1:
                grp = s.reshape(c.n_group, E // c.n_group)
                if c.topk_method == "noaux_tc":
                    gs = np.sort(grp, axis=1)[:, -2:].sum(axis=1)
                else:
                    gs = grp.max(axis=1)
                keep = topk_desc(gs, c.topk_group)
                if c.topk_group < c.n_group:
                    srt = np.sort(gs)[::-1]
                    self.stats.group_margin = min(self.stats.group_margin,
                                                  srt[c.topk_group - 1] - srt[c.topk_group])
                drop = np.ones(c.n_group, dtype=bool)
                drop[keep] = False
                grp = np.where(drop[:, None], -np.inf, grp)
                s = grp.reshape(E)
            idx[t] = topk_desc(s, k)
            srt = np.sort(s)[::-1]
            if k < E and np.isfinite(srt[k]):
                self.stats.route_margin = min(self.stats.route_margin, srt[k - 1] - srt[k])
        w = np.take_along_axis(scores, idx, axis=1)
        if c.norm_topk_prob:
            w = w / w.sum(axis=1, keepdims=True)
        w = w * c.route_scale
        return idx, w

    def moe(self, ly, x):
        idx, w = self.route(ly, x)
        y = np.zeros_like(x)
        for e, ew in enumerate(ly["experts"]):
            rows, slot = np.nonzero(idx == e)
            if rows.size:
                y[rows] += self.swiglu(ew, x[rows]) * w[rows, slot][:, None]
        if ly["shared"] is not None:
            y += self.swiglu(ly["shared"], x)
        return y

    def ffn(self, L, x):
        ly = self.layers[L]
        return self.moe(ly, x) if self.cfg.is_moe(L) else self.swiglu(ly["mlp"], x)

    # --- whole model ----------------------------------------------------------------------

    def _check_ids(self, ids):
        for t in ids:
            if not (0 <= t < self.cfg.vocab):
                raise ValueError(f"token id {t} outside [0, {self.cfg.vocab})")

    def forward_naive(self, ids):
        """Full causal forward over ids; returns logits [T, vocab]."""
        self._check_ids(ids)
        c = self.cfg
        pos = np.arange(len(ids))
        h = self.embed[np.asarray(ids, dtype=np.int64)]
        for L, ly in enumerate(self.layers):
            h = h + self.attn_naive(ly, rmsnorm(h, ly["in_norm"], c.eps), pos)
            h = h + self.ffn(L, rmsnorm(h, ly["post_norm"], c.eps))
        return rmsnorm(h, self.norm, c.eps) @ self.head.T

    def new_cache(self):
        return [{"c": None, "pe": None} for _ in self.layers]

    def forward_absorbed(self, cache, ids, start):
        """Incremental forward with the absorbed MLA cache; returns logits [len(ids), vocab]."""
        self._check_ids(ids)
        c = self.cfg
        pos = np.arange(start, start + len(ids))
        h = self.embed[np.asarray(ids, dtype=np.int64)]
        for L, ly in enumerate(self.layers):
            h = h + self.attn_absorbed(ly, cache[L], rmsnorm(h, ly["in_norm"], c.eps), pos)
            h = h + self.ffn(L, rmsnorm(h, ly["post_norm"], c.eps))
        return rmsnorm(h, self.norm, c.eps) @ self.head.T


def rel_diff(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def generate(model, prompt, steps, check_absorbed=True, tol=1e-9):
    """Prefill + `steps` greedy decode steps.  Each step re-runs the naive full causal forward
    (the oracle); the absorbed incremental path runs alongside and must agree to `tol`."""
    seq = list(prompt)
    cache = model.new_cache() if check_absorbed else None
    out = []
    worst = 0.0
    for i in range(steps + 1):
        model.stats = Stats()
        logits = model.forward_naive(seq)[-1]
        st = model.stats
        if check_absorbed:
            new = seq if i == 0 else seq[-1:]
            la = model.forward_absorbed(cache, new, len(seq) - len(new))[-1]
            d = rel_diff(la, logits)
            worst = max(worst, d)
            if not d <= tol:
                raise AssertionError(f"absorbed vs naive MLA differ: rel {d:.3e} at step {i}")
        tok = int(np.argmax(logits))                    # first maximum -> lowest id on ties
        srt = np.sort(logits)
        out.append({"step": i, "token": tok, "logits": logits,
                    "margin": float(srt[-1] - srt[-2]),
                    "route_margin": st.route_margin, "group_margin": st.group_margin})
        seq.append(tok)
    return out, worst


def fmt_float(v, digits):
    return float(f"{v:.{digits}g}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--prompt-ids", action="append", required=True,
                    help='comma-separated token ids, e.g. "1,2,3" (repeatable)')
    ap.add_argument("--steps", type=int, default=8, help="greedy decode steps after prefill")
    ap.add_argument("--out", required=True, help="output JSON file")
    ap.add_argument("--digits", type=int, default=10,
                    help="significant digits per logit (17 = full float64)")
    ap.add_argument("--seed", type=int,
                    help="seed the checkpoint was generated with; only recorded as \"seed\"")
    ap.add_argument("--no-absorbed-check", action="store_true",
                    help="skip the absorbed-MLA cross-check")
    ap.add_argument("--allow-unused", action="store_true",
                    help="do not fail on tensors the model never reads")
    args = ap.parse_args(argv)
    if not (0 <= args.steps <= MAX_STEPS):
        ap.error(f"--steps must be in [0, {MAX_STEPS}]")
    if not (1 <= args.digits <= 17):
        ap.error("--digits must be in [1, 17]")
    prompts = []
    for s in args.prompt_ids:
        ids = [int(t) for t in s.replace(" ", "").split(",") if t != ""]
        if not ids or len(ids) > MAX_PROMPT_TOKENS:
            ap.error(f"prompt must have 1..{MAX_PROMPT_TOKENS} ids: {s!r}")
        prompts.append(ids)

    ckpt = Checkpoint(args.model)
    model = Model(ckpt)
    unused = ckpt.unused(model.cfg.n_layers)
    if unused and not args.allow_unused:
        raise SystemExit(f"error: {len(unused)} tensors not used by the model, e.g. "
                         f"{unused[:5]} (use --allow-unused to ignore)")
    results = []
    for ids in prompts:
        steps, worst = generate(model, ids, args.steps, not args.no_absorbed_check)
        for s in steps:
            s["logits"] = [fmt_float(v, args.digits) for v in s["logits"].tolist()]
            for k in ("route_margin", "group_margin"):
                if not math.isfinite(s[k]):
                    s[k] = None
        for s in steps:
            rel = s["margin"] / max(max(abs(v) for v in s["logits"]), 1e-300)
            if rel < NEAR_TIE_LOGIT_REL:
                print(f"WARNING: prompt len {len(ids)} step {s['step']}: top-2 logits differ by "
                      f"{rel:.1e} relative; an engine within tolerance may pick another token "
                      f"(compare teacher-forced)", file=sys.stderr)
        close = [s["step"] for s in steps
                 if s["route_margin"] is not None and s["route_margin"] < NEAR_TIE_ROUTE]
        if close:
            print(f"WARNING: prompt len {len(ids)} steps {close}: a routing decision was decided "
                  f"by less than {NEAR_TIE_ROUTE:.0e}; float32 may route differently",
                  file=sys.stderr)
        mm = min(s["margin"] for s in steps)
        rm = [s["route_margin"] for s in steps if s["route_margin"] is not None]
        print(f"prompt len {len(ids)}: tokens {[s['token'] for s in steps]} "
              f"min argmax margin {mm:.3e} min route margin "
              f"{(min(rm) if rm else float('nan')):.3e} absorbed-vs-naive {worst:.1e}",
              file=sys.stderr)
        results.append({"prompt_ids": ids, "steps": steps})
    c = model.cfg
    doc = {
        "generator": "tests/ref/deepseek_ref.py (float64 oracle)",
        "model_config": {k: c.raw.get(k) for k in (
            "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "q_lora_rank",
            "scoring_func", "topk_method", "norm_topk_prob", "routed_scaling_factor")},
        "softmax_scale": c.softmax_scale,
        "decode_steps": args.steps,
        "seed": args.seed,
        "notes": ("steps[i].logits are for prompt_ids + steps[0..i-1].token (greedy, ties -> "
                  "lowest id); step 0 is the last prefill position.  margin = top1 - top2 "
                  "logit; route_margin / group_margin = smallest gap that decided a top-k "
                  "expert / kept-group choice in that forward (null: none).  Feed these tokens "
                  "(teacher forcing) when comparing logits, and compare argmax only where the "
                  "margin exceeds the engine's error."),
        "prompts": prompts,
        "results": results,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
