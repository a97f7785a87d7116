#!/usr/bin/env python3
"""gen_reference.py — writes llama.cpp reference data for kvd's tokenizer and forward-pass tests.

The files it writes are committed; rerun this only when the model or the
reference changes. To regenerate, from the repository root:

    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install llama-cpp-python==0.3.36 numpy
    /tmp/refenv/bin/python tests/golden/gen_reference.py \
        models/SmolLM2-135M-Instruct.Q4_1.gguf

(llama-cpp-python builds llama.cpp from source for the CPU; that takes a
few minutes.) The script refuses any other llama-cpp-python version and
warns if the model's sha256 is not the pinned one. It writes, each time
atomically (temp file, then rename), and prints each path as it goes:

  tests/golden/tokens.txt  — tokenizer corpus: per case one line of the
      string's UTF-8 bytes as lowercase hex (empty for ""), then one line of
      the ids from llm.tokenize(s, add_bos=False, special=True).
  tests/golden/logits.txt  — 8 prompts of 1..512 tokens, run on the CPU:
      prompt <index> <n_tokens> / ids, top64 / id:logit (%.6f) for the last
      position, greedy / 32 ids (argmax of raw logits, lowest id on ties),
      top2 / 32 a:b (top-1 and top-2 logits at each greedy step); a blank
      line between prompts.

Both files start with '#' comment lines and have none after them. The
output is deterministic: fixed corpus, n_threads=2, seed=0, no sampling.
"""

import argparse
import hashlib
import os
import sys
import time

import numpy as np
import llama_cpp

PIN_LLAMA_CPP = "0.3.36"
PIN_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
N_THREADS = 2
N_CTX = 1024
N_BATCH = 512
SEED = 0
N_GREEDY = 32
N_TOP = 64
PROMPT_LENS = (1, 7, 20, 60, 128, 200, 350, 512)


# ---------------------------------------------------------------- corpus

PROSE = [
    "Hello",
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "the quick brown fox",
    "A",
    "a",
    "I",
    "Once upon a time, there was a little robot who loved to paint.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Mr. Smith went to Washington D.C. on Tuesday.",
    "e.g. i.e. etc. vs. Dr. St. Jr.",
    "She sells sea shells by the sea shore.",
    "To be, or not to be, that is the question:",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
    "CamelCaseIdentifiersAreCommon in code",
    "snake_case_identifiers_too",
    "kebab-case-words-and-so-on",
    "ALLCAPS and lowercase and MiXeD cAsE",
    "inference daemon",
    "tokenization",
    "antidisestablishmentarianism",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    "supercalifragilisticexpialidocious",
    "(parenthesised) [bracketed] {braced} <angled>",
    "\"double quoted\" and 'single quoted'",
    "`backticks` and ``double backticks``",
    "a-b_c.d/e\\f|g",
    "user@example.com",
    "#hashtag @mention $dollar %percent ^caret &amp *star",
]

