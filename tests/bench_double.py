#!/usr/bin/python3
"""bench_double.py — a test double of an OpenAI-compatible + SGLang /generate server for
tests/t_bench.sh: streams SSE with known timing (TTFT, then one chunk every ITL), records what
clients sent (arrival times, prompt lengths, peak concurrent streams) and injects failures.

POST /generate, /v1/completions, /v1/chat/completions   the APIs (stream or not)
GET  /v1/models                                          {"data": [{"id": "double-model"}]}
GET  /stats                                              what was recorded (JSON)
POST /config                                             JSON: ttft_ms, itl_ms, tokens_per_chunk,
                                                         fail_every, split, usage, stream_error
                                                         (an error event after the first token;
                                                         /generate: finish_reason abort) (others back
                                                         to defaults); also resets the stats
Usage: bench_double.py PORT_FILE   (binds 127.0.0.1:0 and writes the port to PORT_FILE)
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
DEFAULTS = {"ttft_ms": 50.0, "itl_ms": 10.0, "tokens_per_chunk": 1, "fail_every": 0,
            "split": False, "usage": True, "stream_error": False}
CFG = dict(DEFAULTS)
STATS = {}


def reset():
    STATS.clear()
    STATS.update({"requests": 0, "active": 0, "peak_active": 0, "arrivals": [], "prompt_lens": [],
                  "input_ids_lens": [], "max_tokens": [], "streams": [], "ignore_eos": [],
                  "models": [], "prefixes": [], "paths": [], "failed": 0, "extra": []})


reset()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        if self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": "double-model", "object": "model"}]})
        elif self.path == "/stats":
            with LOCK:
                self.reply(200, STATS)
        else:
            self.reply(404, {"error": {"message": "no such route"}})

    def chunk(self, s):
        b = s.encode()
        if CFG["split"] and len(b) > 8:  # split the frame inside its JSON, delivered apart
            h = len(b) // 2
            for part in (b[:h], b[h:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
                time.sleep(0.001)
        else:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
            self.wfile.flush()

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(n) or b"{}")
        if self.path == "/config":
            with LOCK:
                CFG.clear()
                CFG.update(DEFAULTS)
                CFG.update(body)
                reset()
            self.reply(200, CFG)
            return
        if self.path not in ("/generate", "/v1/completions", "/v1/chat/completions"):
            self.reply(404, {"error": {"message": "no such route"}})
            return
        now = time.monotonic()
        gen = self.path == "/generate"
        chat = self.path == "/v1/chat/completions"
        sp = body.get("sampling_params", {}) if gen else body
        max_tokens = int(sp.get("max_new_tokens" if gen else "max_tokens", 16))
        stream = bool(body.get("stream", False))
        if chat:
            text = body["messages"][0]["content"]
        else:
            text = body.get("text", body.get("prompt", ""))
        ids = body.get("input_ids")
        plen = len(ids) if ids is not None else len(text.split())
        with LOCK:
            STATS["requests"] += 1
            k = STATS["requests"]
            STATS["active"] += 1
            STATS["peak_active"] = max(STATS["peak_active"], STATS["active"])
            STATS["arrivals"].append(now)
            STATS["prompt_lens"].append(plen)
            STATS["input_ids_lens"].append(len(ids) if ids is not None else -1)
            STATS["max_tokens"].append(max_tokens)
            STATS["streams"].append(stream)
            STATS["ignore_eos"].append(sp.get("ignore_eos"))
            STATS["models"].append(body.get("model"))
            STATS["prefixes"].append(text.split("\n\n")[0][:64] if isinstance(text, str) else "")
            STATS["paths"].append(self.path)
            STATS["extra"].append(body.get("x_extra"))
            cfg = dict(CFG)
            fail = cfg["fail_every"] and k % cfg["fail_every"] == 0
            if fail:
                STATS["failed"] += 1
        if fail:
            with LOCK:
                STATS["active"] -= 1
            self.reply(500, {"error": {"message": "injected failure %d" % k, "code": 500}})
            return
        ttft, itl = cfg["ttft_ms"] / 1e3, cfg["itl_ms"] / 1e3
        tpc = max(1, int(cfg["tokens_per_chunk"])) if gen else 1
        usage = {"prompt_tokens": plen, "completion_tokens": max_tokens,
                 "total_tokens": plen + max_tokens}
        if not stream:
            time.sleep(ttft + itl * max(0, (max_tokens + tpc - 1) // tpc - 1))
            out = " tok" * max_tokens
            with LOCK:
                STATS["active"] -= 1
            if gen:
                self.reply(200, {"text": out, "meta_info": {"prompt_tokens": plen,
                                                            "completion_tokens": max_tokens}})
            elif chat:
                self.reply(200, {"choices": [{"index": 0, "message": {"role": "assistant",
                                 "content": out}, "finish_reason": "length"}], "usage": usage})
            else:
                self.reply(200, {"choices": [{"index": 0, "text": out, "finish_reason": "length"}],
                                 "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if chat:  # the role chunk: empty content, sent at once, must not count as the first token
            self.chunk("data: " + json.dumps({"choices": [{"index": 0, "delta": {
                "role": "assistant", "content": ""}}]}) + "\n\n")
        time.sleep(ttft)
        sent = 0
        first = True
        while sent < max_tokens:
            if not first:
                time.sleep(itl)
            first = False
            k = min(tpc, max_tokens - sent)
            sent += k
            if gen:
                ev = {"text": " tok" * sent, "meta_info": {"prompt_tokens": plen,
                                                           "completion_tokens": sent}, "index": 0}
            elif chat:
                ev = {"choices": [{"index": 0, "delta": {"content": " tok"}}]}
            else:
                ev = {"choices": [{"index": 0, "text": " tok"}]}
            self.chunk("data: " + json.dumps(ev) + "\r\n\r\n" if sent % 2 else
                       "data: " + json.dumps(ev) + "\n\n")
        if gen:  # the final frame repeats the text: 0 new tokens, no ITL
            fr = {"type": "abort", "message": "aborted by the double"} if cfg["stream_error"] \
                else {"type": "length"}
            self.chunk("data: " + json.dumps({"text": " tok" * sent, "meta_info": {
                "prompt_tokens": plen, "completion_tokens": sent,
                "finish_reason": fr}, "index": 0}) + "\n\n")
        elif cfg["stream_error"]:
            self.chunk("data: " + json.dumps({"error": {"message": "mid-stream failure"}}) + "\n\n")
        elif cfg["usage"] and body.get("stream_options", {}).get("include_usage"):
            self.chunk("data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n")
        with LOCK:
            STATS["active"] -= 1
        self.chunk(": comment line\n\ndata: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def main():
    srv = Server(("127.0.0.1", 0), Handler)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    srv.serve_forever()


if __name__ == "__main__":
    main()
