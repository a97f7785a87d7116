#!/usr/bin/env python3
"""gen_tiny.py — a tiny llama-family GGUF and llama-perplexity's base file for it: the round trip of kvd's --kl-divergence files.

The files it writes are committed; rerun this only when the format or the
peer changes. From the repository root, with llama.cpp's tools built
(`make peer`) and kvd built (`make`):

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install gguf==0.19.0 numpy==2.4.6
    /tmp/refenv/bin/python tests/golden/gen_tiny.py \
        models/SmolLM2-135M-Instruct.Q4_1.gguf [--peer build/peer/bin] [--kvd build/kvd]

It writes, each atomically (temp file, then rename):

  tests/golden/tiny.gguf — architecture llama, 2 layers, dim 32, 2 heads of
      16 (1 KV head: grouped-query attention as in the default model), FFN
      64, context 256, tied output, every weight F32 from numpy's PCG64 with
      a fixed seed. The tokenizer is the default model's (gpt2, pre-tokenizer
      smollm) cut to its first 512 tokens: the 17 special tokens, the 256
      byte tokens and the first merges, with exactly the merges whose parts
      and result are among them, in their order. Every byte is a token, so
      any text tokenizes; both engines compute the same function.
  tests/golden/tiny.kld — what `llama-perplexity -m tiny.gguf -f GPL-3
      -c 128 --chunks 2 --kl-divergence-base tiny.kld` writes: 2 chunks of
      128 tokens, 126 scored rows (131,076 bytes).
  tests/golden/tiny.txt — the PPL that run printed ("Final estimate"), for
      tests/test_perplexity.c to compare kvd's with.

Then it runs the other direction and prints llama-perplexity's output:
kvd writes a base file for tiny.gguf from the same text (--perplexity
--kl-divergence-base) and llama-perplexity reads it (--kl-divergence).
The text is /usr/share/common-licenses/GPL-3, the one kvd's perplexity
tests and notes use; the tokens are in the base file, so the test does not
need it.
"""

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import gguf

PIN_GGUF = "0.19.0"
TEXT = "/usr/share/common-licenses/GPL-3"
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)))
N_VOCAB = 512
N_LAYER = 2
DIM = 32
N_HEAD = 2
N_HEAD_KV = 1
FFN = 64
CTX_TRAIN = 256
CTX = 128
CHUNKS = 2
SEED = 16
EMBD_STD = 0.15


def tiny_vocab(model_path):
    """The default model's first N_VOCAB tokens, their types and the merges that stay inside them."""
    r = gguf.GGUFReader(model_path)
    f = r.fields
    tokens = f["tokenizer.ggml.tokens"].contents()[:N_VOCAB]
    types = f["tokenizer.ggml.token_type"].contents()[:N_VOCAB]
    have = set(tokens)
    merges = []
    for m in f["tokenizer.ggml.merges"].contents():
        a, b = m.split(" ", 1)
        if a in have and b in have and a + b in have:
            merges.append(m)
    meta = {k: f[k].contents() for k in ("tokenizer.ggml.model", "tokenizer.ggml.pre",
                                         "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                         "tokenizer.ggml.unknown_token_id",
                                         "tokenizer.ggml.padding_token_id")}
    return tokens, types, merges, meta


def weights():
    """Every tensor, numpy shape (rows, cols) = GGUF ne reversed; std 1/sqrt(fan-in), norms near 1."""
    rng = np.random.Generator(np.random.PCG64(SEED))
    head_dim = DIM // N_HEAD
    kv = N_HEAD_KV * head_dim

    def mat(rows, cols, std=None):
        s = std if std is not None else 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols)) * s).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(DIM)).astype(np.float32)

    # Through the tied output, embeddings of std 0.15 give logits of std ~0.9
    # and the input token's own ~5: every log-probability stays well above
    # the base file's floor (16 below the top), and the top is clear.
    t = {"token_embd.weight": mat(N_VOCAB, DIM, EMBD_STD)}
    for layer in range(N_LAYER):
        p = "blk.%d." % layer
        t[p + "attn_norm.weight"] = norm()
        t[p + "attn_q.weight"] = mat(DIM, DIM)
        t[p + "attn_k.weight"] = mat(kv, DIM)
        t[p + "attn_v.weight"] = mat(kv, DIM)
        t[p + "attn_output.weight"] = mat(DIM, DIM)
        t[p + "ffn_norm.weight"] = norm()
        t[p + "ffn_gate.weight"] = mat(FFN, DIM)
        t[p + "ffn_up.weight"] = mat(FFN, DIM)
        t[p + "ffn_down.weight"] = mat(DIM, FFN)
    t["output_norm.weight"] = norm()
    return t


