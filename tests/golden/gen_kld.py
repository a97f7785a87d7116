#!/usr/bin/env python3
"""gen_kld.py — llama.cpp's F32 next-token distributions over a real text, as top-k log-probs, for kvd's KL-divergence test.

The file it writes is committed; rerun this only when the model or the
reference changes. From the repository root, with llama.cpp's tools built
(`make peer`, for llama-quantize and llama-perplexity):

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install llama-cpp-python==0.3.36 numpy==2.4.6 gguf==0.19.0
    /tmp/refenv/bin/python tests/golden/gen_kld.py \
        models/SmolLM2-135M-Instruct.Q4_1.gguf [--peer build/peer/bin] [--kvd build/kvd]

The reference is llama.cpp (the version llama-cpp-python 0.3.36 vendors)
running an F32 copy of the model, made by `llama-quantize
--allow-requantize MODEL F32` (or, without it, by the gguf package's
dequantize, the same arithmetic): every Q4_1/Q8_0 block dequantizes
exactly into F32, so it is the same model, computed without quantized dot
products. The text is /usr/share/common-licenses/GPL-3 (the text kvd's
--perplexity tests and notes use, and not ours), tokenized as
llama-perplexity does (the whole file less one trailing newline, BOS if
the model asks for it, special tokens parsed) and cut into CHUNKS chunks
of CTX tokens; as llama-perplexity, each chunk is evaluated from an empty
context and its positions CTX/2 .. CTX-2 are scored, each predicting the
next token. KV cache F16 and flash attention off, as llama.cpp's defaults
for a CPU context through the Python binding; n_threads 2.

In the first KLD_CHUNKS chunks (381 positions) each scored position keeps
the TOP highest reference log-probs (log-softmax over the full vocabulary,
in double) and lrest = log of the probability of all other tokens. A KL
divergence over those TOP+1 outcomes ("top-k + rest"),

    KLD_k = sum_top p_i (lp_i - lq_i) + p_rest (lrest - log q_rest),

with q_rest the test distribution's mass outside the same TOP ids, is the
KL divergence of both distributions coarsened to TOP+1 outcomes: never
more than the full one (the log-sum inequality), and short of it by
p_rest times the divergence inside the rest. For Q4_1 it is 82% of the
full figure (0.00234 of 0.00285; 88% with 64 tokens, and splitting the
rest into hashed buckets gains little: the rest's divergence is spread
thin). The thresholds are llama.cpp's own Q4_1 run scored the same way on
the same positions, so the approximation is the same on both sides. The
same-top-1 rate is counted over all CHUNKS chunks (2032 positions): over
381 the gap between two engines that flip different near-ties is about a
point by chance alone.

It writes tests/golden/kld_ref.txt atomically: '#' comment lines, then
"key value" lines (ctx, chunks, kld_chunks, top, positions,
kld_positions, and llama.cpp Q4_1's figures: peer_kld, the mean KLD_k;
peer_same_top, the fraction of positions whose argmax is the
reference's; peer_kld_full, the full-vocab mean, for the record), then per
chunk "chunk C", its CTX token ids, and per scored position one line
"pos J NEXT ARGMAX GAP" (ARGMAX the reference's argmax of the raw logits,
lowest id on ties; GAP its top-2 log-prob gap), followed in the first
kld_chunks chunks by "LREST id:lp ..." (TOP pairs, highest first, lowest
id first on ties).

With --peer it also prints llama-perplexity's own full-vocabulary figures
(its 16-bit base file) for the Q4_1 model against the F32 one on the same
chunks, and with --kvd the same for kvd against that base file.
"""

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import gguf
import llama_cpp

PIN_LLAMA_CPP = "0.3.36"
PIN_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TEXT = "/usr/share/common-licenses/GPL-3"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kld_ref.txt")
CTX = 256
CHUNKS = 16		# same-top-1 over all their scored positions (2032)
KLD_CHUNKS = 3		# top-k log-probs, and the KLD, over these first ones (381 positions)
TOP = 32
N_THREADS = 2


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def run(cmd):
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        sys.exit("%s failed (%d):\n%s" % (cmd[0], p.returncode, p.stdout))
    return p.stdout


def load(path, **kw):
    return llama_cpp.Llama(model_path=path, n_ctx=CTX, n_batch=CTX, n_ubatch=CTX, logits_all=True,
                           n_threads=N_THREADS, n_threads_batch=N_THREADS, seed=0, verbose=False,
                           flash_attn=False, **kw)


