#!/usr/bin/python3
"""v4_form_check.py — DeepSeek-V4 forward in the official reference's prefill form
(inference/model.py: the whole sequence at once, compressors pooled window by window with
the overlap transform, window and compressed candidates by index, indexer top-k with the
causal mask), float64, from arch.md §2; no quantisation simulations (--dtype float32
runs none).  moeserve's C forward instead runs per-token compressor state, so the two
formulations check each other.  Teacher-forced: --ids is the prompt followed by the
tokens moeserve generated; writes the logits of positions prompt_len-1 .. end as the
golden JSON tests/compare_logits.py reads, and prints the smallest indexer top-k margin
and routing margin seen (a comparison near a tie is not meaningful).
Usage: v4_form_check.py --model DIR --ids 1,2,3 --prompt-len N --out FILE
Written by the engine's author (not the independent reference of tests/ref/).
Reads one model.safetensors with F32/BF16/I64 tensors (tiny-v4 --dtype fp32|bf16).
"""
import argparse, json, math, struct, sys
import numpy as np, torch
ap = argparse.ArgumentParser()
ap.add_argument('--model', required=True); ap.add_argument('--ids', required=True)
ap.add_argument('--prompt-len', type=int, required=True); ap.add_argument('--out', required=True)
a = ap.parse_args()
d = a.model; ids = [int(x) for x in a.ids.split(',')]
margins = {'topk': math.inf, 'route': math.inf}
cfg = json.load(open(d + '/config.json'))
raw = open(d + '/model.safetensors', 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]; hdr = json.loads(raw[8:8 + n]); base = 8 + n
DT = {'F32': np.float32, 'I64': np.int64, 'BF16': np.uint16, 'F8_E4M3': np.uint8, 'F8_E8M0': np.uint8}
def T(name):
    h = hdr[name]; a, b = h['data_offsets']
    x = np.frombuffer(raw[base + a: base + b], dtype=DT[h['dtype']]).reshape(h['shape'])
    if h['dtype'] == 'BF16': x = (x.astype(np.uint32) << 16).view(np.float32)
    if h['dtype'] == 'I64': return torch.from_numpy(x.copy())
    assert h['dtype'] in ('F32', 'BF16'), name
    return torch.from_numpy(x.astype(np.float64))
