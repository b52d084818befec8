#!/usr/bin/python3
"""train.py — trains the small DeepSeek-V3-architecture model of models/small-code/
(`make train`) and writes it as a Hugging Face checkpoint the engine loads.

  1. checks the committed manifest against this machine (manifest.py) and
     lists its train files in manifest order;
  2. `moeserve tokenizer train` learns the byte-level BPE tokenizer on exactly
     those files (the engine's own deterministic trainer), `moeserve tokenizer
     encode` turns them into ids (BOS + ids per file);
  3. trains model.py (AdamW, bf16 autocast matmuls over float32 master weights,
     next-token loss + MTP_WEIGHT × the MTP head's loss on the token after next,
     the gate bias nudged by BIAS_RATE × sign(mean load − load) each step:
     DeepSeek-V3's auxiliary-loss-free balancing);
  4. writes config.json, model.safetensors (BF16; the gate bias F32),
     tokenizer.json, tokenizer_config.json (DeepSeek-V3's chat template),
     loss.tsv (per step) and train.json (the command, seeds, timing, load).
Deterministic for a given machine: fixed seeds, fixed thread count, fixed file
order (torch's kernels differ between CPUs, so the checkpoint is committed).
Needs Debian's /usr/bin/python3 (torch 1.13, numpy) and build/moeserve.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import manifest  # noqa: E402
import st  # noqa: E402
from model import Model  # noqa: E402

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 16,
    "n_shared_experts": 2,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "q_lora_rank": 128,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
}

MTP_WEIGHT = 0.3     # DeepSeek-V3's λ for the first 10T tokens
BIAS_RATE = 0.005    # γ of the bias update (DeepSeek-V3: 0.001 over far more steps)
UL_WEIGHT = 0.0      # α of the token-level unlikelihood loss (--ul; Welleck et al. use 1)

# DeepSeek-V3's chat template (tokenizer_config.json of deepseek-ai/DeepSeek-V3), the format
# the engine's chat.c renders.
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', "
    "is_first_sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}"
    "{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + "
    "'\\n\\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{ bos_token }}"
    "{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}{%- if message['content'] is none %}"
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + "
    "tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + "
    "'```' + '<｜tool▁call▁end｜>'}}{%- else %}{{'<｜Assistant｜>' + message['content'] + "
    "'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + "
    "tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + "
    "'```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- set ns.is_first = true -%}{%- else %}"
    "{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + "
    "'\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and 'tool_calls' not in message %}{%- if ns.is_tool %}"
    "{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}"
    "{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}"
    "{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"
    "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- set ns.is_output_first = false %}{%- else %}"
    "{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}"
    "{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}"
)


def tokenizer_config():
    tok = lambda s: {"__type": "AddedToken", "content": s, "lstrip": False, "normalized": True,
                     "rstrip": False, "single_word": False}
    return {"add_bos_token": True, "add_eos_token": False,
            "bos_token": tok("<｜begin▁of▁sentence｜>"), "eos_token": tok("<｜end▁of▁sentence｜>"),
            "pad_token": tok("<｜end▁of▁sentence｜>"), "clean_up_tokenization_spaces": False,
            "legacy": True, "model_max_length": CONFIG["max_position_embeddings"],
            "tokenizer_class": "LlamaTokenizerFast", "unk_token": None,
            "chat_template": CHAT_TEMPLATE}


def export(model, out):
    tensors = []
    for name, t in model.state_dict().items():
        if name.endswith("e_score_correction_bias"):   # F32, as DeepSeek-V3 ships it
            tensors.append((name, "F32", t.detach().float().numpy()))
        else:
            tensors.append((name, "BF16", st.bf16_bits(t)))
    st.write(os.path.join(out, "model.safetensors"), tensors)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2, ensure_ascii=False)
        f.write("\n")


def uptime():
    """`uptime`'s line: the machine's load as the run saw it (train.json)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def lr_at(step, steps, peak, warmup, floor):
    """Linear warm-up to peak, then cosine to floor × peak at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


def unlikelihood(lp, inp, tgt):
    """Token-level unlikelihood (Welleck et al. 2019, "Neural Text Generation with
    Unlikelihood Training"): at each position, -log(1 - p(c)) summed over the
    candidates c = tokens already in the window that are not the target, averaged over
    positions.  It lowers the probability of repeating context tokens where the data
    does not repeat them, which is what greedy loops are made of.
    lp [B, S, V] log-probabilities, inp [B, S] the inputs, tgt [B, S] the targets."""
    B, S, V = lp.shape
    pos = torch.arange(S)
    first = torch.full((B, V), S, dtype=torch.long)
    first = first.scatter_reduce(1, inp, pos.expand(B, S), reduce="amin")
    is_first = first.gather(1, inp) == pos                                # [B, S] first occurrences
    # [b, t, j]: log p_t(inp[j]) for the first occurrences j <= t that are not t's target
    lpc = lp.gather(2, inp.unsqueeze(1).expand(B, S, S))
    cand = (pos.view(1, 1, S) <= pos.view(1, S, 1)) & is_first.unsqueeze(1) & \
        (inp.unsqueeze(1) != tgt.unsqueeze(2))
    one_minus = (1.0 - lpc.exp()).clamp(min=1e-5)
    return -(torch.log(one_minus) * cand).sum() / (B * S)


def losses(model, x, ul=0.0):
    """x [B, S+1] ids -> (main CE, MTP CE, unlikelihood (0 when ul = 0)), float32."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lg, lm = model(x[:, :-1], mtp=True)
    V = lg.shape[-1]
    mtp = F.cross_entropy(lm.float().reshape(-1, V), x[:, 2:].reshape(-1))
    if ul <= 0:
        return F.cross_entropy(lg.float().reshape(-1, V), x[:, 1:].reshape(-1)), mtp, torch.zeros(())
    lp = F.log_softmax(lg.float(), dim=-1)
    main = F.nll_loss(lp.reshape(-1, V), x[:, 1:].reshape(-1))
    return main, mtp, unlikelihood(lp, x[:, :-1], x[:, 1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models/small-code")
    ap.add_argument("--manifest", default="models/small-code/manifest.tsv")
    ap.add_argument("--moeserve", default="build/moeserve")
    ap.add_argument("--work", default="build/train")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--lr-floor", type=float, default=0.1,
                    help="the cosine ends at this fraction of --lr")
    ap.add_argument("--snapshot-every", type=int, default=0,
                    help="also write the checkpoint every N steps to WORK/snap/stepN (recipe work)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ul", type=float, default=UL_WEIGHT,
                    help="weight of the token-level unlikelihood loss (0: off)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)   # Adam's second moments go subnormal: 10x slower otherwise
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    t_start = time.time()
    load0 = os.getloadavg()
    uptime0 = uptime()

    bad = manifest.check(a.manifest)
    if bad:
        sys.exit("train: manifest: " + bad)
    rows = manifest.read_manifest(a.manifest)
    train_files = [r[3] for r in rows if r[0] == "train"]
    heldout_files = [r[3] for r in rows if r[0] == "heldout"]
    lst = os.path.join(a.work, "train.list")
    with open(lst, "w") as f:
        f.write("".join(p + "\n" for p in train_files))
    hlst = os.path.join(a.work, "heldout.list")
    with open(hlst, "w") as f:
        f.write("".join(p + "\n" for p in heldout_files))
    run = lambda *args: subprocess.run([a.moeserve, "tokenizer", *args], check=True)
    run("train", "--vocab", str(CONFIG["vocab_size"]), "--out", a.out, "--list", lst)
    ids_path = os.path.join(a.work, "train.bin")
    run("encode", "--model", a.out, "--out", ids_path, "--list", lst)
    hids_path = os.path.join(a.work, "heldout.bin")
    run("encode", "--model", a.out, "--out", hids_path, "--list", hlst)
    ids = torch.from_numpy(np.fromfile(ids_path, dtype="<i4").astype(np.int64))
    hids = torch.from_numpy(np.fromfile(hids_path, dtype="<i4").astype(np.int64))
    t_tok = time.time() - t_start
    print("train: %d train ids, %d held-out ids (tokenizer %.1f s)" % (len(ids), len(hids), t_tok),
          flush=True)

    model = Model(CONFIG)
    model.init_weights(a.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    moes = [l.mlp for l in model.model.layers if hasattr(l.mlp, "gate")]
    g = torch.Generator().manual_seed(a.seed + 1)
    S = a.seq
    # a fixed held-out batch for the curve: 8 windows evenly spread over the held-out ids
    hstarts = torch.linspace(0, len(hids) - S - 2, 8).long()
    hbatch = torch.stack([hids[s:s + S + 1] for s in hstarts.tolist()])

    curve = open(os.path.join(a.out, "loss.tsv"), "w")
    ulcol = a.ul > 0   # the unlikelihood loss gets a column only when it is on
    curve.write("# step\ttokens\tlr\ttrain_loss\ttrain_mtp_loss\theldout_loss\theldout_mtp_loss\tseconds"
                + ("\ttrain_ul_loss" if ulcol else "") + "\n")
    t0 = time.time()
    for step in range(a.steps + 1):
        held = ("", "")
        if step % 40 == 0 or step == a.steps:
            model.eval()
            with torch.no_grad():
                hm, ht, _ = losses(model, hbatch)
            model.train()
            held = ("%.4f" % hm.item(), "%.4f" % ht.item())
        if step == a.steps:
            curve.write("%d\t%d\t\t\t\t%s\t%s\t%.1f%s\n" % (step, step * a.batch * S, held[0], held[1],
                                                           time.time() - t0, "\t" if ulcol else ""))
            break
        lr = lr_at(step, a.steps, a.lr, a.warmup, a.lr_floor)
        for grp in opt.param_groups:
            grp["lr"] = lr
        starts = torch.randint(0, len(ids) - S - 1, (a.batch,), generator=g)
        x = torch.stack([ids[s:s + S + 1] for s in starts.tolist()])
        main_l, mtp_l, ul_l = losses(model, x, a.ul)
        loss = main_l + MTP_WEIGHT * mtp_l + a.ul * ul_l
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for moe in moes:
                load = moe.last_load.float()
                moe.gate.e_score_correction_bias += BIAS_RATE * torch.sign(load.mean() - load)
        el = time.time() - t0
        curve.write("%d\t%d\t%.6f\t%.4f\t%.4f\t%s\t%s\t%.1f%s\n" % (
            step, step * a.batch * S, lr, main_l.item(), mtp_l.item(), held[0], held[1], el,
            "\t%.4f" % ul_l.item() if ulcol else ""))
        curve.flush()
        if a.snapshot_every and (step + 1) % a.snapshot_every == 0 and step + 1 < a.steps:
            snap = os.path.join(a.work, "snap", "step%d" % (step + 1))
            os.makedirs(snap, exist_ok=True)
            export(model, snap)
            shutil.copy(os.path.join(a.out, "tokenizer.json"), snap)
        if step % 10 == 0:
            print("step %d/%d loss %.3f mtp %.3f%s held %s lr %.2e %.0f s (load %.1f)" % (
                step, a.steps, main_l.item(), mtp_l.item(),
                " ul %.3f" % ul_l.item() if ulcol else "", held[0] or "-", lr, el,
                os.getloadavg()[0]), flush=True)
    curve.close()
    t_train = time.time() - t0
    export(model, a.out)
    info = {"command": " ".join(["/usr/bin/python3", "tools/train/train.py"] + sys.argv[1:]),
            "args": vars(a), "mtp_weight": MTP_WEIGHT, "bias_rate": BIAS_RATE,
            "uptime_start": uptime0, "uptime_end": uptime(),
            "train_tokens_seen": a.steps * a.batch * S, "train_ids": len(ids),
            "heldout_ids": len(hids), "tokenizer_seconds": round(t_tok, 1),
            "train_seconds": round(t_train, 1), "total_seconds": round(time.time() - t_start, 1),
            "loadavg_start": load0, "loadavg_end": os.getloadavg(), "torch": torch.__version__,
            "cpu_threads": a.threads, "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    with open(os.path.join(a.out, "train.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    print("train: wrote %s (%.0f s training, %.0f s total)" % (a.out, t_train, info["total_seconds"]))


if __name__ == "__main__":
    main()
