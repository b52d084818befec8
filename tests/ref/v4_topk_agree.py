#!/usr/bin/python3
"""v4_topk_agree.py — how often the MXFP4 indexer (--enable-deepseek-v4-fp4-indexer: keys and
queries Hadamard-rotated and quantised to e2m1 per 32), or with --keys fp8 SGLang's FP8 index
keys (--kv-cache-dtype fp8_e4m3 alone: rotated, e4m3 with an f32 scale amax / 448 per 128),
picks the same top-k compressed entries
as the unquantised indexer, on one long prompt through v4_ref.py's float64 forward (written
from arch.md; the issue's measure of the FP4 indexer).  For every CSA layer and every query
with more valid entries than index_topk: |top-k(FP4 scores) ∩ top-k(exact scores)| / k; the
forward itself follows the exact indexer, so each layer sees the same inputs either way.

    v4_topk_agree.py --model DIR --tokens N [--seed S] [--keys fp4|fp8]

Prints one line per CSA layer and the overall mean ("topk_agree mean=... min=... queries=...").
Not part of `make test` (bench/RESULTS.md records its figure).  Debian's /usr/bin/python3, numpy.
"""

import argparse
import os
import random
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4_ref as V  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--keys", choices=("fp4", "fp8"), default="fp4")
    a = ap.parse_args()
    model = V.V4Model(V.V4Checkpoint(a.model))
    cfg = model.cfg
    rng = random.Random(a.seed)
    ids = [rng.randrange(2, cfg.vocab) for _ in range(a.tokens)]
    per_layer = {}
    exact_scores = V.V4Model.index_scores

    def probe(self, ly, u, qr, pos, keys, theta):
        s = exact_scores(self, ly, u, qr, pos, keys, theta)
        self.fp4_indexer, self.fp8_indexer = a.keys == "fp4", a.keys == "fp8"
        k4 = V.index_sim(keys, a.keys)  # keys arrive unquantised (the forward is exact)
        s4 = exact_scores(self, ly, u, qr, pos, k4, theta)
        self.fp4_indexer = self.fp8_indexer = False
        got = per_layer.setdefault(ly.L, [])
        for p in range(len(pos)):
            nv = int(np.isfinite(s[p]).sum())
            k = min(cfg.idx_topk, nv)
            if nv <= k:
                continue
            e, _ = V.stable_topk(s[p], k)
            f, _ = V.stable_topk(s4[p], k)
            got.append(len(set(e.tolist()) & set(f.tolist())) / k)
        return s

    V.V4Model.index_scores = probe
    model.forward_full(ids)
    allv = [x for v in per_layer.values() for x in v]
    for L, v in sorted(per_layer.items()):
        print("layer %d: %d queries, top-k agreement mean %.4f min %.4f" % (L, len(v), np.mean(v), np.min(v)))
    print("topk_agree keys=%s mean=%.4f min=%.4f queries=%d topk=%d tokens=%d" % (
        a.keys, np.mean(allv), np.min(allv), len(allv), cfg.idx_topk, a.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
