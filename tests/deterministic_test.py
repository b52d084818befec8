#!/usr/bin/python3
"""deterministic_test.py — `serve --enable-deterministic-inference` (issue 29 item 6):
greedy outputs do not depend on what else is in the batch, under --dtype auto.

usage: deterministic_test.py MODEL_DIR [TOKENS]

For each mode (the flag on, then the default): one server; 16 greedy /generate
requests of TOKENS (default 200) new tokens each, first one after another (each
alone in its batch), then all 16 at once (batches of up to 16 decode rows, prefills
mixed with decodes, and prefix-cache hits on the alone runs' pages).  Prompt lengths
include 17 and 33 ids (page 16: a prefix hit leaves one token to compute) and two
prompts share a 40-token prefix.  With the flag, every request's tokens and their log-probs
(bits) must equal its alone; without it, some must differ (the fast paths round by batch size), or
the test could not tell the two apart.  Then the flag again with a KV pool of
--max-total-tokens 1024 and 768 (16 x (prompt + TOKENS) would need ~4,200) and chunks
of 29 and 64 tokens: requests are retracted (the test reads sglang:num_retracted_requests_total,
so it cannot pass without one) and re-run their prompt and generated tokens through
the prefill forward in chunks that start and end anywhere; their tokens must still
equal the alone run's.  Prints `N passed, N failed`.
"""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_proc as sp  # noqa: E402
import json  # noqa: E402

MODEL = sys.argv[1]
TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 200
N_REQ = 16


def prompts():
    """16 id lists, seeded: lengths 5..60, two of 17 and 33, two sharing 40 ids."""
    out, x = [], 12345
    lens = [5, 17, 33, 9, 41, 60, 12, 17, 33, 25, 48, 7, 30, 50, 44, 44]
    for i, n in enumerate(lens):
        ids = []
        for _ in range(n):
            x = (x * 1103515245 + 12345) % (1 << 31)
            ids.append(3 + x % 900)
        out.append(ids)
    out[15][:40] = out[14][:40]  # a shared prefix: the second one hits the radix cache
    return out


def generate(p, ids):
    """[(token, its log-prob)] of a greedy request: equal outputs mean equal bits of
    the logits' log-softmax too, which FP32 kernels (AVX2) need for the control: their
    reduction orders move the logits by ~1e-7, which seldom flips a greedy token."""
    s, body = p.request("/generate", {"input_ids": ids, "return_logprob": True,
                                      "sampling_params": {"max_new_tokens": TOKENS,
                                                          "temperature": 0,
                                                          "ignore_eos": True}}, timeout=600)
    if s != 200:
        return "HTTP %d" % s
    d = json.loads(body)
    return [(t, lp[0]) for t, lp in zip(d["output_ids"],
                                         d["meta_info"]["output_token_logprobs"])]


def retracted(p):
    """sglang:num_retracted_requests_total summed over DP ranks (-1: no metric)."""
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % p.port, timeout=30) as r:
        text = r.read().decode()
    vals = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if ln.startswith("sglang:num_retracted_requests_total{")]
    return sum(vals) if vals else -1


def run(flags, alone_too=True, env=None):
    """(alone outputs, concurrent outputs, server log, retractions) for one server."""
    p = sp.Proc(["serve", "--model-path", MODEL, "--dtype", "auto", "--threads", "2",
                 "--max-running-requests", str(N_REQ), "--skip-server-warmup"] + flags,
                env=env, deadline_s=120)
    if not p.started:
        out = p.output()
        p.stop()
        return None, None, out, 0
    ps = prompts()
    alone = [generate(p, ids) for ids in ps] if alone_too else None
    conc = [None] * N_REQ

    def worker(i):
        try:
            conc[i] = generate(p, ps[i])
        except Exception as e:  # noqa: BLE001 - a lost request is a failure
            conc[i] = "error %s" % e

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N_REQ)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n_retracted = retracted(p) if "--enable-metrics" in flags else 0
    out = p.output()
    p.stop()
    return alone, conc, out, n_retracted


def first_diff(a, b):
    if not isinstance(a, list) or not isinstance(b, list):
        return 0
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else -1


alone, conc, log, _ = run(["--enable-deterministic-inference"])
det_alone = alone
if alone is None:
    sp.check("deterministic server starts", False, log[-1500:])
else:
    lens_ok = all(isinstance(a, list) and len(a) == TOKENS for a in alone)
    sp.check("deterministic: 16 requests alone give %d tokens each" % TOKENS, lens_ok,
             str([a if not isinstance(a, list) else len(a) for a in alone]))
    bad = [(i, first_diff(alone[i], conc[i])) for i in range(N_REQ) if alone[i] != conc[i]]
    sp.check("deterministic: 16 concurrent greedy requests give exactly their tokens and "
             "log-probs alone over %d tokens" % TOKENS, not bad and lens_ok,
             "request, first differing position: %s" % bad)
    sp.check("deterministic: the start-up log names batch-invariant products",
             "batch-invariant products" in log, log[-800:])

# Retractions: a pool too small for the 16 at once, the flag on; compared with the
# alone run above (a pool size changes no arithmetic).
for pool, chunk in (("1024", "29"), ("768", "64")):
    _, conc, log, n_retracted = run(["--enable-deterministic-inference", "--enable-metrics",
                                     "--max-total-tokens", pool, "--chunked-prefill-size", chunk],
                                    alone_too=False)
    what = "KV pool %s, chunk %s" % (pool, chunk)
    if conc is None or det_alone is None:
        sp.check("deterministic server (%s) starts" % what, False, log[-1500:])
        continue
    sp.check("%s: requests were retracted (%d; the check is not vacuous)" % (what, n_retracted),
             n_retracted > 0, log[-800:])
    bad = [(i, first_diff(det_alone[i], conc[i])) for i in range(N_REQ) if det_alone[i] != conc[i]]
    sp.check("deterministic, %s: 16 concurrent greedy requests, some retracted and recomputed, "
             "give exactly their tokens and log-probs alone over %d tokens" % (what, TOKENS), not bad,
             "request, first differing position: %s" % bad)

# The control runs the packed-panel kernels from 2 rows (MOESERVE_PACK_MIN_M), so the
# default mode's reduction order follows the batch on every ISA: at AVX2's default of
# 32 rows, 16 decode rows and these short prompts all take one M-independent kernel
alone, conc, log, _ = run([], env={"MOESERVE_PACK_MIN_M": "2"})
if alone is None:
    sp.check("default server starts", False, log[-1500:])
else:
    diff = [(i, first_diff(alone[i], conc[i])) for i in range(N_REQ) if alone[i] != conc[i]]
    print("    default mode: %d of %d concurrent requests differ from alone (first positions %s)"
          % (len(diff), N_REQ, [d[1] for d in diff]))
    sp.check("default mode: the same check sees batch-dependent tokens (the test can tell)",
             len(diff) > 0)
sp.finish()