UNICODE = [
    # Latin with accents
    "café", "naïve", "résumé", "façade", "jalapeño", "Ångström", "Straße",
    "Zürich Müller Öl", "ČŠŽ čšž", "Łódź", "crème brûlée", "œuvre Æsir",
    "São Paulo", "Dvořák", "İstanbul ığdır", "ﬁ ligature",
    "e\u0301 combining acute", "A\u030a combining ring",
    # Greek
    "Γειά σου κόσμε", "αβγδεζηθικλμνξοπρστυφχψω", "ΑΒΓΔΕΖΗΘ",
    "Καλημέρα! Πώς είσαι;",
    # Cyrillic
    "Привет, мир!", "Съешь же ещё этих мягких французских булок",
    "ПРОПИСНЫЕ буквы", "Україна їжак ґанок", "Здравствуйте",
    # Arabic
    "مرحبا بالعالم", "السلام عليكم", "اللغة العربية ١٢٣٤٥",
    # Hebrew
    "שלום עולם", "עברית עם ניקוד: שָׁלוֹם",
    # Devanagari
    "नमस्ते दुनिया", "हिन्दी भाषा", "संस्कृतम्",
    # CJK
    "你好，世界！", "我爱自然语言处理。", "日本語のテキストです。",
    "東京タワー", "ひらがな カタカナ 漢字", "中文English混合mixed",
    "繁體中文測試", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３",
    # Hangul
    "안녕하세요 세계", "한국어 토큰화 테스트", "ㄱㄴㄷ ㅏㅑㅓ",
    # Thai
    "สวัสดีชาวโลก", "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    # others
    "Ողջույն", "გამარჯობა", "হ্যালো", "வணக்கம்", "ሰላም", "Xin chào thế giới",
    "€ £ ¥ ₹ ₿ ¢", "© ® ™ § ¶ † ‡ • …", "≤ ≥ ≠ ≈ ∞ ∑ ∏ √ ∫ ∂",
    "→ ← ↑ ↓ ⇒ ⇔", "½ ¼ ¾ ² ³ ¹", "“smart quotes” ‘single’ — en–dash",
    "\u00a0non-breaking\u00a0space", "zero\u200bwidth\u200bspace",
    "\ufeffbyte order mark", "soft\u00adhyphen",
]

EMOJI = [
    "😀", "😀😃😄😁", "Hello 👋 world 🌍", "🔥🔥🔥", "❤️", "✅ done ❌ failed",
    "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿", "👋🏽",
    "👨\u200d👩\u200d👧\u200d👦", "👩\u200d💻", "🏳️\u200d🌈", "🧑🏾\u200d🚀",
    "🇫🇷 🇩🇪 🇯🇵 🇺🇸 🇧🇷", "🇺🇳", "🏴\U000E0067\U000E0062\U000E0065\U000E006E\U000E0067\U000E007F",
    "1️⃣ 2️⃣ #️⃣", "☕ ☂ ☃ ★ ☆", "🤖 robots 🤖", "emoji😀inside😀words",
    "🐍 Python", "🦀 Rust", "🎉🎊🎈",
]

CODE = [
    "#include <stdio.h>\n\nint main(void)\n{\n\tprintf(\"hello\\n\");\n\treturn 0;\n}\n",
    "static inline uint32_t rotl(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }",
    "for (int i = 0; i < n; i++) {\n    sum += a[i] * b[i];\n}",
    "struct foo {\n\tint a;\t/* comment */\n\tchar *b;\n};",
    "if (err < 0)\n\t\tgoto err_free;",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\nprint(x.shape)",
    "class Foo:\n    def __init__(self):\n        self._x = {}\n",
    "    indented_four = True\n        indented_eight = False",
    "lambda x: x ** 2 if x >= 0 else -x",
    "const f = async (a, b) => {\n  const r = await fetch(`/api/${a}?b=${b}`);\n  return r.json();\n};",
    "function add(a, b) { return a + b; }\nconsole.log(add(1, 2));",
    "let xs = [1, 2, 3].map(x => x * 2).filter(Boolean);",
    "#!/bin/sh\nset -eu\nfor f in *.txt; do\n  echo \"$f\"\ndone\n",
    "ls -la | grep '^d' | awk '{print $9}' > /tmp/out 2>&1",
    "make -j$(nproc) && ./build/tests/test_sampler || exit 1",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "{\"key\": \"value\", \"n\": 42, \"ok\": true, \"list\": [1, 2, null]}",
    "<div class=\"x\"><p>Hello</p></div>",
    "a == b && c != d || !e",
    "x += 1; y -= 2; z *= 3; w /= 4; v %= 5; u <<= 6; t >>= 7;",
    "0x7fffffff 0xDEADBEEF 0b1010 0o755",
    "/* multi\n * line\n * comment\n */",
    "// TODO(kvd): fix this\n",
    "    \n\t\n",
]

