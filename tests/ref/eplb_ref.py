#!/usr/bin/env python3
"""eplb_ref.py — an independent re-derivation (test-only) of DeepSeek's EPLB from the
prose of ../shared/reference/testing.md §1 (float32 via struct rounding, stable
descending sorts, first-max / lowest-pack ties).  `eplb_ref.py CASES_DIR N SEED`
writes N random cases (case_i.json: loads; case_i.args: the CLI shape) and the
expected {"phy2log", "logcnt", "log2phy"} (case_i.want.json)."""
import json
import random
import struct
import sys


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def pack(w, m):
    n = len(w)
    k = n // m
    if k == 1:
        return list(range(n)), [0] * n
    order = sorted(range(n), key=lambda i: -w[i])  # Python's sort is stable
    pw, cnt = [0.0] * m, [0] * m
    where, rank = [0] * n, [0] * n
    for i in order:
        p = min((q for q in range(m) if cnt[q] < k), key=lambda q: pw[q])
        where[i], rank[i] = p, cnt[p]
        pw[p] = f32(pw[p] + w[i])
        cnt[p] += 1
    return where, rank


def replicate(w, nphy):
    n = len(w)
    p2l, rk, cnt = list(range(n)), [0] * n, [1] * n
    for _ in range(n, nphy):
        loads = [f32(w[e] / cnt[e]) for e in range(n)]
        e = loads.index(max(loads))
        p2l.append(e)
        rk.append(cnt[e])
        cnt[e] += 1
    return p2l, rk, cnt


def layer(w, R, G, N, gpus):
    E = len(w)
    gs, epn, rpn, ppg = E // G, E // N, R // N, R // gpus
    gw = []
    for g in range(G):
        s = 0.0
        for j in range(gs):
            s = f32(s + w[g * gs + j])
        gw.append(s)
    gnode, grank = pack(gw, N)
    l2m = [(gnode[e // gs] * (G // N) + grank[e // gs]) * gs + e % gs for e in range(E)]
    m2l = [0] * E
    for e in range(E):
        m2l[l2m[e]] = e
    phy2log, phyrank, mcnt_all = [0] * R, [0] * R, []
    for k in range(N):
        tm = [w[m2l[k * epn + j]] for j in range(epn)]
        p2m, prk, mcnt = replicate(tm, rpn)
        mcnt_all += mcnt
        tp = [f32(tm[p2m[s]] / mcnt[p2m[s]]) for s in range(rpn)]
        gpu, r = pack(tp, gpus // N)
        for s in range(rpn):
            q = gpu[s] * ppg + r[s]
            phy2log[k * rpn + q] = m2l[k * epn + p2m[s]]
            phyrank[k * rpn + q] = prk[s]
    return phy2log, phyrank, [mcnt_all[l2m[e]] for e in range(E)]


def rebalance(W, R, G, N, gpus):
    if G % N:
        G = N = 1
    res = [layer([f32(x) for x in w], R, G, N, gpus) for w in W]
    mx = max(max(c) for _, _, c in res)
    l2p = []
    for p2l, rk, c in res:
        t = [[-1] * mx for _ in c]
        for s, e in enumerate(p2l):
            t[e][rk[s]] = s
        l2p.append(t)
    return {"phy2log": [r[0] for r in res], "logcnt": [r[2] for r in res], "log2phy": l2p}


def main():
    out, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rnd = random.Random(seed)
    for i in range(n):
        N = rnd.randint(1, 3)
        gpus = N * rnd.randint(1, 3)
        G = rnd.choice([N * rnd.randint(1, 3), rnd.randint(1, 5)])
        E = G * rnd.randint(1, 4)
        R = ((E + gpus - 1) // gpus + rnd.randint(0, 3)) * gpus
        W = [[rnd.randint(0, 3) if i % 4 == 0 else rnd.randint(0, 100000) for _ in range(E)]
             for _ in range(rnd.randint(1, 3))]
        json.dump(W, open(f"{out}/case_{i}.json", "w"))
        open(f"{out}/case_{i}.args", "w").write(f"--num-replicas {R} --num-groups {G} "
                                                f"--num-nodes {N} --num-gpus {gpus}\n")
        json.dump(rebalance(W, R, G, N, gpus), open(f"{out}/case_{i}.want.json", "w"))


if __name__ == "__main__":
    main()
