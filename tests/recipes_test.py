"""recipes_test.py SEEDS_DIR MODEL_DIR — every SGLang launch command of seed 001
(SEEDS_DIR/001_*.txt), as a user would paste it, against a small model (issue 23).

Read from the seed itself: lines beginning `sglang serve` or `python3 -m
sglang.launch_server` inside code blocks (with the `VAR=value \\` lines right above
them), joined over trailing backslashes; wrappers (`<use args below>`, `<role args
below>`) skipped.  Dropped from each: `<...>` placeholders, `{...}` tokens,
--model-path/--model and its value, --host and --port (with values), and the leading
VAR=value prefixes, which go into the environment instead.

The harness adds --model-path MODEL_DIR, loopback host and port, --skip-server-warmup,
--max-total-tokens 2048 and --threads 1 (a small pool and one thread per rank: the
recipes' --tp 8 and --dp 8 start 8 ranks on a 2-core machine).  The recipes run at their
own world size (8 ranks at most; tiny-v3 has 8 heads and 16 experts, enough for tp 8 /
ep 8; a recipe asking more fails here, saying so).

Each command, with the tests' own table of kinds (tests/flag_table.py), must either
  - start and answer a chat request, with one warning line naming each of its GPU flags
    (and one naming each SGLANG_* variable it sets that the engine does not read), or
  - when it holds a NOT_BUILT / V4 / MULTI flag: be refused, naming each of them, saying
    "not implemented", and never "unknown flag".
A flag the table does not know is a failure of this test (the table must be completed).
Prints "N passed, N failed"."""
import glob
import json
import re
import sys

from flag_table import ENV_READ, kind_of
from server_proc import Proc, check, finish, warning_lines

SEEDS, M = sys.argv[1], sys.argv[2]
MODEL_HEADS, MODEL_EXPERTS = 8, 16  # tiny-v3 (src/tools/mkmodel.c)


START = re.compile(r"^(sglang serve|python3 -m sglang\.launch_server)(\s|$)")
ENV_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*\s*\\$")


def commands(path):
    """(line number, env dict, argument list) of each launch command in the file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, in_block, i = [], False, 0
    while i < len(lines):
        s = lines[i].strip()
        if s.startswith("```"):
            in_block = not in_block
            i += 1
            continue
        if in_block and (START.match(s) or ENV_LINE.match(s)):
            first, text, j = i + 1, s, i
            while text.endswith("\\") and j + 1 < len(lines):
                j += 1
                text = text[:-1] + " " + lines[j].strip()
            if "sglang serve" in text or "sglang.launch_server" in text:
                out.append((first, text))
                i = j + 1
                continue
        i += 1
    result = []
    for first, text in out:
        if "<use args below>" in text or "<role args below>" in text:
            continue
        text = re.sub(r"<[^<>]*>", " ", text)
        toks = [t for t in text.split() if not re.fullmatch(r"\{[^}]*\}", t)]
        env = {}
        while toks and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", toks[0]):
            k, v = toks.pop(0).split("=", 1)
            env[k] = v
        if toks[:2] == ["sglang", "serve"]:
            toks = toks[2:]
        elif toks[:3] == ["python3", "-m", "sglang.launch_server"]:
            toks = toks[3:]
        args, k = [], 0
        while k < len(toks):
            t = toks[k]
            if t in ("--model-path", "--model", "--host", "--port"):
                k += 1
                if k < len(toks) and not toks[k].startswith("--"):
                    k += 1
                continue
            args.append(t)
            k += 1
        result.append((first, env, args))
    return result


def flags_of(args):
    """[(flag, [values])] in order."""
    out = []
    for t in args:
        if t.startswith("--"):
            name, eq, v = t.partition("=")
            out.append((name, [v] if eq else []))
        elif out:
            out[-1][1].append(t)
    return out


def width(flags, name, default=1):
    for f, v in flags:
        if f == name and v:
            return int(v[0])
    return default


files = sorted(glob.glob(SEEDS + "/001_*.txt"))
check("seed 001 found in %s" % SEEDS, len(files) == 1)
cmds = commands(files[0]) if files else []
check("launch commands read from the seed (%d)" % len(cmds), len(cmds) >= 10)
n_started = n_refused = 0
for line, env, args in cmds:
    name = "seed 001 line %d" % line
    flags = flags_of(args)
    kinds = {f: kind_of(f, v) for f, v in flags}
    unknown = [f for f, k in kinds.items() if k is None]
    if unknown:
        check("%s: every flag in the test's table" % name, False, "not in tests/flag_table.py: %s"
              % " ".join(unknown))
        continue
    refused_by = [f for f, k in kinds.items() if k in ("NOT_BUILT", "V4", "MULTI")]
    gpu = [f for f, k in kinds.items() if k == "GPU"]
    tp = width(flags, "--tp")
    ep = width(flags, "--ep-size")
    if any(f == "--moe-a2a-backend" and v and v[0] != "none" for f, v in flags):
        ep = tp
    dpa = "--enable-dp-attention" in kinds
    attn_tp = tp // width(flags, "--dp") if dpa else tp
    if not refused_by and (MODEL_HEADS % attn_tp or MODEL_EXPERTS % ep):
        check("%s: tiny-v3 fits tp %d / ep %d" % (name, tp, ep), False,
              "make a model with more heads/experts (moeserve mkmodel) for this recipe")
        continue
    run_env = {k: v for k, v in env.items()}
    p = Proc(["serve", "--model-path", M, "--skip-server-warmup", "--max-total-tokens", "2048",
              "--threads", "1"] + args, env=run_env, deadline_s=240)
    shown = " ".join(args)
    if refused_by:
        out = p.output()
        rc = p.stop()
        missing = [f for f in refused_by if f not in out]
        check("%s refused naming %s: %s" % (name, ", ".join(refused_by), shown),
              not p.started and not p.hung and rc != 0 and not missing
              and "not implemented" in out and "unknown flag" not in out,
              out + ("\nnot named: %s" % missing if missing else ""))
        n_refused += 1
        continue
    st, body = 0, ""
    if p.started:
        try:
            st, body = p.request("/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 4, "temperature": 0})
        except Exception as e:  # noqa: BLE001 - reported as the failure
            body = str(e)
    out = p.output()
    p.stop()
    answered = st == 200 and json.loads(body)["choices"][0]["message"]["content"] is not None
    check("%s starts and answers (tp %d): %s" % (name, tp, shown), p.started and answered,
          out + body)
    w = warning_lines(out)
    if gpu:
        check("%s: one warning naming %s" % (name, ", ".join(gpu)),
              len(w) == 1 and all(f in w[0] for f in gpu), out)
    else:
        check("%s: no GPU-only warning" % name, not w, out)
    unread = [k for k in env if k.startswith("SGLANG_") and k not in ENV_READ]
    ew = [l for l in out.splitlines() if "environment variables" in l]
    if unread:
        check("%s: ignored %s named" % (name, ", ".join(unread)),
              len(ew) == 1 and all(k in ew[0] for k in unread), out)
    n_started += 1
check("recipes both started (%d) and refused (%d)" % (n_started, n_refused),
      n_started > 0 and n_refused > 0)
finish()
