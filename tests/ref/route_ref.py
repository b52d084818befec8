"""route_ref.py — the float64 reference's routing of one token sequence: for every layer,
each position's top-k logical experts (deepseek_ref.py's gate over its naive causal
forward; a position's routing depends only on the tokens up to it, so one forward over
prompt + generated tokens gives the routing of the prefill and of every decode step).
Used by tests/t_expert_recorder.sh against the per_token recorder's dump.

    /usr/bin/python3 tests/ref/route_ref.py --model DIR --ids 0,17,400 --out route.json

Output: {"topk": [layer][position][k] (null for a dense layer), "route_margin": the
smallest gap between the k-th and (k+1)-th selection scores that decided a choice}.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_ref as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ids = [int(t) for t in a.ids.split(",") if t]
    model = ref.Model(ref.Checkpoint(a.model))
    model.stats = ref.Stats()
    n_layers = model.cfg.n_layers
    topk = [None] * n_layers
    cur = {"layer": None}
    ffn, route = model.ffn, model.route

    def ffn_at(layer, x):
        cur["layer"] = layer
        return ffn(layer, x)

    def route_at(ly, x):
        idx, w = route(ly, x)
        topk[cur["layer"]] = idx.tolist()
        return idx, w

    model.ffn, model.route = ffn_at, route_at
    model.forward_naive(ids)
    m = model.stats.route_margin
    with open(a.out, "w") as f:
        json.dump({"topk": topk, "route_margin": m if math.isfinite(m) else None}, f)


if __name__ == "__main__":
    main()
