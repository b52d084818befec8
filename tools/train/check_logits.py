#!/usr/bin/python3
"""check_logits.py — the torch model (model.py, float64) against the C engine
(`moeserve generate --dtype float32`) on a checkpoint written by train.py.

For each prompt (windows of held-out token ids, BOS first): the engine runs
the prompt and N greedy steps and dumps the logits of every step; the torch
model runs the prompt plus the engine's tokens in one causal forward; the
logits of the last prompt position and of every decode step must agree to
max|a - b| / max|torch| <= TOL, and the greedy tokens must be the argmax of
the torch logits, and model.py's KV-cached Model.greedy must give the engine's
tokens.  Prints one line per prompt, then `N passed, N failed`.

With --ppl-file F, also `moeserve perplexity --dtype float32` on F's first
--ppl-chunks windows of --ppl-ctx tokens: its mean NLL must equal the torch
model's over the same windows (first token BOS, positions ctx/2 .. ctx-1
scored) to TOL relative; this pins the command's window semantics.

usage: check_logits.py --model DIR --ids FILE.bin [--moeserve build/moeserve]
       [--prompts 3] [--len 96] [--steps 8] [--tol 1e-4]
       [--ppl-file F --ppl-ctx 128 --ppl-chunks 2]
FILE.bin: int32 ids (`moeserve tokenizer encode`).  Also importable:
load_model(DIR, dtype) -> model.Model with the checkpoint's weights.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402
from model import Model  # noqa: E402


def load_model(d, dtype=torch.float64):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    m = Model(cfg)
    sd = st.read(os.path.join(d, "model.safetensors"))
    m.load_state_dict(sd, strict=True)
    m.to(dtype)
    # the gate bias stays a float32 buffer in training; widen it with the rest here
    for layer in m.model.layers:
        if hasattr(layer.mlp, "gate"):
            layer.mlp.gate.e_score_correction_bias = layer.mlp.gate.e_score_correction_bias.to(dtype)
    m.eval()
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--moeserve", default="build/moeserve")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--len", type=int, default=96)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--ppl-file")
    ap.add_argument("--ppl-ctx", type=int, default=128)
    ap.add_argument("--ppl-chunks", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(2)
    ids = np.fromfile(a.ids, dtype="<i4")
    m = load_model(a.model)
    bos = m.cfg["bos_token_id"]
    prompts = []
    for k in range(a.prompts):   # windows spread over the file, lengths len, len/2, len/4 ...
        n = max(2, a.len >> k)
        s = (len(ids) - n - 1) * k // max(1, a.prompts)
        prompts.append([bos] + ids[s:s + n - 1].tolist())
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "d.jsonl")
        cmd = [a.moeserve, "generate", "--model", a.model, "--dtype", "float32", "--threads", "2",
               "--ignore-eos", "--max-new-tokens", str(a.steps), "--dump-logits", dump]
        for p in prompts:
            cmd += ["--prompt-ids", ",".join(map(str, p))]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print("engine failed: " + r.stderr[-2000:])
            print("0 passed, 1 failed")
            return 1
        steps = {}
        for line in open(dump):
            d = json.loads(line)
            steps.setdefault(d["seq"], {})[d["step"]] = (d["token"], d["logits"])
    passed = failed = 0
    for i, p in enumerate(prompts):
        got = steps.get(i, {})
        toks = [got[s][0] for s in sorted(got)]
        if len(toks) != a.steps:
            print("prompt %d: engine gave %d steps, want %d" % (i, len(toks), a.steps))
            failed += 1
            continue
        seq = torch.tensor([p + toks[:-1]])
        with torch.no_grad():
            ref = m(seq)[0]
        worst, bad = 0.0, None
        for s in range(a.steps):
            r_ = ref[len(p) - 1 + s]
            e_ = torch.tensor(got[s][1], dtype=torch.float64)
            rel = ((r_ - e_).abs().max() / r_.abs().max()).item()
            worst = max(worst, rel)
            if int(r_.argmax()) != toks[s]:
                top2 = r_.topk(2).values
                bad = "step %d: engine token %d, torch argmax %d (margin %.2e)" % (
                    s, toks[s], int(r_.argmax()), (top2[0] - top2[1]).item())
        with torch.no_grad():   # model.py's KV-cached greedy decode must give the same tokens
            kv = m.greedy(torch.tensor([p]), a.steps)[0].tolist()
        if kv != toks and not bad:
            bad = "Model.greedy (KV cache) gave %s, engine %s" % (kv, toks)
        if bad or worst > a.tol:
            print("prompt %d (%d tokens): FAIL max relative %.3e; %s" % (i, len(p), worst, bad or ""))
            failed += 1
        else:
            print("prompt %d (%d tokens, %d steps): max relative %.3e, KV-cached greedy = engine" % (
                i, len(p), a.steps, worst))
            passed += 1
    if a.ppl_file:
        ok = check_ppl(a, m)
        passed, failed = passed + ok, failed + (not ok)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


def check_ppl(a, m):
    """The engine's perplexity (float32) against the torch model's on the same windows."""
    with tempfile.TemporaryDirectory() as tmp:
        lst, ids_path = os.path.join(tmp, "l"), os.path.join(tmp, "ids.bin")
        with open(lst, "w") as f:
            f.write(a.ppl_file + "\n")
        subprocess.run([a.moeserve, "tokenizer", "encode", "--model", a.model, "--out", ids_path,
                        "--list", lst], check=True, capture_output=True)
        ids = np.fromfile(ids_path, dtype="<i4")[1:]   # the file's ids, without encode's BOS
        r = subprocess.run([a.moeserve, "perplexity", "--model", a.model, "--file", a.ppl_file,
                            "--dtype", "float32", "--threads", "2", "--ctx", str(a.ppl_ctx),
                            "--chunks", str(a.ppl_chunks)], capture_output=True, text=True)
    line = [l for l in r.stdout.splitlines() if l.startswith("result:")]
    if r.returncode or not line:
        print("perplexity failed: " + (r.stderr + r.stdout)[-2000:])
        return False
    res = dict(kv.split("=") for kv in line[0].split()[1:])
    C, half = a.ppl_ctx, a.ppl_ctx // 2
    nll, n = 0.0, 0
    for w in range(a.ppl_chunks):
        win = [m.cfg["bos_token_id"]] + ids[w * C + 1:(w + 1) * C].tolist()
        with torch.no_grad():
            lp = m(torch.tensor([win]))[0].log_softmax(-1)
        for p in range(half - 1, C - 1):
            nll -= lp[p, win[p + 1]].item()
            n += 1
    ref = math.exp(nll / n)
    got = float(res["ppl"])
    rel = abs(got - ref) / ref
    ok = int(res["tokens"]) == n and rel <= a.tol
    print("perplexity %s: engine ppl %.6f over %s tokens, torch %.6f over %d (relative %.2e)" % (
        "ok" if ok else "FAIL", got, res["tokens"], ref, n, rel))
    return ok


if __name__ == "__main__":
    sys.exit(main())
