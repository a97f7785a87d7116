#!/usr/bin/env python3
"""make_seeds.py MODEL.gguf -- writes the seed corpora of tests/fuzz/corpus/.

(`python3 -c 'import make_seeds; make_seeds.jinja_seeds()'` from the
repository root with tests/fuzz on PYTHONPATH writes only the jinja ones.)

Run from the repository root; the committed seeds came from the default
model (models/SmolLM2-135M-Instruct.Q4_1.gguf). Seeds are small: the GGUF
ones keep the model's own metadata but cut its vocabulary to the first 300
tokens (and the merges that stay inside it) and shrink the network to one
layer of width 32, so every stage of the reader and loader has a valid
starting point for the fuzzer to mutate.
"""
import os
import struct
import sys

OUT = "tests/fuzz/corpus"
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
          10: "<Q", 11: "<q", 12: "<d"}


def put(name, sub, data):
    d = os.path.join(OUT, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- GGUF ----

class Reader:
    def __init__(self, b):
        self.b, self.o = b, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.o)
        self.o += struct.calcsize(fmt)
        return v[0]

    def str(self):
        n = self.take("<Q")
        s = self.b[self.o:self.o + n]
        self.o += n
        return s

    def value(self, t):
        if t == 8:
            return self.str()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALAR[t])


def read_kvs(path):
    with open(path, "rb") as f:
        b = f.read(8 << 20)
    r = Reader(b)
    assert r.take("<I") == 0x46554747
    r.take("<I")
    r.take("<Q")
    n_kv = r.take("<Q")
    kvs = []
    for _ in range(n_kv):
        k = r.str()
        t = r.take("<I")
        kvs.append((k, t, r.value(t)))
    return kvs


def w_str(s):
    return struct.pack("<Q", len(s)) + s


