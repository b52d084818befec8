#!/usr/bin/python3
"""prefix_hit_compare.py — a cold /v1/completions answer against a prefix-hit one (the shell
tests' prefix-hit checks, t_v4_cache.sh and t_v4_kvq.sh): the same text and top-5 tokens,
log-probabilities within 1e-4 (float32), the cold run with no cached tokens and the hit with
exactly CACHED.  Prints one line, starting "ok" or "BAD".

    prefix_hit_compare.py COLD.json HIT.json CACHED
"""
import json
import sys

cold, hit = (json.load(open(p)) for p in sys.argv[1:3])
want = int(sys.argv[3])
cc = cold["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
hc = hit["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
a, b = cold["choices"][0], hit["choices"][0]
d = max(abs(x - y) for x, y in zip(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]))
for p, q in zip(a["logprobs"]["top_logprobs"], b["logprobs"]["top_logprobs"]):
    assert sorted(p) == sorted(q), (p, q)
    d = max([d] + [abs(p[k] - q[k]) for k in p])
ok = a["text"] == b["text"] and hc == want and cc == 0 and d <= 1e-4
print("%s cached %d (cold %d), same text %s, max logprob change %.2g"
      % ("ok" if ok else "BAD", hc, cc, a["text"] == b["text"], d))
