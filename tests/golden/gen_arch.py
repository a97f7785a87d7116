#!/usr/bin/env python3
"""gen_arch.py — tiny random-weight GGUFs of every architecture and weight type kvd runs or refuses, with llama.cpp's next-token distributions on them.

The files it writes are committed; rerun this only when a case, the format
or the peer changes. From the repository root, with llama.cpp's tools built
(`make peer`, for llama-quantize):

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install llama-cpp-python==0.3.36 gguf==0.19.0 numpy==2.4.6
    /tmp/refenv/bin/python tests/golden/gen_arch.py \
        models/SmolLM2-135M-Instruct.Q4_1.gguf [--peer build/peer/bin] [--check]

Every model has the default model's tokenizer cut to 512 tokens
(gen_tiny.py's tiny_vocab), so llama.cpp loads it, and weights from
numpy's PCG64 with a fixed seed: matrices N(0, 1/cols), norms near 1, an
embedding scaled so that logits through the tied output have a spread of
a few nats (the input token's own logit highest: distributions with a clear
top, neither flat nor one-hot). Tensor names, shapes and metadata keys are
those convert_hf_to_gguf.py writes for the architecture.

  small: dim 32, 2 layers, 2 query heads of 16 sharing 1 KV head (grouped-
      query attention), FFN 64, vocab 512, every weight F32: the
      architecture cases, and the base of the 32-element block types.
  wide:  dim 256, 2 layers, 4 query heads of 64 sharing 1 KV head, FFN 256:
      rows of 256, what the K-quants and IQ4_XS need; only its quantized
      copies are kept.

Quantized cases are `llama-quantize --pure BASE OUT TYPE`: every 2-D tensor
(the matmul weights and token_embd, which is also the tied output) in that
type, norms F32; the script checks this in each file it wrote and prints
the table.

The reference is llama.cpp (llama-cpp-python 0.3.36) evaluating each file
on the CPU: n_threads 2, logits for every position (logits_all), KV cache
F32 (type_k = type_v = 0) and flash attention off, so nothing but the
weights' own type is rounded. Two prompts of fixed token ids from a fixed
seed (ids 0..511, special tokens included: the engines see ids, not
text): SHORT (8 tokens) and LONG (500: past every sliding window and past
the original context of the scaled-RoPE cases).

Each case writes tests/golden/arch/<case>.gguf and <case>.ref. The .ref is
little-endian binary (a vocab of 512 makes whole log-prob rows cheap, and
binary keeps 23 cases inside a few megabytes):

    char magic[8] = "KVDAREF1"; u32 vocab, n_prompts;
    per prompt: u32 n_tokens, n_rows;
        u16 tokens[n_tokens];
        per position: u16 argmax (lowest id on ties), u16 pad, f32 gap
            (top-2 log-prob gap);
        u16 row_pos[n_rows]; i16 lp[n_rows][vocab];

lp is the log-softmax (computed in double) of the raw logits at the row's
position, times LP_SCALE = 1024 and rounded, clamped at -32 (p < 1.3e-14).
The full distribution at n_rows positions rather than top-k at every one:
the KL divergence is then exact, not a lower bound. The storage's own
error (at most 4.9e-4 in each log-prob) puts a floor of ~4e-8 under it,
below the F32 cases' bound; a floor at -16 (scale 2048) would not do: the
mass it hides, ~1e-6 a row here, shows up as divergence. The rows are every position of SHORT and every
25th of LONG plus its last; argmax and gap cover every position.

phi3 carries the sliding_window key convert_hf_to_gguf.py writes (2047,
phi-3-mini-4k's), which this llama.cpp ignores for phi3 (its loader turns
Phi SWA off): --check shows a window of 64 changes nothing, so kvd must
ignore it too to agree. gemma2's window (64) and caps (attention 2, final
10) are small enough to change the result (--check: 0.24 to 1.3 nats).

--check also evaluates throwaway variants (gemma2 without its caps or its
window, the RoPE cases without their scaling) and prints how far each is
from its case, to show the feature changes the distributions.
"""

