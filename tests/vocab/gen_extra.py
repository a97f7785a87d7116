#!/usr/bin/env python3
"""gen_extra.py — writes tests/vocab/extra.txt: llama.cpp's token ids (through
llama-cpp-python, Llama(vocab_only=True)) for strings its own test vectors do
not cover, on the vocabularies of llama.cpp's models/ggml-vocab-*.gguf that kvd
tokenizes. tests/test_vocab.c checks kvd against every line.

Run offline (a few minutes), from the repository root, in a venv with the
reference's pinned PyPI packages:
    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install llama-cpp-python==0.3.36 gguf==0.19.0
    sh tests/vocab/fetch.sh   # the vocabulary files, into build/vocab
    /tmp/refenv/bin/python tests/vocab/gen_extra.py [VOCAB_DIR]

Lines: "<vocab> <mode> <hex of the UTF-8 text> <ids>"; mode '-' encodes with
no BOS and special-token spellings as text, 's' parses them as tokens, 'b'
also prepends BOS ('bs' both). A vocab named "X+nosp" is X with
tokenizer.ggml.add_space_prefix = false, the SentencePiece setting Gemma's
vocabularies carry: the generator writes that variant to a scratch file for
llama.cpp, the test clears the same flag on kvd's tokenizer of X.
"""
import os
import sys
import tempfile

import gguf
import llama_cpp

VOCABS = ["gpt-2", "mpt", "starcoder", "refact", "command-r", "llama-bpe", "qwen2",
          "qwen35", "falcon", "llama-spm", "phi-3"]
NOSP = ["llama-spm", "phi-3"]

TEXTS = [
    # multilingual
    "Grüße aus München, straße Œuvre façade naïve",
    "Привет, как дела? Съешь же ещё этих мягких французских булок",
    "Γειά σου Κόσμε, ΑΘΗΝΑ",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם",
    "नमस्ते दुनिया, हिन्दी में क्षत्रिय",
    "สวัสดีชาวโลก ภาษาไทย",
    "你好，世界！我们今天学习中文。",
    "こんにちは世界、カタカナとひらがな",
    "안녕하세요 세계 한국어",
    "Tiếng Việt có dấu: Nguyễn Thị Minh Khai",
    "e\u0301 a\u0308 combining marks n\u0303o\u0302",
    "İstanbul'da ıslak ışık; DON'T I'M WE'LL they'RE you'VE she'D",
    "it's 'quoted' ''double'' ' s 't",
    # letters and marks new in Unicode 15.0/15.1 (Kawi, CJK extension I, Kannada, Lao):
    # kvd's classes must be llama.cpp's Unicode version
    "abc\U00011F04\U00011F05def x\U0002EBF0y \U00011F04\U00011F05",
    "\u0c95\u0cf3x \u0e81\u0ecey a\u0cf3",
    "a \U00011F50\U00011F51\U00011F52\U00011F53 b 1\U00011F502 x\U00011F04y (\U00011F05",
    # code
    "def f(x):\n    return x**2  # square\n\n\nclass A:\n\tpass\n",
    "int main(void) {\n\tprintf(\"%d\\n\", a[i] >> 2 | b << 3);\n\treturn 0;\n}\n",
    "{\"key\": [1, 2.5, -3e10, null, true], \"s\": \"a\\u00e9\"}",
    "for (i = 0; i < n; i++) if (x != y && z >= w || !q) x += y -= z *= 2;",
    "SELECT * FROM t WHERE a = 'x' AND b <> 3; -- comment",
    "<div class=\"x\">&amp;&lt;&gt;</div> `code` ~tilde~ ^caret^ $dollar$ |pipe|",
    "https://example.com/path?q=1&r=two#frag user@example.org",
    "    indented\n        twice\n\t\ttabs\n",
    # whitespace runs
    " " * 7,
    " " * 16 + "x",
    "a" + " " * 33 + "b",
    "\t\t\t\t",
    "\n\n\n\n\n\n",
    "\r\n\r\n",
    "line\r\nline\rline\n",
    " \n \n  \n\t\n",
    "trailing   ",
    "\u00a0nbsp\u2003em\u3000ideographic\u2028sep",
    "x\u000b\u000cy\u0085z",
    # digits
    "1234567890",
    "3.14159265358979 2.718281828",
    "1,000,000 and 12,34,567",
    "0x1F 0b1010 1e-9 007",
    "٠١٢٣٤٥٦٧٨٩ ۱۲۳ १२३",
    "１２３４５ fullwidth ＡＢＣ",
    "Ⅻ ½ ¾ ² ³ ①②③",
    "9" * 40,
    "v1.2.3-rc4+build.567",
    # emoji and symbols
    "🦙🦙🦙 llama",
    "👨‍👩‍👧‍👦 family 🏳️‍🌈 flag 🇩🇪🇯🇵",
    "👍🏽👋🏿 ✨🔥💯",
    "→ ← ↑ ↓ ⇒ ∀x ∃y ∑ ∫ √ ∞ ≠ ≤ ≥ ± × ÷",
    "©®™ € £ ¥ ₹ ₿ § ¶ † ‡ • … ‰",
    "\u200b\u200c\u200d zero widths \ufeff bom",
    "\U0001F600\U0001F601\U0001F602\U0001F923",
    # mixed
    "Hello World! HELLO world? hello, World.",
    "   Hello   World   ",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "a\nb\n\nc\n\n\nd",
    "'s's's 'll'll",
    "x" * 100,
    "ab" * 50,
]


