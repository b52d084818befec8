#!/usr/bin/python3
"""compare_logits.py — compare a `moeserve generate --dump-logits` JSON-lines
file with a golden reference (tests/ref/deepseek_ref.py output, or another dump).

Per (seq, step): greedy tokens must be identical and the logits within
max|a - b| / max|ref| <= --tol.  Prints one line per mismatch, then
`N passed, N failed` (one check per sequence).  Exit status 1 on failure.
Usage: compare_logits.py REF (golden .json or dump .jsonl) DUMP.jsonl [--tol 1e-4]
"""
import json
import sys


def load(path):
    """-> {seq: {step: (token, logits)}}"""
    with open(path) as f:
        text = f.read()
    out = {}
    if text.lstrip().startswith('{"prompts"') or path.endswith(".json"):
        doc = json.loads(text)
        for s, res in enumerate(doc["results"]):
            out[s] = {st["step"]: (st["token"], st["logits"]) for st in res["steps"]}
        return out
    for line in text.splitlines():
        if line.strip():
            d = json.loads(line)
            out.setdefault(d["seq"], {})[d["step"]] = (d["token"], d["logits"])
    return out


def main(argv):
    tol = 1e-4
    if "--tol" in argv:
        i = argv.index("--tol")
        tol = float(argv[i + 1])
        del argv[i:i + 2]
    ref, got = load(argv[1]), load(argv[2])
    passed = failed = 0
    worst = 0.0
    for s in sorted(ref):
        ok = True
        if s not in got or set(got[s]) != set(ref[s]):
            print(f"seq {s}: steps differ: ref {sorted(ref[s])} got {sorted(got.get(s, {}))}")
            failed += 1
            continue
        for step in sorted(ref[s]):
            rt, rl = ref[s][step]
            gt, gl = got[s][step]
            if len(rl) != len(gl):
                print(f"seq {s} step {step}: vocab {len(gl)} != {len(rl)}")
                ok = False
                break
            scale = max(abs(x) for x in rl) or 1.0
            err = max(abs(a - b) for a, b in zip(rl, gl)) / scale
            worst = max(worst, err)
            if rt != gt or err > tol:
                print(f"seq {s} step {step}: token {gt} vs ref {rt}, rel err {err:.3g} (tol {tol:g})")
                ok = False
        passed += ok
        failed += not ok
    print(f"max relative error {worst:.3g}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