D = cfg['hidden_size']; L = cfg['num_hidden_layers']; H = cfg['num_attention_heads']; hd = cfg['head_dim']
dr = cfg['qk_rope_head_dim']; W = cfg['sliding_window']; G = cfg['o_groups']; R = cfg['o_lora_rank']
nI = cfg['index_n_heads']; ihd = cfg['index_head_dim']; topk = cfg['index_topk']; hc = cfg['hc_mult']
K = cfg['num_experts_per_tok']; E = cfg['n_routed_experts']; eps = cfg['rms_norm_eps']; hce = cfg['hc_eps']
lim = cfg['swiglu_limit']; rsf = cfg['routed_scaling_factor']; ratios = cfg['compress_ratios']
rs = cfg['rope_scaling']
def freqs(base, orig, factor, bf, bs):
    f = 1.0 / (base ** (torch.arange(0, dr, 2, dtype=torch.float64) / dr))
    if orig > 0:
        cd = lambda r: dr * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))
        lo = max(math.floor(cd(bf)), 0); hi = min(math.ceil(cd(bs)), dr - 1)
        if lo == hi: hi += 0.001
        ramp = ((torch.arange(dr // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        f = f / factor * ramp + f * (1 - ramp)
    return f
FP = freqs(cfg['rope_theta'], 0, 1, 0, 0)
FC = freqs(cfg['compress_rope_theta'], rs['original_max_position_embeddings'], rs['factor'], rs['beta_fast'], rs['beta_slow'])
def rope(x, pos, f, inv=False):  # x [..., S, *, dr] with pos [S]
    ang = pos.double()[:, None] * f[None, :]
    if inv: ang = -ang
    c, s = torch.cos(ang), torch.sin(ang)
    while c.dim() < x.dim(): c = c.unsqueeze(-2); s = s.unsqueeze(-2)
    a, b = x[..., 0::2], x[..., 1::2]
    y = torch.empty_like(x); y[..., 0::2] = a * c - b * s; y[..., 1::2] = a * s + b * c
    return y
def rms(x, w=None):
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y
S = len(ids); pos = torch.arange(S)
def compressor(p, u, ratio, dd, f):
    ov = ratio == 4; kv = u @ T(p + '.wkv.weight').T; sc = u @ T(p + '.wgate.weight').T
    cut = S - S % ratio; nn = cut // ratio
    if nn == 0: return torch.zeros(0, dd, dtype=torch.float64)
    kv = kv[:cut].view(nn, ratio, -1); sc = sc[:cut].view(nn, ratio, -1) + T(p + '.ape')
    if ov:
        k2 = torch.zeros(nn, 2 * ratio, dd, dtype=torch.float64); s2 = torch.full((nn, 2 * ratio, dd), -math.inf, dtype=torch.float64)
        k2[:, ratio:] = kv[:, :, dd:]; s2[:, ratio:] = sc[:, :, dd:]
        k2[1:, :ratio] = kv[:-1, :, :dd]; s2[1:, :ratio] = sc[:-1, :, :dd]
        kv, sc = k2, s2
    c = (kv * sc.softmax(dim=1)).sum(1)
    c = rms(c, T(p + '.norm.weight'))
    c[:, -dr:] = rope(c[:, -dr:], torch.arange(nn) * ratio, f)
    return c
def attn(p, u, ratio):
    f = FC if ratio else FP
    qr = rms(u @ T(p + '.wq_a.weight').T, T(p + '.q_norm.weight'))
    q = rms((qr @ T(p + '.wq_b.weight').T).view(S, H, hd))
    q[..., -dr:] = rope(q[..., -dr:], pos, f)
    kv = rms(u @ T(p + '.wkv.weight').T, T(p + '.kv_norm.weight'))
    kv[:, -dr:] = rope(kv[:, -dr:], pos, f)
    comp = compressor(p + '.compressor', u, ratio, hd, f) if ratio else None
    if ratio == 4:
        iq = (qr @ T(p + '.indexer.wq_b.weight').T).view(S, nI, ihd)
        iq[..., -dr:] = rope(iq[..., -dr:], pos, f)
        ik = compressor(p + '.indexer.compressor', u, 4, ihd, f)
        iw = (u @ T(p + '.indexer.weights_proj.weight').T) * (ihd ** -0.5 * nI ** -0.5)
    sink = T(p + '.attn_sink'); o = torch.zeros(S, H, hd, dtype=torch.float64)
    for i in range(S):
        cand = [kv[j] for j in range(max(0, i - W + 1), i + 1)]
        nv = (i + 1) // ratio if ratio else 0
        if ratio == 128: cand += [comp[j] for j in range(nv)]
        if ratio == 4 and nv > 0:
            sc = (iw[i][:, None] * torch.relu(iq[i] @ ik[:nv].T)).sum(0)
            k = min(topk, nv); srt = sc.sort(descending=True).values
            if nv > k: margins['topk'] = min(margins['topk'], float(srt[k - 1] - srt[k]))
            sel = sc.topk(k).indices
            cand += [comp[j] for j in sel.tolist()]
        C = torch.stack(cand); s = (q[i] @ C.T) * hd ** -0.5
        z = s.max(-1, keepdim=True).values; e = torch.exp(s - z)
        den = e.sum(-1) + torch.exp(sink - z[:, 0])
        o[i] = (e / den[:, None]) @ C
    o[..., -dr:] = rope(o[..., -dr:], pos, f, inv=True)
    z = torch.einsum('sgd,grd->sgr', o.reshape(S, G, -1), T(p + '.wo_a.weight').view(G, R, -1))
    return z.reshape(S, -1) @ T(p + '.wo_b.weight').T
def moe(p, u, l):
    lg = u @ T(p + '.gate.weight').T; sc = torch.sqrt(torch.nn.functional.softplus(lg))
    if l < cfg['num_hash_layers']: idx = T(p + '.gate.tid2eid')[torch.tensor(ids)]
    else:
        b = sc + T(p + '.gate.bias'); srt = b.sort(-1, descending=True).values
        margins['route'] = min(margins['route'], float((srt[:, K - 1] - srt[:, K]).min()))
        idx = b.topk(K).indices
    w = sc.gather(1, idx); w = w / w.sum(-1, keepdim=True) * rsf
    def ex(q, x):
        g = (x @ T(q + '.w1.weight').T).clamp(max=lim); up = (x @ T(q + '.w3.weight').T).clamp(-lim, lim)
        return torch.nn.functional.silu(g) * up, q
    y = torch.zeros_like(u)
    for t in range(S):
        for j in range(K):
            h, q = ex('%s.experts.%d' % (p, int(idx[t, j])), u[t:t+1])
            y[t] += ((h * w[t, j]) @ T(q + '.w2.weight').T)[0]
    h, q = ex(p + '.shared_experts', u)
    return y + h @ T(q + '.w2.weight').T
def hc_pre(X, p):
    fl = X.reshape(S, -1); r = torch.rsqrt((fl * fl).mean(-1, keepdim=True) + eps)
    mix = (fl @ T(p + '_fn').T) * r; sc = T(p + '_scale'); b = T(p + '_base')
    pre = torch.sigmoid(mix[:, :hc] * sc[0] + b[:hc]) + hce
    post = 2 * torch.sigmoid(mix[:, hc:2*hc] * sc[1] + b[hc:2*hc])
    cb = (mix[:, 2*hc:] * sc[2] + b[2*hc:]).view(S, hc, hc)
    cb = cb.softmax(-1) + hce; cb = cb / (cb.sum(-2, keepdim=True) + hce)
    for _ in range(cfg['hc_sinkhorn_iters'] - 1):
        cb = cb / (cb.sum(-1, keepdim=True) + hce); cb = cb / (cb.sum(-2, keepdim=True) + hce)
    return (pre[..., None] * X).sum(1), post, cb
def hc_post(f, X, post, cb):
    return post[..., None] * f[:, None, :] + (cb[..., None] * X[:, :, None, :]).sum(1)
X = T('embed.weight')[torch.tensor(ids)][:, None, :].repeat(1, hc, 1)
for l in range(L):
    p = 'layers.%d' % l
    u, post, cb = hc_pre(X, p + '.hc_attn'); X = hc_post(attn(p + '.attn', rms(u, T(p + '.attn_norm.weight')), ratios[l]), X, post, cb)
    u, post, cb = hc_pre(X, p + '.hc_ffn'); X = hc_post(moe(p + '.ffn', rms(u, T(p + '.ffn_norm.weight')), l), X, post, cb)
fl = X.reshape(S, -1); r = torch.rsqrt((fl * fl).mean(-1, keepdim=True) + eps)
pre = torch.sigmoid((fl @ T('hc_head_fn').T) * r * T('hc_head_scale')[0] + T('hc_head_base')) + hce
y = rms((pre[..., None] * X).sum(1), T('norm.weight'))
logits = y @ T('head.weight').T
P = a.prompt_len
steps = [{'step': i, 'token': int(logits[P - 1 + i].argmax()), 'logits': logits[P - 1 + i].tolist()}
         for i in range(S - P + 1)]
json.dump({'results': [{'prompt_ids': ids[:P], 'steps': steps}]}, open(a.out, 'w'))
print('smallest indexer top-k margin %.3g, routing margin %.3g' % (margins['topk'], margins['route']),
      file=sys.stderr)