def special_texts(reader):
    """A few control-token spellings of the vocab: BOS, EOS and the first others."""
    toks = reader.fields["tokenizer.ggml.tokens"]
    types = reader.fields.get("tokenizer.ggml.token_type")
    out = []
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        f = reader.fields.get(key)
        if f is not None:
            out.append(int(f.contents()))
    if types is not None:
        ty = types.contents()
        out += [i for i, t in enumerate(ty) if t == 3][:6]
    seen, texts = set(), []
    for i in out:
        if i in seen or i >= len(toks.data):
            continue
        seen.add(i)
        s = toks.contents(i)
        if s:
            texts.append(s)
    return texts


def special_cases(sp):
    if not sp:
        return []
    a = sp[0]
    b = sp[-1]
    return [
        a + "Hello" + b,
        "x " + a + " y " + b + "\n" + a,
        "".join(sp),
        " ".join(sp) + " end",
        a + a + "text" + b + b,
    ]


def write_nosp(src, dst):
    """src with tokenizer.ggml.add_space_prefix = false (a vocab-only GGUF, no tensors)."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), vt)
    w.add_bool("tokenizer.ggml.add_space_prefix", False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def emit(out, name, llm, text, mode):
    b = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    ids = llm.tokenize(b, add_bos="b" in mode, special="s" in mode)
    out.append("%s %s %s %s" % (name, mode, b.hex(), " ".join(str(i) for i in ids)))


def gen_vocab(out, name, path):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    r = gguf.GGUFReader(path)
    sp = special_texts(r)
    for t in TEXTS:
        emit(out, name, llm, t, "-")
    # ill-formed UTF-8: stray continuation, truncated sequences, bad lead bytes
    for raw in (b"ab\x80cd", b"\xe4\xbd", b"x\xf0\x9f\xa6", b"\xff\xfe ok", b"\xc3\x28 z"):
        emit(out, name, llm, raw, "-")
    for t in special_cases(sp):
        for mode in ("-", "s", "bs"):
            emit(out, name, llm, t, mode)
    for t in ("Hello world", " leading space", ""):
        emit(out, name, llm, t, "b")
    del llm


def main():
    vdir = sys.argv[1] if len(sys.argv) > 1 else "build/vocab"
    out = ["# extra tokenizer vectors - generated by tests/vocab/gen_extra.py",
           "# llama-cpp-python %s, gguf-py, vocabularies of the llama-cpp-python 0.3.36 sdist"
           % llama_cpp.__version__,
           "# <vocab> <mode: - plain, s parse special, b add BOS> <hex text> <ids>"]
    for v in VOCABS:
        gen_vocab(out, v, os.path.join(vdir, "ggml-vocab-%s.gguf" % v))
    with tempfile.TemporaryDirectory() as tmp:
        for v in NOSP:
            dst = os.path.join(tmp, "nosp.gguf")
            write_nosp(os.path.join(vdir, "ggml-vocab-%s.gguf" % v), dst)
            gen_vocab(out, v + "+nosp", dst)
    with open("tests/vocab/extra.txt", "w") as fp:
        fp.write("\n".join(out) + "\n")
    print("tests/vocab/extra.txt: %d cases" % (len(out) - 3))


if __name__ == "__main__":
    main()
