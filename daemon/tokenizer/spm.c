/* spm.c — SentencePiece-style BPE (Llama 2): score-ordered merges over characters, byte fallback. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tokenizer/tokenizer_int.h"

static const char k_marker[3] = { (char)0xE2, (char)0x96, (char)0x81 };	/* U+2581 */

int tok_spm_init(struct tokenizer *t, char *err, size_t errlen)
{
	(void)err;
	(void)errlen;
	for (unsigned b = 0; b < 256; b++) {
		char hex[8];
		char one = (char)b;
		uint32_t id;

		snprintf(hex, sizeof(hex), "<0x%02X>", b);
		id = tok_lookup(t, hex, 6);
		if (id == TOK_NONE)
			id = tok_lookup(t, &one, 1);
		t->byte_tok[b] = id;
	}
	return 0;
}

size_t tok_spm_unmap(const char *text, size_t len, char *buf, size_t cap)
{
	size_t w = 0;

	for (size_t i = 0; i < len; w++) {
		char ch = text[i];

		if (len - i >= 3 && memcmp(text + i, k_marker, 3) == 0) {
			ch = ' ';
			i += 3;
		} else {
			i++;
		}
		if (w < cap)
			buf[w] = ch;
	}
	return w;
}

struct spm_sym {
	uint32_t off, len;	/* bytes of the escaped text; len 0 once merged away */
	int32_t prev, next;
};

/* Pairs carry minus the joined token's score as key and in a the pair's bytes
 * when queued (a change makes it stale). */
struct spm_work {
	const struct tokenizer *t;
	const char *s;
	struct spm_sym *sym;
	struct tok_pair *heap;	/* higher score first, then leftmost */
	uint32_t n_heap;
};

/* A pair is a candidate only if its joined text is a token; the token's score orders it. */
static void try_pair(struct spm_work *w, int32_t l, int32_t r)
{
	uint32_t len, id;

	if (l < 0 || r < 0)
		return;
	len = w->sym[l].len + w->sym[r].len;
	id = tok_lookup(w->t, w->s + w->sym[l].off, len);
	if (id == TOK_NONE)
		return;
	tok_pair_push(w->heap, &w->n_heap,
		      (struct tok_pair){ -(double)w->t->vocab[id].score, (uint32_t)l, (uint32_t)r, len, 0, 0 });
}

static void emit_symbol(const struct tokenizer *t, const char *s, uint32_t len, struct tok_out *o)
{
	uint32_t id = tok_lookup(t, s, len);

	if (id != TOK_NONE) {
		tok_out_push(o, id);
		return;
	}
	/* No token for this character: one byte token per byte. */
	for (uint32_t i = 0; i < len; i++) {
		id = t->byte_tok[(uint8_t)s[i]];
		if (id == TOK_NONE)
			id = t->unk;
		if (id != TOK_NONE)
			tok_out_push(o, id);
	}
}

/* Length of the character starting with b as SentencePiece counts it (by the high nibble). */
static uint32_t char_len(uint8_t b)
{
	static const uint8_t lookup[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };

	return lookup[b >> 4];
}

int tok_spm_encode(const struct tokenizer *t, const char *text, size_t len, int space_prefix,
		   struct tok_out *o)
{
	struct spm_work w = { .t = t };
	size_t cap = 3 * (len + 1), m = 0;
	char *s;
	uint32_t n = 0;

	if (len > UINT32_MAX / 4)
		return -E2BIG;
	s = malloc(cap);
	w.sym = malloc(cap * sizeof(*w.sym));
	w.heap = malloc(3 * cap * sizeof(*w.heap));
	if (!s || !w.sym || !w.heap) {
		free(w.heap);
		free(w.sym);
		free(s);
		return -ENOMEM;
	}
	/* Spaces become U+2581, and one is prepended when asked. */
	if (space_prefix) {
		memcpy(s, k_marker, 3);
		m = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(s + m, k_marker, 3);
			m += 3;
		} else {
			s[m++] = text[i];
		}
	}
	w.s = s;
	for (size_t i = 0; i < m; n++) {
		uint32_t cl = char_len((uint8_t)s[i]);

		if (cl > m - i)
			cl = (uint32_t)(m - i);
		w.sym[n] = (struct spm_sym){ (uint32_t)i, cl, (int32_t)n - 1, -1 };
		if (n)
			w.sym[n - 1].next = (int32_t)n;
		i += cl;
	}
	for (uint32_t i = 1; i < n; i++)
		try_pair(&w, (int32_t)i - 1, (int32_t)i);

	while (w.n_heap) {
		struct tok_pair p = tok_pair_pop(w.heap, &w.n_heap);
		struct spm_sym *l = &w.sym[p.left], *r = &w.sym[p.right];

		if (l->len == 0 || r->len == 0 || l->len + r->len != p.a)
			continue;
		l->len += r->len;
		r->len = 0;
		l->next = r->next;
		if (r->next >= 0)
			w.sym[r->next].prev = (int32_t)p.left;
		try_pair(&w, l->prev, (int32_t)p.left);
		try_pair(&w, (int32_t)p.left, l->next);
	}
	for (int32_t i = n ? 0 : -1; i >= 0; i = w.sym[i].next)
		emit_symbol(t, s + w.sym[i].off, w.sym[i].len, o);

	free(w.heap);
	free(w.sym);
	free(s);
	return 0;
}
