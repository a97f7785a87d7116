/* tokenizer.c — vocabulary, special-token splitting and decoding shared by the BPE and SentencePiece tokenizers. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/model/gguf.h"
#include "daemon/model/model.h"
#include "daemon/tokenizer/tokenizer.h"
#include "daemon/tokenizer/tokenizer_int.h"
#include "daemon/tokenizer/unicode.h"
#include "daemon/log.h"

/* FNV-1a: token texts are short, and this only runs at load and in SPM. */
static uint32_t str_hash(const char *s, size_t len)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < len; i++)
		h = (h ^ (uint8_t)s[i]) * 16777619u;
	return h;
}

uint32_t tok_lookup(const struct tokenizer *t, const char *s, size_t len)
{
	uint32_t i = str_hash(s, len) & t->vmap_mask;

	for (;; i = (i + 1) & t->vmap_mask) {
		uint32_t id = t->vmap[i];
		const struct tok_entry *e;

		if (id == TOK_NONE)
			return TOK_NONE;
		e = &t->vocab[id];
		if (e->len == len && memcmp(e->text, s, len) == 0)
			return id;
	}
}

static void vmap_insert(struct tokenizer *t, uint32_t id)
{
	const struct tok_entry *e = &t->vocab[id];
	uint32_t i = str_hash(e->text, e->len) & t->vmap_mask;

	for (;; i = (i + 1) & t->vmap_mask) {
		uint32_t old = t->vmap[i];

		if (old == TOK_NONE || (t->vocab[old].len == e->len &&
					memcmp(t->vocab[old].text, e->text, e->len) == 0)) {
			t->vmap[i] = id;
			return;
		}
	}
}

static int load_vocab(struct tokenizer *t, const struct gguf_file *f, char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
	const void *types = NULL, *scores = NULL;
	uint64_t n_types = 0, n_scores = 0;
	uint32_t cap = 1;
	int ret;

	if (!kv || kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING) {
		log_errf(err, errlen, 0, "tokenizer.ggml.tokens: missing or not a string array");
		return -EINVAL;
	}
	if (kv->arr_len == 0 || kv->arr_len >= INT32_MAX) {
		log_errf(err, errlen, 0, "tokenizer.ggml.tokens: bad length %llu",
			(unsigned long long)kv->arr_len);
		return -EINVAL;
	}
	t->n_vocab = (uint32_t)kv->arr_len;
	ret = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_VT_I32, &types, &n_types);
	if (ret != -ENOENT && (ret || n_types != t->n_vocab)) {
		log_errf(err, errlen, 0, "tokenizer.ggml.token_type: not an i32 array of %u entries (%llu)",
			t->n_vocab, (unsigned long long)n_types);
		return -EINVAL;
	}
	ret = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_VT_F32, &scores, &n_scores);
	if (ret != -ENOENT && (ret || n_scores != t->n_vocab)) {
		log_errf(err, errlen, 0, "tokenizer.ggml.scores: not an f32 array of %u entries (%llu)",
			t->n_vocab, (unsigned long long)n_scores);
		return -EINVAL;
	}

	t->vocab = calloc(t->n_vocab, sizeof(*t->vocab));
	while (cap < 2 * t->n_vocab)
		cap <<= 1;
	t->vmap = malloc((size_t)cap * sizeof(*t->vmap));
	if (!t->vocab || !t->vmap)
		return -ENOMEM;
	memset(t->vmap, 0xff, (size_t)cap * sizeof(*t->vmap));
	t->vmap_mask = cap - 1;

	for (uint32_t i = 0; i < t->n_vocab; i++) {
		struct gguf_str s = gguf_arr_str(kv, i);
		struct tok_entry *e = &t->vocab[i];
		int32_t ty = TOKT_NORMAL;

		if (s.len > UINT32_MAX / 2) {
			log_errf(err, errlen, 0, "tokenizer.ggml.tokens[%u]: too long", i);
			return -EINVAL;
		}
		e->text = s.ptr;
		e->len = (uint32_t)s.len;
		/* The arrays sit unaligned in the mapping. */
		if (types)
			memcpy(&ty, (const char *)types + 4 * (size_t)i, 4);
		if (ty <= 0 || ty >= TOKT_LAST)
			ty = TOKT_NORMAL;
		e->type = (uint8_t)ty;
		if (scores)
			memcpy(&e->score, (const char *)scores + 4 * (size_t)i, 4);
		vmap_insert(t, i);
	}
	return 0;
}

