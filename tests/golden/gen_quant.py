#!/usr/bin/env python3
"""gen_quant.py — random blocks of every quantized weight type and the gguf package's dequantization of them, for tests/test_quant.c.

The file it writes (tests/golden/quant.txt) is committed; rerun this only
when the reference changes. From the repository root:

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install gguf==0.19.0 numpy==2.4.6
    /tmp/refenv/bin/python tests/golden/gen_quant.py [tests/golden/quant.txt]

Each type gets a few blocks of random bytes (a fixed seed) whose f16 scale
fields are overwritten with sane values (log-uniform magnitudes from 2^-20,
which includes f16 subnormals, up to 1; d and Q5_1/Q4_1's m of either sign,
the K types' dmin positive), so no block holds an inf or a nan. The
expected values are gguf.quants.dequantize() of those bytes: the gguf
package's own numpy reading of the ggml formats, independent of both kvd
and llama.cpp's C code.

Format, one record per type:
    type <enum kb_type number> <name> <blocks>
    b <the blocks' bytes in hex>
    y <each dequantized f32 as 8 hex digits of its bits, space-separated>
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

SEED = 17

# name: (kb_type number, block bytes, [(offset, kind)] of its f16 fields, blocks)
TYPES = {
    "Q4_0": (2, 18, [(0, "d")], 8),
    "Q4_1": (3, 20, [(0, "d"), (2, "d")], 8),
    "Q5_0": (6, 22, [(0, "d")], 8),
    "Q5_1": (7, 24, [(0, "d"), (2, "d")], 8),
    "Q8_0": (8, 34, [(0, "d")], 8),
    "Q2_K": (10, 84, [(80, "d"), (82, "dmin")], 3),
    "Q3_K": (11, 110, [(108, "d")], 3),
    "Q4_K": (12, 144, [(0, "d"), (2, "dmin")], 3),
    "Q5_K": (13, 176, [(0, "d"), (2, "dmin")], 3),
    "Q6_K": (14, 210, [(208, "d")], 3),
    "IQ4_NL": (20, 18, [(0, "d")], 8),
    "IQ4_XS": (23, 136, [(0, "d")], 3),
}


def sane_f16(rng, kind):
    mag = 2.0 ** rng.uniform(-20.0, 0.0)
    sign = 1.0 if kind == "dmin" or rng.random() < 0.5 else -1.0
    return np.array([sign * mag], dtype=np.float16).view(np.uint8)


def record(rng, name):
    num, nbytes, fields, nblk = TYPES[name]
    blocks = rng.integers(0, 256, size=(nblk, nbytes), dtype=np.uint8)
    for b in range(nblk):
        for off, kind in fields:
            blocks[b, off:off + 2] = sane_f16(rng, kind)
    y = dequantize(blocks.reshape(-1), T[name]).astype(np.float32).reshape(-1)
    assert np.all(np.isfinite(y)), name
    lines = [f"type {num} {name} {nblk}", "b " + blocks.tobytes().hex()]
    lines.append("y " + " ".join(f"{v:08x}" for v in y.view(np.uint32)))
    return lines


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/quant.txt"
    rng = np.random.default_rng(SEED)
    lines = ["# tests/golden/gen_quant.py: gguf 0.19.0 gguf.quants.dequantize() of random blocks"]
    for name in TYPES:
        lines += record(rng, name)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
