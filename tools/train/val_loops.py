#!/usr/bin/python3
"""val_loops.py — the validation prompt set for the greedy-loop bound (issue 24), judged
through the engine: recipe choices (finetune_ul.py's length, lr, ...) are made on these
prompts, never on tests/t_small_model.sh's four.

The rule (fixed, committed): the manifest's held-out rows, in manifest order, minus the
test's bits/byte files (hmac.py, netrc.py); random.Random(SEED).sample of N of them; in
each, the non-blank lines of at least 8 characters (after stripping), one drawn by the
same generator; the prompt is that line and the next one joined by a newline, cut to its
first 40 characters (a line start, like the test's prompts).  Each prompt gets 64 greedy
tokens from `moeserve generate --ignore-eos` (BF16, the test's settings; one engine call,
--enable-deterministic-inference so a prompt's tokens do not depend on its batch-mates);
its distinct-token ratio is distinct ids / 64, and it passes at >= 0.3 (the test's bound).
Prints one line per prompt with --verbose, then
  val: pass=K/N mean_distinct=R
usage: val_loops.py --model DIR [--manifest M] [--n 32] [--seed 24] [--moeserve build/moeserve]
"""
import argparse, os, random, subprocess, sys

EXCLUDE = ("/usr/lib/python3.11/hmac.py", "/usr/lib/python3.11/netrc.py")


def prompts(manifest, n, seed):
    rows = [l.rstrip("\n").split("\t") for l in open(manifest) if not l.startswith("#")]
    files = [r[3] for r in rows if r[0] == "heldout" and r[3] not in EXCLUDE]
    rng = random.Random(seed)
    out = []
    for path in rng.sample(files, n):
        lines = open(path, encoding="utf-8").read().split("\n")
        cand = [i for i, l in enumerate(lines) if len(l.strip()) >= 8 and i + 1 < len(lines)]
        i = cand[rng.randrange(len(cand))]
        out.append((path, (lines[i] + "\n" + lines[i + 1])[:40]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--manifest", default="models/small-code/manifest.tsv")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--moeserve", default="build/moeserve")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    ps = prompts(a.manifest, a.n, a.seed)
    cmd = [a.moeserve, "generate", "--model", a.model, "--max-new-tokens", "64", "--ignore-eos",
           "--ids", "--threads", "2", "--enable-deterministic-inference"]
    for _, p in ps:
        cmd += ["--prompt", p]
    r = subprocess.run(cmd, capture_output=True, text=True)
    gens = [l.split(":", 1)[1].split() for l in r.stdout.splitlines() if l.startswith("ids:")]
    if r.returncode or len(gens) != len(ps):
        sys.exit("val_loops: generate failed (%d of %d): %s" % (len(gens), len(ps), r.stderr[-2000:]))
    ratios = [len(set(g)) / 64 for g in gens]
    if a.verbose:
        for (path, p), g, q in zip(ps, gens, ratios):
            print("%.3f %d %s %r" % (q, len(g), os.path.basename(path), p))
    k = sum(q >= 0.3 for q in ratios)
    print("val: pass=%d/%d mean_distinct=%.3f" % (k, len(ps), sum(ratios) / len(ratios)))


if __name__ == "__main__":
    main()