static uint32_t get_id(const struct tokenizer *t, const struct gguf_file *f, const char *key,
		       uint32_t dflt)
{
	uint32_t v;

	if (gguf_get_u32(f, key, &v) != 0)
		return dflt;
	return v < t->n_vocab ? v : TOK_NONE;
}

static int cmp_special(const void *a, const void *b, void *arg)
{
	const struct tokenizer *t = arg;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	if (t->vocab[x].len != t->vocab[y].len)
		return t->vocab[x].len > t->vocab[y].len ? -1 : 1;
	return x < y ? -1 : x > y;
}

static void add_eog(struct tokenizer *t, uint32_t id)
{
	if (id == TOK_NONE || tokenizer_is_eog(t, id))
		return;
	if (t->n_eog < sizeof(t->eog) / sizeof(t->eog[0]))
		t->eog[t->n_eog++] = id;
}

/*
 * Special ids llama.cpp derives from token texts when the metadata lacks
 * them: end-of-turn, and every end-of-generation marker forced to control.
 */
static void load_specials(struct tokenizer *t, const struct gguf_file *f)
{
	static const char *const eot_texts[] = {
		"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
		"<EOT>", "_<EOT>", /* DeepSeek's <｜end▁of▁sentence｜>, in octal so no hex escape runs on */
		"<\357\275\234end\342\226\201of\342\226\201sentence\357\275\234>",
	};
	int spm = t->model == TOK_MODEL_SPM;
	int flag;

	t->bos = get_id(t, f, "tokenizer.ggml.bos_token_id", spm && t->n_vocab > 1 ? 1 : TOK_NONE);
	t->eos = get_id(t, f, "tokenizer.ggml.eos_token_id", spm && t->n_vocab > 2 ? 2 : TOK_NONE);
	t->unk = get_id(t, f, "tokenizer.ggml.unknown_token_id", spm ? 0 : TOK_NONE);
	t->eot = get_id(t, f, "tokenizer.ggml.eot_token_id", TOK_NONE);
	if (gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &flag) == 0)
		t->add_bos = flag;
	if (gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &flag) == 0)
		t->add_space_prefix = flag;

	add_eog(t, t->eos);
	for (size_t i = 0; i < sizeof(eot_texts) / sizeof(eot_texts[0]); i++) {
		uint32_t id = tok_lookup(t, eot_texts[i], strlen(eot_texts[i]));

		if (id == TOK_NONE)
			continue;
		if (t->eot == TOK_NONE)
			t->eot = id;
		t->vocab[id].type = TOKT_CONTROL;
		add_eog(t, id);
	}
	add_eog(t, t->eot);
	add_eog(t, get_id(t, f, "tokenizer.ggml.eom_token_id", TOK_NONE));
}

static int build_special_list(struct tokenizer *t)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < t->n_vocab; i++) {
		uint8_t ty = t->vocab[i].type;

		n += (ty == TOKT_CONTROL || ty == TOKT_USER || ty == TOKT_UNKNOWN) && t->vocab[i].len;
	}
	t->special = malloc(((size_t)n + 1) * sizeof(*t->special));
	if (!t->special)
		return -ENOMEM;
	for (uint32_t i = 0; i < t->n_vocab; i++) {
		uint8_t ty = t->vocab[i].type;

		if ((ty == TOKT_CONTROL || ty == TOKT_USER || ty == TOKT_UNKNOWN) && t->vocab[i].len)
			t->special[t->n_special++] = i;
	}
	qsort_r(t->special, t->n_special, sizeof(*t->special), cmp_special, t);
	return 0;
}

/*
 * llama.cpp's token attributes set by model name: in a model named Phi-3
 * every special token but <unk>, <s> and <|endoftext|> (and </s> too)
 * strips the whitespace that follows it, so "<|user|>\nHi" encodes as
 * "<|user|>Hi" does.
 */
