"""st.py — the safetensors files of tools/train: read (BF16/F32 -> float64 torch
tensors) and write ([(name, dtype string, numpy array holding the stored bytes)],
in order, header padded to 8 bytes).  No third-party safetensors package."""
import json
import struct

import numpy as np
import torch


def read(path):
    """-> {name: float64 tensor}; BF16 and F32 only (what train.py writes)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = np.frombuffer(data, dtype=np.uint8, count=e - b, offset=base + b)
        if info["dtype"] == "BF16":
            v = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F32":
            v = raw.view("<f4")
        else:
            raise ValueError("%s: dtype %s not handled" % (name, info["dtype"]))
        out[name] = torch.from_numpy(v.astype(np.float64).reshape(info["shape"]))
    return out


def write(path, tensors):
    header, blobs, off = {}, [], 0
    for name, dt, a in tensors:
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def bf16_bits(t):
    """A float tensor -> its bf16 bits (round to nearest even), uint16 numpy."""
    return t.detach().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
