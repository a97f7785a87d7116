#!/usr/bin/env python3
"""gguf_bytes.py — the bytes of tensor data in a GGUF file: what one decoded token reads.

Decode of a dense model reads every weight once per token (the embedding is
tied to the output projection here, so it is read whole too); the tensor data
is the file from the aligned end of the tensor infos to its end. Prints
"tensor_bytes N" (and the count of tensors) for tests/bench_peer.sh.

    gguf_bytes.py MODEL.gguf
"""
import os
import struct
import sys

# GGUF metadata value types: fixed sizes, 8 = string, 9 = array.
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt):
        n = struct.calcsize(fmt)
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("truncated file")
        return struct.unpack(fmt, b)[0]

    def string(self):
        return self.f.read(self.take("<Q"))

    def skip_value(self, t):
        """Skips one value of type t; returns it when it is an integer (for general.alignment)."""
        if t in FIXED:
            b = self.f.read(FIXED[t])
            return int.from_bytes(b, "little") if t in (4, 10) else None
        if t == 8:
            self.string()
        elif t == 9:
            et, n = self.take("<I"), self.take("<Q")
            if et in FIXED:
                self.f.seek(FIXED[et] * n, os.SEEK_CUR)
            else:
                for _ in range(n):
                    self.skip_value(et)
        else:
            raise ValueError(f"unknown metadata type {t}")
        return None


def tensor_bytes(path):
    """(bytes of tensor data, tensor count) of the GGUF file at path."""
    with open(path, "rb") as f:
        r = Reader(f)
        if f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        version = r.take("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        n_tensors, n_kv = r.take("<Q"), r.take("<Q")
        align = 32
        for _ in range(n_kv):
            key = r.string()
            v = r.skip_value(r.take("<I"))
            if key == b"general.alignment" and v:
                align = v
        for _ in range(n_tensors):
            r.string()
            f.seek(8 * r.take("<I") + 4 + 8, os.SEEK_CUR)  # dims, type, offset
        start = (f.tell() + align - 1) // align * align
        return os.path.getsize(path) - start, n_tensors


def main():
    if len(sys.argv) != 2:
        print("usage: gguf_bytes.py MODEL.gguf", file=sys.stderr)
        return 2
    try:
        n, count = tensor_bytes(sys.argv[1])
    except (OSError, ValueError) as e:
        print(f"gguf_bytes: {sys.argv[1]}: {e}", file=sys.stderr)
        return 1
    print(f"tensors {count}")
    print(f"tensor_bytes {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