NUMBERS = [
    "0", "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
    "3.14159", "2.718281828", "-42", "+7", "1e-9", "6.022e23", "1E+10", "0.5", ".5",
    "1,000,000", "1.000.000,50", "$19.99", "99%", "42nd", "1st 2nd 3rd 4th",
    "+1 (555) 123-4567", "555-867-5309", "+44 20 7946 0958",
    "2024-01-15", "15/01/2024", "01.15.2024", "12:34:56", "2024-01-15T12:34:56Z",
    "v1.2.3", "192.168.0.1", "127.0.0.1:8080", "3/4", "10^6", "1+1=2",
    "In 1969, 3 astronauts flew 384400 km.",
]

CONTRACTION_SUBJ = ["it", "don", "they", "we", "I", "you", "she"]
CONTRACTION_SUFF = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE"]
CONTRACTIONS = [
    "It's", "IT'S", "don't", "DON'T", "they're", "we've", "I'm", "you'll", "she'd",
    "John's book", "JOHN'S BOOK", "rock 'n' roll", "'tis", "o'clock", "y'all'd've",
    "can't won't shouldn't", "’s curly apostrophe", "''", "'",
]

PUNCT = [
    "!", "?", "...", "!!!", "???", "?!?!", "---", "___", "***", "===", "~~~",
    "....", "…", ",,,", ";;", "::", "//", "\\\\", "<<>>", "()[]{}", "!@#$%^&*()",
    "-->", "<--", "=>", "->", "::=", "&&||", "?.", "..=", "a!b?c.",
    "\"\"\"", "'''", "```", "# Heading\n## Sub\n- item\n* item",
    "| a | b |\n|---|---|\n| 1 | 2 |",
]

URLS = [
    "https://example.com",
    "https://www.example.com/path/to/page.html?query=1&x=y#frag",
    "http://localhost:8080/v1/completions",
    "ftp://files.example.org/pub/file.tar.gz",
    "https://github.com/ggerganov/llama.cpp/blob/master/README.md",
    "mailto:someone@example.com",
    "See https://en.wikipedia.org/wiki/Tokenization_(lexical_analysis) for more.",
    "www.example.co.uk",
    "file:///home/user/models/model.gguf",
]

CHAT = [
    "<|im_start|>user\nHello!<|im_end|>\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>assistant\n2+2 is 4.<|im_end|>\n<|endoftext|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|im_start|><|im_end|>",
    "<|endoftext|><|endoftext|>",
    "text<|endoftext|>more text",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start|>user\n\n\n<|im_end|>",
    "<|im_start|>user\nПривет 👋<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\n```python\nprint(1)\n```<|im_end|>",
    "<|im_start|user\nbroken special<|im_end",
    "<|notaspecial|>",
    "<|im_start|>system\nA<|im_end|>\n<|im_start|>user\nB<|im_end|>\n<|im_start|>assistant\nC<|im_end|>\n",
]

WS_UNITS = [" ", "\t", "\n", "\r\n", "\r", "  ", "\n\n"]

LONG = [
    "a" * 200,
    "ab" * 150,
    "x" * 1000,
    "Z" * 64,
    "1" * 100,
    "." * 100,
    "-" * 80,
    "😀" * 40,
    "日本" * 60,
    "hippopotomonstrosesquippedaliophobia" * 5,
    "".join(chr(ord("a") + (i * 7) % 26) for i in range(300)),
    "longwordwithoutanyspaces" * 12,
]


