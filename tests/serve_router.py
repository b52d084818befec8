#!/usr/bin/python3
"""serve_router.py — DP admission of a real 2-DP-rank `moeserve serve`.

Usage: serve_router.py BASE_URL POLICY
POLICY is the server's --load-balance-method.  A prompt P is served once,
then a long request is pinned to P's rank with X-Data-Parallel-Rank, then P
comes again without a hint.  cache_aware must send it back to the rank
holding P although that rank is busier (in-flight 1 against 0 is within the
imbalance thresholds), so the repeat reports cached prompt tokens;
total_requests must send it to the idle rank (no cached tokens).  A new prompt then goes to the less loaded rank under every policy.
Prints one line per check and `N passed, N failed`.
"""
import http.client
import json
import socket
import sys
import time
import urllib.parse

BASE, POLICY = sys.argv[1], sys.argv[2]
U = urllib.parse.urlparse(BASE)
passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def req(method, path, body=None, headers=None):
    c = http.client.HTTPConnection(U.hostname, U.port, timeout=120)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request(method, path, body=None if body is None else json.dumps(body), headers=h)
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, json.loads(raw) if raw else None


def load():
    return req("GET", "/get_load")[1]


def busy():
    return [d["num_running_reqs"] + d["num_waiting_reqs"] for d in load()]


def complete(prompt, headers=None):
    s, j = req("POST", "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 2,
                                           "temperature": 0}, headers)
    if s != 200:
        return None
    return j["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)


def wait_idle(timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout and any(busy()):
        time.sleep(0.05)


P = "System: you are a careful assistant who answers briefly. " * 6 + "Question: what is two plus two?"
Q = "A different conversation about rivers, mountains and the weather in spring. " * 5

s, info = req("GET", "/server_info")
check("/server_info names the policy", info.get("load_balance_method") == POLICY, info.get("load_balance_method"))
first = complete(P)
check("first request served", first is not None, first)
wait_idle()
# a long streamed request pinned to rank 0 (where P went: both ranks were idle, the first wins)
sk = socket.create_connection((U.hostname, U.port))
b = json.dumps({"model": "m", "prompt": "Go", "max_tokens": 200, "temperature": 0, "stream": True,
                "ignore_eos": True}).encode()
sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"X-Data-Parallel-Rank: 0\r\nContent-Length: " + str(len(b)).encode() + b"\r\n\r\n" + b)
sk.recv(4096)
for _ in range(200):
    if busy()[0] > 0:
        break
    time.sleep(0.005)
per = busy()
check("the pinned request runs on rank 0", per[0] >= 1 and per[1] == 0, per)
again = complete(P)
if POLICY == "cache_aware":
    check(f"{POLICY}: the repeat goes to the busier rank holding its prefix (cached tokens)",
          again is not None and again >= 32, again)
else:
    check(f"{POLICY}: the repeat goes to the idle rank (no cached tokens)", again == 0, again)
fresh = complete(Q)
check(f"{POLICY}: a new prompt goes to the idle rank (no cached tokens)", fresh == 0, fresh)
sk.close()
wait_idle()
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