def add_tiny_vocab(w, vocab):
    """Write tiny_vocab()'s tokenizer into the GGUF writer w (no BOS added, no space prefix)."""
    tokens, types, merges, meta = vocab
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(tokens)
    w.add_token_types([int(x) for x in types])
    w.add_token_merges(merges)
    w.add_bos_token_id(int(meta["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(meta["tokenizer.ggml.eos_token_id"]))
    w.add_unk_token_id(int(meta["tokenizer.ggml.unknown_token_id"]))
    w.add_pad_token_id(int(meta["tokenizer.ggml.padding_token_id"]))
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)


def write_gguf(path, model_path):
    tokens, types, merges, meta = tiny_vocab(model_path)
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name("kvd tiny round-trip model")
    w.add_block_count(N_LAYER)
    w.add_context_length(CTX_TRAIN)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(DIM // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tiny_vocab(w, (tokens, types, merges, meta))
    for name, data in weights().items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    print("wrote %s (%d bytes; %d tokens, %d merges)" % (path, os.path.getsize(path), len(tokens),
                                                         len(merges)))


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        sys.exit("%s failed (%d):\n%s" % (cmd[0], p.returncode, p.stdout))
    return p.stdout


def final_ppl(out):
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
    if not m:
        sys.exit("no 'Final estimate' in:\n" + out)
    return m.group(1), m.group(2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the default model (its tokenizer is cut down)")
    ap.add_argument("--peer", default="build/peer/bin", help="llama.cpp's tools (make peer)")
    ap.add_argument("--kvd", default="build/kvd")
    a = ap.parse_args()
    have = importlib.metadata.version("gguf")
    if have != PIN_GGUF:
        sys.exit("gguf %s, not the pinned %s" % (have, PIN_GGUF))
    ppl_bin = os.path.join(a.peer, "llama-perplexity")
    model = os.path.join(OUT_DIR, "tiny.gguf")
    base = os.path.join(OUT_DIR, "tiny.kld")
    write_gguf(model, a.model)

    tmp = base + ".tmp"
    out = run([ppl_bin, "-m", model, "-f", TEXT, "-c", str(CTX), "--chunks", str(CHUNKS), "-t", "2",
               "--kl-divergence-base", tmp])
    ppl, unc = final_ppl(out)
    os.replace(tmp, base)
    print("wrote %s (%d bytes); llama-perplexity: PPL = %s +/- %s" % (base, os.path.getsize(base), ppl, unc))
    with open(os.path.join(OUT_DIR, "tiny.txt.tmp"), "w") as f:
        f.write("# gen_tiny.py: what llama-perplexity printed writing tiny.kld for tiny.gguf\n")
        f.write("ppl %s\nppl_unc %s\n" % (ppl, unc))
    os.replace(os.path.join(OUT_DIR, "tiny.txt.tmp"), os.path.join(OUT_DIR, "tiny.txt"))

    # kvd reads llama.cpp's file (what tests/test_perplexity.c asserts) ...
    print(run([a.kvd, "--backend", "cpu", "-m", model, "--kl-divergence-base", base, "--kl-divergence"]))
    # ... and llama.cpp reads kvd's.
    with tempfile.TemporaryDirectory() as d:
        kbase = os.path.join(d, "kvd-tiny.kld")
        out = run([a.kvd, "--backend", "cpu", "-m", model, "--perplexity", TEXT, "--ctx", str(CTX),
                   "--chunks", str(CHUNKS), "--kl-divergence-base", kbase])
        print(out)
        print("kvd: PPL = %s +/- %s" % final_ppl(out))
        print(run([ppl_bin, "-m", model, "-t", "2", "--kl-divergence-base", kbase, "--kl-divergence"]))


if __name__ == "__main__":
    main()