def w_value(t, v):
    if t == 8:
        return w_str(v)
    if t == 9:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(w_value(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def gguf(kvs, tensors, version=3, align=32):
    """tensors: (name, dims, type, data bytes)."""
    out = struct.pack("<IIQQ", 0x46554747, version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += w_str(k) + struct.pack("<I", t) + w_value(t, v)
    off = 0
    blobs = []
    for name, dims, ttype, data in tensors:
        out += w_str(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", ttype, off)
        blobs.append(data)
        off += (len(data) + align - 1) // align * align
    out += b"\0" * (-len(out) % align)
    for data in blobs:
        out += data + b"\0" * (-len(data) % align)
    return out


def small_model(kvs, n_vocab=300, dim=32, ffn=64, heads=2, kv_heads=1):
    keep = []
    toks = None
    for k, t, v in kvs:
        if k == b"tokenizer.ggml.tokens":
            toks = v[1][:n_vocab]
            keep.append((k, t, (v[0], toks)))
        elif k in (b"tokenizer.ggml.token_type", b"tokenizer.ggml.scores"):
            keep.append((k, t, (v[0], v[1][:n_vocab])))
        elif k == b"tokenizer.ggml.merges":
            have = set(toks or [])
            ok = [m for m in v[1] if all(p in have for p in m.split(b" ")) and m.replace(b" ", b"") in have]
            keep.append((k, t, (v[0], ok)))
        elif k.endswith(b"_token_id") and v >= n_vocab:
            continue
        elif k.startswith(b"llama."):
            sub = {b"llama.block_count": 1, b"llama.embedding_length": dim,
                   b"llama.feed_forward_length": ffn, b"llama.attention.head_count": heads,
                   b"llama.attention.head_count_kv": kv_heads,
                   b"llama.rope.dimension_count": dim // heads, b"llama.vocab_size": n_vocab,
                   b"llama.context_length": 256}
            keep.append((k, t, sub.get(k, v)))
        else:
            keep.append((k, t, v))
    f32 = lambda n: struct.pack("<%df" % n, *[((i * 7919) % 97 - 48) / 480.0 for i in range(n)])
    # Q8_0: 32 elements per block, an f16 scale then 32 int8s.
    q8 = lambda rows, cols: (struct.pack("<e", 0.01) + bytes((i * 37) & 0xff for i in range(32))) * (rows * cols // 32)
    kv_dim = dim // heads * kv_heads
    tensors = [("token_embd.weight", [dim, n_vocab], 8, q8(n_vocab, dim)),
               ("output_norm.weight", [dim], 0, f32(dim)),
               ("blk.0.attn_norm.weight", [dim], 0, f32(dim)),
               ("blk.0.attn_q.weight", [dim, dim], 8, q8(dim, dim)),
               ("blk.0.attn_k.weight", [dim, kv_dim], 8, q8(kv_dim, dim)),
               ("blk.0.attn_v.weight", [dim, kv_dim], 8, q8(kv_dim, dim)),
               ("blk.0.attn_output.weight", [dim, dim], 8, q8(dim, dim)),
               ("blk.0.ffn_norm.weight", [dim], 0, f32(dim)),
               ("blk.0.ffn_gate.weight", [dim, ffn], 8, q8(ffn, dim)),
               ("blk.0.ffn_up.weight", [dim, ffn], 8, q8(ffn, dim)),
               ("blk.0.ffn_down.weight", [ffn, dim], 8, q8(dim, ffn))]
    return keep, [(n.encode(), d, ty, b) for n, d, ty, b in tensors]


def gguf_seeds(model):
    kvs = read_kvs(model)
    keep, tensors = small_model(kvs)
    full = gguf(keep, tensors)
    put("small-model.gguf", "gguf", full)
    put("small-model-v2.gguf", "gguf", gguf(keep, tensors, version=2))
    no_tok = [kv for kv in keep if not kv[0].startswith(b"tokenizer.")]
    put("no-tokenizer.gguf", "gguf", gguf(no_tok, tensors))
    put("metadata-only.gguf", "gguf", gguf(keep, []))
    put("header-only.gguf", "gguf", full[:24])
    put("truncated.gguf", "gguf", full[:len(full) // 2])


# ---- control messages ----

MAGIC = 0x3144564B
ABI_VERSION = 2


def msg(mtype, body=b"", seq=1, magic=MAGIC, length=None, flags=0, status=0):
    n = 24 + len(body) if length is None else length
    return struct.pack("<IHHIIiI", magic, mtype, flags, n, seq, status, 0) + body


def hello(features=0x7F):
    return msg(1, struct.pack("<II16x", ABI_VERSION, features))


def sess_open(sq=0, cq=0, arena=0):
    return msg(2, struct.pack("<IIII16x", sq, cq, arena, 0))


def sess_close(sid):
    return msg(3, struct.pack("<II", sid, 0))


def rec(m, free=False):
    return struct.pack("<H", len(m) | (0x8000 if free else 0)) + m


def ctrl_seeds():
    put("hello", "ctrl", rec(hello()))
    put("hello-vocab-open-stats", "ctrl", rec(hello()) + rec(sess_open()) + rec(msg(4)))
    put("open-close", "ctrl", rec(sess_open(8, 16, 4096)) + rec(sess_close(0x100)) +
        rec(sess_close(0x100), True) + rec(sess_open()))
    put("many-opens", "ctrl", b"".join(rec(sess_open()) for _ in range(20)))
    put("bad", "ctrl", rec(msg(1, magic=0)) + rec(msg(9)) + rec(msg(4, length=99)) +
        rec(b"\x4b\x56") + rec(msg(4, flags=1)) + rec(hello()[:30]))
    put("odd-sizes", "ctrl", rec(sess_open(3, 5, 7)) + rec(sess_open(1 << 20, 0, 0)) +
        rec(sess_open(0, 0, 0xFFFFFFFC)))


# ---- SQEs and rings ----

def sqe(op, flags=0, sid_live=True, user=1, toff=0, ntok=0, out=0, maxt=0, slot=0, target=0,
        prio=0, temp=0):
    prio |= 0x80 if sid_live else 0
    return struct.pack("<BBHIQIIIIQHHHHHHIQ", op, prio, flags, 0, user, toff, ntok, out, maxt,
                       7, temp, 0, 0, 0, 0, 0, slot, target)


# fuzz_ring takes offsetof(struct kvd_sqe, resv) bytes of an SQE; the fields sqe() does not
# pack (logprobs, penalties, the system message) and the reserved tail stay zero.
SQE_BODY = 88


def put_sqe(q):
    return b"\x01" + q + bytes(SQE_BODY - len(q))


def write(off, data):
    return b"\x00" + struct.pack("<HB", off, len(data)) + data


def ring_seeds():
    # sq 4, cq 4: size byte 0b1010. Ring headers are 192 bytes: the arena starts at
    # 192 + 192 + 4 * 128 + 4 * 32 = 1024.
    arena = 1024
    prompt = struct.pack("<5I", 504, 3575, 282, 4649, 314)
    gen = sqe(3, 2, toff=0, ntok=5, out=64, maxt=4)
    put("generate", "ring", b"\x0a" + write(arena, prompt) + put_sqe(gen) + b"\x02" +
        b"\x03\xff\xff\xff\xff" + b"\x03\x00\x00\x00\x00" + b"\x04" + b"\x02")
    put("all-ops", "ring", b"\x0a" + write(arena, prompt) +
        b"".join(put_sqe(sqe(op, user=op + 1, toff=0 if op in (1, 3) else 0,
                             ntok=5 if op in (1, 3) else 0, out=64 if op in (2, 3) else 0,
                             maxt=4 if op in (2, 3) else 0, target=2 if op == 4 else 0))
                 for op in range(6)) + b"\x02\x03\x00\x00\x00\x00\x04\x02")
    put("text-chat", "ring", b"\x0a" + write(arena, b"Hello <|im_start|>") +
        put_sqe(sqe(1, 0x18, ntok=18)) + put_sqe(sqe(1, 0x19, ntok=18, slot=1)) + b"\x02")
    put("cq-full", "ring", b"\x00" + b"".join(put_sqe(sqe(0, user=i)) for i in range(8)) +
        b"\x02\x02\x04\x02\x02")
    put("bad-tail", "ring", b"\x0a" + write(64, struct.pack("<I", 1000)) + b"\x02" +
        write(0, struct.pack("<I", 77)) + write(192, b"\xff" * 8) + b"\x02\x04\x02")
    put("close-open", "ring", b"\x0f" + put_sqe(gen) + b"\x02\x05\x00\x06" + put_sqe(gen) +
        b"\x02\x03\x01\x00\x00\x00\x05\x01\x02")
    # A raw write sets the reserved tail of the SQE in slot 0 (SQEs start at 384).
    put("sqe-resv", "ring", b"\x0a" + write(arena, prompt) + put_sqe(gen) +
        write(384 + SQE_BODY + 7, b"\x01") + b"\x02\x04\x02")
    put("bad-sqes", "ring", b"\x0a" + put_sqe(sqe(9)) + put_sqe(sqe(1, ntok=5, toff=2)) +
        put_sqe(sqe(2, out=1 << 30, maxt=1)) + put_sqe(sqe(1, ntok=0x40000000)) +
        put_sqe(sqe(1, ntok=1, sid_live=False)) + put_sqe(sqe(2, maxt=1, slot=99)) +
        write(arena, b"\xff\xff\xff\xff") + put_sqe(sqe(1, ntok=1)) + b"\x02")


# ---- tokenizer ----

def tokenizer_seeds():
    texts = [b"\x00Hello world", b"\x03Once upon a time, there was a little robot.",
             b"\x02<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
             b"\x01caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 \xd8\xb3\xd9\x84\xd8\xa7\xd9\x85",
             b"\x00\xff\xfe\xc3\x28 \xe2\x82 \xf0\x9f\x98 bad utf-8",
             b"\x38    spaces\t\ttabs\n\n\nnewlines   12345678901234567890",
             b"\x30" + b"a" * 300, b"\x07<|endoftext|><|im_end|><|im_start|>",
             b"\x1c'll 've 're don't I'M", b"\x22" + bytes(range(1, 256))]
    for i, t in enumerate(texts):
        put("t%02d" % i, "tokenizer", t)


# ---- jinja: the chat templates test_chat renders, and the snippets ----

def jinja_seeds():
    d = "tests/golden/chat"
    for i, name in enumerate(sorted(f for f in os.listdir(d) if f.endswith(".jinja"))):
        with open(os.path.join(d, name), "rb") as f:
            put("j%02d" % i, "jinja", bytes([i & 0x0f]) + f.read() + b"\0  Gr\xc3\xbc\xc3\x9fe \n")
    with open(os.path.join(d, "snippets.txt"), "rb") as f:
        b = f.read()
    k = 0
    while b:
        head, _, b = b.partition(b"\n")
        n = int(head.split(b" ")[1])
        text, b = b[:n], b[n + 1:]
        if head.startswith(b"tmpl "):
            put("s%02d" % k, "jinja", bytes([k & 0x0f]) + text)
            k += 1


# ---- state: patches over fuzz_state.c's baseline image ----

# Its layout for the default model (ctx_len 8192) and the target's 32 blocks
# of 16 tokens, 4 slot records: daemon/serve/persist.c's struct pst_hdr and
# struct pst_slot. The fuzzer finds its own way from here.
ST_SLOTS_OFF = 8192
ST_COPY = 32896
ST_BLOCKS_OFF = 4096
ST_REC = 96


def st_patch(off, data):
    return struct.pack("<I", off)[:3] + bytes([len(data)]) + data


def st_copy(rec, k):
    return ST_SLOTS_OFF + (2 * rec + k) * ST_COPY


def state_seeds():
    put("baseline", "state", b"\0")
    put("magic", "state", b"\0" + st_patch(0, b"KVDSTAT2"))
    put("model", "state", b"\1" + st_patch(16, b"\x01\x02"))
    put("cut_header", "state", b"\2" + struct.pack("<I", 100)[:3])
    put("cut_slots", "state", b"\3" + struct.pack("<I", ST_SLOTS_OFF + ST_COPY)[:3])
    # a slot's token id (resealed: only the vocabulary check can refuse it)
    put("token", "state", b"\1" + st_patch(st_copy(0, 0) + 104, struct.pack("<I", 0xffffff)))
    put("n_tokens", "state", b"\1" + st_patch(st_copy(0, 0) + 52, struct.pack("<I", 9000)))
    put("slot", "state", b"\1" + st_patch(st_copy(1, 0) + 40, struct.pack("<I", 7)))
    put("session", "state", b"\1" + st_patch(st_copy(1, 0) + 36, struct.pack("<I", 0x1ff)))
    put("token_dup", "state", b"\1" + st_patch(st_copy(2, 0) + 16, b"\0" * 16))
    put("gen_both", "state", b"\0" + st_patch(st_copy(0, 0), struct.pack("<Q", 7)) +
        st_patch(st_copy(0, 1), struct.pack("<Q", 7)))
    put("torn", "state", b"\0" + st_patch(st_copy(0, 0) + 120, b"\xff" * 8))
    # block records: a state, a token, a key
    put("block_state", "state", b"\0" + st_patch(ST_BLOCKS_OFF + 28, struct.pack("<I", 7)))
    put("block_token", "state", b"\0" + st_patch(ST_BLOCKS_OFF + 32, struct.pack("<I", 5)))
    put("block_key", "state", b"\0" + st_patch(ST_BLOCKS_OFF + ST_REC, b"\x55" * 8))


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    state_seeds()
    gguf_seeds(model)
    ctrl_seeds()
    ring_seeds()
    tokenizer_seeds()
    jinja_seeds()


if __name__ == "__main__":
    main()
