#!/usr/bin/python3
"""to_fp8.py — DeepSeek-V3's FP8 layout of a BF16 checkpoint written by train.py:
every linear weight of the decoder layers (attention projections, dense MLP,
routed and shared experts; not the router, not eh_proj, not the embedding or
the LM head, as DeepSeek-V3 ships them) becomes float8_e4m3fn with one float32
`weight_scale_inv` per 128×128 block (scale = block amax / 448, values rounded
to the nearest e4m3, ties to even), and config.json gains DeepSeek's
quantization_config.  The other files are copied.  numpy only (torch 1.13 has
no float8).  usage: to_fp8.py SRC_DIR DST_DIR
"""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

BLOCK = 128
QUANTISED = ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa",
             "self_attn.kv_b_proj", "self_attn.o_proj", "gate_proj", "up_proj", "down_proj")


def e4m3_table():
    """Values of the non-negative e4m3fn codes 0..126 (127 is NaN), increasing."""
    v = []
    for c in range(127):
        e, m = c >> 3, c & 7
        v.append(m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(v)


TABLE = e4m3_table()


def encode(x):
    """float64 array (|x| <= 448) -> uint8 e4m3fn codes, nearest value, ties to the even code."""
    a = np.abs(x)
    hi = np.clip(np.searchsorted(TABLE, a), 1, len(TABLE) - 1)
    lo = hi - 1
    dlo, dhi = a - TABLE[lo], TABLE[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= TABLE[-1], len(TABLE) - 1, code)
    return (code | np.where(x < 0, 0x80, 0)).astype(np.uint8)


def quantise(w):
    """w [rows, cols] float64 -> (codes uint8 [rows, cols], scales float32 [rb, cb])."""
    r, c = w.shape
    rb, cb = -(-r // BLOCK), -(-c // BLOCK)
    codes = np.zeros((r, c), dtype=np.uint8)
    scales = np.zeros((rb, cb), dtype=np.float32)
    for i in range(rb):
        for j in range(cb):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            amax = np.abs(blk).max()
            s = np.float32(amax / 448.0) if amax > 0 else np.float32(1.0)
            scales[i, j] = s
            codes[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = encode(blk / float(s))
    return codes, scales


def main(argv):
    if len(argv) != 3:
        print("usage: to_fp8.py SRC_DIR DST_DIR", file=sys.stderr)
        return 2
    src, dst = argv[1], argv[2]
    os.makedirs(dst, exist_ok=True)
    sd = st.read(os.path.join(src, "model.safetensors"))
    out = []
    for name, t in sd.items():
        a = t.numpy()
        if name.endswith(".weight") and a.ndim == 2 and any(k + ".weight" in name for k in QUANTISED):
            codes, scales = quantise(a)
            out.append((name, "F8_E4M3", codes))
            out.append((name[:-len("weight")] + "weight_scale_inv", "F32", scales))
        elif name.endswith("e_score_correction_bias"):
            out.append((name, "F32", a.astype(np.float32)))
        else:
            out.append((name, "BF16", st.bf16_bits(t)))
    st.write(os.path.join(dst, "model.safetensors"), out)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "weight_block_size": [BLOCK, BLOCK]}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(src, fn), os.path.join(dst, fn))
    n = sum(1 for _, dt, _ in out if dt == "F8_E4M3")
    print("to_fp8: %s -> %s (%d FP8 matrices)" % (src, dst, n))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
