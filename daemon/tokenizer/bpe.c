/* bpe.c — GPT-2 style byte-level BPE: hand-written pre-tokenizer scanners and rank-ordered merging. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/gguf.h"
#include "daemon/tokenizer/tokenizer_int.h"
#include "daemon/tokenizer/unicode.h"
#include "daemon/log.h"

/*
 * GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for
 * themselves; the 68 others (0x00-0x20, 0x7F-0xA0, 0xAD) become U+0100..
 * U+0143 in byte order, so every byte is a visible character in vocab and
 * merge texts.
 */
static uint32_t byte_to_cp(unsigned b)
{
	if (b <= 0x20)
		return 0x100 + b;
	if (b >= 0x7F && b <= 0xA0)
		return 0x100 + 33 + (b - 0x7F);
	if (b == 0xAD)
		return 0x100 + 67;
	return b;
}

/* Inverse of byte_to_cp(); -1 for a code point no byte maps to. */
static int cp_to_byte(uint32_t cp)
{
	if (cp >= 0x100 + 68)
		return -1;
	if (cp >= 0x100) {
		cp -= 0x100;
		return cp < 33 ? (int)cp : cp < 67 ? (int)(0x7F + cp - 33) : 0xAD;
	}
	return byte_to_cp(cp) == cp ? (int)cp : -1;
}

size_t tok_bpe_unmap(const char *text, size_t len, char *buf, size_t cap)
{
	const uint8_t *s = (const uint8_t *)text;
	size_t i = 0, w = 0;

	while (i < len) {
		size_t adv;
		uint32_t cp = unicode_utf8_next(s + i, len - i, &adv);
		int b = cp_to_byte(cp);

		if (b >= 0) {
			if (w < cap)
				buf[w] = (char)b;
			w++;
		} else {
			/* Not byte-level text: pass it through. */
			for (size_t k = 0; k < adv; k++, w++)
				if (w < cap)
					buf[w] = (char)s[i + k];
		}
		i += adv;
	}
	return w;
}

static const struct {
	const char *name;
	uint8_t stages[TOK_PRE_MAX];
	uint8_t n;
	uint8_t ignore_merges;
	uint8_t add_bos;
} k_pre[] = {
	/*
	 * llama.cpp's names (src/llama-vocab.cpp) grouped by the regexes and
	 * flags they select there; a name missing here is refused, never
	 * guessed. "gpt2" is kvd's own alias of "gpt-2".
	 */
	/* llama.cpp's fallback for models converted without a known pre-tokenizer. */
	{ "default", { PRE_RUN_PUNCT, PRE_GPT2, PRE_RUN_NUMBER, PRE_DIGITS3 }, 4, 0, 0 },
	{ "gpt2", { PRE_GPT2 }, 1, 0, 0 },
	{ "gpt-2", { PRE_GPT2 }, 1, 0, 0 },
	{ "phi-2", { PRE_GPT2 }, 1, 0, 0 },
	{ "mpt", { PRE_GPT2 }, 1, 0, 0 },
	{ "olmo", { PRE_GPT2 }, 1, 0, 0 },
	{ "jais", { PRE_GPT2 }, 1, 0, 0 },
	{ "exaone4", { PRE_GPT2 }, 1, 0, 0 },
	{ "smollm", { PRE_EACH_NUMBER, PRE_GPT2 }, 2, 0, 0 },
	{ "starcoder", { PRE_EACH_NUMBER, PRE_GPT2 }, 2, 0, 0 },
	{ "refact", { PRE_EACH_NUMBER, PRE_GPT2 }, 2, 0, 0 },
	{ "command-r", { PRE_EACH_NUMBER, PRE_GPT2 }, 2, 0, 0 },
	{ "codeshell", { PRE_EACH_NUMBER, PRE_GPT2 }, 2, 0, 0 },
	{ "exaone", { PRE_EACH_NUMBER, PRE_GPT2 }, 2, 0, 0 },
	{ "minerva-7b", { PRE_EACH_NUMBER, PRE_GPT2 }, 2, 0, 0 },
	{ "falcon", { PRE_RUN_PUNCT_BT, PRE_GPT2, PRE_DIGITS3 }, 3, 0, 0 },
	{ "qwen2", { PRE_QWEN2 }, 1, 0, 0 },
	{ "deepseek-r1-qwen", { PRE_QWEN2 }, 1, 0, 0 },
	{ "stablelm2", { PRE_QWEN2 }, 1, 0, 0 },
	{ "megrez", { PRE_QWEN2 }, 1, 0, 0 },
	{ "hunyuan", { PRE_QWEN2 }, 1, 0, 0 },
	{ "qwen35", { PRE_QWEN35 }, 1, 0, 0 },
	/* llama 3's regex without its flags. */
	{ "dbrx", { PRE_LLAMA3 }, 1, 0, 0 },
	{ "smaug-bpe", { PRE_LLAMA3 }, 1, 0, 0 },
	{ "llama-bpe", { PRE_LLAMA3 }, 1, 1, 1 },
	{ "llama3", { PRE_LLAMA3 }, 1, 1, 1 },
	{ "llama-v3", { PRE_LLAMA3 }, 1, 1, 1 },
	{ "falcon3", { PRE_LLAMA3 }, 1, 1, 1 },
	{ "falcon-h1", { PRE_LLAMA3 }, 1, 1, 1 },
	{ "pixtral", { PRE_LLAMA3 }, 1, 1, 1 },
};