def build_corpus():
    """The fixed test strings, deduplicated in first-seen order."""
    cases = ["", " ", "  ", "\t", "\n", "\r\n", "\n\n\n", " \t\n\r\n ", "\u3000"]
    cases += PROSE + UNICODE + EMOJI + CODE + NUMBERS + CONTRACTIONS + PUNCT
    cases += URLS + CHAT + LONG

    # Contractions after every subject, lower- and uppercase.
    for subj in CONTRACTION_SUBJ:
        for suf in CONTRACTION_SUFF:
            cases.append(subj + suf)
    cases.append(" ".join(s + "'ll" for s in CONTRACTION_SUBJ))

    # Whitespace runs: alone, leading, trailing, between words.
    for unit in WS_UNITS:
        for n in (1, 2, 3, 5, 8):
            run = unit * n
            cases.append(run)
            cases.append(run + "word")
            cases.append("word" + run)
            cases.append("hello" + run + "world")
    cases.append("\t\t  \t mixed tabs and spaces  \t")
    cases.append("line1\r\nline2\r\n\r\nline4\r\n")
    cases.append(" " * 17 + "x" + " " * 17)

    # Numbers glued to words and spaces.
    for num in ("7", "42", "1234567", "3.14159", "1e-9"):
        cases.append("x" + num)
        cases.append(num + "x")
        cases.append(" " + num)
        cases.append("The answer is " + num + ".")

    # Punctuation runs of growing length.
    for ch in "!?.,-=*#~/":
        for n in (2, 4, 7):
            cases.append(ch * n)

    # Script changes at word boundaries.
    words = ["hello", "мир", "世界", "🌍", "123", "café", "שלום", "'s"]
    for a in words:
        for b in words:
            if a != b:
                cases.append(a + " " + b)

    seen = set()
    out = []
    for c in cases:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


# ---------------------------------------------------------------- prompts

PROSE_LONG = (
    "The lighthouse keeper woke before dawn, as he had every morning for thirty "
    "years. He climbed the spiral stairs, one hundred and twelve of them, counting "
    "each step out of habit rather than necessity. At the top, the great lens "
    "waited, cold and patient, its brass fittings dulled by the salt air. He wiped "
    "the glass with a soft cloth and checked the oil, then stood for a while at the "
    "narrow window, watching the grey line of the horizon slowly turn to silver. "
    "Fishing boats were already leaving the harbour below, their engines a distant "
    "murmur beneath the cries of the gulls. His daughter had written again, asking "
    "him to come and live with her in the city, where there were doctors and "
    "libraries and warm apartments with elevators. He had folded the letter "
    "carefully and placed it in the drawer with the others. The light did not need "
    "him any more; it had been automated the previous spring, and a technician from "
    "the mainland visited once a month to replace a fuse or tighten a bolt. Still, "
    "he climbed the stairs. Someone, he believed, ought to look at the sea every "
    "morning and make sure it was still there. In the afternoons he walked along "
    "the cliffs, collecting driftwood and the occasional glass float washed up from "
    "some faraway net. He kept a notebook of the birds he saw: cormorants, "
    "oystercatchers, a single puffin one June that he never saw again. In the "
    "evenings he cooked simple meals, potatoes and fish and whatever vegetables the "
    "grocer's van had brought on Thursday, and he listened to the shipping forecast "
    "on an old radio that crackled whenever the wind blew from the north. When "
    "winter came, the storms arrived one after another, and the waves threw spray "
    "high enough to rattle the windows of the lamp room. On those nights he did not "
    "sleep much. He sat by the stove with a blanket over his knees and read the "
    "novels his wife had loved, the ones with long descriptions of country houses "
    "and letters that arrived too late. Sometimes he read a passage aloud, as if she "
    "were still in the other chair, knitting and correcting his pronunciation of "
    "French names. In March a young woman arrived on the supply boat. She was a "
    "marine biologist, she explained, studying the seals that gathered on the rocks "
    "at the northern end of the island, and she needed somewhere to stay for six "
    "weeks. The council had told her the keeper's cottage had a spare room. He "
    "showed her the room, which smelled of damp wool and old paper, and apologised "
    "for the state of it. She laughed and said she had slept in far worse places, "
    "including a tent on a glacier for most of one summer. Over the following weeks "
    "they settled into an easy routine. She left early with her cameras and her "
    "waterproof notebooks, and he made soup for when she returned, cold and "
    "windblown, with stories about the seals: which ones were bold, which ones were "
    "shy, the pup that had been born on the wrong side of the rocks and had to be "
    "watched through the night. She asked him about the light, and he found himself "
    "telling her things he had not said aloud in years, about the wreck of the "
    "trawler in the great storm, about the winter the supply boat could not come "
    "for five weeks, about his wife, who had painted the cliffs in every season and "
    "never once been satisfied with the colour of the water. When the six weeks "
    "were over, the young woman packed her equipment and thanked him, and promised "
    "to send him a copy of her paper when it was published. He walked her down to "
    "the harbour and carried her heaviest bag. After the boat had gone he stood on "
    "the quay for a long time. Then he went home, took the letters out of the "
    "drawer, and read them all again, one by one, in the order they had arrived."
)

