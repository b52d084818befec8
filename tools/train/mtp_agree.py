#!/usr/bin/python3
"""mtp_agree.py — how often the checkpoint's MTP head predicts what the model
itself would say next-but-one, which is what a one-token MTP draft's
acceptance rate depends on (greedy verification).  torch float32.

For a sequence t and main-model position i the MTP layer is fed norm(h_i) and
t[i+1] and guesses t[i+2]; the main model's own choice there is the argmax of
its logits at position i+1.  Two measurements (model.py):
  teacher  — t is held-out text (windows of --ctx tokens, BOS first);
  greedy   — t is the model's own greedy continuation (--gen tokens, by
             `moeserve generate --dtype float32`) of a held-out prompt, the sequence greedy decoding with an MTP draft
             would actually verify (there t[i+1] is the main model's argmax,
             so agreement = acceptance of the draft token).
Also the MTP head's top-1 accuracy against the held-out text itself.
Prints one `mtp:` line of key=value figures.
usage: mtp_agree.py --model DIR --ids HELDOUT.bin [--windows 8] [--ctx 256] [--gen 64]
       [--moeserve build/moeserve]
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_logits import load_model  # noqa: E402


def agreement(m, seq):
    """seq [1, S] -> (agree, total, text_hits) over positions i = 0 .. S-3."""
    with torch.no_grad():
        main, mtp = m(seq, mtp=True)
    own = main[0, 1:-1].argmax(-1)        # main model's choice at i+1, i = 0..S-3
    guess = mtp[0, :-1].argmax(-1)        # MTP at i (fed t[i+1]) guessing t[i+2]
    text = seq[0, 2:]
    return int((own == guess).sum()), len(own), int((guess == text).sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--moeserve", default="build/moeserve")
    a = ap.parse_args()
    torch.set_num_threads(2)
    m = load_model(a.model, torch.float32)   # argmax agreement: float32 is plenty
    bos = m.cfg["bos_token_id"]
    ids = np.fromfile(a.ids, dtype="<i4")
    starts = np.linspace(0, len(ids) - a.ctx - 1, a.windows).astype(np.int64)
    ta = tn = th = 0
    prompts = []
    for s in starts:
        win = torch.tensor([[bos] + ids[s + 1:s + a.ctx].tolist()])
        x, n, h = agreement(m, win)
        ta, tn, th = ta + x, tn + n, th + h
        prompts.append(win[0, :a.ctx // 2].tolist())   # prompt: the window's first half
    cmd = [a.moeserve, "generate", "--model", a.model, "--dtype", "float32", "--threads", "2",
           "--ignore-eos", "--ids", "--max-new-tokens", str(a.gen)]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    gens = [list(map(int, l.split()[1:])) for l in r.stdout.splitlines() if l.startswith("ids:")]
    if len(gens) != len(prompts):
        sys.exit("mtp_agree: generate gave %d continuations for %d prompts" % (len(gens), len(prompts)))
    ga = gn = 0
    p0 = a.ctx // 2 - 1   # positions whose t[i+1] is generated: i >= prompt length - 1
    for p, g in zip(prompts, gens):
        seq = torch.tensor([p + g])
        with torch.no_grad():
            main_l, mtp_l = m(seq, mtp=True)
        own = main_l[0, p0 + 1:-1].argmax(-1)
        guess = mtp_l[0, p0:-1].argmax(-1)
        ga += int((own == guess).sum())
        gn += len(own)
    print("mtp: teacher_agree=%.4f greedy_accept=%.4f mtp_text_top1=%.4f positions=%d greedy_positions=%d"
          % (ta / tn, ga / gn, th / tn, tn, gn))
    return 0


if __name__ == "__main__":
    sys.exit(main())
