"""flags_test.py MODEL_DIR — the flag-class test of issue 23 over every flag of the
tests' own table (tests/flag_table.py): each NOT_BUILT, V4 and MULTI flag is refused by
`serve` (some by `generate` too) naming it, never as an unknown flag; all GPU flags
together start a server that answers and names each in one warning line, and so does
`generate`; the IMPL flags start a server and are named in no warning; SGLANG_* variables
not read are named as ignored; --page-size values; EAGLE3 refused (serve and plan);
--stream-interval 4 gives SSE chunks of up to 4 tokens and the same text as without.
Prints "N passed, N failed"."""
import json
import sys

from flag_table import GPU, IMPL, IMPL_VALUES, MULTI, NOT_BUILT, NOT_BUILT_VALUES, V4, args_of
from server_proc import Proc, check, finish, warning_lines

M = sys.argv[1]


BASE = ["serve", "--model-path", M, "--skip-server-warmup", "--max-total-tokens", "1024",
        "--threads", "1"]


def refused(args, must_name, cmd="serve", extra=None):
    """Runs a command that must be refused at start-up; returns (ok, output)."""
    if cmd == "serve":
        p = Proc(BASE + args, deadline_s=30)
    else:
        p = Proc(["generate", "--model", M, "--prompt", "hi", "--max-new-tokens", "1"] + args,
                 deadline_s=30, wait_health=False)
    out = p.output()
    rc = p.stop()
    ok = (not p.started and not p.hung and rc != 0 and all(n in out for n in must_name)
          and "unknown flag" not in out and (extra is None or extra in out))
    return ok, out


def chat(p, **kw):
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 6,
            "temperature": 0}
    body.update(kw)
    return p.request("/v1/chat/completions", body)


# ---- kind (c): each refused, naming it and saying it is not implemented
for flag, v in NOT_BUILT.items():
    ok, out = refused(args_of(flag, v), [flag, "not implemented"])
    check("refused: %s" % " ".join(args_of(flag, v)), ok, out)
for flag, vals in NOT_BUILT_VALUES.items():
    for v in vals:
        ok, out = refused([flag, v], [flag, v, "not implemented"])
        check("refused: %s %s" % (flag, v), ok, out)
ok, out = refused(["--speculative-algorithm", "EAGLE3"], ["EAGLE3", "draft model"])
check("EAGLE3 refused (serve), the separate draft model named", ok, out)
p = Proc(["plan", "--model", "deepseek-v3", "--tp", "8", "--speculative-algorithm", "EAGLE3"],
         deadline_s=30, wait_health=False)
out = p.output()
check("EAGLE3 refused (plan)", p.stop() != 0 and "EAGLE3" in out and "draft model" in out, out)
p = Proc(["plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8", "--speculative-algorithm", "EAGLE"],
         deadline_s=30, wait_health=False)
out = p.output()
check("EAGLE (the MTP layer) still planned", p.stop() == 0, out)
# the refusal names every refused flag of a command line, and generate refuses too
ok, out = refused(["--speculative-algorithm", "DSPARK", "--swa-full-tokens-ratio", "0.1",
                   "--enable-hierarchical-cache"],
                  ["--speculative-algorithm DSPARK", "--swa-full-tokens-ratio",
                   "--enable-hierarchical-cache"])
check("refusal names each refused flag", ok, out)
for flag in ("--speculative-algorithm", "--kv-cache-dtype", "--enable-hierarchical-cache"):
    ok, out = refused(args_of(flag, NOT_BUILT[flag]), [flag, "not implemented"], cmd="generate")
    check("generate refuses %s" % flag, ok, out)
# an unknown flag stays unknown, even next to refused ones
p = Proc(BASE + ["--no-such-flag", "1", "--enable-eplb"], deadline_s=30)
out = p.output()
check("an unknown flag is reported as unknown", p.stop() != 0 and "unknown flag --no-such-flag" in out, out)
# the KV cache stores the activation dtype: fp32 only with --dtype float32
ok, out = refused(["--kv-cache-dtype", "fp32"], ["--kv-cache-dtype fp32", "not implemented"])
check("--kv-cache-dtype fp32 refused with --dtype auto", ok, out)

for flag in ("--pp-size", "--attn-cp-size"):
    ok, out = refused([flag, "2"], [flag + " 2", "not implemented"])
    check("%s 2 refused before any rank starts" % flag, ok, out)

# ---- another model family
for flag, v in V4.items():
    ok, out = refused(args_of(flag, v), [flag, "DeepSeek-V4", "deepseek_v3"])
    check("V4 flag refused on a V3 model: %s" % flag, ok, out)
# the V4 parsers start on a V3 model too (SGLang takes any parser with any model)
v4_parsers = []
for flag, vals in IMPL_VALUES.items():
    for v in vals:
        v4_parsers += [flag, v]
