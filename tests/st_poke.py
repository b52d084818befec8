#!/usr/bin/env python3
"""st_poke.py — overwrites one element of one tensor in a safetensors file in
place (tests/t_load.sh: corrupt checkpoints).  Usage:
    st_poke.py FILE TENSOR INDEX VALUE     VALUE: nan, inf, -inf or a number
INDEX is the flat (row-major) element.  F32, BF16, F16 and F8_E4M3 (where
nan is the code 0x7f and inf is refused: the format has none)."""
import json
import math
import struct
import sys

path, name, index, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
with open(path, "r+b") as f:
    (hlen,) = struct.unpack("<Q", f.read(8))
    info = json.loads(f.read(hlen))[name]
    dt, (begin, _) = info["dtype"], info["data_offsets"]
    if dt == "F32":
        raw = struct.pack("<f", value)
    elif dt == "BF16":
        raw = struct.pack("<f", value)[2:]
    elif dt == "F16":
        raw = struct.pack("<e", value)
    elif dt == "F8_E4M3":
        if not math.isnan(value):
            sys.exit("st_poke: F8_E4M3 has no infinity")
        raw = b"\x7f"
    else:
        sys.exit("st_poke: dtype %s" % dt)
    f.seek(8 + hlen + begin + index * len(raw))
    f.write(raw)