static void load_strip(struct tokenizer *t, const struct gguf_file *f)
{
	static const char *const keep[] = { "<unk>", "<s>", "<|endoftext|>" };
	struct gguf_str name;
	char low[256];
	size_t n;
	uint32_t id;

	if (gguf_get_str(f, "general.name", &name) != 0)
		return;
	n = name.len < sizeof(low) - 1 ? name.len : sizeof(low) - 1;
	for (size_t i = 0; i < n; i++)
		low[i] = (char)((name.ptr[i] >= 'A' && name.ptr[i] <= 'Z') ? name.ptr[i] | 0x20 : name.ptr[i]);
	low[n] = 0;
	if (!strstr(low, "phi-3") && !strstr(low, "phi3"))
		return;
	for (uint32_t i = 0; i < t->n_special; i++)
		t->vocab[t->special[i]].rstrip = 1;
	id = tok_lookup(t, "</s>", 4);
	if (id != TOK_NONE)
		t->vocab[id].rstrip = 1;
	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
		id = tok_lookup(t, keep[i], strlen(keep[i]));
		if (id != TOK_NONE)
			t->vocab[id].rstrip = 0;
	}
}

int tokenizer_create(struct tokenizer **out, const struct gguf_file *f, char *err, size_t errlen)
{
	struct tokenizer *t;
	struct gguf_str model;
	int ret;

	log_errf(err, errlen, 0, "ok");
	if (gguf_get_str(f, "tokenizer.ggml.model", &model) != 0) {
		log_errf(err, errlen, 0, "tokenizer.ggml.model: missing or not a string");
		return -EINVAL;
	}
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0) {
		t->model = TOK_MODEL_BPE;
	} else if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0) {
		t->model = TOK_MODEL_SPM;
		t->add_bos = 1;
		t->add_space_prefix = 1;
	} else {
		log_errf(err, errlen, 0, "unsupported tokenizer model '%.*s' (kvd knows gpt2, llama)",
			(int)(model.len > 64 ? 64 : model.len), model.ptr);
		ret = -ENOTSUP;
		goto err_free;
	}
	t->bos = t->eos = t->eot = t->unk = TOK_NONE;

	ret = load_vocab(t, f, err, errlen);
	if (ret)
		goto err_free;
	if (t->model == TOK_MODEL_BPE)
		ret = tok_bpe_init(t, f, err, errlen);
	else
		ret = tok_spm_init(t, err, errlen);
	if (ret)
		goto err_free;
	load_specials(t, f);
	ret = build_special_list(t);
	if (ret)
		goto err_free;
	load_strip(t, f);
	ret = tok_chat_init(t, f);
	if (ret)
		goto err_free;
	*out = t;
	return 0;

err_free:
	if (ret == -ENOMEM)
		log_errf(err, errlen, 0, "tokenizer: out of memory");
	tokenizer_destroy(t);
	return ret;
}

int tokenizer_for_model(struct tokenizer **out, const struct model *m, char *err, size_t errlen)
{
	struct tokenizer *t;
	int rc = tokenizer_create(&t, m->gguf, err, errlen);
	if (rc)
		return rc;
	uint32_t n = tokenizer_vocab_size(t), rows = m->hp.vocab;
	const struct { const char *what; uint32_t id; } special[] = {
		{ "BOS", tokenizer_bos(t) }, { "EOS", tokenizer_eos(t) }, { "EOT", tokenizer_eot(t) },
	};
	if (n > rows)
		rc = log_errf(err, errlen, -EINVAL, "the tokenizer has %u tokens but the embedding only "
			      "%u rows: ids from %u up would have no embedding", n, rows, rows);
	for (size_t i = 0; !rc && i < sizeof(special) / sizeof(special[0]); i++)
		if (special[i].id != TOK_NONE && special[i].id >= rows)
			rc = log_errf(err, errlen, -EINVAL, "the %s token %u is outside the embedding's "
				      "%u rows", special[i].what, special[i].id, rows);
	if (rc) {
		tokenizer_destroy(t);
		return rc;
	}
	*out = t;
	return 0;
}

void tokenizer_destroy(struct tokenizer *t)
{
	if (!t)
		return;
	tok_chat_free(t);
	free(t->special);
	free(t->merges);
	free(t->vmap);
	free(t->vocab);
	free(t);
}

uint32_t tokenizer_vocab_size(const struct tokenizer *t) { return t->n_vocab; }
uint32_t tokenizer_bos(const struct tokenizer *t) { return t->bos; }
uint32_t tokenizer_eos(const struct tokenizer *t) { return t->eos; }
uint32_t tokenizer_eot(const struct tokenizer *t) { return t->eot; }
int tokenizer_add_bos(const struct tokenizer *t) { return t->add_bos && t->bos != TOK_NONE; }

int tokenizer_is_eog(const struct tokenizer *t, uint32_t id)
{
	for (uint32_t i = 0; i < t->n_eog; i++)
		if (t->eog[i] == id)
			return 1;
	return 0;
}