ESSAY = (
    "Large language models generate text one token at a time. At each step the "
    "model reads the tokens produced so far, computes a score for every entry in "
    "its vocabulary, and a sampler turns those scores into a choice. Greedy "
    "decoding always takes the highest score, which is fast and repeatable but "
    "often dull. Temperature sampling divides the scores before the softmax, so "
    "that a low temperature sharpens the distribution and a high one flattens it. "
    "Top-k sampling keeps only the k most likely tokens, while nucleus sampling "
    "keeps the smallest set whose probabilities add up to a chosen mass. Each of "
    "these filters trades diversity for coherence in a slightly different way, and "
    "practitioners usually combine them. Behind the sampler sits the expensive "
    "part: a stack of transformer layers, each applying attention over a cache of "
    "keys and values followed by a feed-forward network. Quantised weights make the "
    "model small enough to fit in memory, and careful kernels make the matrix "
    "products fast enough that a small model can answer in a few milliseconds."
)

CODE_PROMPT = (
    "def merge_sorted(a, b):\n"
    "    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n"
    "    out = []\n"
    "    i = j = 0\n"
    "    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n"
    "            out.append(a[i])\n"
    "            i += 1\n"
    "        else:\n"
    "            out.append(b[j])\n"
    "            j += 1\n"
)

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat_ids(llm, system, user, target):
    """Chat-formatted ids of exactly target tokens: the user text is cut to fit."""
    head = llm.tokenize(
        ("<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n" % system).encode(),
        add_bos=False, special=True)
    tail = llm.tokenize(b"<|im_end|>\n<|im_start|>assistant\n", add_bos=False, special=True)
    body = llm.tokenize(user.encode(), add_bos=False, special=True)
    k = target - len(head) - len(tail)
    if k <= 0 or len(body) < k:
        sys.exit("chat prompt of %d tokens does not fit its text" % target)
    return head + body[:k] + tail


def plain_ids(llm, text, target):
    ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    if len(ids) < target:
        sys.exit("plain prompt of %d tokens needs more text (%d)" % (target, len(ids)))
    return ids[:target]


def build_prompts(llm):
    p = []
    p.append(plain_ids(llm, "The", 1))
    p.append(plain_ids(llm, "The capital of France is Paris, and the capital", 7))
    p.append(chat_ids(llm, "Be brief.", "What is the tallest mountain on Earth?", 20))
    p.append(plain_ids(llm, CODE_PROMPT + "    out.extend(a[i:])\n" * 4, 60))
    p.append(chat_ids(llm, SYSTEM, "Explain what this text is about:\n\n" + ESSAY, 128))
    p.append(plain_ids(llm, ESSAY + " " + PROSE_LONG, 200))
    p.append(chat_ids(llm, SYSTEM, "Summarise this story in one sentence:\n\n" + PROSE_LONG, 350))
    p.append(plain_ids(llm, PROSE_LONG + "\n\n" + ESSAY, 512))
    for ids, n in zip(p, PROMPT_LENS):
        assert len(ids) == n, (len(ids), n)
    return p