def dequantize_f32(src, dst):
    """src with every tensor dequantized to F32 by the gguf package: what llama-quantize F32 writes, without it."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, None)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.file_type":
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape([int(n) for n in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def text_tokens(llm):
    with open(TEXT, "rb") as f:
        text = f.read()
    if text.endswith(b"\n"):
        text = text[:-1]
    # add_bos=True adds BOS only where the vocabulary asks for it, as llama-perplexity's call.
    ids = llm.tokenize(text, add_bos=True, special=True)
    if len(ids) < CHUNKS * CTX:
        sys.exit("%s: %d tokens, fewer than %d chunks of %d" % (TEXT, len(ids), CHUNKS, CTX))
    # llama-perplexity puts BOS first in every chunk when the vocabulary adds one.
    bos = llm.token_bos() if llm.tokenize(b"", add_bos=True) else None
    return [ids[c * CTX:(c + 1) * CTX] for c in range(CHUNKS)], bos


def log_probs(llm, chunk, bos):
    """Log-softmax (double) of the scored positions' logits, (CTX-1-CTX/2, vocab), and the raw argmaxes."""
    toks = list(chunk)
    if bos is not None:
        toks[0] = bos
    llm.reset()
    llm.eval(toks)
    logits = np.array(llm.scores[:CTX], dtype=np.float32)[CTX // 2:CTX - 1]
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return x - lse, logits.argmax(axis=1)


def lse(v):
    m = v.max()
    return m + np.log(np.exp(v - m).sum())


def top_of(lp):
    """The TOP ids of lp, highest first, lowest id first on ties."""
    cand = np.argpartition(-lp, TOP)[:TOP + 8]
    order = sorted(cand.tolist(), key=lambda i: (-lp[i], i))
    # argpartition may cut a tie at the boundary: settle it on the full row.
    kth = lp[order[TOP - 1]]
    ties = np.nonzero(lp == kth)[0].tolist()
    keep = [i for i in order if lp[i] > kth] + sorted(ties)
    return keep[:TOP]


def kld_k(lp, lq, top):
    """KLD over the TOP ids plus one bucket for the rest; lp, lq full log-prob rows."""
    rest = np.ones(lp.shape[0], dtype=bool)
    rest[top] = False
    lp_rest, lq_rest = lse(lp[rest]), lse(lq[rest])
    p = np.exp(lp[top])
    return float((p * (lp[top] - lq[top])).sum() + np.exp(lp_rest) * (lp_rest - lq_rest))


def reference(llm, chunks, bos):
    """Per chunk: its argmaxes and top-2 gaps; for the first KLD_CHUNKS also the log-probs and TOP ids."""
    ref = []
    for c, ch in enumerate(chunks):
        lp, am = log_probs(llm, ch, bos)
        two = np.sort(lp, axis=1)[:, -2:]
        r = {"am": am, "gap": two[:, 1] - two[:, 0]}
        if c < KLD_CHUNKS:
            r["lp"], r["tops"] = lp, [top_of(row) for row in lp]
        ref.append(r)
    return ref


def compare(ref, llm, chunks, bos, n_chunks=None):
    """Mean KLD_k, same-top-1 fraction, full mean KLD of llm against ref, positions of each."""
    k, full, same, n = [], [], 0, 0
    for c, (r, ch) in enumerate(zip(ref[:n_chunks], chunks)):
        lq, amq = log_probs(llm, ch, bos)
        same += int((r["am"] == amq).sum())
        n += len(amq)
        if "lp" not in r:
            continue
        lp = r["lp"]
        for j in range(lp.shape[0]):
            k.append(kld_k(lp[j], lq[j], r["tops"][j]))
            full.append(float((np.exp(lp[j]) * (lp[j] - lq[j])).sum()))
    return float(np.mean(k)), same / n, float(np.mean(full)), len(k), n


def peer_figures(peer, kvd, f32, q41, bos_note):
    """llama-perplexity's full-vocabulary KLD of Q4_1 (and kvd) against F32, through its 16-bit base file."""
    ppl = os.path.join(peer, "llama-perplexity")
    pat = r"(Mean    KLD:.*|Same top p:.*|Mean PPL\(Q\)  .*|Mean PPL\(base\).*)"
    with tempfile.TemporaryDirectory() as d:
        base = os.path.join(d, "f32.kld")
        common = ["-c", str(CTX), "--chunks", str(KLD_CHUNKS), "-t", str(N_THREADS)]
        run([ppl, "-m", f32, "-f", TEXT, "--kl-divergence-base", base] + common)
        out = run([ppl, "-m", q41, "--kl-divergence-base", base, "--kl-divergence"] + common)
        print("llama-perplexity --kl-divergence, Q4_1 against F32%s:" % bos_note)
        print("\n".join("  " + s for s in re.findall(pat, out)))
        if kvd:
            out = run([kvd, "--backend", "cpu", "-m", q41, "--kl-divergence-base", base, "--kl-divergence"])
            print("kvd --kl-divergence (cpu backend), Q4_1 against llama.cpp's F32:")
            print("\n".join("  " + s for s in re.findall(pat, out)))


def write(chunks, ref, fig):
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        f.write("# kld_ref.txt: written by tests/golden/gen_kld.py (see its docstring); do not edit\n")
        f.write("# llama.cpp (llama-cpp-python %s) on the F32 dequantization of the default model\n" % PIN_LLAMA_CPP)
        f.write("# over %s; llama.cpp's Q4_1 figures on the same positions beside it\n" % TEXT)
        f.write("ctx %d\nchunks %d\nkld_chunks %d\ntop %d\npositions %d\nkld_positions %d\n" %
                (CTX, CHUNKS, KLD_CHUNKS, TOP, fig[4], fig[3]))
        f.write("peer_kld %.6f\npeer_same_top %.6f\npeer_kld_full %.6f\n" % fig[:3])
        for c, (toks, r) in enumerate(zip(chunks, ref)):
            f.write("chunk %d\n%s\n" % (c, " ".join(map(str, toks))))
            for j in range(len(r["am"])):
                pos = CTX // 2 + j
                f.write("pos %d %d %d %.4f" % (pos, toks[pos + 1], r["am"][j], r["gap"][j]))
                if "lp" in r:
                    lp, top = r["lp"][j], r["tops"][j]
                    rest = np.ones(lp.shape[0], dtype=bool)
                    rest[top] = False
                    f.write(" %.6f %s" % (lse(lp[rest]), " ".join("%d:%.5f" % (i, lp[i]) for i in top)))
                f.write("\n")
    os.replace(tmp, OUT)
    print("wrote %s (%d bytes)" % (OUT, os.path.getsize(OUT)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the default model, Q4_1")
    ap.add_argument("--peer", default="build/peer/bin", help="llama.cpp's tools (make peer)")
    ap.add_argument("--kvd", help="kvd, for its full-vocabulary figure beside llama.cpp's")
    ap.add_argument("--f32", help="the F32 copy to use or make (default: a temporary file)")
    a = ap.parse_args()
    if llama_cpp.__version__ != PIN_LLAMA_CPP:
        sys.exit("llama-cpp-python %s, not the pinned %s" % (llama_cpp.__version__, PIN_LLAMA_CPP))
    if sha256(a.model) != PIN_MODEL_SHA256:
        print("warning: %s is not the pinned model" % a.model, file=sys.stderr)
    with tempfile.TemporaryDirectory() as d:
        f32 = a.f32 or os.path.join(d, "f32.gguf")
        quantize = os.path.join(a.peer, "llama-quantize")
        if os.path.exists(f32):
            pass
        elif os.path.exists(quantize):
            run([quantize, "--allow-requantize", a.model, f32, "F32"])
        else:
            print("no %s: the gguf package dequantizes" % quantize, file=sys.stderr)
            dequantize_f32(a.model, f32)
        ref_llm = load(f32)
        chunks, bos = text_tokens(ref_llm)
        ref = reference(ref_llm, chunks, bos)
        del ref_llm
        fig = compare(ref, load(a.model), chunks, bos)
        write(chunks, ref, fig)
        print("llama.cpp Q4_1 against F32: mean KLD_k %.6f (full-vocab %.6f) over %d positions, "
              "same top-1 %.2f%% over %d" % (fig[0], fig[2], fig[3], 100 * fig[1], fig[4]))
        rest = np.array([1 - np.exp(row[t]).sum() for r in ref[:KLD_CHUNKS] for row, t in zip(r["lp"], r["tops"])])
        print("reference mass outside the top %d: mean %.4f, max %.4f" % (TOP, rest.mean(), rest.max()))
        # How far an exact path with another KV-cache precision would sit: F32 K/V against F16.
        f = compare(ref, load(f32, type_k=0, type_v=0), chunks, bos, KLD_CHUNKS)
        print("llama.cpp F32 with an F32 KV cache against F16: mean KLD_k %.3g, same top-1 %.2f%%, "
              "full %.3g" % (f[0], 100 * f[1], f[2]))
        if os.path.exists(os.path.join(a.peer, "llama-perplexity")):
            peer_figures(a.peer, a.kvd, f32, a.model, "" if bos is None else " (BOS)")


if __name__ == "__main__":
    main()
