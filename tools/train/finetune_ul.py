#!/usr/bin/python3
"""finetune_ul.py — sequence-level unlikelihood fine-tuning of a checkpoint written by
train.py (Welleck et al. 2019, "Neural Text Generation with Unlikelihood Training" §5.2),
against greedy loops (issue 24); `make train`'s second stage (Makefile: the committed
recipe's options).

Each update: greedy continuations (--gen tokens, bf16 autocast, model.py's KV-cached
Model.greedy) of --bul
data prefixes of --prefix tokens; every generated token inside a 4-gram that already
occurred in the sequence gets -log(1 - p(token)); plus the MLE + MTP_WEIGHT × MTP loss
of train.py on --bmle data windows of 256.  --line-start: prefixes begin after a newline
token with BOS first (generate's prompts), --prefix-min: a prefix length per update drawn
from [prefix-min, prefix], --lr-floor: cosine decay.  AdamW, no weight decay, fixed seed,
--threads; the gate bias is left as loaded.  Writes the fine-tuned checkpoint (config,
BF16 safetensors, tokenizer files) to --out.  What it did to models/small-code's
recipe: tools/train/README.md ("Recipe experiments").

usage: finetune_ul.py --model DIR --out DIR --ids TRAIN.bin [--updates 8] [--lr 1e-4]
       [--bul 8] [--bmle 8] [--prefix 16] [--gen 48] [--alpha 1.0] [--seed 7]
       [--save-at 8,16,...]   (also writes the checkpoint after those updates to OUT/updN,
                               the candidates val_loops.py judges)
TRAIN.bin: the train ids of the checkpoint's tokenizer (train.py's WORK/train.bin).
"""
import argparse, json, math, os, sys, time, shutil
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np, torch, torch.nn.functional as F
import train as T
from check_logits import load_model
ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True); ap.add_argument("--out", required=True)
ap.add_argument("--ids", required=True)
ap.add_argument("--updates", type=int, default=8); ap.add_argument("--lr", type=float, default=1e-4)
ap.add_argument("--bul", type=int, default=8); ap.add_argument("--bmle", type=int, default=8)
ap.add_argument("--prefix", type=int, default=16); ap.add_argument("--gen", type=int, default=48)
ap.add_argument("--alpha", type=float, default=1.0); ap.add_argument("--seed", type=int, default=7)
ap.add_argument("--save-at", default="")
ap.add_argument("--lr-floor", type=float, default=1.0,
                help="cosine from --lr down to this fraction of it at the last update (1: constant)")
ap.add_argument("--line-start", action="store_true",
                help="prefixes start after a newline token and get BOS first, as generate's prompts")
ap.add_argument("--prefix-min", type=int, default=0,
                help="draw each update's prefix length from [prefix-min, --prefix] (0: always --prefix)")
ap.add_argument("--fail-only", action="store_true",
                help="penalise only generations whose distinct-token ratio is below 0.3 (the bound)")
ap.add_argument("--stop-after", type=int, default=0,
                help="stop after this many updates of the --updates schedule (0: all); equals the "
                     "--save-at snapshot of the full run")
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
torch.set_num_threads(a.threads); torch.set_flush_denormal(True); torch.manual_seed(a.seed)
m = load_model(a.model, torch.float32)
for l in m.model.layers:
    if hasattr(l.mlp, "gate"):
        l.mlp.gate.e_score_correction_bias = l.mlp.gate.e_score_correction_bias.float()