# ---------------------------------------------------------------- output

def write_atomic(path, text):
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print("wrote %s (%d bytes)" % (path, len(text)))


def header(model_sha, what):
    return (
        "# %s - generated by tests/golden/gen_reference.py\n"
        "# llama-cpp-python %s, numpy %s, n_threads=%d, seed=%d\n"
        "# model SmolLM2-135M-Instruct.Q4_1.gguf sha256 %s\n"
        % (what, llama_cpp.__version__, np.__version__, N_THREADS, SEED, model_sha)
    )


def top_sorted(row):
    """Indices by logit descending, lowest id first among equals."""
    ids = np.arange(row.shape[0])
    return np.lexsort((ids, -row.astype(np.float64)))


def run_prompt(llm, ids):
    llm.reset()
    llm.eval(ids)
    row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    order = top_sorted(row)[:N_TOP]
    top64 = [(int(i), float(row[i])) for i in order]

    greedy, top2 = [], []
    for step in range(N_GREEDY):
        tok = int(np.argmax(row))  # first maximum = lowest id on ties
        o = top_sorted(row)[:2]
        greedy.append(tok)
        top2.append((float(row[o[0]]), float(row[o[1]])))
        assert int(o[0]) == tok
        if step + 1 < N_GREEDY:
            llm.eval([tok])
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return top64, greedy, top2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="path to SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                    help="output directory (default: this script's)")
    args = ap.parse_args()

    if llama_cpp.__version__ != PIN_LLAMA_CPP:
        sys.exit("need llama-cpp-python %s, have %s" % (PIN_LLAMA_CPP, llama_cpp.__version__))
    h = hashlib.sha256()
    with open(args.model, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    model_sha = h.hexdigest()
    if model_sha != PIN_MODEL_SHA256:
        print("warning: model sha256 %s, expected %s" % (model_sha, PIN_MODEL_SHA256),
              file=sys.stderr)

    t0 = time.time()
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=N_CTX, n_threads=N_THREADS,
                          n_threads_batch=N_THREADS, n_batch=N_BATCH, n_ubatch=N_BATCH,
                          logits_all=True, seed=SEED, n_gpu_layers=0, verbose=False)

    # Tokens first: other tests wait on this file.
    corpus = build_corpus()
    lines = [header(model_sha, "tokenizer corpus (%d cases)" % len(corpus)),
             "# per case: UTF-8 hex line, then ids of tokenize(add_bos=False, special=True)\n"]
    for s in corpus:
        ids = llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)
        lines.append(s.encode("utf-8").hex() + "\n")
        lines.append(" ".join(str(i) for i in ids) + "\n")
    write_atomic(os.path.join(args.out, "tokens.txt"), "".join(lines))

    prompts = build_prompts(llm)
    out = [header(model_sha, "CPU logits and greedy continuations (%d prompts)" % len(prompts))]
    for idx, ids in enumerate(prompts):
        t = time.time()
        top64, greedy, top2 = run_prompt(llm, ids)
        if idx:
            out.append("\n")
        out.append("prompt %d %d\n" % (idx, len(ids)))
        out.append(" ".join(str(i) for i in ids) + "\n")
        out.append("top64\n")
        out.append(" ".join("%d:%.6f" % (i, v) for i, v in top64) + "\n")
        out.append("greedy\n")
        out.append(" ".join(str(i) for i in greedy) + "\n")
        out.append("top2\n")
        out.append(" ".join("%.6f:%.6f" % ab for ab in top2) + "\n")
        print("prompt %d: %d tokens, %.1f s, greedy %r" %
              (idx, len(ids), time.time() - t,
               llm.detokenize(greedy, special=True).decode("utf-8", "replace")))
    write_atomic(os.path.join(args.out, "logits.txt"), "".join(out))
    print("done in %.1f s" % (time.time() - t0))


if __name__ == "__main__":
    main()