import argparse
import math
import importlib.metadata
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf
import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_tiny import add_tiny_vocab, tiny_vocab  # noqa: E402  (same tokenizer cut)

PIN_GGUF = "0.19.0"
PIN_LLAMA_CPP = "0.3.36"
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arch")
N_VOCAB = 512
N_THREADS = 2
N_CTX = 512
SHORT, LONG = 8, 500
ROW_STRIDE = 25
LP_SCALE = 1024.0
LP_FLOOR = -32.0
SEED_PROMPT = 1717

SMALL = dict(dim=32, layers=2, heads=2, kv_heads=1, head_dim=16, ffn=64, embd_std=0.5, seed=17)
WIDE = dict(dim=256, layers=2, heads=4, kv_heads=1, head_dim=64, ffn=256, embd_std=0.19, seed=18)

# ggml type names for llama-quantize, and their GGML type numbers (for the check).
SMALL_TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "IQ4_NL"]
WIDE_TYPES = ["Q4_K", "Q6_K", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS"]


class Rng:
    def __init__(self, seed):
        self.g = np.random.Generator(np.random.PCG64(seed))

    def mat(self, rows, cols, std=None):
        s = std if std is not None else 1.0 / np.sqrt(cols)
        return (self.g.standard_normal((rows, cols)) * s).astype(np.float32)

    def norm(self, n):
        return (1.0 + 0.1 * self.g.standard_normal(n)).astype(np.float32)

    def bias(self, n):
        return (0.5 * self.g.standard_normal(n)).astype(np.float32)


def llama3_factors(head_dim, base, factor=8.0, low=1.0, high=4.0, old_ctx=256):
    """convert_hf_to_gguf's rope_freqs for rope_type llama3, at a tiny original context so every branch occurs."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * np.pi * base ** (i / head_dim)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def llama_tensors(g, c, qk_dim=None, biases=False, fused=False, post_norms=False, untied=False, out_gain=1.0):
    """Tensors of one model: numpy (rows, cols) = GGUF ne reversed."""
    d, hd = c["dim"], qk_dim or c["head_dim"]
    q, kv = c["heads"] * hd, c["kv_heads"] * hd
    t = {"token_embd.weight": g.mat(N_VOCAB, d, c["embd_std"])}
    for layer in range(c["layers"]):
        p = "blk.%d." % layer
        t[p + "attn_norm.weight"] = g.norm(d)
        wq, wk, wv = g.mat(q, d), g.mat(kv, d), g.mat(kv, d)
        if fused:
            t[p + "attn_qkv.weight"] = np.concatenate([wq, wk, wv])
        else:
            t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"] = wq, wk, wv
        if biases:
            t[p + "attn_q.bias"], t[p + "attn_k.bias"], t[p + "attn_v.bias"] = g.bias(q), g.bias(kv), g.bias(kv)
        t[p + "attn_output.weight"] = g.mat(d, q)
        if post_norms:
            t[p + "post_attention_norm.weight"] = g.norm(d)
        t[p + "ffn_norm.weight"] = g.norm(d)
        gate, up = g.mat(c["ffn"], d), g.mat(c["ffn"], d)
        if fused:
            t[p + "ffn_up.weight"] = np.concatenate([gate, up])
        else:
            t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"] = gate, up
        t[p + "ffn_down.weight"] = g.mat(d, c["ffn"])
        if post_norms:
            t[p + "post_ffw_norm.weight"] = g.norm(d)
    t["output_norm.weight"] = g.norm(d) * np.float32(out_gain)
    if untied:
        t["output.weight"] = g.mat(N_VOCAB, d, c["embd_std"])
    return t


def writer(path, arch, c, vocab, ctx, name):
    w = gguf.GGUFWriter(path, arch)
    w.add_name("kvd arch golden: " + name)
    w.add_block_count(c["layers"])
    w.add_context_length(ctx)
    w.add_embedding_length(c["dim"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_layer_norm_rms_eps(1e-5 if arch != "gemma2" else 1e-6)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tiny_vocab(w, vocab)
    return w


def finish(w, tensors, f16=False):
    for name, data in tensors.items():
        if f16 and data.ndim == 2:
            data = data.astype(np.float16)
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Each maker writes one GGUF at path; variant names a throwaway change for --check.
def make_llama(path, vocab, c=SMALL, theta=10000.0, ctx=512, f16=False, freqs=False, scaling=None,
               variant=None, name="llama"):
    w = writer(path, "llama", c, vocab, ctx, name)
    w.add_rope_dimension_count(c["head_dim"])
    w.add_rope_freq_base(theta)
    w.add_vocab_size(N_VOCAB)
    if scaling and variant != "unscaled":
        kind, factor, orig = scaling
        w.add_rope_scaling_type(kind)
        w.add_rope_scaling_factor(factor)
        if orig:
            w.add_rope_scaling_orig_ctx_len(orig)
    t = llama_tensors(Rng(c["seed"]), c)
    if freqs and variant != "unscaled":
        t["rope_freqs.weight"] = llama3_factors(c["head_dim"], theta)
    finish(w, t, f16)


def make_nemo(path, vocab, variant=None):
    """Mistral Nemo: llama arch, head_dim 2 * dim / heads (key_length = value_length)."""
    c, hd = SMALL, 2 * SMALL["dim"] // SMALL["heads"]
    w = writer(path, "llama", c, vocab, 1024, "mistral-nemo-like")
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(1000000.0)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_vocab_size(N_VOCAB)
    finish(w, llama_tensors(Rng(c["seed"] + 1), c, qk_dim=hd, untied=True))


def make_qwen2(path, vocab, variant=None):
    c = SMALL
    w = writer(path, "qwen2", c, vocab, 32768, "qwen2-like")
    w.add_rope_freq_base(1000000.0)
    t = llama_tensors(Rng(c["seed"] + 2), c, biases=variant != "nobias")
    finish(w, t)


# LongRoPE's factors as Phi-3.5's converter writes them (conversion/phi.py): (head_dim / 2,) each.
LONGROPE_LONG = [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 20.0]
LONGROPE_SHORT = [1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.4]


def make_phi3(path, vocab, variant=None, longrope=None):
    """Phi-3 mini: fused attn_qkv and ffn_up (gate | up), output untied, its sliding_window key (2047, as phi-3-mini-4k).

    longrope "short" / "long": Phi-3.5's LongRoPE, with an original context
    above / below N_CTX, so that llama.cpp (which picks the long factors when
    its context exceeds the original one) uses the short / the long factors.
    """
    c = SMALL
    ctx, orig = 4096, 4096
    if longrope:
        orig = 4096 if longrope == "short" else 128
        ctx = 4 * orig
    # Not "phi3" in general.name: llama.cpp would then look for Phi-3's special tokens in the cut vocabulary.
    w = writer(path, "phi3", c, vocab, ctx, "phi mini-like")
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_rope_dimension_count(c["head_dim"])
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(2047 if variant != "window" else 64)
    t = llama_tensors(Rng(c["seed"] + 3), c, fused=True, untied=True)
    if longrope:
        assert len(LONGROPE_LONG) == c["head_dim"] // 2
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(ctx / orig) / math.log(orig)))
        if variant != "nofactors":
            t["rope_factors_long.weight"] = np.array(LONGROPE_LONG, dtype=np.float32)
            t["rope_factors_short.weight"] = np.array(LONGROPE_SHORT, dtype=np.float32)
    finish(w, t)


# Gemma multiplies its input embedding by sqrt(dim) (5.7 here): an embedding 5 times smaller keeps the
# input token from swamping the residual stream, and a final norm of ~5 gives back the logits' spread.
GEMMA_EMBD_STD, GEMMA_OUT_GAIN = 0.1, 5.0
ATTN_CAP, FINAL_CAP, WINDOW = 2.0, 10.0, 64


def make_gemma(path, vocab, variant=None):
    c = dict(SMALL, embd_std=GEMMA_EMBD_STD)
    w = writer(path, "gemma", c, vocab, 8192, "gemma-like")
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    finish(w, llama_tensors(Rng(c["seed"] + 4), c, out_gain=GEMMA_OUT_GAIN))


def make_gemma2(path, vocab, variant=None):
    c = dict(SMALL, embd_std=GEMMA_EMBD_STD)
    w = writer(path, "gemma2", c, vocab, 8192, "gemma2-like")
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_attn_logit_softcapping(ATTN_CAP if variant != "noattncap" else 1e6)
    w.add_final_logit_softcapping(FINAL_CAP if variant != "nofinalcap" else 1e6)
    w.add_sliding_window(WINDOW if variant != "nowindow" else 8192)
    finish(w, llama_tensors(Rng(c["seed"] + 5), c, post_norms=True, out_gain=GEMMA_OUT_GAIN))


LINEAR = (gguf.RopeScalingType.LINEAR, 2.0, 0)
YARN = (gguf.RopeScalingType.YARN, 4.0, 128)

# name -> (maker, its keyword arguments, --check variants)
F32_CASES = {
    "llama-f32": (make_llama, {}, []),
    "llama-f16": (make_llama, {"f16": True}, []),
    "llama3-freqs": (make_llama, {"theta": 500000.0, "ctx": 512, "freqs": True}, ["unscaled"]),
    "llama3-nofreqs": (make_llama, {"theta": 500000.0, "ctx": 512}, []),
    "llama-linear": (make_llama, {"ctx": 512, "scaling": LINEAR}, ["unscaled"]),
    "llama-yarn": (make_llama, {"ctx": 512, "scaling": YARN}, ["unscaled"]),
    "mistral-nemo": (make_nemo, {}, []),
    "qwen2": (make_qwen2, {}, ["nobias"]),
    "phi3": (make_phi3, {}, ["window"]),
    "phi3-longrope-short": (make_phi3, {"longrope": "short"}, ["nofactors"]),
    "phi3-longrope-long": (make_phi3, {"longrope": "long"}, ["nofactors"]),
    "gemma": (make_gemma, {}, []),
    "gemma2": (make_gemma2, {}, ["noattncap", "nofinalcap", "nowindow"]),
}


def prompts():
    g = np.random.Generator(np.random.PCG64(SEED_PROMPT))
    return [g.integers(0, N_VOCAB, SHORT).tolist(), g.integers(0, N_VOCAB, LONG).tolist()]


def log_probs(path, toks):
    """llama.cpp's log-softmax (double) of every position's logits, (n, vocab), and the raw argmaxes."""
    llm = llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=True,
                          n_threads=N_THREADS, n_threads_batch=N_THREADS, seed=0, verbose=False,
                          flash_attn=False, type_k=0, type_v=0)
    if llm.n_vocab() != N_VOCAB:
        sys.exit("%s: vocab %d" % (path, llm.n_vocab()))
    llm.reset()
    llm.eval(toks)
    logits = np.array(llm.scores[:len(toks)], dtype=np.float32)
    llm.close()
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return x - lse, logits.argmax(axis=1)


def rows_of(n):
    return list(range(n)) if n <= SHORT else sorted(set(range(0, n, ROW_STRIDE)) | {n - 1})


def write_ref(path, ps, results):
    out = [b"KVDAREF1", struct.pack("<II", N_VOCAB, len(ps))]
    for toks, (lp, am) in zip(ps, results):
        rows = rows_of(len(toks))
        out.append(struct.pack("<II", len(toks), len(rows)))
        out.append(np.array(toks, dtype="<u2").tobytes())
        two = np.sort(lp, axis=1)[:, -2:]
        gap = (two[:, 1] - two[:, 0]).astype("<f4")
        pa = np.zeros(len(toks), dtype=[("am", "<u2"), ("pad", "<u2"), ("gap", "<f4")])
        pa["am"], pa["gap"] = am, gap
        out.append(pa.tobytes())
        out.append(np.array(rows, dtype="<u2").tobytes())
        q = np.round(np.maximum(lp[rows], LP_FLOOR) * LP_SCALE)
        out.append(np.clip(q, -32768, 0).astype("<i2").tobytes())
    with open(path + ".tmp", "wb") as f:
        f.write(b"".join(out))
    os.replace(path + ".tmp", path)


def kld(lp, lq):
    return float((np.exp(lp) * (lp - lq)).sum(axis=1).mean())


def stats(lp):
    p = np.exp(lp)
    ent = float(-(p * lp).sum(axis=1).mean())
    return ent, float(p.max(axis=1).mean())


def tensor_types(path):
    r = gguf.GGUFReader(path)
    by = {}
    for t in r.tensors:
        kind = "norm/bias" if len(t.shape) == 1 or t.name.endswith(("norm.weight", ".bias")) else t.name
        key = "1-D" if kind == "norm/bias" else ("token_embd" if "token_embd" in t.name else
                                                  "output" if t.name == "output.weight" else "matmul")
        by.setdefault(key, set()).add(t.tensor_type.name)
    return by


def case(name, path, ps):
    res = [log_probs(path, p) for p in ps]
    write_ref(os.path.join(OUT_DIR, name + ".ref"), ps, res)
    ent, top = stats(res[1][0])
    types = tensor_types(path)
    print("%-16s %8d B  %-40s entropy %.2f nats, mean top p %.2f" %
          (name, os.path.getsize(path), " ".join("%s=%s" % (k, "/".join(sorted(v)))
                                                  for k, v in sorted(types.items())), ent, top), flush=True)
    return res, types


def quantize(peer, base, out, typ):
    cmd = [os.path.join(peer, "llama-quantize"), "--pure", base, out, typ, "2"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), p.returncode, p.stdout))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the default model (its tokenizer is cut down)")
    ap.add_argument("--peer", default="build/peer/bin", help="llama.cpp's tools (make peer)")
    ap.add_argument("--check", action="store_true", help="also show each feature changes the result")
    a = ap.parse_args()
    for pkg, pin in (("gguf", PIN_GGUF), ("llama_cpp_python", PIN_LLAMA_CPP)):
        if importlib.metadata.version(pkg) != pin:
            sys.exit("%s %s, not the pinned %s" % (pkg, importlib.metadata.version(pkg), pin))
    vocab = tiny_vocab(a.model)
    ps = prompts()
    os.makedirs(OUT_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (maker, kw, variants) in F32_CASES.items():
            path = os.path.join(OUT_DIR, name + ".gguf")
            maker(path + ".tmp", vocab, **kw)
            os.replace(path + ".tmp", path)
            res, _ = case(name, path, ps)
            for v in variants if a.check else []:
                vp = os.path.join(tmp, name + "-" + v + ".gguf")
                maker(vp, vocab, variant=v, **kw)
                lv = log_probs(vp, ps[1])[0]
                print("    --check %-11s KLD(case || variant) on LONG %.4g" % (v, kld(res[1][0], lv)))
        wide = os.path.join(tmp, "llama-wide-f32.gguf")
        make_llama(wide, vocab, c=WIDE, name="llama wide")
        for typ, base in [(t, os.path.join(OUT_DIR, "llama-f32.gguf")) for t in SMALL_TYPES] + \
                         [(t, wide) for t in WIDE_TYPES]:
            name = "llama-" + typ.lower()
            path = os.path.join(OUT_DIR, name + ".gguf")
            quantize(a.peer, base, path + ".tmp", typ)
            os.replace(path + ".tmp", path)
            _, types = case(name, path, ps)
            if types["matmul"] != {typ} or types["token_embd"] != {typ}:
                sys.exit("%s: types %s, not all %s" % (path, types, typ))
        if a.check:
            lw = log_probs(wide, ps[1])[0]
            for typ in WIDE_TYPES:
                lq = log_probs(os.path.join(OUT_DIR, "llama-" + typ.lower() + ".gguf"), ps[1])[0]
                print("    --check llama.cpp %s vs the wide F32 base: KLD %.4g" % (typ, kld(lw, lq)))
    total = sum(os.path.getsize(os.path.join(OUT_DIR, f)) for f in os.listdir(OUT_DIR))
    print("tests/golden/arch: %d bytes in all" % total)


if __name__ == "__main__":
    main()