/* A piece of the input: raw text, or one special token found in it. */
struct frag {
	size_t off, len;
	uint32_t id;		/* TOK_NONE for raw text */
};

struct frags {
	struct frag *v;
	size_t n, cap;
};

static int frags_push(struct frags *fr, size_t off, size_t len, uint32_t id)
{
	if (fr->n == fr->cap) {
		size_t cap = fr->cap ? 2 * fr->cap : 16;
		struct frag *v = realloc(fr->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		fr->v = v;
		fr->cap = cap;
	}
	fr->v[fr->n++] = (struct frag){ off, len, id };
	return 0;
}

/* Whether a special token's match at [at, at + n) may become the token: not inside plain text. */
static int match_ok(const struct tok_entry *e, size_t at, size_t n, const struct tok_span *plain,
		    size_t n_plain)
{
	if (e->type == TOKT_USER)
		return 1;
	for (size_t i = 0; i < n_plain; i++)
		if (at < plain[i].off + plain[i].len && plain[i].off < at + n)
			return 0;
	return 1;
}

/* C's isspace() in the C locale, which llama.cpp's strip uses. */
static int is_ascii_space(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/*
 * Cut every occurrence of special token id out of the raw fragments of in,
 * into out, but for matches overlapping plain: those stay raw text.
 */
static int split_one(const struct tokenizer *t, const char *text, uint32_t id,
		     const struct tok_span *plain, size_t n_plain, const struct frags *in,
		     struct frags *out)
{
	const struct tok_entry *e = &t->vocab[id];
	int ret = 0;

	out->n = 0;
	for (size_t i = 0; i < in->n && !ret; i++) {
		struct frag g = in->v[i];
		size_t from = g.off, end = g.off + g.len;
		const char *p;

		while (g.id == TOK_NONE && end - from >= e->len &&
		       (p = memmem(text + from, end - from, e->text, e->len))) {
			size_t at = (size_t)(p - text);

			from = at + 1;
			if (!match_ok(e, at, e->len, plain, n_plain))
				continue;
			if (at > g.off)
				ret |= frags_push(out, g.off, at - g.off, TOK_NONE);
			ret |= frags_push(out, at, e->len, id);
			g.off = from = at + e->len;
			while (e->rstrip && g.off < end && is_ascii_space(text[g.off]))
				g.off = ++from;
			g.len = end - g.off;
		}
		if (g.len || g.id != TOK_NONE)
			ret |= frags_push(out, g.off, g.len, g.id);
	}
	return ret ? -ENOMEM : 0;
}

/*
 * Split text at special tokens the way llama.cpp does: each special token,
 * longest first, is cut out of every raw fragment left by the longer ones
 * (not leftmost-longest: of two overlapping matches the longer token wins).
 * User-defined tokens are always matched; control and unknown ones only
 * with parse_special, and never inside the plain spans. On return *fr
 * holds the fragments in text order.
 */
static int split_special(const struct tokenizer *t, const char *text, size_t len,
			 int parse_special, const struct tok_span *plain, size_t n_plain,
			 struct frags *fr)
{
	struct frags spare = { 0 };
	uint8_t present[256] = { 0 };
	int ret;

	ret = frags_push(fr, 0, len, TOK_NONE);
	if (ret || len == 0)
		return ret;
	for (size_t i = 0; i < len; i++)
		present[(uint8_t)text[i]] = 1;

	for (uint32_t s = 0; s < t->n_special && !ret; s++) {
		const struct tok_entry *e = &t->vocab[t->special[s]];
		struct frags tmp;

		if (!parse_special && e->type != TOKT_USER)
			continue;
		if (!present[(uint8_t)e->text[0]] || e->len > len ||
		    !memmem(text, len, e->text, e->len))
			continue;
		ret = split_one(t, text, t->special[s], plain, n_plain, fr, &spare);
		tmp = *fr;
		*fr = spare;
		spare = tmp;
	}
	free(spare.v);
	return ret;
}

int tok_encode_masked(const struct tokenizer *t, const char *text, size_t len, int add_bos,
		      int parse_special, const struct tok_span *plain, size_t n_plain,
		      uint32_t *out, size_t cap)
{
	struct tok_out o = { out, out ? cap : 0, 0 };
	struct frags fr = { 0 };
	int prev_special = 1;
	int ret;

	if (!text && len)
		return -EINVAL;
	if (add_bos && t->bos != TOK_NONE)
		tok_out_push(&o, t->bos);
	ret = split_special(t, text, len, parse_special, plain, n_plain, &fr);
	for (size_t i = 0; !ret && i < fr.n; i++) {
		const struct frag *g = &fr.v[i];

		if (g->id != TOK_NONE) {
			tok_out_push(&o, g->id);
			prev_special = 1;
			continue;
		}
		if (g->len == 0)
			continue;
		if (t->model == TOK_MODEL_BPE)
			ret = tok_bpe_encode(t, text + g->off, g->len, &o);
		else
			ret = tok_spm_encode(t, text + g->off, g->len,
					     t->add_space_prefix && prev_special, &o);
		prev_special = 0;
	}
	free(fr.v);
	if (ret)
		return ret;
	return o.n > INT_MAX ? -EOVERFLOW : (int)o.n;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len,
		     int add_bos, int parse_special, uint32_t *out, size_t cap)
{
	return tok_encode_masked(t, text, len, add_bos, parse_special, NULL, 0, out, cap);
}

static size_t copy_out(const char *s, size_t n, char *buf, size_t cap)
{
	if (buf && cap)
		memcpy(buf, s, n < cap ? n : cap);
	return n;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int tokenizer_token_bytes(const struct tokenizer *t, uint32_t id, int render_special,
			  char *buf, size_t cap)
{
	const struct tok_entry *e;
	size_t n;

	if (id >= t->n_vocab)
		return -ERANGE;
	if (!buf)
		cap = 0;
	e = &t->vocab[id];
	switch (e->type) {
	case TOKT_CONTROL:
	case TOKT_UNKNOWN:
		n = render_special ? copy_out(e->text, e->len, buf, cap) : 0;
		break;
	case TOKT_USER:
		n = copy_out(e->text, e->len, buf, cap);
		break;
	case TOKT_UNUSED:
		n = 0;
		break;
	case TOKT_BYTE:
		if (e->len == 6 && memcmp(e->text, "<0x", 3) == 0 && e->text[5] == '>' &&
		    hexval(e->text[3]) >= 0 && hexval(e->text[4]) >= 0) {
			char b = (char)(hexval(e->text[3]) << 4 | hexval(e->text[4]));

			n = copy_out(&b, 1, buf, cap);
			break;
		}
		/* A byte token spelled as its byte-level char. */
		/* fall through */
	default:
		if (t->model == TOK_MODEL_BPE)
			n = tok_bpe_unmap(e->text, e->len, buf, cap);
		else
			n = tok_spm_unmap(e->text, e->len, buf, cap);
		break;
	}
	return n > INT_MAX ? -EOVERFLOW : (int)n;
}

/*
 * How the bytes at p[0..n) start: > 0 a complete well-formed character of
 * that length, 0 a well-formed but unfinished prefix (all n bytes), < 0 an
 * ill-formed start whose maximal subpart (-ret bytes) becomes one U+FFFD.
 */
static int utf8_check(const uint8_t *p, size_t n)
{
	uint8_t b = p[0], lo = 0x80, hi = 0xBF;
	size_t need;

	if (b < 0x80)
		return 1;
	if (b >= 0xC2 && b <= 0xDF)
		need = 2;
	else if (b >= 0xE0 && b <= 0xEF)
		need = 3;
	else if (b >= 0xF0 && b <= 0xF4)
		need = 4;
	else
		return -1;
	if (b == 0xE0)
		lo = 0xA0;
	else if (b == 0xED)
		hi = 0x9F;
	else if (b == 0xF0)
		lo = 0x90;
	else if (b == 0xF4)
		hi = 0x8F;
	for (size_t i = 1; i < need; i++) {
		if (i == n)
			return 0;
		if (p[i] < lo || p[i] > hi)
			return -(int)i;
		lo = 0x80;
		hi = 0xBF;
	}
	return (int)need;
}

static const char k_repl[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

/* Emit the complete characters of in[0..n) into out (NULL: count only); returns bytes consumed. */
static size_t utf8_emit(const uint8_t *in, size_t n, char *out, size_t *w)
{
	size_t i = 0;

	while (i < n) {
		int r = utf8_check(in + i, n - i);

		if (r == 0)
			break;
		if (r > 0) {
			if (out)
				memcpy(out + *w, in + i, (size_t)r);
			*w += (size_t)r;
			i += (size_t)r;
		} else {
			if (out)
				memcpy(out + *w, k_repl, 3);
			*w += 3;
			i += (size_t)-r;
		}
	}
	return i;
}

int tok_decoder_feed(const struct tokenizer *t, struct tok_decoder *d, uint32_t id,
		     char *out, size_t cap)
{
	char stack[256], *tmp = stack;
	size_t n, w = 0, used;
	int ret;

	ret = tokenizer_token_bytes(t, id, 0, NULL, 0);
	if (ret < 0)
		return ret;
	n = (size_t)ret;
	if (d->n_pending + n > sizeof(stack)) {
		tmp = malloc(d->n_pending + n);
		if (!tmp)
			return -ENOMEM;
	}
	memcpy(tmp, d->pending, d->n_pending);
	tokenizer_token_bytes(t, id, 0, tmp + d->n_pending, n);
	/* SentencePiece's space prefix is not part of the text. */
	if (t->model == TOK_MODEL_SPM && t->add_space_prefix && d->n_emitted == 0 &&
	    d->n_pending == 0 && n > 0 && tmp[0] == ' ') {
		memmove(tmp, tmp + 1, --n);
	}
	n += d->n_pending;

	used = utf8_emit((const uint8_t *)tmp, n, NULL, &w);
	if (w > cap || n - used > sizeof(d->pending)) {
		ret = -ENOSPC;
		goto out;
	}
	w = 0;
	utf8_emit((const uint8_t *)tmp, n, out, &w);
	d->n_pending = (uint32_t)(n - used);
	memcpy(d->pending, tmp + used, d->n_pending);
	if (n > 0)
		d->n_emitted++;
	ret = (int)w;
out:
	if (tmp != stack)
		free(tmp);
	return ret;
}

int tok_decoder_flush(struct tok_decoder *d, char *out, size_t cap)
{
	if (d->n_pending == 0)
		return 0;
	if (cap < 3)
		return -ENOSPC;
	/* Pending bytes are always one unfinished well-formed prefix. */
	memcpy(out, k_repl, 3);
	d->n_pending = 0;
	return 3;
}

int tokenizer_decode(const struct tokenizer *t, const uint32_t *ids, size_t n,
		     char *out, size_t cap)
{
	int spm_prefix = t->model == TOK_MODEL_SPM && t->add_space_prefix;
	size_t w = 0;
	int first = 1;

	if (!out)
		cap = 0;
	for (size_t i = 0; i < n; i++) {
		size_t room = w < cap ? cap - w : 0;
		int r = tokenizer_token_bytes(t, ids[i], 0, NULL, 0);
		char c = 0;

		if (r < 0)
			return r;
		if (r == 0)
			continue;
		if (first && spm_prefix)
			tokenizer_token_bytes(t, ids[i], 0, &c, 1);
		first = 0;
		if (c == ' ') {
			/* Drop SentencePiece's space prefix: the token is one marker plus text. */
			char stack[256], *tmp = (size_t)r <= sizeof(stack) ? stack : malloc((size_t)r);

			if (!tmp)
				return -ENOMEM;
			tokenizer_token_bytes(t, ids[i], 0, tmp, (size_t)r);
			copy_out(tmp + 1, (size_t)r - 1 < room ? (size_t)r - 1 : room,
				 room ? out + w : NULL, room);
			if (tmp != stack)
				free(tmp);
			r--;
		} else {
			tokenizer_token_bytes(t, ids[i], 0, room ? out + w : NULL, room);
		}
		w += (size_t)r;
		if (w > INT_MAX)
			return -EOVERFLOW;
	}
	return (int)w;
}

static int pair_before(const struct tok_pair *x, const struct tok_pair *y)
{
	return x->key < y->key || (x->key == y->key && x->left < y->left);
}

void tok_pair_push(struct tok_pair *heap, uint32_t *n, struct tok_pair p)
{
	uint32_t i = (*n)++;

	while (i > 0) {
		uint32_t up = (i - 1) / 2;

		if (!pair_before(&p, &heap[up]))
			break;
		heap[i] = heap[up];
		i = up;
	}
	heap[i] = p;
}

struct tok_pair tok_pair_pop(struct tok_pair *heap, uint32_t *n)
{
	struct tok_pair top = heap[0], last = heap[--*n];
	uint32_t i = 0, m = *n;

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= m)
			break;
		if (c + 1 < m && pair_before(&heap[c + 1], &heap[c]))
			c++;
		if (!pair_before(&heap[c], &last))
			break;
		heap[i] = heap[c];
		i = c;
	}
	if (m)
		heap[i] = last;
	return top;
}