static int pick_pre(struct tokenizer *t, const struct gguf_file *f, char *err, size_t errlen)
{
	struct gguf_str pre = { "default", 7 };

	gguf_get_str(f, "tokenizer.ggml.pre", &pre);
	for (size_t i = 0; i < sizeof(k_pre) / sizeof(k_pre[0]); i++) {
		if (strlen(k_pre[i].name) != pre.len || memcmp(k_pre[i].name, pre.ptr, pre.len))
			continue;
		memcpy(t->pre, k_pre[i].stages, sizeof(t->pre));
		t->n_pre = k_pre[i].n;
		t->ignore_merges = k_pre[i].ignore_merges;
		t->add_bos = k_pre[i].add_bos;
		return 0;
	}
	log_errf(err, errlen, 0, "unknown pre-tokenizer '%.*s' (tokenizer.ggml.pre)",
		 (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
	return -ENOTSUP;
}

static uint32_t merge_hash(uint64_t key)
{
	key *= 0x9E3779B97F4A7C15ull;
	return (uint32_t)(key >> 32);
}

static const struct tok_merge *merge_find(const struct tokenizer *t, uint32_t l, uint32_t r)
{
	uint64_t key = (uint64_t)l << 32 | r;
	uint32_t i = merge_hash(key) & t->merge_mask;

	for (;; i = (i + 1) & t->merge_mask) {
		const struct tok_merge *m = &t->merges[i];

		if (m->key == key)
			return m;
		if (m->key == UINT64_MAX)
			return NULL;
	}
}

static void merge_insert(struct tokenizer *t, uint32_t l, uint32_t r, uint32_t rank, uint32_t id)
{
	uint64_t key = (uint64_t)l << 32 | r;
	uint32_t i = merge_hash(key) & t->merge_mask;

	for (;; i = (i + 1) & t->merge_mask) {
		struct tok_merge *m = &t->merges[i];

		if (m->key == key)
			return;		/* a repeated pair keeps its first rank */
		if (m->key == UINT64_MAX) {
			*m = (struct tok_merge){ key, rank, id };
			return;
		}
	}
}

/*
 * Merges are "left right" with the two token texts in byte-level form. A
 * rule whose parts or result are not in the vocabulary can never fire on
 * token ids and is dropped.
 */
static int load_merges(struct tokenizer *t, const struct gguf_file *f, char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.merges");
	uint32_t cap = 1, n;
	char stack[512];

	if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING) {
		log_errf(err, errlen, 0, "tokenizer.ggml.merges: missing or not a string array");
		return -EINVAL;
	}
	if (kv->arr_len >= INT32_MAX) {
		log_errf(err, errlen, 0, "tokenizer.ggml.merges: too many");
		return -EINVAL;
	}
	n = (uint32_t)kv->arr_len;
	while (cap < 2 * n + 2)
		cap <<= 1;
	t->merges = malloc((size_t)cap * sizeof(*t->merges));
	if (!t->merges)
		return -ENOMEM;
	memset(t->merges, 0xff, (size_t)cap * sizeof(*t->merges));
	t->merge_mask = cap - 1;

	for (uint32_t i = 0; i < n; i++) {
		struct gguf_str s = gguf_arr_str(kv, i);
		const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
		size_t ll, rl;
		uint32_t l, r, m;

		if (!sp) {
			log_errf(err, errlen, 0, "tokenizer.ggml.merges[%u]: no space in '%.*s'", i,
				 (int)(s.len > 64 ? 64 : s.len), s.ptr);
			return -EINVAL;
		}
		ll = (size_t)(sp - s.ptr);
		rl = s.len - ll - 1;
		if (ll + rl > sizeof(stack))
			continue;
		l = tok_lookup(t, s.ptr, ll);
		r = tok_lookup(t, sp + 1, rl);
		memcpy(stack, s.ptr, ll);
		memcpy(stack + ll, sp + 1, rl);
		m = tok_lookup(t, stack, ll + rl);
		if (l == TOK_NONE || r == TOK_NONE || m == TOK_NONE)
			continue;
		merge_insert(t, l, r, i, m);
	}
	return 0;
}

int tok_bpe_init(struct tokenizer *t, const struct gguf_file *f, char *err, size_t errlen)
{
	int ret = pick_pre(t, f, err, errlen);

	if (ret)
		return ret;
	for (unsigned b = 0; b < 256; b++) {
		uint8_t u[4];
		size_t n = unicode_utf8_put(byte_to_cp(b), u);

		t->byte_tok[b] = tok_lookup(t, (const char *)u, n);
	}
	return load_merges(t, f, err, errlen);
}

/* ---- merging ---------------------------------------------------------- */

struct bpe_sym {
	uint32_t id;		/* TOK_NONE once merged into its left neighbour */
	int32_t prev, next;	/* -1 at the ends */
};

/* Pairs carry the merge rank as key, a/b the symbols' ids when queued (a change
 * makes the pair stale) and c the merged token. */
/* Scratch reused across the pieces of one encode call. */
struct bpe_work {
	struct bpe_sym *sym;	/* (cap,) */
	struct tok_pair *heap;	/* (3 * cap,): n - 1 initial pairs, at most 2 per merge */
	char *mapped;		/* (4 * cap,) ignore_merges: the piece in byte-level text */
	size_t cap;
	uint32_t n_heap;
};

static void try_pair(const struct tokenizer *t, struct bpe_work *w, int32_t l, int32_t r)
{
	const struct tok_merge *m;

	if (l < 0 || r < 0)
		return;
	m = merge_find(t, w->sym[l].id, w->sym[r].id);
	if (m)
		tok_pair_push(w->heap, &w->n_heap, (struct tok_pair){ (double)m->rank, (uint32_t)l, (uint32_t)r,
						w->sym[l].id, w->sym[r].id, m->id });
}

static int work_reserve(struct bpe_work *w, size_t n)
{
	void *a, *b, *c;

	if (n <= w->cap)
		return 0;
	if (n < 64)
		n = 64;
	a = realloc(w->sym, n * sizeof(*w->sym));
	if (a)
		w->sym = a;
	b = realloc(w->heap, 3 * n * sizeof(*w->heap));
	if (b)
		w->heap = b;
	c = realloc(w->mapped, 4 * n);
	if (c)
		w->mapped = c;
	if (!a || !b || !c)
		return -ENOMEM;
	w->cap = n;
	return 0;
}

/*
 * BPE on one pre-token piece: always apply the lowest-ranked adjacent merge,
 * leftmost first on ties, until none applies (llama.cpp's order).
 */
static int bpe_piece(const struct tokenizer *t, struct bpe_work *w, const uint8_t *s, size_t n,
		     struct tok_out *o)
{
	int ret;

	if (n == 1) {
		if (t->byte_tok[s[0]] != TOK_NONE)
			tok_out_push(o, t->byte_tok[s[0]]);
		return 0;
	}
	ret = work_reserve(w, n);
	if (ret)
		return ret;
	if (t->ignore_merges) {
		size_t m = 0;
		uint32_t id;

		for (size_t i = 0; i < n; i++)
			m += unicode_utf8_put(byte_to_cp(s[i]), (uint8_t *)w->mapped + m);
		id = tok_lookup(t, w->mapped, m);
		if (id != TOK_NONE) {
			tok_out_push(o, id);
			return 0;
		}
	}
	for (size_t i = 0; i < n; i++)
		w->sym[i] = (struct bpe_sym){ t->byte_tok[s[i]], (int32_t)i - 1,
					      i + 1 < n ? (int32_t)i + 1 : -1 };
	w->n_heap = 0;
	for (size_t i = 0; i + 1 < n; i++)
		try_pair(t, w, (int32_t)i, (int32_t)i + 1);

	while (w->n_heap) {
		struct tok_pair p = tok_pair_pop(w->heap, &w->n_heap);
		struct bpe_sym *l = &w->sym[p.left], *r = &w->sym[p.right];

		if (l->id != p.a || r->id != p.b || l->next != (int32_t)p.right ||
		    l->id == TOK_NONE || r->id == TOK_NONE)
			continue;
		l->id = p.c;
		l->next = r->next;
		if (r->next >= 0)
			w->sym[r->next].prev = (int32_t)p.left;
		r->id = TOK_NONE;
		try_pair(t, w, l->prev, (int32_t)p.left);
		try_pair(t, w, (int32_t)p.left, l->next);
	}
	/* Symbol 0 only ever absorbs its right neighbours, so the chain starts there. */
	for (int32_t i = 0; i >= 0; i = w->sym[i].next)
		if (w->sym[i].id != TOK_NONE)
			tok_out_push(o, w->sym[i].id);
	return 0;
}

/* ---- pre-tokenizer ---------------------------------------------------- */

#define CP_IN 0x80	/* flag bit: position holds a code point (is inside the text) */

struct pre_ctx {
	const struct tokenizer *t;
	const uint8_t *bytes;	/* the fragment, ill-formed UTF-8 replaced by U+FFFD */
	uint32_t *cp;		/* (n,) code points */
	uint8_t *fl;		/* (n,) UNI_* | CP_IN */
	uint32_t *off;		/* (n + 1,) byte offset of each code point */
	struct bpe_work *w;
	struct tok_out *o;
	int ret;
};

static void pre_stage(struct pre_ctx *c, uint32_t k, uint32_t a, uint32_t b);

/* Piece [a, b) of code points goes to stage k, or to BPE after the last. */
static void pre_emit(struct pre_ctx *c, uint32_t k, uint32_t a, uint32_t b)
{
	if (a >= b || c->ret)
		return;
	if (k < c->t->n_pre)
		pre_stage(c, k, a, b);
	else
		c->ret = bpe_piece(c->t, c->w, c->bytes + c->off[a], c->off[b] - c->off[a], c->o);
}

/* Regex lookahead sees nothing past the range a stage was handed. */
#define F(i) ((i) < b ? c->fl[i] : 0)
#define C(i) ((i) < b ? c->cp[i] : 0)

static int is_contraction(struct pre_ctx *c, uint32_t pos, uint32_t b, int fold)
{
	uint32_t n1, n2;

	if (C(pos) != '\'' || pos + 1 >= b)
		return 0;
	n1 = C(pos + 1);
	if (fold && n1 < 0x80)
		n1 |= (n1 >= 'A' && n1 <= 'Z') ? 0x20 : 0;
	if (n1 == 's' || n1 == 't' || n1 == 'd' || n1 == 'm')
		return 2;
	if (pos + 2 >= b)
		return 0;
	n2 = C(pos + 2);
	if (fold && n2 < 0x80)
		n2 |= (n2 >= 'A' && n2 <= 'Z') ? 0x20 : 0;
	if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l'))
		return 3;
	return 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static void scan_gpt2(struct pre_ctx *c, uint32_t k, uint32_t a, uint32_t b)
{
	const uint32_t cls = UNI_SPACE | UNI_LETTER | UNI_NUMBER;
	uint32_t pos = a;

	while (pos < b && !c->ret) {
		uint32_t start = pos, cp = C(pos), f2, ws = 0;
		int con = is_contraction(c, pos, b, 0);

		if (con) {
			pos += (uint32_t)con;
			goto emit;
		}
		f2 = cp == ' ' ? F(pos + 1) : F(pos);
		if (f2 & UNI_LETTER) {
			for (pos += cp == ' '; F(pos) & UNI_LETTER; pos++)
				;
			goto emit;
		}
		if (f2 & UNI_NUMBER) {
			for (pos += cp == ' '; F(pos) & UNI_NUMBER; pos++)
				;
			goto emit;
		}
		if (f2 && !(f2 & cls)) {
			for (pos += cp == ' '; F(pos) && !(F(pos) & cls); pos++)
				;
			goto emit;
		}
		while (F(pos + ws) & UNI_SPACE)
			ws++;
		if (ws > 1 && F(pos + ws))
			pos += ws - 1;		/* \s+(?!\S): leave one for the next word */
		else if (ws > 0)
			pos += ws;
		else
			pos++;
emit:
		pre_emit(c, k + 1, start, pos);
	}
}

/*
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 * ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * and its two variants: qwen2 has \p{N} for \p{N}{1,3} (digits = 1), qwen35
 * also [\p{L}\p{M}] for \p{L} (letter = UNI_LETTER | UNI_MARK), in both the
 * word and the [^\s...] alternatives.
 */
static void scan_llama3(struct pre_ctx *c, uint32_t k, uint32_t a, uint32_t b, uint32_t letter,
			uint32_t digits)
{
	const uint32_t cls = UNI_SPACE | letter | UNI_NUMBER;
	uint32_t pos = a;

	while (pos < b && !c->ret) {
		uint32_t start = pos, cp = C(pos), f = F(pos), f2, ws = 0, last_nl = 0;
		int con = is_contraction(c, pos, b, 1);

		if (con) {
			pos += (uint32_t)con;
			goto emit;
		}
		if (!(cp == '\r' || cp == '\n' || (f & UNI_NUMBER)) &&
		    ((f & letter) || (F(pos + 1) & letter))) {
			for (pos++; F(pos) & letter; pos++)
				;
			goto emit;
		}
		if (f & UNI_NUMBER) {
			/* \p{N}{1,digits}: a run splits into pieces of that many from the left. */
			uint32_t ini = pos;

			while (F(pos) & UNI_NUMBER) {
				if (++pos - ini >= digits) {
					pre_emit(c, k + 1, ini, pos);
					ini = pos;
				}
			}
			start = ini;
			goto emit;
		}
		f2 = cp == ' ' ? F(pos + 1) : f;
		if (f2 && !(f2 & cls)) {
			for (pos += cp == ' '; F(pos) && !(F(pos) & cls); pos++)
				;
			while (C(pos) == '\r' || C(pos) == '\n')
				pos++;
			goto emit;
		}
		while (F(pos + ws) & UNI_SPACE) {
			uint32_t x = C(pos + ws);

			if (x == '\r' || x == '\n')
				last_nl = pos + ws + 1;
			ws++;
		}
		if (last_nl)
			pos = last_nl;		/* \s*[\r\n]+ */
		else if (ws > 1 && F(pos + ws))
			pos += ws - 1;
		else if (ws > 0)
			pos += ws;
		else
			pos++;
emit:
		pre_emit(c, k + 1, start, pos);
	}
}

/*
 * Membership in a scan_class() class: 0 \p{N}; 1 [\p{P}\$\+<=>\^~\|]; 2 the
 * same with ` (falcon). The ASCII symbols are listed because they are \p{S}.
 */
static int in_class(const struct pre_ctx *c, uint32_t pos, uint32_t b, int cls)
{
	uint32_t x;

	if (pos >= b)
		return 0;
	if (cls == 0)
		return (c->fl[pos] & UNI_NUMBER) != 0;
	x = c->cp[pos];
	return (c->fl[pos] & UNI_PUNCT) || x == '$' || x == '+' || x == '<' || x == '=' ||
	       x == '>' || x == '^' || x == '~' || x == '|' || (cls == 2 && x == '`');
}

/* Runs of class cls (in_class()) and the gaps between them; single: each member alone. */
static void scan_class(struct pre_ctx *c, uint32_t k, uint32_t a, uint32_t b, int cls, int single)
{
	uint32_t pos = a;

	while (pos < b) {
		uint32_t start = pos;
		int in = in_class(c, pos, b, cls);

		if (in && single)
			pos++;
		else
			for (pos++; pos < b && in_class(c, pos, b, cls) == in && !(in && single); pos++)
				;
		pre_emit(c, k + 1, start, pos);
	}
}

/* [0-9][0-9][0-9]: leftmost non-overlapping triples of ASCII digits, gaps kept. */
static void scan_digits3(struct pre_ctx *c, uint32_t k, uint32_t a, uint32_t b)
{
	uint32_t gap = a, pos = a;

	while (pos + 3 <= b) {
		if (C(pos) - '0' < 10 && C(pos + 1) - '0' < 10 && C(pos + 2) - '0' < 10) {
			pre_emit(c, k + 1, gap, pos);
			pre_emit(c, k + 1, pos, pos + 3);
			pos += 3;
			gap = pos;
		} else {
			pos++;
		}
	}
	pre_emit(c, k + 1, gap, b);
}

#undef F
#undef C

static void pre_stage(struct pre_ctx *c, uint32_t k, uint32_t a, uint32_t b)
{
	switch (c->t->pre[k]) {
	case PRE_GPT2:
		scan_gpt2(c, k, a, b);
		break;
	case PRE_LLAMA3:
		scan_llama3(c, k, a, b, UNI_LETTER, 3);
		break;
	case PRE_QWEN2:
		scan_llama3(c, k, a, b, UNI_LETTER, 1);
		break;
	case PRE_QWEN35:
		scan_llama3(c, k, a, b, UNI_LETTER | UNI_MARK, 1);
		break;
	case PRE_EACH_NUMBER:
		scan_class(c, k, a, b, 0, 1);
		break;
	case PRE_RUN_NUMBER:
		scan_class(c, k, a, b, 0, 0);
		break;
	case PRE_RUN_PUNCT:
		scan_class(c, k, a, b, 1, 0);
		break;
	case PRE_RUN_PUNCT_BT:
		scan_class(c, k, a, b, 2, 0);
		break;
	case PRE_DIGITS3:
		scan_digits3(c, k, a, b);
		break;
	default:
		pre_emit(c, k + 1, a, b);
		break;
	}
}

int tok_bpe_encode(const struct tokenizer *t, const char *text, size_t len, struct tok_out *o)
{
	const uint8_t *s = (const uint8_t *)text;
	struct bpe_work w = { 0 };
	struct pre_ctx c = { .t = t, .w = &w, .o = o };
	uint8_t *clean = NULL;
	size_t n = 0, i, adv;
	int bad = 0;

	/* llama.cpp reads ill-formed UTF-8 as U+FFFD, one per bad byte, and tokenizes that. */
	for (i = 0; i < len; i += adv)
		bad |= unicode_utf8_next(s + i, len - i, &adv) == 0xFFFD && adv == 1;
	if (bad) {
		size_t m = 0;

		clean = malloc(3 * len);
		if (!clean)
			return -ENOMEM;
		for (i = 0; i < len; i += adv) {
			uint32_t cp = unicode_utf8_next(s + i, len - i, &adv);

			if (cp == 0xFFFD && adv == 1)
				m += unicode_utf8_put(cp, clean + m);
			else
				for (size_t k = 0; k < adv; k++)
					clean[m++] = s[i + k];
		}
		s = clean;
		len = m;
	}
	if (len > UINT32_MAX - 1) {
		c.ret = -E2BIG;
		goto out;
	}
	c.bytes = s;
	c.cp = malloc(len * sizeof(*c.cp));
	c.fl = malloc(len);
	c.off = malloc((len + 1) * sizeof(*c.off));
	if (!c.cp || !c.fl || !c.off) {
		c.ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < len; i += adv, n++) {
		c.cp[n] = unicode_utf8_next(s + i, len - i, &adv);
		c.fl[n] = (uint8_t)(unicode_flags(c.cp[n]) | CP_IN);
		c.off[n] = (uint32_t)i;
	}
	c.off[n] = (uint32_t)len;
	pre_emit(&c, 0, 0, (uint32_t)n);
out:
	free(w.sym);
	free(w.heap);
	free(w.mapped);
	free(c.off);
	free(c.fl);
	free(c.cp);
	free(clean);
	return c.ret;
}