p = Proc(BASE + v4_parsers, deadline_s=60)
st, body = chat(p) if p.started else (0, "")
out = p.output()
check("%s: the server starts and answers on a V3 model" % " ".join(v4_parsers),
      p.started and st == 200 and not warning_lines(out), out + body)
p.stop()

# ---- multi-node
for flag, v in MULTI.items():
    ok, out = refused(["--tp", "2", flag, v], [flag, "mpirun -np 2 --hostfile"])
    check("multi-node refused with the mpirun command: %s" % flag, ok, out)
ok, out = refused(["--tp", "4", "--nnodes", "2", "--node-rank", "1"],
                  ["mpirun -np 4 --hostfile HOSTS --map-by ppr:2:node"])
check("multi-node: ranks per node in the mpirun command", ok, out)

# ---- --page-size
for ps in ("1", "16", "64"):
    p = Proc(BASE + ["--page-size", ps], deadline_s=60)
    info = p.get("/server_info") if p.started else {}
    st, body = chat(p) if p.started else (0, "")
    check("--page-size %s is the page size served" % ps,
          p.started and info.get("page_size") == int(ps) and st == 200, p.output())
    p.stop()
p = Proc(BASE, deadline_s=60)
info = p.get("/server_info") if p.started else {}
check("no --page-size: 16, as --help says", info.get("page_size") == 16, p.output())
p.stop()
for ps in ("0", "70000", "abc"):
    ok, out = refused(["--page-size", ps], ["--page-size"])
    check("--page-size %s refused" % ps, ok, out)

# ---- kind (b): all together start, one warning line names each
gpu_args = []
for flag, v in GPU.items():
    gpu_args += args_of(flag, v)
p = Proc(BASE + gpu_args, env={"SGLANG_NOT_A_THING": "1",
                               "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "256"},
         deadline_s=60)
st, body = chat(p) if p.started else (0, "")
out = p.output()
w = warning_lines(out)
check("GPU-only flags: the server starts and answers", p.started and st == 200, out)
check("GPU-only flags: one warning line", len(w) == 1, out)
for flag in GPU:
    check("GPU-only flag named in the warning: %s" % flag, w and flag in w[0], out)
env_w = [l for l in out.splitlines() if "environment variables" in l]
check("SGLANG_* not read: named as ignored", len(env_w) == 1 and "SGLANG_NOT_A_THING" in env_w[0], out)
check("SGLANG_* read: not named", env_w and "SGLANG_DEEPEP" not in env_w[0], out)
p.stop()
p = Proc(["generate", "--model", M, "--prompt", "hi", "--max-new-tokens", "2"] + gpu_args,
         deadline_s=60, wait_health=False)
out = p.output()
w = warning_lines(out)
check("generate: GPU-only flags accepted and named in one warning line",
      p.stop() == 0 and len(w) == 1 and all(f in w[0] for f in GPU), out)

p = Proc(["plan", "--model", "deepseek-v3", "--gpu", "H200", "--tp", "8"] + gpu_args,
         deadline_s=60, wait_health=False)
out = p.output()
w = warning_lines(out)
check("plan: GPU-only flags accepted and named in one warning line",
      p.stop() == 0 and len(w) == 1 and all(f in w[0] for f in GPU), out)

# ---- kind (a): a server with the implemented flags starts, none named as without effect
impl_args = []
for flag, v in IMPL.items():
    impl_args += args_of(flag, v)
p = Proc(BASE + impl_args, deadline_s=60)
st, body = chat(p) if p.started else (0, "")
out = p.output()
check("implemented flags: the server starts and answers", p.started and st == 200, out)
check("implemented flags: no GPU-only warning", not warning_lines(out), out)
p.stop()

# ---- --stream-interval 4: chunks of up to 4 tokens, the same text
p = Proc(BASE + ["--dtype", "float32", "--stream-interval", "4"], deadline_s=60)
if not p.started:
    check("--stream-interval 4: server starts", False, p.output())
else:
    n_tok = 13
    st, body = chat(p, max_tokens=n_tok, ignore_eos=True)
    whole = json.loads(body)["choices"][0]["message"]["content"]
    st, sse = chat(p, max_tokens=n_tok, ignore_eos=True, stream=True, logprobs=True)
    text, sizes = "", []
    for line in sse.splitlines():
        if not line.startswith("data: {"):
            continue
        ch = json.loads(line[6:])["choices"]
        if not ch:
            continue
        text += ch[0]["delta"].get("content") or ""
        lp = ch[0].get("logprobs")
        if lp and lp.get("content"):
            sizes.append(len(lp["content"]))
    check("--stream-interval 4: the same text as without streaming", text == whole,
          "stream %r\nwhole  %r" % (text, whole))
    check("--stream-interval 4: chunks of up to 4 tokens (%s)" % sizes,
          sum(sizes) == n_tok and max(sizes) == 4 and all(s <= 4 for s in sizes), sse)
    p.stop()
ok, out = refused(["--stream-interval", "0"], ["--stream-interval"])
check("--stream-interval 0 refused", ok, out)

finish()