ids = torch.from_numpy(np.fromfile(a.ids, dtype="<i4").astype(np.int64))
opt = torch.optim.AdamW(m.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
g = torch.Generator().manual_seed(a.seed)
if a.line_start:
    # ids whose byte-level string ends in a newline ('Ċ'); a prefix starts right after one
    vocab = json.load(open(os.path.join(a.model, "tokenizer.json")))["model"]["vocab"]
    nl = torch.zeros(max(vocab.values()) + 1, dtype=torch.bool)
    nl[[i for t, i in vocab.items() if t.endswith("\u010a")]] = True
    line_starts = (torch.nonzero(nl[ids[:-300]]).squeeze(1) + 1)
    BOS = json.load(open(os.path.join(a.model, "config.json")))["bos_token_id"]
def greedy(x, n):
    """x [B, P] ids -> [B, P + n]: n greedy tokens appended (KV-cached)."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return torch.cat([x, m.greedy(x, n)], 1)
save_at = set(int(v) for v in a.save_at.split(",") if v)
def save(d):
    os.makedirs(d, exist_ok=True)
    T.export(m, d)
    shutil.copy(os.path.join(a.model, "tokenizer.json"), d)
def marks(seq, k):
    """seq [S] ids -> bool [S]: positions >= k inside a 4-gram seen earlier in seq."""
    s = seq.tolist(); S = len(s); mk = [False] * S; seen = set()
    for i in range(S - 3):
        ng = tuple(s[i:i + 4])
        if ng in seen and i + 3 >= k:
            for j in range(max(i, k), i + 4): mk[j] = True
        seen.add(ng)
    return torch.tensor(mk)
t0 = time.time()
uptime0, curve = T.uptime(), []
for u in range(a.stop_after or a.updates):
    lr = a.lr * (a.lr_floor + (1 - a.lr_floor) * 0.5 * (1 + math.cos(math.pi * u / max(1, a.updates - 1))))
    for grp in opt.param_groups:
        grp["lr"] = lr
    P = a.prefix
    if a.prefix_min:
        P = int(torch.randint(a.prefix_min, a.prefix + 1, (1,), generator=g))
    if a.line_start:
        st = line_starts[torch.randint(0, len(line_starts), (a.bul,), generator=g)]
        pre = torch.stack([torch.cat([torch.tensor([BOS]), ids[s:s + P - 1]]) for s in st.tolist()])
    else:
        st = torch.randint(0, len(ids) - 300, (a.bul,), generator=g)
        pre = torch.stack([ids[s:s + P] for s in st.tolist()])
    m.eval(); seq = greedy(pre, a.gen); m.train()
    mk = torch.stack([marks(r, P) for r in seq])
    if a.fail_only:
        gen_distinct = torch.tensor([len(set(r[P:].tolist())) / a.gen for r in seq])
        mk &= (gen_distinct < 0.3).unsqueeze(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lg = m(seq[:, :-1])
    lp = F.log_softmax(lg.float(), -1).gather(2, seq[:, 1:].unsqueeze(-1)).squeeze(-1)  # log p(x_t)
    mt = mk[:, 1:]
    ul = -(torch.log((1 - lp.exp()).clamp(min=1e-5)) * mt).sum() / max(1, mt.numel())
    st2 = torch.randint(0, len(ids) - 258, (a.bmle,), generator=g)
    x = torch.stack([ids[s:s + 257] for s in st2.tolist()])
    main_l, mtp_l, _ = T.losses(m, x)
    loss = main_l + T.MTP_WEIGHT * mtp_l + a.alpha * ul
    opt.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step()
    if u + 1 in save_at and u + 1 < (a.stop_after or a.updates):
        save(os.path.join(a.out, "upd%d" % (u + 1)))
    curve.append("%d\t%.3f\t%.4f\t%.3f\t%.3f\t%.0f" % (u, mt.float().mean().item(), ul.item(),
                                                   main_l.item(), mtp_l.item(), time.time() - t0))
    print("upd %d lr %.2e P %d" % (u, lr, P), end=" ")
    print("upd %d rep-frac %.3f ul %.4f mle %.3f mtp %.3f %.0f s" % (u, mt.float().mean().item(), ul.item(), main_l.item(), mtp_l.item(), time.time() - t0), flush=True)
os.makedirs(a.out, exist_ok=True)
# train.py's record of the base run (train.json) and its loss curve travel with the result
src_info = os.path.join(a.model, "train.json")
info = json.load(open(src_info)) if os.path.exists(src_info) else {}
T.export(m, a.out)
if os.path.abspath(a.model) != os.path.abspath(a.out):
    for f in ("tokenizer.json", "loss.tsv"):
        if os.path.exists(os.path.join(a.model, f)):
            shutil.copy(os.path.join(a.model, f), a.out)
with open(os.path.join(a.out, "finetune.tsv"), "w") as f:
    f.write("# update\trepeated_4gram_frac\tul_loss\tmle_loss\tmtp_loss\tseconds\n")
    f.write("".join(l + "\n" for l in curve))
info["finetune_ul"] = {"command": " ".join(["/usr/bin/python3", "tools/train/finetune_ul.py"] + sys.argv[1:]),
                       "args": vars(a), "seconds": round(time.time() - t0, 1),
                       "uptime_start": uptime0, "uptime_end": T.uptime(),
                       "loadavg_end": os.getloadavg()}
info_path = os.path.join(a.out, "train.json")
with open(info_path, "w") as f:
    json.dump(info, f, indent=2)
    f.write("\n")
